"""The host's side of `--loops N`: fronts, each an event loop in a private interpreter of its own.

The host's loop accepts every connection and hands it to the front with the fewest open
(least connections; the descriptor is the process's, so handing it over is a number on
the front's channel). A front serves its connections' infer requests on its own loop
and submits their batches to the host's pools in C (`server/front.py`, `native/host/link.c`);
the host answers what a front hands back (admin, metrics, health, ... and infer requests
for models the front does not serve) with its own router, as if the request had come
on one of its connections. With no front serving, the host serves the connection itself.

The host tells the fronts which models they serve (`models`, on every change of the
routes and of the trace settings), retires a load only once every front answered what it queued of it (`retire`),
gathers their counters when metrics or statistics are asked for (`stats`), and passes on
draining (`drain`) and shutdown (`close`). A front whose loop ends without being told to
is reported in the log, the metrics (`aserve_loop_restarts_total`) and readiness (503
until it is replaced), and started again in the same interpreter.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from typing import TYPE_CHECKING, Any

import msgspec

from .. import _native
from ..dataplane.plane import Pending
from ..engine import Pool
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
    RequestHead,
    Retire,
    Retired,
    Spans,
    State,
    ToHost,
    Took,
)
from .http import Request

if TYPE_CHECKING:
    from ..dataplane.models import ModelHandle
    from .serve import Server

log = logging.getLogger("aserve.server")

STATS_TIMEOUT_S = 5.0  # longest the host waits for a front's counters
RESTART_FIRST_S = 0.5  # a loop that ended is started again after this, doubled while it keeps ending
RESTART_MAX_S = 10.0
STATE_EVERY_S = 0.05  # how often the host looks whether the readiness it published to the fronts changed
RESTART_RESET_S = 60.0  # a loop that ran this long before it ended starts again after RESTART_FIRST_S


class FrontLoop:
    """The host's view of one front."""

    __slots__ = ("channel", "connections", "failures", "handed", "index", "job", "ready", "started")

    def __init__(self, index: int) -> None:
        self.index = index
        self.job: asyncio.Future[str] | None = None  # the front's life, as a job of the loops' pool
        self.channel: Channel[ToHost] | None = None
        self.ready = False
        self.connections = 0
        self.handed: set[int] = set()  # descriptors sent to it that it has not yet taken
        self.started = time.monotonic()
        self.failures = 0  # ends in a row, each soon after its start


