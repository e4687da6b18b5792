"""One served model version (`ModelHandle`) and the routes to a model's versions (`ModelRoutes`).

Domain code: no web framework here. The data plane looks models up with
`ModelRegistry.get(name, version)` (aserve.dataplane.registry), which reads one
`ModelRoutes` snapshot; a handle that is ready has a schema to decode requests against
and a batcher to submit them to.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

from ..batching import Batcher, BatchPolicy, WindowPolicy
from ..batching.adaptive import AdaptivePolicy
from ..batching.costmodel import contention, warmup
from ..batching.join import JoinPlanner, measure_stages
from ..batching.joining import Joining
from ..batching.native import NativeBatcher, PlanFeed
from ..engine import ModelInfo, Pool
from ..errors import ModelNotReady
from ..inference import ModelSchema
from ..repository import BatchingConfig, ModelConfig, VersionSource, read_labels
from .stats import RequestStats

# a version's states, as Triton's repository index names them
LOADING, READY, UNLOADING, UNAVAILABLE = "LOADING", "READY", "UNLOADING", "UNAVAILABLE"


async def make_policy(
    batching: BatchingConfig, *, pool: Pool, info: ModelInfo, max_batch_size: int
) -> tuple[BatchPolicy, Joining | None]:
    """The batching policy a model's config asks for, and layer-level joining if it applies.

    "adaptive" first measures the model's latency curve; a model with stages also gets
    its stage shares measured, and joins running batches unless `layer_join` is off."""
    if batching.policy != "adaptive":
        return WindowPolicy(max_queue_delay=batching.max_queue_delay_ms / 1000.0), None
    cost = await warmup(pool, info, max_batch_size)
    budget = batching.latency_budget_ms / 1000.0
    policy = AdaptivePolicy(
        cost, latency_budget_s=budget, interpreters=info.interpreters,
        max_queue_delay_s=batching.max_queue_delay_ms / 1000.0, overload_reserve=batching.admission_reserve,
        contention=await contention(pool, info, cost, max_batch_size),
    )
    joining = None
    if batching.layer_join and info.stages > 0 and max_batch_size > 0:
        profile = await measure_stages(pool, info, min(4, max_batch_size))
        planner = JoinPlanner(cost, profile, scale=lambda: policy.slowdown_cautious)
        joining = Joining(pool, planner, budget, benefit=batching.join_rule == "benefit")
    return policy, joining


def queue_layout(fronts: int) -> tuple[int, int]:
    """A model's queue Counter under `--loops`: its (slots, summed). Slot 0 and 1..fronts: the
    samples each loop's batchers queued (the host's, then each front's); then, per front, what
    its batches or requests waiting in the pool's queue hold (`wait_slots`): samples, summed
    with the batchers' for max_queue_size, then requests and batches, and the batches its
    requests lead, running (batching/native.py), which its statistics read."""
    return 1 + 5 * fronts, 1 + 2 * fronts


def wait_slots(fronts: int, index: int) -> tuple[int, int, int, int]:
    """The slots front `index` (0-based) counts in while its batches or requests wait in the
    pool's queue: samples, requests, batches; and the batches its native requests lead,
    running (`queue_layout`)."""
    return 1 + fronts + index, 1 + 2 * fronts + index, 1 + 3 * fronts + index, 1 + 4 * fronts + index


class ModelHandle:
    """One load of one model version: its config, engine choice, state and batcher.

    A reload makes a new handle (with a new `key`, the instance's name in the pool);
    the old one is `retired`: taken out of the routes, its accepted requests answered,
    then unloaded."""

    def __init__(self, name: str, source: VersionSource, *, key: str | None = None,
                 stats: RequestStats | None = None) -> None:
        self.name = name
        self.number = source.version
        self.version = str(source.version)
        self.key = key or f"{name}/{self.version}"
        self.stats = stats if stats is not None else RequestStats()
        self.source = source
        self.fingerprint = source.fingerprint
        self.config: ModelConfig = source.config or ModelConfig()
        self.timeout_ms = self.config.batching.timeout_ms  # a request's deadline, at most
        self.engine = ""
        self.engine_reason = ""
        self.state = UNAVAILABLE if source.config is None or source.error else LOADING
        self.reason = source.error or ""
        self.retired = False  # out of the routes: a request holding it looks the model up again
        self.loaded_at: float | None = None  # time.time() when it became ready
        self.load_seconds = 0.0  # how long its load and warm-up took
        self.info: ModelInfo | None = None
        self.schema: ModelSchema | None = None  # set once loaded: what requests are decoded against
        self.memory_bytes = 0  # the process PSS its load (every interpreter) and warm-up added
        self.batcher: Batcher | NativeBatcher | None = None
        # a front's model batched in the pool (NativeBatcher): the batcher of its requests that
        # are traced or carry a caller's context, which the pool's queue does not take
        self.traced: Batcher | None = None
        # `--loops`: what every loop queued of it (a _native.Counter laid out by queue_layout)
        self.queued: Any = None
        # `--loops`, the adaptive policy: the policy in C that batches the fronts' requests in the pool
        self.plan: PlanFeed | None = None
        self.pool: Pool | None = None  # the pool it is loaded in: readiness asks it which interpreters still serve
        self._labels: dict[str, list[str] | None] = {}  # output -> its class labels, read once per load

    def batchers(self) -> tuple[Batcher | NativeBatcher, ...]:
        """Its batchers: the one its requests meet, and the `traced` one beside it if any."""
        return tuple(b for b in (self.batcher, self.traced) if b is not None)

    @property
    def ready(self) -> bool:
        """Loaded, and an interpreter that is not lost runs it."""
        pool = self.pool
        return self.state == READY and (pool is None or not pool.lost_mask or pool.serves(self.key))

    def no_interpreter_reason(self) -> str:
        assert self.pool is not None
        _, lost = self.pool.interpreters_of(self.key)
        many = len(lost) > 1
        return (f"model {self.name!r} version {self.version} has no interpreter left: interpreter"
                f"{'s' if many else ''} {', '.join(map(str, lost))} of the {self.pool.engine} pool "
                f"did not return from a cancelled batch (blocked in native code) and {'were' if many else 'was'} "
                "given up")

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
            if self.pool is not None:  # those given up on (stuck in a cancelled batch) serve no more
                mine, lost = self.pool.interpreters_of(self.key)
                out["interpreters_serving"] = len(mine) - len(lost)
                out["interpreters_lost"] = lost
            out["memory_bytes"] = self.memory_bytes
            out["class"] = self.info.class_name
            out["tensor_format"] = self.info.tensor_format
        if self.reason:
            out["reason"] = self.reason
        out["version"] = self.version
        out["directory"] = self.source.directory
        if self.config.package is not None:
            out["package"] = msgspec.to_builtins(self.config.package)
        batching = self.config.batching
        summary: dict[str, Any] = {
            "policy": batching.policy,
            "max_queue_delay_ms": batching.max_queue_delay_ms,
            "max_queue_size": batching.max_queue_size,
            "timeout_ms": batching.timeout_ms,
        }
        if batching.policy == "adaptive":
            summary["latency_budget_ms"] = batching.latency_budget_ms
            summary["admission_reserve"] = batching.admission_reserve
        # the live policy state (adaptive: budget, arrival rate, the fitted cost model)
        state = self.plan.as_dict if self.plan is not None else \
            getattr(self.batcher.policy, "as_dict", None) if self.batcher is not None else None
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
            join = policy.get("join") if self.plan is not None and state is not None else None
            if join is not None:  # the fronts' requests join in the pool, by the Plan
                summary["layer_join"] = join["active"]
                summary["stage_profile"] = {"stages": len(join["stage_shares"]), "shares": join["stage_shares"],
                                            "observations": join["profile_observations"]}
            else:
                summary["layer_join"] = "join" in stats and self.plan is None
                if "join" in stats:
                    summary["stage_profile"] = stats["join"]["stage_profile"]  # type: ignore[index]
            summary["join_rule"] = batching.join_rule
        out["batching"] = summary
        return out

    def labels(self, output: str) -> list[str] | None:
        """The class labels of `output` (the file config.toml's `[parameters.classification_labels]`
        names for it), read once per load; None when it names none."""
        if output not in self._labels:
            self._labels[output] = read_labels(self.name, self.source.directory, self.config, output)
        return self._labels[output]

    def require_ready(self) -> ModelSchema:
        """The loaded model's schema, or ModelNotReady saying why it cannot answer."""
        if self.schema is None or self.batcher is None or self.state != READY:
            raise ModelNotReady(
                f"model {self.name!r} is {self.state.lower()}" + (f": {self.reason}" if self.reason else "")
            )
        pool = self.pool
        if pool is not None and pool.lost_mask and not pool.serves(self.key):
            raise ModelNotReady(self.no_interpreter_reason())
        return self.schema


class ModelRoutes:
    """What a model's name leads to, as one immutable snapshot: its serving versions, its
    labels, and the handles to report when a version does not serve (loading, failed).

    The registry builds a new one on every change and swaps it in with one assignment,
    so a request's lookup takes no lock and never waits for a load."""

    __slots__ = ("labels", "latest", "name", "others", "versions")

    def __init__(self, name: str, versions: dict[int, ModelHandle], labels: dict[str, int],
                 others: dict[int, ModelHandle]) -> None:
        self.name = name
        self.versions = {str(v): h for v, h in sorted(versions.items())}
        self.labels = {label: str(v) for label, v in labels.items()}
        self.others = {str(v): h for v, h in sorted(others.items())}  # not serving: why
        self.latest = versions[max(versions)] if versions else None

    def status(self) -> ModelHandle | None:
        """The handle that says why the model does not answer (its newest version's attempt)."""
        if not self.others:
            return None
        return self.others[max(self.others, key=int)]

    def find(self, version: str) -> ModelHandle | None:
        """The handle for a version number or label: serving, or one that says why not."""
        found = self.versions.get(version)
        if found is not None:
            return found
        target = self.labels.get(version)
        if target is not None:
            return self.versions.get(target) or self.others.get(target)
        return self.others.get(version)

    def describe(self) -> str:
        """The versions and labels that exist, for a 404."""
        names = sorted({*self.versions, *self.others}, key=int)
        text = f"versions: {', '.join(names) or 'none'}"
        if self.labels:
            text += "; labels: " + ", ".join(f"{k} (version {v})" for k, v in sorted(self.labels.items()))
        return text
