"""The served models: pools per engine, one handle (config, schema, batcher) per model.

Domain code: no web framework here. The data plane looks models up with
`ModelRegistry.get(name, version)`; a handle that is ready has a schema to decode
requests against and a batcher to submit them to.
"""

from __future__ import annotations

import asyncio
import logging
import pathlib
import time
from typing import Any

from ..batching import Batcher, BatchPolicy, FairScheduler, WindowPolicy
from ..batching.batcher import Joining
from ..config import ServerSettings
from ..engine import ModelInfo, ModelSpec, Pool
from ..engine.choose import close_probe
from ..errors import AserveError, EngineError, ModelNotFound, ModelNotReady
from ..inference import ModelSchema
from ..repository import BatchingConfig, ModelConfig, ModelEntry, scan_repository
from .engines import resolve_engine
from .stats import Metrics, RequestStats

log = logging.getLogger("aserve.server")


def process_pss() -> int:
    """This process's proportional set size in bytes (its share of shared pages)."""
    import psutil

    return int(psutil.Process().memory_full_info().pss)

VERSIONS = ("1",)  # only version 1 exists until versioned folders are served

LOADING, READY, UNAVAILABLE = "LOADING", "READY", "UNAVAILABLE"


async def make_policy(
    batching: BatchingConfig, *, pool: Pool, info: ModelInfo, max_batch_size: int
) -> tuple[BatchPolicy, Joining | None]:
    """The batching policy a model's config asks for, and layer-level joining if it applies.

    "adaptive" first measures the model's latency curve; a model with stages also gets
    its stage shares measured, and joins running batches unless `layer_join` is off."""
    if batching.policy != "adaptive":
        return WindowPolicy(max_queue_delay=batching.max_queue_delay_ms / 1000.0), None
    from ..batching.adaptive import AdaptivePolicy
    from ..batching.costmodel import warmup
    from ..batching.join import JoinPlanner, measure_stages

    cost = await warmup(pool, info, max_batch_size)
    budget = batching.latency_budget_ms / 1000.0
    policy = AdaptivePolicy(
        cost, latency_budget_s=budget, interpreters=info.interpreters,
        max_queue_delay_s=batching.max_queue_delay_ms / 1000.0,
    )
    joining = None
    if batching.layer_join and info.stages > 0 and max_batch_size > 0:
        profile = await measure_stages(pool, info, min(4, max_batch_size))
        joining = Joining(pool, JoinPlanner(cost, profile), budget, benefit=batching.join_rule == "benefit")
    return policy, joining


