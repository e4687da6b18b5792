"""The gRPC front: a gRPC server on the HTTP front's event loop, in the same process
(`h2.GrpcServer`: HTTP/2 in C, the calls on the loop).

It serves `inference.GRPCInferenceService` (`service.Methods`), gRPC's standard health
service (`grpc.health.v1.Health`, for Kubernetes `grpc:` probes) and server reflection
(so that grpcurl needs no proto files). Its limits are HTTP's: a message larger than
`--max-body-bytes` is refused with RESOURCE_EXHAUSTED, and so is metadata larger in all
than `--max-header-bytes`. Its connections are bounded by the `grpc_*` settings, as gRPC's
servers read them (`h2`): calls open at once per connection, idle time and age (GOAWAY),
and the keepalive policy (the server's pings, and the clients' it accepts).
`stop` stops taking calls and answers those accepted.

Health answers from the server's state when asked: the service "" and
`inference.GRPCInferenceService` are SERVING when the server is ready (`App.readiness`,
HTTP's rule), "liveness" while the process serves (liveness).

With front loops (`--loops N`) every front runs a server of its own on the same port
(SO_REUSEPORT: the kernel spreads connections over them) and answers the infer methods
on its own loop, as its HTTP connections, and health and readiness from the readiness the
host publishes to every front (HTTP's); the host holds the port (`reserve`) without
listening, and answers every other method a front relays to it (`answer`): metadata,
a model's readiness where the front does not serve the model, the repository, statistics,
trace settings.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from typing import Any

import grpc
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection, reflection_pb2
from grpc_reflection.v1alpha._async import ReflectionServicer
from grpc_reflection.v1alpha.reflection_pb2_grpc import add_ServerReflectionServicer_to_server

from ...logs import AccessLogger
from ...protocol.grpc import protos
from ..app import App
from .h2 import GrpcServer, bind
from .service import GrpcStats, Methods, Relay

HEALTH = "grpc.health.v1.Health"
LIVENESS = "liveness"
SERVING: int = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING: int = health_pb2.HealthCheckResponse.NOT_SERVING
WATCH_EVERY_S = 0.5  # a Watch stream looks at readiness this often (the server has no event for it)


class Health:
    """grpc.health.v1.Health, answered from the server's readiness."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.closing: asyncio.Event | None = None  # set on shutdown: Watch streams end

    def status(self, service: str) -> int | None:
        """The service's status, None for a service this server does not know."""
        if service == LIVENESS:
            return SERVING
        if service not in ("", protos.SERVICE):
            return None
        return SERVING if self.app.readiness().ready else NOT_SERVING

    async def check(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        status = self.status(request.service)
        if status is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}; expected '', "
                                                           f"{protos.SERVICE!r} or {LIVENESS!r}")
        return health_pb2.HealthCheckResponse(status=status)

    async def watch(self, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        """The status now, then each change (SERVICE_UNKNOWN for a service this server does not know)."""
        if self.closing is None:
            self.closing = asyncio.Event()
        closing = self.closing
        last = None
        while True:
            status = self.status(request.service)
            if status is None:
                status = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
            if closing.is_set():
                status = NOT_SERVING if status != health_pb2.HealthCheckResponse.SERVICE_UNKNOWN else status
            if status != last:
                last = status
                yield health_pb2.HealthCheckResponse(status=status)
            if closing.is_set():
                return  # shutting down: the stream ends rather than hold the server's stop
            try:
                await asyncio.wait_for(closing.wait(), WATCH_EVERY_S)
            except TimeoutError:
                pass

    def close(self) -> None:
        """Shutting down: Watch streams say NOT_SERVING and end."""
        if self.closing is None:
            self.closing = asyncio.Event()
        self.closing.set()

    def handler(self) -> grpc.GenericRpcHandler:
        request = health_pb2.HealthCheckRequest.FromString
        serialize = health_pb2.HealthCheckResponse.SerializeToString
        return grpc.method_handlers_generic_handler(HEALTH, {
            "Check": grpc.unary_unary_rpc_method_handler(self.check, request, serialize),
            "Watch": grpc.unary_stream_rpc_method_handler(self.watch, request, serialize),
        })


class Unbound(OSError):
    """The gRPC front cannot bind its address (`address`: what the CLI names)."""

    def __init__(self, address: str, why: str) -> None:
        super().__init__(f"the gRPC front cannot bind it (in use, or not an address of this machine): {why}")
        self.address = address


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


class GrpcFront:
    """The gRPC server of an App: `start(host, port)` binds (port 0: a free one, `port`
    says which), `stop(grace)` answers what was accepted within `grace` seconds. With
    front loops the host `reserve`s the port and `answer`s what the fronts relay; a front's
    is made with `relay`, which asks the host."""

    def __init__(self, app: App, *, access_log: AccessLogger | None = None, relay: Relay | None = None) -> None:
        self.app = app
        self.stats = GrpcStats()
        app.grpc_stats = self.stats
        self.methods = Methods(app, self.stats, access_log, relay=relay)
        self.health = Health(app)
        self.server: GrpcServer | None = None
        self.port = 0
        self._reserved: socket.socket | None = None

    def reserve(self, host: str, port: int) -> None:
        """Hold host:port (port 0: a free one) for the front loops' servers, without listening:
        bound with SO_REUSEPORT, so they can bind it too, and only they are handed connections.
        OSError (Unbound) when another holds it."""
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((host.strip("[]"), port))
        except OSError as e:
            sock.close()
            raise Unbound(_address(host, port), str(e)) from None
        self._reserved = sock
        self.port = sock.getsockname()[1]
        self.methods.host = _address(host, self.port)

    async def answer(self, name: str, raw: bytes, md: dict[str, str]) -> dict[str, Any]:
        """What the host answers a unary method a front relayed (`Methods.relayed`)."""
        return await self.methods.answer(name, raw, md)

    async def start(self, host: str, port: int, *, shared: bool = False) -> None:
        """Listen on host:port; OSError when the address cannot be bound. `shared`: a front
        loop's server, on the port the host reserved."""
        server = GrpcServer(self.app.settings)
        server.add_generic_rpc_handlers((self.methods.handler(), self.health.handler()))
        for file in (health_pb2.DESCRIPTOR, reflection_pb2.DESCRIPTOR):
            try:
                protos.POOL.FindFileByName(file.name)
            except KeyError:
                protos.POOL.AddSerializedFile(file.serialized_pb)
        add_ServerReflectionServicer_to_server(
            ReflectionServicer((protos.SERVICE, HEALTH, reflection.SERVICE_NAME), pool=protos.POOL), server)
        address = _address(host, port)
        try:
            sock = bind(host, port, reuse_port=shared)
        except OSError as e:
            raise Unbound(address, str(e)) from None
        await server.start(sock)
        self.server = server
        self.port = sock.getsockname()[1]
        self.methods.host = _address(host, self.port)

    async def stop(self, grace: float | None) -> None:
        """Stop taking calls; answer those accepted (cancel what still runs after `grace` s).
        Open streams end: a Watch at once, a ModelStreamInfer once it answered the requests
        it had taken."""
        if self._reserved is not None:
            self._reserved.close()
            self._reserved = None
        if self.server is not None:
            self.health.close()
            self.methods.stop_reading()
            await self.server.stop(grace)
