"""A front's models: the handle of each model version the host lists to it, and the Link
through which their batches and requests go to the host's pools.

`front_handle` makes a front's handle of a model (`loops.front_model`'s description): its
requests are queued in the pool one by one (`NativeBatcher`, batched there by the model's
window rule or Plan, every loop's requests in one queue) and its traced ones batched by a
`Batcher` of the front's own; `LinkEngine` is what both run on, a native `Link` (its
completions read on the front's loop).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from .. import _native
from ..batching import Batcher, FairScheduler
from ..batching.native import NativeBatcher, NativeDone, PlanAdmission
from ..batching.policy import WindowPolicy
from ..config import ServerSettings
from ..dataplane import DataPlane
from ..dataplane.models import READY, ModelHandle, wait_slots
from ..engine.pool import Done, ModelInfo, _error, tensors
from ..errors import ModelNotFound
from ..inference import ModelSchema
from ..repository.config import ModelConfig
from ..repository.scan import VersionSource
from ..tensor import Tensor

# A model's queue Counter (its address) and the slots a front's batches count in while they
# wait in the pool's queue (dataplane/models.py, wait_slots)
Waiting = tuple[int, tuple[int, int, int, int]]


def _shared(queued: list[int] | None, index: int) -> _native.Counter | None:
    """This front's view of a model's queued samples over every loop (its slot: after the host's)."""
    return None if queued is None else _native.Counter.at(queued[0], index + 1)


def with_waiting(stats: dict[str, Any], queued: _native.Counter, slots: tuple[int, ...]) -> dict[str, Any]:
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