class Loops:
    """N fronts over the host's models (see the module's docstring)."""

    def __init__(self, server: Server, count: int) -> None:
        self.server = server
        self.count = count
        self.fronts = [FrontLoop(i) for i in range(count)]
        self.pool: Pool | None = None
        self.restarts = 0
        self.closing = False
        self._close_timeout = 0.0  # close()'s: a front whose channel opens after close began is told at once
        self._asked: dict[int, asyncio.Future[Any]] = {}
        self._next = 0
        self._publishing = False
        self._state: State | None = None  # the readiness the fronts were last sent
        self._state_timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Future[Any]] = set()
        self._serving = asyncio.Event()  # every front serves (set and cleared as they come and go)
        self._closed = asyncio.Event()  # close() began

    async def start(self) -> None:
        """Start every front's interpreter and loop (they report ready on their own)."""
        self.pool = Pool(engine="private", interpreters=self.count, spin_us=0, threads="aserve-loop")
        await self.pool.start()
        if self.closing:  # the shutdown came while the interpreters started: no front to start
            return
        for front in self.fronts:
            self._start(front)
        self._state_timer = asyncio.get_running_loop().call_later(STATE_EVERY_S, self._tick)

    def _tick(self) -> None:
        self.send_state()
        self._state_timer = asyncio.get_running_loop().call_later(STATE_EVERY_S, self._tick)

    def send_state(self, front: FrontLoop | None = None) -> None:
        """Send the fronts the server's readiness if it changed since they were last sent it
        (and `front`, which just began serving, whatever it is): what they answer readiness from.
        Sent at once where the host changes it (a loop ends or serves, the routes change), and
        looked at every STATE_EVERY_S for what changes on its own (an interpreter lost)."""
        state = self.server.app.readiness()
        message = State(ready=state.ready, reason=state.reason, waiting=list(state.waiting))
        changed = message != self._state
        self._state = message
        for f in self.fronts:
            if f.ready and f.channel is not None and (changed or f is front):
                f.channel.send(message)

    def _start(self, front: FrontLoop) -> None:
        assert self.pool is not None
        host_end, front_end = socket.socketpair()
        settings = self.server.settings
        grpc = self.server.grpc
        config = msgspec.json.encode({"index": front.index, "fd": front_end.detach(), "api": _native.link_api(),
                                      "settings": msgspec.to_builtins(settings),
                                      "grpc_port": grpc.port if grpc is not None else 0}).decode()
        source = f"from aserve.server.front import main\nmain({config!r})\nresult = None\n"
        front.ready = False
        front.connections = 0
        front.started = time.monotonic()
        front.job = asyncio.ensure_future(self.pool.execute(front.index, source))
        front.job.add_done_callback(lambda job: self._ended(front, job))
        self._spawn(self._talk(front, host_end))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @property
    def serving(self) -> int:
        return sum(f.ready for f in self.fronts)

    @property
    def connections(self) -> int:
        """Connections open on the fronts (handed to them, not yet reported gone)."""
        return sum(f.connections for f in self.fronts)

    @property
    def ready(self) -> bool:
        """Every front serves (readiness is 503 while one is being replaced)."""
        return self.closing or all(f.ready for f in self.fronts)

    def pick(self) -> FrontLoop | None:
        """The serving front with the fewest open connections, or None (the host serves)."""
        best = None
        for front in self.fronts:
            if front.ready and (best is None or front.connections < best.connections):
                best = front
        return best

    def hand(self, conn: socket.socket) -> bool:
        """Give an accepted connection to a front; False when none serves."""
        front = self.pick()
        if front is None or front.channel is None:
            return False
        front.connections += 1
        fd = conn.detach()
        front.handed.add(fd)
        front.channel.send(Conn(fd=fd))
        return True

    # ---- one front's channel ----

    async def _talk(self, front: FrontLoop, sock: socket.socket) -> None:
        channel: Channel[ToHost] = await Channel.open(sock, ToHost)
        front.channel = channel
        if self.closing:  # close() began before this front could be told
            channel.send(Close(timeout=self._close_timeout))
        try:
            while True:
                message = await channel.receive()
                match message:
                    case None:
                        return
                    case Forward():
                        self._spawn(self._answer(channel, message))
                    case Head():
                        self._head(channel, message)
                    case Spans():
                        self._spawn(self._export(channel, message))
                    case GrpcCall():
                        self._spawn(self._grpc(channel, message))
                    case Log(name=name, level=level, message=text, extra=extra):
                        logging.getLogger(name).log(level, "%s", text, extra=extra)
                    case Gone():
                        front.connections -= 1
                    case Cancelled(pool=address, job=job):  # its running batch: given up with the host's own if it never returns
                        for pool in self.server.plane.registry.pools.values():
                            if pool.address == address:
                                pool.watch(job)
                    case Took(fd=fd):
                        front.handed.discard(fd)
                    case Counts(id=key, data=data):
                        self._answered(key, data)
                    case Retired(id=key):
                        self._answered(key, None)
                    case Ready():
                        channel.send(self._models())
                        front.ready = True
                        self.send_state(front)
                        if self.serving == self.count:
                            self._serving.set()
                        log.info("loop %d serving", front.index)
        finally:
            front.ready = False
            self._serving.clear()
            front.channel = None
            channel.close()
            handed, front.handed = front.handed, set()
            for fd in handed:  # sent, never taken: nothing was read from them yet, so another loop serves them
                self.server.adopt(socket.socket(fileno=fd))

    async def serving_all(self, timeout: float) -> bool:
        """Wait until every front serves (at most `timeout` s, and no longer than until the
        loops close: a shutdown that comes while a front starts must not wait for it); whether
        they do."""
        waits = [asyncio.ensure_future(self._serving.wait()), asyncio.ensure_future(self._closed.wait())]
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        return self._serving.is_set() and not self.closing

    def _ended(self, front: FrontLoop, job: asyncio.Future[str]) -> None:
        """A front's loop returned: told to (shutdown), or it failed and is started again."""
        front.ready = False
        self._serving.clear()
        self.send_state()  # the others say not ready until it serves again
        front.connections = 0  # closed with its loop
        # what its batchers held of the models' shared queue counts is held no more
        for handle in self.server.plane.registry.handles():
            if handle.queued is not None:
                handle.queued.clear(front.index + 1)
        error = job.exception() if not job.cancelled() else None
        if self.closing:
            return
        self.restarts += 1
        # a loop that keeps failing is started again ever later (at most RESTART_MAX_S), not in a tight circle
        front.failures = front.failures + 1 if time.monotonic() - front.started < RESTART_RESET_S else 1
        delay = min(RESTART_MAX_S, RESTART_FIRST_S * 2 ** (front.failures - 1))
        log.error("loop %d ended (%s): its connections are closed; starting it again in %.1f s", front.index,
                  f"{type(error).__name__}: {error}" if error else "it returned", delay)
        asyncio.get_running_loop().call_later(delay, self._restart, front)

    def _restart(self, front: FrontLoop) -> None:
        if not self.closing:
            self._start(front)

    def _answered(self, key: int, data: Any) -> None:
        """A front's answer to the host's `_ask` number `key`."""
        future = self._asked.get(key)
        if future is not None and not future.done():
            future.set_result(data)

    async def _answer(self, channel: Channel[ToHost], message: Forward) -> None:
        """Answer a request a front handed over, with the host's router and handlers."""
        dispatcher = self.server.http.dispatcher
        body = message.body
        request = _request(message)
        request.whole = message.whole  # its duration counts from then: the hop to this loop included
        try:
            response: Any = dispatcher.head(request, len(body))
            if response is None:
                request.body = body
                pending = dispatcher.respond(request)
                answer = await (pending.answer if isinstance(pending, Pending) else pending)
                response = dispatcher.finish(request, answer)
            out = _answer(message.id, response)
        except Exception as exc:  # noqa: BLE001 - every failure is an answer, as on a connection: the client never hangs
            out = _answer(message.id, dispatcher.failed(request, exc))
        channel.send(out)

    async def _export(self, channel: Channel[ToHost], message: Spans) -> None:
        """Send the spans a front recorded with the host's exporter; answer how many went."""
        try:
            out = Exported(id=message.id, exported=int(await self.server.tracing.export(message.payload)))
        except Exception as exc:  # noqa: BLE001 - the front's tracer logs it and counts them dropped
            out = Exported(id=message.id, error=f"{type(exc).__name__}: {exc}")
        channel.send(out)

    async def _grpc(self, channel: Channel[ToHost], message: GrpcCall) -> None:
        """Answer a gRPC method a front relayed (`GrpcFront.answer`)."""
        grpc = self.server.grpc
        assert grpc is not None  # a front serves gRPC only when the host reserved its port
        try:
            out = await grpc.answer(message.name, message.raw, message.metadata)
        except Exception as exc:  # noqa: BLE001 - the front's call fails, not the channel
            out = {"code": "INTERNAL", "message": f"{type(exc).__name__}: {exc}"}
        channel.send(Relayed(id=message.id, reply=out))

    def _head(self, channel: Channel[ToHost], message: Head) -> None:
        """The host's head checks on an infer request a front hands over once its body is in:
        a refusal now (status and all), or status None: the body may come."""
        dispatcher = self.server.http.dispatcher
        request = _request(message)
        try:
            response = dispatcher.head(request, message.length)
            if response is None:
                response = dispatcher.ahead(request)  # the front sends the head while the body is on the way
        except Exception as exc:  # noqa: BLE001 - a failure is the request's answer, not the channel's end
            response = dispatcher.failed(request, exc)
        channel.send(_answer(message.id, response) if response is not None else Answer(id=message.id))

    # ---- what the fronts serve ----

    def publish(self) -> None:
        """The routes changed: tell every front (once per turn of the loop)."""
        if self._publishing:
            return
        self._publishing = True
        asyncio.get_running_loop().call_soon(self._publish)

    def _publish(self) -> None:
        self._publishing = False
        message = self._models()
        for front in self.fronts:
            if front.ready and front.channel is not None:
                front.channel.send(message)
        self.send_state()

    def _models(self) -> Models:
        """The `models` message: every serving version of each model a front can serve whole
        (every version of it ready, window policy, a pool of the host's), and its labels."""
        registry = self.server.plane.registry
        models: list[dict[str, Any]] = []
        labels: dict[str, dict[str, int]] = {}
        for name, routes in list(registry.routes.items()):
            handles = list(routes.versions.values())
            if not handles or not all(_servable(h) for h in handles):
                continue
            models.extend(front_model(handle, self.count) for handle in handles)
            labels[name] = {label: int(v) for label, v in routes.labels.items()}
        tracer = self.server.plane.tracer
        tracing = tracer.settings() if tracer is not None else None  # each front samples as the host does
        roots = self.server.app.policy.redactor().roots  # model errors name paths as the host's do
        return Models(models=models, labels=labels, tracing=tracing, roots=list(roots))

    async def retire(self, key: str) -> None:
        """Before `key` is unloaded: every front answers what it queued of it."""
        await asyncio.gather(*(self._ask(front, Retire(key=key)) for front in self.fronts if front.ready))

    async def _ask(self, front: FrontLoop, message: Asking, timeout: float | None = None) -> Any:
        """Send `message` numbered; the front's answer's data (None if it gave none in time)."""
        if front.channel is None:
            return None
        self._next += 1
        key = message.id = self._next
        future = self._asked[key] = asyncio.get_running_loop().create_future()
        front.channel.send(message)
        job = front.job
        try:
            waits = [future] if job is None else [future, job]  # a front that ends answers nothing
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            return future.result() if future.done() else None
        finally:
            self._asked.pop(key, None)

    async def stats(self) -> list[dict[str, Any]]:
        """Every serving front's counters."""
        found = await asyncio.gather(*(self._ask(front, AskCounts(), STATS_TIMEOUT_S) for front in self.fronts
                                       if front.ready))
        return [s for s in found if s is not None]

    # ---- draining and shutdown ----

    def drain(self) -> None:
        for front in self.fronts:
            if front.channel is not None:
                front.channel.send(Drain())

    async def close(self, timeout: float) -> None:
        """Every front answers what it accepted (within `timeout`) and stops."""
        self.closing = True
        self._close_timeout = timeout
        self._closed.set()
        if self._state_timer is not None:
            self._state_timer.cancel()
            self._state_timer = None
        jobs = []
        for front in self.fronts:
            if front.channel is not None:
                front.channel.send(Close(timeout=timeout))
            if front.job is not None:
                jobs.append(front.job)
        if jobs:
            await asyncio.wait(jobs, timeout=timeout + 5.0)
        for task in list(self._tasks):
            task.cancel()
        if self.pool is not None:
            await self.pool.close(timeout=1.0)