class ModelHandle:
    """One served model version: its config, engine choice, load state and batcher."""

    def __init__(self, entry: ModelEntry, *, version: str = "1", stats: RequestStats | None = None) -> None:
        self.name = entry.name
        self.version = version
        self.stats = stats if stats is not None else RequestStats()
        self.entry = entry
        self.config: ModelConfig = entry.config or ModelConfig()
        self.engine = ""
        self.engine_reason = ""
        self.state = UNAVAILABLE if entry.config is None else LOADING
        self.reason = entry.error or ""
        self.info: ModelInfo | None = None
        self.schema: ModelSchema | None = None  # set once loaded: what requests are decoded against
        self.memory_bytes = 0  # the process PSS its load (every interpreter) and warm-up added
        self.batcher: Batcher | None = None

    @property
    def ready(self) -> bool:
        return self.state == READY

    @property
    def timeout_ms(self) -> float:
        return self.config.batching.timeout_ms

    def parameters(self) -> dict[str, Any]:
        """What model metadata reports beside inputs and outputs."""
        out: dict[str, Any] = {
            "engine": self.engine,
            "engine_reason": self.engine_reason,
            "max_batch_size": self.config.max_batch_size,
            "batching_policy": self.config.batching.policy,
            "state": self.state,
        }
        if self.info is not None:
            out["interpreters"] = self.info.interpreters
            out["memory_bytes"] = self.memory_bytes
            out["class"] = self.info.class_name
            out["tensor_format"] = self.info.tensor_format
        if self.reason:
            out["reason"] = self.reason
        batching = self.config.batching
        summary: dict[str, Any] = {
            "policy": batching.policy,
            "max_queue_delay_ms": batching.max_queue_delay_ms,
            "max_queue_size": batching.max_queue_size,
            "timeout_ms": batching.timeout_ms,
        }
        if batching.policy == "adaptive":
            summary["latency_budget_ms"] = batching.latency_budget_ms
        # the live policy state (adaptive: budget, arrival rate, the fitted cost model)
        state = getattr(self.batcher.policy, "as_dict", None) if self.batcher is not None else None
        if state is not None:
            policy: dict[str, Any] = state(time.monotonic())
            budget = policy.get("latency_budget_s")
            if isinstance(budget, (int, float)):
                summary["latency_budget_ms"] = budget * 1000.0
            if "arrival_rate_samples_per_s" in policy:
                summary["arrival_rate_samples_per_s"] = policy["arrival_rate_samples_per_s"]
            if "cost" in policy:
                summary["cost_model"] = policy["cost"]
        if self.info is not None:
            out["stages"] = self.info.stages
        if self.batcher is not None and batching.policy == "adaptive":
            stats = self.batcher.stats()
            summary["layer_join"] = "join" in stats
            summary["join_rule"] = batching.join_rule
            if "join" in stats:
                summary["stage_profile"] = stats["join"]["stage_profile"]  # type: ignore[index]
        out["batching"] = summary
        return out

    def require_ready(self) -> ModelSchema:
        """The loaded model's schema, or ModelNotReady saying why it cannot answer."""
        if self.schema is None or self.batcher is None or self.state != READY:
            raise ModelNotReady(
                f"model {self.name!r} is {self.state.lower()}" + (f": {self.reason}" if self.reason else "")
            )
        return self.schema


