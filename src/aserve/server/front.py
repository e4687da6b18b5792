"""A front: an event loop of its own, in an interpreter of its own, serving the connections
the host hands it (`aserve serve --loops N`; the host's side is `server/loops.py`).

A front runs the same connection protocol, router and data plane as the host's loop. It
answers the infer routes of the models the host lists as its own (their requests go to
the host's pools through a native `Link`, with no Python of the host's on the way:
`server/front_models.py`), liveness and readiness (from the state the host publishes), a
served model's readiness and configuration, and hands every other request to the host's
loop over its channel (`server/channel.py`): the repository, trace settings, metadata,
statistics, metrics, a model loading, not ready or unknown. The client cannot tell which
loop answered.

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
from typing import Any

import msgspec

from ..batching import Batcher, FairScheduler
from ..config import ServerSettings
from ..dataplane import DataPlane
from ..dataplane.models import ModelHandle, ModelRoutes
from ..dataplane.stats import BatchTotals
from ..errors import EngineError, ModelNotFound
from ..logs import AccessLogger
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
from .front_models import LinkEngine, front_handle, with_waiting
from .http import Request, Response
from .router import Dispatcher, Router
from .routes import ROUTES, Route


def main(config: str) -> None:
    """The front's whole life (the job the host runs in the front's interpreter): serve
    until the host says close, or the channel to it is gone."""
    import uvloop

    cfg = msgspec.json.decode(config)
    loop = uvloop.new_event_loop()  # no signal handlers: signals are the host's
    loop.set_exception_handler(_drop_ended_calls)
    asyncio.set_event_loop(loop)
    try:
        loop.run_until_complete(Front(cfg).serve())
    finally:
        loop.close()
        asyncio.set_event_loop(None)


def _drop_ended_calls(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The loop's exception handler. grpc.aio's completion queue belongs to the interpreter and
    hands each call's events to the loop that made the call: an event of a call made on a front
    loop that has ended (a loop started again, the next server in the process) reaches this
    loop's reader and fails handing it to the closed loop. Nobody waits for that call: the event
    is dropped; every other error is reported as usual."""
    error = context.get("exception")
    if isinstance(error, RuntimeError) and str(error) == "Event loop is closed" \
            and "PollerCompletionQueue._handle_events" in str(context.get("message", "")):
        return
    loop.default_exception_handler(context)


_HOSTS = "hosts"  # an infer request's state: the host answers it
# a `traced` batcher's counts, any of which it reports once it is not zero (batching/batcher.py, stats)
_TRACED_SHOWN = ("requests", "running_batches", "queued_requests", "refused", "timed_out")
# routes a front answers itself, with the host's handlers: liveness (a front that answers is a
# live process), readiness (from what the host publishes, `State`), the server's metadata, the
# OpenAPI document and its page
ANSWERED_HERE = frozenset({"live", "ready", "server_metadata", "openapi", "docs"})
# and, for a model it serves, the model's readiness and configuration (its handle has them)
SERVED_HERE = (v2_routes.model_ready, v2_routes.model_config)


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
                    stats = with_waiting(stats, handle.queued, waiting[1])
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
