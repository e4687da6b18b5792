"""The data plane: the whole infer path behind any front, with no web framework.

A front (the aiohttp server, a test, `python -m benchmarks.core`, a future gRPC or in-process
front) looks a model up, decodes the request body against its schema with a codec
from `aserve.protocol`, and hands the typed request here:

    schema = plane.schema("simple")                      # 404 / 503 as aserve errors
    request = decode_infer(body, content_type=..., header_length=..., schema=schema)
    response = await plane.infer("simple", None, request)

`infer` checks readiness, turns the request's timeout and latency budget into a
deadline and a budget on the loop's clock, queues it on the model's batcher, and
counts its outcome. A front that also wants its decode and encode counted (as the
HTTP front does) uses the same parts: `model()`, `handle.stats.track()`, `run()`.
"""

from __future__ import annotations

import asyncio
import pathlib
import time
from typing import Any

from ..config import ServerSettings
from ..errors import InvalidInput, ModelNotReady
from ..inference import InferRequest, InferResponse, ModelSchema
from .models import ModelHandle
from .registry import ModelRegistry
from .stats import Metrics


class DataPlane:
    """Every model of a repository and the infer path to them.

    `start()` scans the repository and loads every model (engines chosen, pools
    started, policies warmed up); `close()` answers what was accepted and closes the
    pools."""

    def __init__(self, repository: str | pathlib.Path, settings: ServerSettings) -> None:
        self.settings = settings
        self.metrics = Metrics()
        self.registry = ModelRegistry(repository, settings, self.metrics)
        self.tracer: Any = None  # aserve.tracing.Tracer while tracing is on (set_tracer)

    def set_tracer(self, tracer: Any) -> None:
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

    # ---- models ----

    def model(self, name: str, version: str | None = None) -> ModelHandle:
        """A model's handle, loaded or not; ModelNotFound names what is missing."""
        return self.registry.get(name, version)

    def schema(self, name: str, version: str | None = None) -> ModelSchema:
        """What a request to a ready model is decoded against; ModelNotFound / ModelNotReady."""
        return self.registry.get(name, version).require_ready()

    # ---- inference ----

    async def infer(self, model: str, version: str | None, request: InferRequest) -> InferResponse:
        """Answer one request decoded against `schema(model, version)`, counting its outcome."""
        handle = self.registry.get(model, version)
        with handle.stats.track() as tracked:
            tracked.samples = request.samples
            return await self.run(handle, request)

    async def run(self, handle: ModelHandle, request: InferRequest, *, trace: Any = None,
                  received: float | None = None) -> InferResponse:
        """Queue one request on the model's batcher and wait for its outputs.

        The request's timeout may only shorten the model's; its latency budget must be
        in (0, the model's timeout]. Raises what the batcher raises: InvalidInput,
        Overloaded (503), RequestTimeout (504), ModelError, ModelNotReady. `trace`: the
        request's RequestTrace when it is sampled (aserve.tracing); `received`: the
        time.monotonic() at which the front read its first bytes (its latency budget
        counts from then: a burst can hold it on the event loop before it is queued)."""
        batcher = handle.batcher
        if batcher is None or handle.state != "READY":
            handle.require_ready()
        assert batcher is not None
        if request.schema is not handle.schema and (handle.schema is None or not handle.schema.accepts(request.schema)):
            raise ModelNotReady(
                f"model {handle.name!r} version {handle.version} was reloaded with other inputs or outputs while "
                "the request was decoded; retry"
            )
        limit = handle.timeout_ms
        budget = request.latency_budget_ms
        if budget is not None and not 0 < budget <= limit:
            raise InvalidInput(
                f"parameters.latency_budget_ms: expected milliseconds in (0, {limit:g}] (the model's "
                f"timeout_ms), got {budget}"
            )
        timeout = request.timeout_ms
        if timeout is not None and timeout < limit:
            limit = timeout
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