class ModelRegistry:
    """Every model of a repository, loaded into one pool per engine in use.

    The models of a pool share its interpreters through one FairScheduler: their
    batches take the pool's slots round-robin by model, so a busy model cannot
    starve the others."""

    def __init__(self, repository: str | pathlib.Path, settings: ServerSettings,
                 metrics: Metrics | None = None) -> None:
        self.repository = pathlib.Path(repository)
        self.settings = settings
        self.metrics = metrics if metrics is not None else Metrics()
        self.tracer: Any = None  # given to every batcher (aserve.tracing.Tracer, or None)
        self.models: dict[str, ModelHandle] = {}
        self.pools: dict[str, Pool] = {}
        self.schedulers: dict[str, FairScheduler] = {}  # per engine, beside its pool
        self._closed = False

    def scan(self) -> None:
        """Read the repository (configs only; nothing is loaded). Raises RepositoryError."""
        for entry in scan_repository(self.repository):
            self.models[entry.name] = ModelHandle(entry, stats=self.metrics.stats(entry.name, "1"))

    async def _choose_engine(self, handle: ModelHandle) -> None:
        try:
            handle.engine, handle.engine_reason = await resolve_engine(
                handle.config, self.settings, model_file=handle.entry.model_file
            )
        except AserveError as e:
            handle.state, handle.reason = UNAVAILABLE, str(e)
            log.error("model %s cannot be served: %s", handle.name, e)

    @property
    def engines(self) -> set[str]:
        return {h.engine for h in self.models.values() if h.engine and h.state == LOADING}

    @property
    def ready(self) -> bool:
        """True once every model of the repository is loaded."""
        return bool(self.models) and all(h.ready for h in self.models.values()) and not self._closed

    def get(self, name: str, version: str | None = None) -> ModelHandle:
        """The handle of a model (version None = the latest); ModelNotFound names what is missing."""
        handle = self.models.get(name)
        if handle is None:
            raise ModelNotFound(f"unknown model {name!r}; this server has: {', '.join(sorted(self.models)) or 'none'}")
        if version is not None and version not in VERSIONS:
            raise ModelNotFound(f"model {name!r} has no version {version!r}; versions: {', '.join(VERSIONS)}")
        return handle

    async def start(self) -> None:
        """Start the pools the models need, then load every model, in parallel."""
        if not self.models:
            self.scan()
        try:
            for handle in self.models.values():  # one probe interpreter, one model at a time
                if handle.state == LOADING:
                    await self._choose_engine(handle)
        finally:
            await close_probe()
        size = self.settings.pool_size
        for engine in sorted(self.engines):
            self.pools[engine] = Pool(engine=engine, interpreters=size)
            self.schedulers[engine] = FairScheduler(size)
        results = await asyncio.gather(*(p.start() for p in self.pools.values()), return_exceptions=True)
        for (engine, pool), result in zip(list(self.pools.items()), results):
            if isinstance(result, BaseException):
                log.error("engine %s failed to start: %s", engine, result)
                del self.pools[engine]
                del self.schedulers[engine]
                for h in self.models.values():
                    if h.engine == engine:
                        h.state, h.reason = UNAVAILABLE, f"engine {engine!r} failed to start: {result}"
        # one model at a time, so that the memory each load adds is that model's
        for handle in [h for h in self.models.values() if h.state == LOADING]:
            await self._load(handle)

    async def _load(self, handle: ModelHandle) -> None:
        pool = self.pools[handle.engine]
        config = handle.config
        try:
            if config.interpreters is not None and config.interpreters > pool.interpreters:
                raise EngineError(
                    f"model {handle.name!r}: config.toml asks for interpreters = {config.interpreters}, the "
                    f"{handle.engine} pool has {pool.interpreters} (--interpreters)"
                )
            spec = ModelSpec(
                name=handle.name, path=handle.entry.directory, class_name=config.class_name,
                inputs=config.input_specs, outputs=config.output_specs, parameters=config.parameters,
            )
            before = process_pss()
            info = await pool.load(spec, interpreters=config.interpreters)
            policy, joining = await make_policy(
                config.batching, pool=pool, info=info, max_batch_size=config.max_batch_size
            )
            handle.memory_bytes = max(0, process_pss() - before)
        except (AserveError, ValueError, TypeError) as e:
            handle.state, handle.reason = UNAVAILABLE, str(e)
            log.error("model %s failed to load: %s", handle.name, e)
            return
        schema = ModelSchema(
            handle.name, handle.version, inputs=info.inputs, outputs=info.outputs,
            max_batch_size=config.max_batch_size, max_latency_budget_ms=handle.timeout_ms,
        )
        handle.info = info
        handle.schema = schema
        handle.batcher = Batcher(
            model=handle.name, run=pool.run, policy=policy, max_batch_size=config.max_batch_size,
            interpreters=info.interpreters, max_queue_size=config.batching.max_queue_size, join=joining,
            scheduler=self.schedulers[handle.engine], uniform=schema.uniform,
        )
        handle.batcher.tracer = self.tracer
        handle.state, handle.reason = READY, ""
        log.info("model %s ready: engine %s (%s), %d interpreters", handle.name, handle.engine,
                 handle.engine_reason, info.interpreters)

    async def close(self, *, timeout: float | None = None) -> None:
        """Answer what is queued, then close every pool (tolerating failures of each)."""
        self._closed = True
        batchers = [h.batcher for h in self.models.values() if h.batcher is not None]
        await asyncio.gather(*(b.close(timeout=timeout) for b in batchers), return_exceptions=True)
        results = await asyncio.gather(*(p.close() for p in self.pools.values()), return_exceptions=True)
        for engine, result in zip(list(self.pools), results):
            if isinstance(result, BaseException):
                log.error("closing the %s pool failed: %s", engine, result)