def _request(message: RequestHead) -> Request:
    """The request a front's `Forward` or `Head` describes (its body apart)."""
    return Request(message.method, message.target, message.version, message.headers, received=message.received,
                   remote=message.remote)


def _answer(key: int, response: Any) -> Answer:
    """The `Answer` of a response to a front's request `key`."""
    return Answer(id=key, status=response.status, headers=response.headers,
                  body=b"".join(bytes(c) for c in response.chunks), close=response.close,
                  hold=getattr(response, "hold", 0.0), budget=getattr(response, "budget", None),
                  rate=getattr(response, "rate", None))


def front_model(handle: ModelHandle, fronts: int) -> dict[str, Any]:
    """One ready model version as the `models` message lists it to `fronts` fronts: what a
    front's batcher needs to queue its requests in the host's pool (`front_models.front_handle`)."""
    pool = handle.pool
    assert pool is not None and handle.info is not None
    return {
        "name": handle.name, "version": handle.number, "key": handle.key, "engine": handle.engine,
        "config": msgspec.to_builtins(handle.config), "directory": handle.source.directory,
        "fingerprint": handle.fingerprint, "info": msgspec.to_builtins(handle.info),
        "pool": pool.address, "mask": pool.mask_of(handle.key), "interpreters": pool.interpreters,
        "names": [s.name for s in handle.info.inputs], "datatypes": [s.datatype for s in handle.info.inputs],
        "queued": None if handle.queued is None else [handle.queued.address, fronts],
        "plan": None if handle.plan is None else handle.plan.address,
    }


def _servable(handle: Any) -> bool:
    return (handle.ready and handle.batcher is not None and handle.pool is not None and handle.info is not None
            and (handle.config.batching.policy == "window" or handle.plan is not None) and not handle.retired)
