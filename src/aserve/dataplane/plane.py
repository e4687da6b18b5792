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
import pathlib
import time
from typing import Any

from .. import logs
from ..config import ServerSettings
from ..errors import AserveError, ModelError
from ..inference import Answer, InferCall, InferRequest, InferResponse
from ..tracing import RequestTrace, Tracer, recorder
from .models import ModelHandle
from .registry import ModelRegistry
from .stats import Metrics, failure_reason


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

    def set_tracer(self, tracer: Tracer | None) -> None:
        """Trace sampled requests' batches from now on (None: stop)."""
        self.tracer = tracer
        self.registry.tracer = tracer
        for handle in self.registry.handles():
            if handle.batcher is not None:
                handle.batcher.tracer = tracer

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
        the HTTP status: 400, 404, 503, 504, 500 for a model's failure, ...).

        `handle`: the model's handle when the front already looked it up (the HTTP front
        does, from the request head, to refuse an unknown model before reading the body)."""
        if handle is None or handle.retired:  # retired: a reload or unload took it out while the body arrived
            handle = self.registry.get(call.model, call.version)
        stats = handle.stats
        start = time.perf_counter()
        trace: RequestTrace | None = None
        request: InferRequest | None = None
        try:
            if self.tracer is not None:
                trace = start_trace(self.tracer, call)
            schema = handle.require_ready()
            if trace is None:
                request = call.codec.decode(call, schema)
                response = await self._run(handle, request, None, call.received)
                answer = call.codec.encode(call, request, response, handle.labels)
            else:
                trace.stamp(recorder.DECODE_START)
                request = call.codec.decode(call, schema)
                trace.stamp(recorder.DECODE_END)
                response = await self._run(handle, request, trace, call.received)
                trace.stamp(recorder.ENCODE_START)
                answer = call.codec.encode(call, request, response, handle.labels)
                trace.stamp(recorder.ENCODE_END)
        except BaseException as exc:
            stats.failed(failure_reason(exc), time.perf_counter() - start)
            if isinstance(exc, ModelError):
                exc.model, exc.version = handle.name, handle.version
            if trace is not None:
                end_trace(trace, call, exc)
            raise
        stats.succeeded(time.perf_counter() - start, request.samples)
        if trace is not None and not trace.end(200):
            end_trace(trace, call, None)
        return answer

    async def _run(self, handle: ModelHandle, request: InferRequest, trace: RequestTrace | None,
                   received: float | None) -> InferResponse:
        """Queue the request on the model's batcher and wait for its outputs.

        Its deadline is the model's timeout, or the request's own when shorter; its
        latency budget (checked by the codec against the model's timeout) counts from
        `received`, the time.monotonic() its first bytes arrived: a burst can hold it on the
        event loop before it is queued."""
        batcher = handle.batcher
        assert batcher is not None  # require_ready checked it
        limit = handle.timeout_ms
        timeout = request.timeout_ms
        if timeout is not None and timeout < limit:
            limit = timeout
        budget = request.latency_budget_ms
        now = time.monotonic()
        future = batcher.submit(
            request.inputs, request.samples, deadline=now + limit / 1000.0,
            budget=None if budget is None else budget / 1000.0, trace=trace,
            waited=0.0 if received is None else now - received,
        )
        try:
            outputs = await future
        except asyncio.CancelledError:
            batcher.withdraw(future)  # the caller went away: free its place if it has not run
            raise
        return InferResponse(model_name=handle.name, model_version=handle.version, outputs=outputs, id=request.id)


def start_trace(tracer: Tracer, call: InferCall) -> RequestTrace | None:
    """The call's RequestTrace when it is sampled, with its OpenTelemetry HTTP server
    attributes (the same for every call to a model, route and address: made once, kept in
    the tracer's table)."""
    trace = tracer.start(call.headers)
    if trace is None:
        return None
    protocol = call.codec.protocol(call)
    key = (call.route, call.model, call.version, protocol, call.host)
    index = tracer.route(key)
    if index < 0:
        host = call.host
        address, _, port = host.rpartition(":") if ":" in host else (host, "", "")
        version = call.version or ""
        path = call.route.replace("{model}", call.model).replace("{version}", version).replace("{label}", version)
        attributes: dict[str, Any] = {
            "http.request.method": "POST", "http.route": call.route, "url.scheme": "http",
            "url.path": path, "server.address": address or host,
            "network.protocol.version": "1.1", "aserve.model": call.model,
            "aserve.version": call.version or "latest", "aserve.protocol": protocol,
        }
        if port.isdigit():
            attributes["server.port"] = int(port)
        index = tracer.add_route(key, f"POST {call.route}", attributes)
        if index < 0:  # the table is full (a client sending many Host names): as a span
            trace.common = recorder.shared(attributes)
    trace.route = index
    if logs.trace_ids_logged:
        logs.current_trace.set(trace)  # this request's task: its log records carry the ids
    return trace


def end_trace(trace: RequestTrace, call: InferCall, error: BaseException | None) -> None:
    """Record a sampled call's server span as a span (it failed, or the tracer's table could
    not hold it as numbers)."""
    status = 200
    if error is not None:
        status = error.status if isinstance(error, AserveError) else 500
        if isinstance(error, asyncio.CancelledError):
            status = 499  # the client went away
    recorder.finish(trace, f"POST {call.route}", status, error)
