"""What the HTTP front's handlers read: the data plane and the policies, built once per server."""

from __future__ import annotations

import logging
from typing import Any, NamedTuple

from ..config import ServerSettings, is_loopback
from ..dataplane import DataPlane
from .access import Access, Cors
from .errors import ErrorPolicy
from .threads import ThreadCpu

log = logging.getLogger("aserve.server")

# why a connection's request was refused before a handler saw it (`aserve_http_refused_total{reason}`)
REFUSALS = ("malformed", "header_size", "body_size", "timeout", "connection_limit")


class HttpStats:
    """What the HTTP front counts beside the data plane: requests answered, refusals by
    reason, and the connections open now."""

    __slots__ = ("connections", "refused", "requests")

    def __init__(self) -> None:
        self.requests = 0
        self.connections = 0
        self.refused = dict.fromkeys(REFUSALS, 0)


class Readiness(NamedTuple):
    """Whether the server takes inference requests now, and if not why: `reason` for anyone,
    `waiting` (the model versions not ready, and why) for callers that may see the models."""

    ready: bool
    reason: str = ""
    waiting: tuple[dict[str, str], ...] = ()


class App:
    """The server's data plane and the policies every request meets: access (tokens per kind
    of route), CORS, what error messages may say, the limits of a request, draining."""

    def __init__(self, plane: DataPlane, settings: ServerSettings) -> None:
        self.plane = plane
        self.settings = settings
        self.access = Access(admin_token=settings.admin_token, api_token=settings.api_token)
        if not self.access.guards_anything and not is_loopback(settings.host):
            log.warning("listening on %s with no --admin-token: anyone who reaches it can load and unload models "
                        "(and, with no --api-token, run them)", settings.host)
        self.cors = Cors(settings.cors_origins) if settings.cors_origins else None
        self.policy = ErrorPolicy(expose_model_errors=settings.model_errors_exposed, registry=plane.registry)
        self.max_body_bytes = settings.max_body_bytes
        self.stats = HttpStats()
        self.openapi = b""  # the OpenAPI document of the route table, encoded (set by the server)
        self.draining = False  # readiness answers 503 and every answer closes its connection
        self.loops: Any = None  # server/loops.py Loops, with --loops: readiness asks whether every loop serves
        self.published: Readiness | None = None  # a front loop's: the host's readiness, as it last sent it
        self.grpc_stats: Any = None  # grpc.service.GrpcStats, while the gRPC front serves
        self.threads = ThreadCpu()  # the loops' and interpreters' CPU, for /metrics

    def readiness(self) -> Readiness:
        """The one readiness rule, for HTTP's /v2/health/ready and gRPC's ServerReady and Health:
        not draining, every event loop serving, every model version the repository asks for ready.
        A front loop answers what the host last published of it (`published`)."""
        if self.draining:
            return Readiness(False, "draining: the server is about to stop")
        if self.published is not None:
            return self.published
        loops = self.loops
        if loops is not None and not loops.ready:
            return Readiness(False, f"{loops.serving} of {loops.count} event loops serve: one is being started again")
        plane = self.plane
        if plane.ready:
            return Readiness(True)
        registry = plane.registry
        waiting = tuple(registry.not_ready())
        if waiting:
            reason = f"{len(waiting)} model version{'s' if len(waiting) > 1 else ''} not ready"
        else:
            reason = "shutting down" if registry.closed else "the repository holds no model to serve"
        return Readiness(False, reason, waiting)
