"""A front: an event loop of its own, in an interpreter of its own, serving the connections
the host hands it (`aserve serve --loops N`; the host's side is `server/loops.py`).

A front runs the same connection protocol, router and data plane as the host's loop. It
answers the infer routes of the models the host lists as its own (their batches go to
the host's pools through a native `Link`, with no Python of the host's on the way), and
hands every other request to the host's loop over its channel (`server/channel.py`):
admin, metadata, metrics, health, the repository, trace settings, a model loading, not
ready or unknown. The client cannot tell which loop answered.

While the host traces, a front samples and records the spans of its own requests (a
`Tracer` of its own, kept in step with the host's settings) and hands what it recorded to
the host's exporter over the channel.

It runs in a private interpreter (its own libpython, its own GIL), started by the host as
a job that returns when the front stops; its log records go to the host's handlers.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from .. import _native
from ..batching import Batcher, FairScheduler
from ..batching.native import NativeBatcher, NativeDone, PlanAdmission
from ..batching.policy import WindowPolicy
from ..config import ServerSettings
from ..dataplane import DataPlane
from ..dataplane.models import READY, ModelHandle, ModelRoutes, wait_slots
from ..dataplane.stats import BatchTotals
from ..engine.pool import Done, ModelInfo, _error, tensors
from ..errors import EngineError, ModelNotFound
from ..inference import ModelSchema
from ..logs import AccessLogger
from ..repository.config import ModelConfig
from ..repository.scan import VersionSource
from ..tensor import Tensor
from ..tracing import Resolved, Tracer
from . import infer as infer_routes
from . import openapi
from . import v2 as v2_routes
from .app import App, Readiness
from .channel import (
    Answer,
    AskCounts,
    Asking,
    Cancelled,
    Channel,
    Close,
    Conn,
    Counts,
    Drain,
    Exported,
    Forward,
    Gone,
    GrpcCall,
    Head,
    Log,
    Models,
    Ready,
    Relayed,
    Retire,
    Retired,
    Spans,
    State,
    ToFront,
    Took,
)
from .connection import HttpServer, Limits
from .http import Request, Response
from .router import Dispatcher, Router
from .routes import ROUTES, Route


def main(config: str) -> None:
    """The front's whole life (the job the host runs in the front's interpreter): serve
    until the host says close, or the channel to it is gone."""
    import uvloop

    cfg = msgspec.json.decode(config)
    loop = uvloop.new_event_loop()  # no signal handlers: signals are the host's
    asyncio.set_event_loop(loop)
    try:
        loop.run_until_complete(Front(cfg).serve())
    finally:
        loop.close()
        asyncio.set_event_loop(None)


_HOSTS = "hosts"  # an infer request's state: the host answers it
# a `traced` batcher's counts, any of which it reports once it is not zero (batching/batcher.py, stats)
_TRACED_SHOWN = ("requests", "running_batches", "queued_requests", "refused", "timed_out")
# routes a front answers itself, with the host's handlers: liveness (a front that answers is a
# live process), readiness (from what the host publishes, `State`), the server's metadata, the
# OpenAPI document and its page
ANSWERED_HERE = frozenset({"live", "ready", "server_metadata", "openapi", "docs"})
# and, for a model it serves, the model's readiness and configuration (its handle has them)
SERVED_HERE = (v2_routes.model_ready, v2_routes.model_config)


# A model's queue Counter (its address) and the slots a front's batches count in while they
# wait in the pool's queue (dataplane/models.py, wait_slots)
Waiting = tuple[int, tuple[int, int, int, int]]


def _shared(queued: list[int] | None, index: int) -> _native.Counter | None:
    """This front's view of a model's queued samples over every loop (its slot: after the host's)."""
    return None if queued is None else _native.Counter.at(queued[0], index + 1)


def _with_waiting(stats: dict[str, Any], queued: _native.Counter, slots: tuple[int, ...]) -> dict[str, Any]:
    """A front batcher's statistics with its batches that wait in the pool's queue counted as
    queued, not running: the batcher handed them on, but no interpreter has taken them yet."""
    samples, requests, batches = (queued.get(slot) for slot in slots[:3])
    if batches:
        stats["queued_samples"] += samples
        stats["queued_requests"] += requests
        stats["running_batches"] -= batches
    return stats


def _rows(config: ModelConfig) -> int:
    """The most rows a batch of the model gathered in the pool may hold: its max_batch_size (0:
    it does not batch, and is never gathered there). BYTES rows are sliced apart in C too."""
    return config.max_batch_size


def _native_slots(slots: tuple[int, int, int, int]) -> tuple[int, int, int]:
    """What a NativeBatcher reads of its front's wait slots: samples, requests, running batches."""
    return slots[0], slots[1], slots[3]


def _response(answer: Answer) -> Response:
    """The host's answer as the front's response."""
    assert answer.status is not None
    response = Response(answer.status, answer.body, answer.headers, close=answer.close)
    response.hold = answer.hold
    response.budget = answer.budget
    response.rate = answer.rate
    return response


def _refuse_early(request: Request, head: asyncio.Future[Answer]) -> None:
    """The host refused the request from its head while its body was still on the way: the
    refusal goes out now, and the body is dropped as it comes."""
    if head.cancelled() or head.result().status is None:
        return
    request.connection.answer_early(request, _response(head.result()))


class LinkEngine:
    """What a front's batchers run batches on: the host's pools, through a native Link."""

    def __init__(self, api: int, loop: asyncio.AbstractEventLoop, cancelled: Callable[[int, int], None]) -> None:
        self.link = _native.Link(api, tensor=Tensor, error=_error)
        self.loop = loop
        self.cancelled = cancelled  # (pool, job): a running batch was cancelled; the host watches it
        # a model's key -> (its pool's address, the interpreters that run it, its inputs' names and datatypes,
        # the most rows a batch coalesced with other fronts' may hold: 0 never, and the model's queue
        # Counter with the slots this front's batches count in while they wait in the pool's queue, or None)
        self.models: dict[str, tuple[int, int, tuple[str, ...], tuple[str, ...], int, Waiting | None]] = {}
        # a model batched in the pool (`request`): its pool's address and what the Link read of it once
        self.targets: dict[str, tuple[int, Any]] = {}
        # a model with the adaptive policy: its Plan's address, which counts its batches run here
        self.plans: dict[str, int] = {}
        self.pools: set[int] = set()  # the addresses of every pool a model it was given runs on
        loop.add_reader(self.link.fileno(), self._drain)

    @property
    def in_flight(self) -> int:
        """Jobs queued or running, their completion not yet taken."""
        jobs: int = self.link.pending[0]
        return jobs

    def add(self, m: dict[str, Any], handle: ModelHandle, index: int) -> None:
        """Run the batches of a model version the host lists (`loops.front_model`) for front
        `index`, whose handle of it is `handle`."""
        assert handle.info is not None
        rows = _rows(handle.config)
        counter = None if m["queued"] is None else (m["queued"][0], wait_slots(m["queued"][1], index))
        names, datatypes = tuple(m["names"]), tuple(m["datatypes"])
        self.models[m["key"]] = (m["pool"], m["mask"], names, datatypes, rows, counter)
        if counter is not None:
            self.targets[m["key"]] = (m["pool"], self.link.target(m["pool"], m["key"], m["mask"], names, datatypes, rows,
                                                                  counter[0], counter[1][:4], m.get("plan") or 0))
        if m.get("plan"):
            self.plans[m["key"]] = m["plan"]
        self.pools.add(m["pool"])

    def remove(self, key: str) -> None:
        """The model version `key` is no longer run here."""
        self.models.pop(key, None)
        self.targets.pop(key, None)
        self.plans.pop(key, None)

    def run(self, model: str, inputs: Sequence[Any], done: Done, /, *, trace: bool | str = False,
            context: str | None = None, waiting: tuple[int, int] | None = None) -> tuple[int, int]:
        """`Pool.run` for a front: queue one batch on the first idle interpreter of `model`;
        returns what `cancel` takes (its pool's address and the job's id). trace, context: as
        `Pool.run`'s (a str `trace` is the W3C context of the traced batch's run span). waiting:
        the batch's (samples, requests), which count in the model's queue while it waits for an
        interpreter."""
        found = self.models.get(model)
        if found is None:
            raise ModelNotFound(f"model {model!r} is not loaded")
        pool, mask, names, datatypes, max_rows, counter = found
        counted = None if counter is None or waiting is None else \
            (counter[0], counter[1][:3], *waiting, self.plans.get(model, 0))
        traced = bool(trace)
        header = trace if isinstance(trace, str) else context
        job: int = self.link.infer(pool, model, mask, names, datatypes, list(inputs),
                                   functools.partial(self._done, done, traced), traced, max_rows, counted, header)
        return pool, job

    def request(self, model: str, inputs: Sequence[Any], samples: int, done: NativeDone, /, *,
                window_ns: int, deadline_ns: int) -> tuple[int, int]:
        """Queue one request of `model` in the pool, which batches it with every loop's queued
        requests of the model (batching/native.py); returns what `cancel` takes. The Link's
        drain calls `done` itself."""
        found = self.targets.get(model)
        if found is None:
            raise ModelNotFound(f"model {model!r} is not loaded")
        pool, target = found
        job: int = self.link.request(target, inputs, samples, window_ns, deadline_ns, done)
        return pool, job

    def hold(self) -> None:
        """Keep the requests `request` queues from now on, until `release`."""
        self.link.hold()

    def release(self) -> None:
        """Queue the requests held since `hold` together, then wake the interpreters that
        take them: one taking the first finds the others queued and batches them."""
        self.link.release()

    def cancel(self, job: tuple[int, int], /) -> bool:
        """`Pool.cancel` for a front: a batch nobody waits for any more never runs, or gets
        Cancelled raised in its interpreter (its completion still comes, failed). False: it
        finished, or runs in one batch with other batches (pool_coalesce.c), whose requests
        still wait. A running one is reported to the host, whose pool gives its interpreter up
        if it has not returned within the grace period (Pool.watch)."""
        return self.cancel_request(job) is not None

    def cancel_request(self, job: tuple[int, int], /) -> str | None:
        """`cancel`, telling the job's state: "queued" (it left the queue), "running"
        (Cancelled is raised in its interpreter), or None (finished, or running in one batch
        with others). A request batched in the pool (NativeBatcher) counts a cancelled batch
        only when it was running."""
        pool, number = job
        state = self.link.cancel(pool, number)
        if state == "running":
            self.cancelled(pool, number)
        return state

    def _drain(self) -> None:
        for token, ok, payload in self.link.drain():
            try:
                if token is None:  # a request's done, called by the drain, raised `payload`
                    raise payload
                token(ok, payload)
            except Exception as exc:  # noqa: BLE001 - every other completion is still answered
                self.loop.call_exception_handler({"message": "aserve: a batch's completion raised", "exception": exc})

    def _done(self, done: Any, traced: bool, ok: bool, payload: Any) -> None:
        if not ok:
            done(None, _error(payload))
        elif traced:
            outputs, interpreter, start_ns, end_ns, spans = payload
            done(tensors(outputs), None, (interpreter, start_ns, end_ns, spans))
        else:
            done(tensors(payload), None)

    def abandon(self) -> int:
        """The front's loop ends, its connections closed: nobody waits for what it still has
        queued in the pools. Each such job completes now, failed, and gives its place in its
        model's queue back at once (rather than holding it, and later an interpreter, for
        nobody); running ones finish. Returns how many were queued."""
        return sum(self.link.abandon(pool) for pool in self.pools)

    def close(self) -> None:
        self.loop.remove_reader(self.link.fileno())


def front_handle(m: dict[str, Any], plane: DataPlane, engine: LinkEngine, schedulers: dict[str, FairScheduler],
                 index: int, settings: ServerSettings) -> ModelHandle:
    """A front's handle of one model version the host lists (`loops.front_model`): its batcher
    queues the front's requests in the host's pool through `engine`; `index`: the front's."""
    config = msgspec.convert(m["config"], ModelConfig)
    source = VersionSource(version=m["version"], directory=m["directory"], config=config,
                           fingerprint=m["fingerprint"])
    name = m["name"]
    handle = ModelHandle(name, source, key=m["key"], stats=plane.metrics.stats(name, str(m["version"])))
    info = msgspec.convert(m["info"], ModelInfo)
    schema = ModelSchema(name, handle.version, inputs=info.inputs, outputs=info.outputs,
                         max_batch_size=config.max_batch_size, max_latency_budget_ms=handle.timeout_ms)
    kind = m["engine"]
    scheduler = schedulers.get(kind)
    if scheduler is None:
        scheduler = schedulers[kind] = FairScheduler(m["interpreters"])
    queued = _shared(m["queued"], index)
    delay = config.batching.max_queue_delay_ms / 1000.0
    adaptive = m.get("plan") is not None  # the policy in C the host publishes (batching/native.py, PlanFeed)
    budget = config.batching.latency_budget_ms / 1000.0

    def window() -> Batcher:
        policy = WindowPolicy(max_queue_delay=delay) if not adaptive or queued is None else PlanAdmission(
            max_queue_delay=delay, latency_budget_s=budget, interpreters=info.interpreters, link=engine.link,
            shared=queued, target=lambda: (engine.targets.get(handle.key) or (None, None))[1])
        return Batcher(
            model=name, key=handle.key, run=engine.run, policy=policy,
            max_batch_size=config.max_batch_size, interpreters=info.interpreters,
            max_queue_size=config.batching.max_queue_size, scheduler=scheduler, uniform=schema.uniform,
            cancel=engine.cancel, shared=queued, waiting=queued is not None,
        )

    if queued is not None and (settings.front_batching == "pool" or adaptive) and _rows(config) > 0:
        handle.batcher = NativeBatcher(
            model=name, key=handle.key, queue=engine, max_batch_size=config.max_batch_size,
            max_queue_size=config.batching.max_queue_size, max_queue_delay=delay, shared=queued,
            slots=_native_slots(wait_slots(m["queued"][1], index)),
            adaptive=(budget, info.interpreters) if adaptive else None,
        )
        # the requests sampled for tracing (or carrying an unsampled caller's context): batched
        # among themselves by the window rule, in batches that run with their context (a model
        # with the adaptive policy admits them by its Plan, which counts their batches too)
        handle.traced = window()
    else:
        handle.batcher = window()
    handle.queued = queued
    handle.engine, handle.info, handle.schema, handle.state = kind, info, schema, READY
    return handle


def _trace_with(handle: ModelHandle, tracer: Tracer | None) -> None:
    """Batches of `handle`'s sampled requests get spans from `tracer` (None: none do)."""
    for batcher in handle.batchers():
        if isinstance(batcher, Batcher):
            batcher.tracer = tracer


class _Connections(set[Any]):
    """The front's open connections; each one that closes tells the host (it spreads new
    connections over the fronts by how many each has: those it handed, less those gone)."""

    def __init__(self, gone: Any) -> None:
        super().__init__()
        self._gone = gone

    def discard(self, conn: Any) -> None:
        if conn in self:
            super().discard(conn)
            self._gone()


_RECORD_FIELDS = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


class _ToHost(logging.Handler):
    """Sends the front's log records to the host, whose handlers write them."""

    def __init__(self, channel: Channel[ToFront]) -> None:
        super().__init__()
        self.channel = channel

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
            if record.exc_info:
                text += "\n" + logging.Formatter().formatException(record.exc_info)
            extra = {k: v for k, v in record.__dict__.items()
                     if k not in _RECORD_FIELDS and isinstance(v, (str, int, float, bool))}
            self.channel.send(Log(name=record.name, level=record.levelno, message=text, extra=extra))
        except Exception:  # noqa: BLE001 - logging must never fail the caller
            self.handleError(record)


class Front:
    """One front's state: its connections, the models it answers, what it asked the host."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.index: int = cfg["index"]
        self.fd: int = cfg["fd"]
        self.api: int = cfg["api"]
        self.settings = settings = msgspec.convert(cfg["settings"], ServerSettings)
        root = logging.getLogger()
        root.handlers[:] = [logging.NullHandler()]  # until the channel is open
        root.setLevel(settings.log_level.upper())
        self.plane = DataPlane(settings.repository or ".", settings)  # its routes are the host's (`models`)
        self.app = App(self.plane, settings)
        self.app.published = Readiness(False, "this event loop has not yet heard the server's readiness")
        self.app.openapi = msgspec.json.encode(openapi.document(ROUTES))  # served here (`ANSWERED_HERE`)
        access_log = self.access_log = AccessLogger(logging.getLogger("aserve.access")) if settings.access_log else None
        self.grpc_port: int = cfg.get("grpc_port") or 0  # the port the host reserved for the loops' gRPC servers
        self.grpc: Any = None  # server/grpc GrpcFront, while it serves gRPC
        # max_connections is the whole process's: the host holds back what is over it
        limits = msgspec.structs.replace(Limits.of(settings), max_connections=0)
        self.http = HttpServer(Dispatcher(self.app, Router(self._routes())), limits, access_log=access_log)
        self.http.connections = _Connections(self._gone)
        self.handles: dict[str, ModelHandle] = {}  # by key: those the host lists now
        self.retired: dict[str, ModelHandle] = {}  # no longer listed, not yet closed
        self.schedulers: dict[str, FairScheduler] = {}
        self.totals: dict[tuple[str, str], BatchTotals] = {}  # the batchers of loads retired, summed
        self._asked: dict[int, asyncio.Future[Any]] = {}
        self._next = 0
        self.engine: LinkEngine | None = None
        self.channel: Channel[ToFront] | None = None

    def _routes(self) -> list[Route]:
        """The route table with the front's handlers: its own infer path, the routes it answers
        as the host does (`ANSWERED_HERE`, `SERVED_HERE`), the host for the rest."""
        out = []
        for route in ROUTES:
            if route.codec is not None:
                out.append(route._replace(head=self._prepare, handler=self._infer))
            elif route.operation in ANSWERED_HERE or route.handler is openapi.static_files:
                out.append(route)
            elif route.handler in SERVED_HERE:
                out.append(route._replace(handler=functools.partial(self._served_here, route.handler)))
            else:
                out.append(route._replace(head=None, handler=self.forward))
        return out

    async def _served_here(self, handler: Any, app: App, request: Request) -> Response:
        """This front's answer for a model it serves (every version of it ready), the host's for
        any other (loading, not ready, unknown)."""
        params = request.params
        try:
            app.plane.model(params["model"], params.get("version"))
        except ModelNotFound:
            return await self.forward(app, request)
        response: Response = await handler(app, request)
        return response

    # ---- requests ----

    def _prepare(self, app: App, request: Request) -> None:
        """The infer routes' head check. For a request the host answers (a model this front does
        not list: loading, not ready, unknown) whose body did not come with its head, the head
        goes to the host: the host's head checks (a refusal for overload, 404, a model not ready)
        answer while the body arrives, and a refused request's body is never read."""
        try:
            infer_routes.prepare(app, request)
            return
        except ModelNotFound:  # not one of the front's: the host knows (and answers 404 if none)
            pass
        request.state = _HOSTS
        # after this read is parsed: a body that came with the head is whole by then, and the
        # host's checks run once, on the whole request (forward)
        asyncio.get_running_loop().call_soon(self._ask_head, request)

    def _ask_head(self, request: Request) -> None:
        if request.state is not _HOSTS or request.complete or request.connection.closing:
            return  # its handler took it, or will, with its body; or its connection went to the host
        headers = request.headers
        length = None if "transfer-encoding" in headers else int(headers.get("content-length", "0"))
        head = request.state = self._ask(Head(method=request.method, target=request.target, version=request.version,
                                              headers=headers, remote=request.remote, received=request.received,
                                              length=length))
        head.add_done_callback(functools.partial(_refuse_early, request))

    def _infer(self, app: App, request: Request) -> Any:
        state = request.state
        if state is _HOSTS:
            request.state = None
            return self.forward(app, request)
        if isinstance(state, asyncio.Future):
            return self._forward_admitted(state, app, request)
        return infer_routes.infer(app, request)

    async def _forward_admitted(self, head: asyncio.Future[Answer], app: App, request: Request) -> Response:
        """The host's refusal from the request's head, or else its answer to the whole request."""
        answer = await head
        if answer.status is not None:
            return _response(answer)
        return await self.forward(app, request)

    def _ask(self, message: Asking) -> asyncio.Future[Any]:
        """Send the host `message` with a new id; the future of its answer (the message
        that names that id: `Answer`, `Exported` or `Relayed`)."""
        channel = self.channel
        if channel is None:
            raise EngineError("the server is shutting down")
        self._next += 1
        key = message.id = self._next
        future = self._asked[key] = asyncio.get_running_loop().create_future()
        future.add_done_callback(lambda _: self._asked.pop(key, None))
        channel.send(message)
        return future

    async def forward(self, app: App, request: Request) -> Response:
        """The host's answer to a request (it runs the same checks and handler)."""
        body = request.body
        answer: Answer = await self._ask(Forward(
            method=request.method, target=request.target, version=request.version, headers=request.headers,
            body=body if isinstance(body, bytes) else bytes(body), remote=request.remote, received=request.received,
            whole=time.perf_counter()))
        return _response(answer)

    async def _relay(self, name: str, raw: bytes, md: dict[str, str]) -> dict[str, Any]:
        """A gRPC method this loop does not answer itself, answered by the host's."""
        relayed: Relayed = await self._ask(GrpcCall(name=name, raw=raw, metadata=md))
        return relayed.reply

    # ---- the host's messages ----

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        channel: Channel[ToFront] = await Channel.open(socket.socket(fileno=self.fd), ToFront)
        self.channel = channel
        logging.getLogger().handlers[:] = [_ToHost(channel)]
        self.engine = LinkEngine(self.api, loop, lambda pool, job: channel.send(Cancelled(pool=pool, job=job)))
        if self.grpc_port:  # gRPC on this loop too, on the port every loop shares
            from .grpc import GrpcFront  # only where gRPC is served

            self.grpc = GrpcFront(self.app, access_log=self.access_log, relay=self._relay)
            await self.grpc.start(self.settings.host, self.grpc_port, shared=True)
        channel.send(Ready(index=self.index))
        closing: asyncio.Future[None] | None = None  # the host said close: answering what was accepted
        try:
            while True:
                if closing is None:
                    message = await channel.receive()
                else:  # the channel is still read while closing: the answers to what the close asks the host
                    receiving = asyncio.ensure_future(channel.receive())
                    await asyncio.wait((receiving, closing), return_when=asyncio.FIRST_COMPLETED)
                    if closing.done():
                        receiving.cancel()
                        await closing
                        return
                    message = receiving.result()
                if message is None:  # the host is gone
                    if closing is None:
                        await self._close(0.0)
                    else:
                        closing.cancel()
                    return
                match message:
                    case Conn(fd=fd):
                        sock = socket.socket(fileno=fd)
                        channel.send(Took(fd=fd))
                        try:
                            await loop.connect_accepted_socket(self.http, sock)
                        except OSError:  # the client left before it was served
                            sock.close()
                            self._gone()
                    case Answer() | Exported() | Relayed():
                        future = self._asked.get(message.id)
                        if future is not None and not future.done():
                            future.set_result(message)
                    case Models():
                        self._models(message.models, message.labels)
                        self._tracing(message.tracing)
                        self.app.policy.use_roots(message.roots)
                    case Retire(key=key, id=ask):
                        loop.create_task(self._retire(key, ask))
                    case AskCounts(id=ask):
                        channel.send(Counts(id=ask, data=self.stats()))
                    case State(ready=ready, reason=reason, waiting=waiting):
                        self.app.published = Readiness(ready, reason, tuple(waiting))
                    case Drain():
                        self.app.draining = True
                    case Close(timeout=timeout):
                        closing = closing or asyncio.ensure_future(self._close(timeout))
        finally:
            if closing is not None and not closing.done():
                closing.cancel()
            if self.grpc is not None:  # a loop that ends takes no more calls
                await self.grpc.stop(0)
            for conn in list(self.http.connections):  # a loop that ends leaves no connection behind
                if conn.transport is not None:
                    conn.transport.abort()
            for future in self._asked.values():
                if not future.done():
                    future.set_exception(EngineError("the server is shutting down"))
            if self.engine is not None:
                self.engine.abandon()
                self.engine.close()
            logging.getLogger().handlers[:] = []
            channel.close()

    # ---- tracing ----

    def _tracing(self, settings: dict[str, Any] | None) -> None:
        """The host's trace settings (`Tracer.settings`, None: off): a tracer of the front's own
        that samples as the host's does and sends its records to the host's exporter."""
        tracer = self.plane.tracer
        if settings is None:
            if tracer is not None:
                tracer.flush()
                self._use_tracer(None)
            return
        if tracer is None:
            resolved = Resolved(sampler=settings["sampler"], ratio=settings["ratio"], exporter_env=settings["env"])
            tracer = Tracer(resolved, export=self._export, source=self.index + 1)
            self._use_tracer(tracer)
        tracer.apply(settings)

    def _use_tracer(self, tracer: Tracer | None) -> None:
        self.plane.set_tracer(tracer)
        for handle in [*self.handles.values(), *self.retired.values()]:
            _trace_with(handle, tracer)

    def _export(self, payload: bytes) -> asyncio.Future[int]:
        """The front tracer's export: the host's exporter sends the records; the future of how many."""
        exported: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        def answered(asked: asyncio.Future[Exported]) -> None:
            if exported.done():
                return
            if asked.cancelled():
                exported.cancel()
            elif asked.exception() is not None:
                exported.set_exception(asked.exception())  # type: ignore[arg-type]
            elif asked.result().error is not None:
                exported.set_exception(EngineError(asked.result().error))
            else:
                exported.set_result(asked.result().exported)

        self._ask(Spans(payload=payload)).add_done_callback(answered)
        return exported

    def _gone(self) -> None:
        if self.channel is not None:
            self.channel.send(Gone())

    async def _close(self, timeout: float) -> None:
        """Answer what was accepted (within `timeout`), then stop."""
        await asyncio.gather(self.http.shutdown(timeout), *([self.grpc.stop(timeout)] if self.grpc else []))
        for handle in [*self.handles.values(), *self.retired.values()]:
            for batcher in handle.batchers():
                await batcher.close()
        tracer = self.plane.tracer
        if tracer is not None:  # what it recorded goes to the host's exporter before the channel closes
            try:
                await asyncio.wait_for(tracer.drain(), max(timeout, 1.0))
            except TimeoutError:
                logging.getLogger("aserve.tracing").warning("loop %d: its last spans could not be sent", self.index)

    def _models(self, models: list[dict[str, Any]], labels: dict[str, dict[str, int]]) -> None:
        """The models the host lists as the front's: every serving version of each, as handles
        with batchers of the front's own; a model not listed is the host's."""
        handles: dict[str, ModelHandle] = {}
        versions: dict[str, dict[int, ModelHandle]] = {}
        assert self.engine is not None
        for m in models:
            key = m["key"]
            handle = self.handles.pop(key, None) or self._handle(m)
            handles[key] = handle
            _trace_with(handle, self.plane.tracer)
            versions.setdefault(handle.name, {})[handle.number] = handle
            self.engine.add(m, handle, self.index)
        self.retired.update(self.handles)  # listed no more: closed when the host retires them
        for handle in self.handles.values():
            handle.retired = True
        self.handles = handles
        self.plane.registry.routes = {name: ModelRoutes(name, vs, labels.get(name, {}), {})
                                      for name, vs in versions.items()}

    def _handle(self, m: dict[str, Any]) -> ModelHandle:
        assert self.engine is not None
        return front_handle(m, self.plane, self.engine, self.schedulers, self.index, self.settings)

    async def _retire(self, key: str, ask: int) -> None:
        """The host unloads `key` once every front answered what it queued of it."""
        handle = self.retired.pop(key, None) or self.handles.pop(key, None)
        try:
            if handle is not None:
                handle.retired = True
                for batcher in handle.batchers():
                    await batcher.close()
                    self.totals.setdefault((handle.name, handle.version), BatchTotals()).add(batcher)
        finally:
            if self.engine is not None:
                self.engine.remove(key)
            if self.channel is not None:
                self.channel.send(Retired(id=ask))

    def stats(self) -> dict[str, Any]:
        """What the front counted, for the host's metrics and statistics (added to its own)."""
        http = self.app.stats
        models: list[dict[str, Any]] = []
        for handle in [*self.handles.values(), *self.retired.values()]:
            entry = self.engine.models.get(handle.key) if self.engine is not None else None
            waiting = entry[5] if entry is not None else None
            for batcher in handle.batchers():
                stats = batcher.stats()
                if batcher is handle.traced and not any(stats.get(k) for k in _TRACED_SHOWN):
                    continue  # it never took a request: nothing of it to add
                if waiting is not None and isinstance(batcher, Batcher):
                    stats = _with_waiting(stats, handle.queued, waiting[1])
                models.append({"name": handle.name, "version": handle.version, "batcher": stats,
                               "batch_sizes": batcher.batch_sizes, "last_dispatch": batcher.last_dispatch})
        for (name, version), t in self.totals.items():
            models.append({"name": name, "version": version, "last_dispatch": None, "batch_sizes": t.batch_sizes,
                           "batcher": {"batches": t.batches, "requests": t.requests, "queue_seconds": t.queue_seconds,
                                       "compute_seconds": t.compute_seconds}})
        requests = [[name, version, s.counts()] for (name, version), s in self.plane.metrics.items()]
        tracer = self.plane.tracer
        grpc = self.app.grpc_stats
        return {"index": self.index, "http": {"requests": http.requests, "connections": http.connections, "refused": http.refused},
                "requests": requests, "models": models, "tracing": tracer.stats() if tracer is not None else None,
                "grpc": None if grpc is None else {"calls": [[m, c, n] for (m, c), n in grpc.calls.items()],
                                                   "held": grpc.held}}
