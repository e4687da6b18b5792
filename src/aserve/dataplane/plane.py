"""The data plane: every model of a repository, and the one path an infer call takes to them.

Every front (the HTTP server, a test, a benchmark) hands `DataPlane.infer` an `InferCall`:
the model it names, the body as it arrived and the codec that reads it. `infer` owns
the call from there to the encoded answer, each step once:

1. the model's handle (`registry.get`: 404 naming what is missing), and its readiness
   (`ModelHandle.require_ready`: 503 with the reason);
2. decoding with the call's codec, which checks the inputs against the model's schema
   (`protocol.validate`: names, datatypes, shapes, batch size, parameters, budget);
3. the deadline and latency budget on the clock the batcher counts in, and the submit;
4. the outputs encoded by the same codec;
5. the outcome counted (`RequestStats`) and, when the request is sampled, traced.

Nothing here imports a web framework.
"""

from __future__ import annotations

import asyncio
import contextvars
import math
import pathlib
import time
from collections.abc import Callable
from typing import Any

from .. import logs
from ..config import ServerSettings
from ..errors import AserveError, ModelError, Overloaded
from ..inference import Answer, InferCall, InferRequest, InferResponse
from ..tensor import Tensor
from ..tracing import RequestTrace, Tracer, recorder
from ..tracing.batches import untraced_context
from .models import ModelHandle
from .registry import ModelRegistry
from .stats import Metrics, failure_reason

SOLE_CALLS = 8  # calls in a row from one client before `DataPlane.sole` says one client sends


class DataPlane:
    """Every model of a repository and the infer path to them.

    `start()` scans the repository and loads every model (engines chosen, pools
    started, policies warmed up); `close()` answers what was accepted and closes the
    pools."""

    def __init__(self, repository: str | pathlib.Path, settings: ServerSettings) -> None:
        self.settings = settings
        self.metrics = Metrics()
        self.registry = ModelRegistry(repository, settings, self.metrics)
        self.tracer: Tracer | None = None  # while tracing is on (set_tracer)
        self._client: int | None = None  # InferCall.client of the last call submitted
        self._same_client = 0  # calls in a row from that client
        self.registry.sole = self.sole

    def sole(self) -> bool:
        """Whether the last few calls submitted came from one client (one connection)."""
        return self._same_client >= SOLE_CALLS

    def set_tracer(self, tracer: Tracer | None) -> None:
        """Trace sampled requests' batches from now on (None: stop)."""
        self.tracer = tracer
        self.registry.tracer = tracer
        for handle in self.registry.handles():
            for batcher in handle.batchers():
                batcher.tracer = tracer

    # ---- lifecycle ----

    def scan(self) -> None:
        """Read the repository's configs (nothing is loaded). Raises RepositoryError."""
        self.registry.scan()

    async def start(self) -> None:
        """Load every model of the repository (scanning it first if that was not done)."""
        await self.registry.start()

    async def close(self, *, timeout: float | None = None) -> None:
        """Refuse new requests, answer those accepted (up to `timeout` s), close the pools."""
        await self.registry.close(timeout=timeout)

    @property
    def ready(self) -> bool:
        """True once every model version the repository aspires to answers requests."""
        return self.registry.ready

    async def rescan(self) -> None:
        """Read the repository again: load new versions, reload changed ones, unload removed ones."""
        await self.registry.rescan()

    async def load(self, name: str, override: dict[str, Any] | None = None) -> None:
        """Load or reload one model (config fields in `override` laid over its config.toml)."""
        await self.registry.load(name, override)

    async def unload(self, name: str) -> None:
        """Stop serving a model once the requests it accepted are answered."""
        await self.registry.unload(name)

    def model(self, name: str, version: str | None = None) -> ModelHandle:
        """A model's handle, loaded or not; ModelNotFound names what is missing."""
        return self.registry.get(name, version)

    # ---- the infer path ----

    async def infer(self, call: InferCall, /, *, handle: ModelHandle | None = None) -> Answer:
        """Answer one infer call, or raise the AserveError that says why not (its status is
        the HTTP status: 400, 404, 503, 504, 500 for a model's failure, ...). Cancelling the
        caller withdraws the call from its model's queue if it has not run.

        `handle`: the model's handle when the front already looked it up (the HTTP front
        does, from the request head, to refuse an unknown model before reading the body)."""
        pending = self.submit(call, handle=handle)
        try:
            return await pending.answer
        except asyncio.CancelledError:
            pending.drop()
            raise

    def head(self, call: InferCall, /, *, handle: ModelHandle) -> None:
        """What the call's head alone decides, before its body is read (a front that reads
        the body itself calls it once the head is in): Overloaded (503, Retry-After) when the
        model's batcher would refuse any request the body may hold (`Batcher.refuse_ahead`,
        with the loosest latency budget the call's codec lets a request carry), counted as
        `submit` counts its refusals. A model that is not ready is left to `submit`."""
        batcher = handle.batcher
        schema = handle.schema
        if batcher is None or schema is None or not handle.ready:
            return
        budget = None  # the policy's own
        if call.codec.budgets:  # a request may carry its own, up to the schema's largest
            largest = schema.max_latency_budget_ms
            if largest is None:
                budget = math.inf
            elif largest > handle.config.batching.latency_budget_ms:
                budget = largest / 1000.0
        waited = 0.0 if call.received is None else time.monotonic() - call.received
        try:
            batcher.refuse_ahead(budget=budget, waited=waited)
        except Overloaded as exc:
            _failed(handle, call, None, time.perf_counter(), exc)  # refused at once
            raise

    def submit(self, call: InferCall, /, *, handle: ModelHandle | None = None) -> Pending:
        """`infer` without a coroutine: the call is decoded and queued now (what is wrong with it
        raises here), and `Pending.answer` resolves to its Answer, or to its error, once its
        batch ran. A front that answers many calls uses it to spend no task on each."""
        if handle is None or handle.retired:  # retired: a reload or unload took it out while the body arrived
            handle = self.registry.get(call.model, call.version)
        start = time.perf_counter() if call.whole is None else call.whole
        client = call.client
        if client is not None and client == self._client:
            self._same_client += 1
        else:
            self._client, self._same_client = client, 0
        trace: RequestTrace | None = None
        caller: str | None = None  # not sampled: the caller's W3C context for model code
        try:
            if self.tracer is not None:
                trace = start_trace(self.tracer, call)
                if trace is None:
                    caller = untraced_context(call.headers)
            schema = handle.require_ready()
            if trace is not None:
                trace.stamp(recorder.DECODE_START)
            request = call.codec.decode(call, schema)
            if trace is not None:
                trace.stamp(recorder.DECODE_END)
            # the deadline: the model's timeout, or the request's own when shorter; the latency
            # budget (checked by the codec against the model's timeout) counts from when the
            # request's first bytes arrived: a burst can hold it on the loop before it is queued
            limit = handle.timeout_ms
            timeout = request.timeout_ms
            if timeout is not None and timeout < limit:
                limit = timeout
            timeout = call.timeout_ms  # the front's deadline (gRPC's)
            if timeout is not None and timeout < limit:
                limit = timeout
            budget_ms = request.latency_budget_ms
            budget = None if budget_ms is None else budget_ms / 1000.0
            call.admission = (request.samples, budget)
            now = time.monotonic()
            batcher = handle.batcher
            assert batcher is not None  # require_ready checked it
            if handle.traced is not None and (trace is not None or caller is not None):
                batcher = handle.traced
            future = batcher.submit(
                request.inputs, request.samples, deadline=now + limit / 1000.0, budget=budget, trace=trace,
                waited=0.0 if call.received is None else now - call.received, context=caller, held=call.held,
            )
        except BaseException as exc:
            _failed(handle, call, trace, start, exc)
            raise
        pending = Pending(call, handle, request, trace, start, future)
        if trace is not None and logs.trace_ids_logged:
            # the answer's log records carry the trace's ids: the context of this call alone, not
            # the caller's (a connection's context outlives its requests)
            context = contextvars.copy_context()
            context.run(logs.current_trace.set, trace)
            future.add_done_callback(pending.ran, context=context)
        else:
            future.add_done_callback(pending.ran)
        return pending

    def refuse_again(self, call: InferCall, handle: ModelHandle, *, received: float, held: bool) -> Overloaded | None:
        """A call `submit` refused for overload (Overloaded), sent again byte for byte (a client
        that does not wait as told), judged by its model's admission alone: the refusal, counted
        as `submit` counts one, or None where `submit` may admit it (nothing counted: the caller
        submits it as a new call). `received`, `held`: the new request's (`InferCall`'s fields).
        Where the call would meet anything else now (tracing on, another handle for the name, a
        model not ready), None too."""
        admission = call.admission
        if admission is None or self.tracer is not None or handle.retired or not handle.ready:
            return None
        try:
            if self.registry.get(call.model, call.version) is not handle:
                return None
        except AserveError:
            return None
        batcher = handle.batcher
        if batcher is None:
            return None
        start = time.perf_counter()
        samples, budget = admission
        refused = batcher.refuse_again(samples, budget=budget, waited=time.monotonic() - received, held=held)
        if refused is not None:
            _failed(handle, call, None, start, refused)
        return refused


Done = Callable[[Answer | None, BaseException | None], None]


class Pending:
    """A call queued on its model's batcher. Once its batch ran and its outputs are encoded
    (`ran`), its caller learns the answer: from `done(answer, None)` or `done(None, error)` when
    it gave one (`then`), else from the `answer` future. `drop()` when the caller stops waiting."""

    __slots__ = ("_answer", "_done", "call", "dropped", "finished", "future", "handle", "request", "start", "trace")

    def __init__(self, call: InferCall, handle: ModelHandle, request: InferRequest, trace: RequestTrace | None,
                 start: float, future: asyncio.Future[dict[str, Tensor]]) -> None:
        self.call = call
        self.handle = handle
        self.request = request
        self.trace = trace
        self.start = start
        self.future = future
        self.dropped = False
        self.finished = False  # `ran` counted the outcome
        self._answer: asyncio.Future[Answer] | None = None
        self._done: Done | None = None

    def then(self, done: Done) -> None:
        """Call `done` with the answer or the error, from the loop, once the batch ran."""
        self._done = done

    @property
    def answer(self) -> asyncio.Future[Answer]:
        """A future of the answer (for a caller that gave no `then`)."""
        if self._answer is None:
            self._answer = self.future.get_loop().create_future()
        return self._answer

    def ran(self, future: asyncio.Future[dict[str, Tensor]]) -> None:
        """The batch ran: encode the outputs with the call's codec, count, trace, answer."""
        if future.cancelled():
            return  # withdrawn: `drop` counted it
        error = future.exception()
        if self.dropped:
            return
        self.finished = True
        call, handle, request, trace = self.call, self.handle, self.request, self.trace
        try:
            if error is not None:
                raise error
            response = InferResponse(model_name=handle.name, model_version=handle.version,
                                     outputs=future.result(), id=request.id)
            if trace is not None:
                trace.stamp(recorder.ENCODE_START)
            encoded = call.codec.encode(call, request, response, handle.labels)
            if trace is not None:
                trace.stamp(recorder.ENCODE_END)
        except Exception as exc:  # noqa: BLE001 - the call's own failure, answered to its caller
            _failed(handle, call, trace, self.start, exc)
            self._tell(None, exc)
            return
        stats = handle.stats
        if trace is None:
            stats.succeeded(time.perf_counter() - self.start, request.samples)
        else:
            stats.succeeded(time.perf_counter() - self.start, request.samples, trace.trace_id_hex)
            if not trace.end(200):
                end_trace(trace, call, None)
        stats.answered(call.front)
        self._tell(encoded, None)

    def _tell(self, answer: Answer | None, error: BaseException | None) -> None:
        done = self._done
        if done is not None:
            done(answer, error)
            return
        future = self.answer
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(answer)  # type: ignore[arg-type]

    def drop(self) -> None:
        """The caller stopped waiting: free the call's place in the queue if it has not run."""
        if self.dropped or self.finished:  # finished: answered (a caller that stops waiting then counts once)
            return
        self.dropped = True
        batcher = self.handle.batcher
        if batcher is not None and not self.future.done():
            self.future.cancel()
            batcher.withdraw(self.future)
        _failed(self.handle, self.call, self.trace, self.start, asyncio.CancelledError())


def _failed(handle: ModelHandle, call: InferCall, trace: RequestTrace | None, start: float,
            exc: BaseException) -> None:
    """Count a call that failed with `exc` (and name the model a model error came from)."""
    stats = handle.stats
    stats.failed(failure_reason(exc), time.perf_counter() - start)
    stats.answered(call.front)
    if isinstance(exc, ModelError):
        exc.model, exc.version = handle.name, handle.version
    if trace is not None:
        end_trace(trace, call, exc)


def start_trace(tracer: Tracer, call: InferCall) -> RequestTrace | None:
    """The call's RequestTrace when it is sampled, with its server span's attributes (the
    front's for its transport, `InferCall.describe`, and the model's; the same for every call
    to a model, route and address: made once, kept in the tracer's table) and the caller's W3C
    tracestate and baggage."""
    headers = call.headers
    trace = tracer.start(headers)
    if trace is None:
        return None
    if trace.remote and "tracestate" in headers:  # a caller's tracestate goes with its traceparent only
        trace.tracestate = recorder.parse_tracestate(headers["tracestate"])
    if "baggage" in headers:
        trace.baggage = headers["baggage"]
    protocol = call.codec.protocol(call)
    key = (call.route, call.model, call.version, protocol, call.host)
    index = tracer.route(key)
    if index < 0:
        name, attributes = (call.describe or _untold)(call)
        attributes.update({"aserve.model": call.model, "aserve.version": call.version or "latest",
                           "aserve.protocol": protocol})
        index = tracer.add_route(key, name, attributes)
        if index < 0:  # the table is full (a client sending many Host names): as a span
            trace.common = recorder.shared(attributes)
    trace.route = index
    return trace


def end_trace(trace: RequestTrace, call: InferCall, error: BaseException | None) -> None:
    """Record a sampled call's server span as a span (it failed, or the tracer's table could
    not hold it as numbers)."""
    status = 200
    if error is not None:
        status = error.status if isinstance(error, AserveError) else 500
        if isinstance(error, asyncio.CancelledError):
            status = 499  # the client went away
    recorder.finish(trace, span_name(call), status, error)


def span_name(call: InferCall) -> str:
    """A call's server span name, as its front describes it."""
    return (call.describe or _untold)(call)[0]


def _untold(call: InferCall) -> tuple[str, dict[str, Any]]:
    """The server span of a call whose front did not describe its transport: its route."""
    return call.route, {}
