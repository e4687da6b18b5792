"""What the data plane counts, and the reports made of it.

Every request's outcome, samples and end-to-end duration (`RequestStats`: durations of
successful requests only, in a histogram whose buckets are Triton's microseconds;
failures by reason), which `aserve.server.metrics` renders; and Triton's statistics
extension (`statistics`), per model version, from those counts and its batchers'.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from ..batching import Batcher
from ..batching.native import NativeBatcher
from ..errors import InvalidInput, ModelError, ModelNotReady, Overloaded, PayloadTooLarge, RequestTimeout

if TYPE_CHECKING:  # the registry keeps these counts and imports this module
    from .registry import ModelRegistry

# Upper bounds (microseconds) of the request duration histogram's buckets.
DURATION_BUCKETS_US = (
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000,
)

# Why a request failed: the `reason` label of aserve_inference_request_failure_total.
REASONS = ("invalid", "overloaded", "timeout", "model", "unavailable", "cancelled", "other")


def failure_reason(exc: BaseException) -> str:
    """The `reason` label of a request that failed with `exc`."""
    if isinstance(exc, asyncio.CancelledError):
        return "cancelled"  # the client went away
    if isinstance(exc, Overloaded):
        return "overloaded"
    if isinstance(exc, RequestTimeout):
        return "timeout"
    if isinstance(exc, ModelError):
        return "model"
    if isinstance(exc, ModelNotReady):
        return "unavailable"
    if isinstance(exc, (InvalidInput, PayloadTooLarge)):
        return "invalid"
    return "other"


# ---- what is counted ----


class RequestStats:
    """One model version's request outcomes; durations of successful requests only,
    so that duration sum / success count is their mean latency."""

    __slots__ = ("buckets", "duration_us", "exemplars", "fail_us", "failures", "protocols", "samples", "success")

    def __init__(self) -> None:
        self.protocols: dict[str, int] = {}  # requests answered (either way) by the front they came in: http, grpc
        self.success = 0
        self.failures = dict.fromkeys(REASONS, 0)
        self.fail_us = 0.0  # summed durations of failed requests
        self.samples = 0  # samples of successful requests (Triton's inference count)
        self.duration_us = 0.0
        self.buckets = [0] * (len(DURATION_BUCKETS_US) + 1)  # the last one: above every bound
        # per bucket, the latest sampled request in it: (trace id, microseconds, when it ended (epoch s))
        self.exemplars: list[tuple[str, float, float] | None] = [None] * len(self.buckets)

    def succeeded(self, seconds: float, samples: int, trace_id: str | None = None) -> None:
        """Count a successful request; trace_id (hex): it was traced, and is its bucket's exemplar."""
        us = seconds * 1e6
        self.success += 1
        self.samples += samples
        self.duration_us += us
        bucket = bisect.bisect_left(DURATION_BUCKETS_US, us)
        self.buckets[bucket] += 1
        if trace_id is not None:
            self.exemplars[bucket] = (trace_id, us, time.time())

    def answered(self, front: str) -> None:
        """Count a request answered, successfully or not, under the front it came in."""
        protocols = self.protocols
        protocols[front] = protocols.get(front, 0) + 1

    def failed(self, reason: str, seconds: float = 0.0) -> None:
        self.failures[reason] = self.failures.get(reason, 0) + 1
        self.fail_us += seconds * 1e6

    def track(self) -> Tracker:
        """`with stats.track() as t: ...; t.samples = n`: time one request, count its outcome."""
        return Tracker(self)

    def counts(self) -> dict[str, Any]:
        """Its counters as plain data (another loop's, sent to the host: `Metrics.add`)."""
        return {"success": self.success, "failures": self.failures, "fail_us": self.fail_us,
                "samples": self.samples, "duration_us": self.duration_us, "buckets": self.buckets,
                "exemplars": self.exemplars, "protocols": self.protocols}


class Tracker:
    """Times one request and records its outcome when the `with` block ends.

    Set `samples` once known; an exception leaving the block is a failure (and goes on)."""

    __slots__ = ("_start", "_stats", "samples")

    def __init__(self, stats: RequestStats) -> None:
        self._stats = stats
        self._start = 0.0
        self.samples = 0

    def __enter__(self) -> Self:
        self._start = time.perf_counter()  # a measurement, not a deadline: full resolution
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None:
            self._stats.succeeded(time.perf_counter() - self._start, self.samples)
        else:
            self._stats.failed(failure_reason(exc), time.perf_counter() - self._start)


class Metrics:
    """Request counters of every model version."""

    def __init__(self) -> None:
        self._stats: dict[tuple[str, str], RequestStats] = {}

    def stats(self, model: str, version: str) -> RequestStats:
        key = (model, version)
        found = self._stats.get(key)
        if found is None:
            found = self._stats[key] = RequestStats()
        return found

    def track(self, model: str, version: str) -> Tracker:
        """`with metrics.track(name, version) as t: ...; t.samples = n`"""
        return Tracker(self.stats(model, version))

    def items(self) -> list[tuple[tuple[str, str], RequestStats]]:
        """((model, version), its counters) for every version counted so far."""
        return list(self._stats.items())

    def combined(self, others: list[list[Any]]) -> Metrics:
        """A new Metrics with these counters and others' ([model, version, counts] rows) added."""
        out = Metrics()
        for (model, version), stats in self._stats.items():
            out.add(model, version, stats.counts())
        for model, version, counts in others:
            out.add(model, version, counts)
        return out

    def add(self, model: str, version: str, counts: dict[str, Any]) -> None:
        """Add counters another loop's RequestStats reported (`server/front.py` `stats`)."""
        mine = self.stats(model, version)
        mine.success += counts["success"]
        for reason, count in counts["failures"].items():
            mine.failures[reason] = mine.failures.get(reason, 0) + count
        mine.fail_us += counts["fail_us"]
        mine.samples += counts["samples"]
        for front, count in counts.get("protocols", {}).items():
            mine.protocols[front] = mine.protocols.get(front, 0) + count
        mine.duration_us += counts["duration_us"]
        for i, count in enumerate(counts["buckets"]):
            mine.buckets[i] += count
        for i, exemplar in enumerate(counts.get("exemplars", ())):  # the latest of each bucket's
            held = mine.exemplars[i]
            if exemplar is not None and (held is None or exemplar[2] > held[2]):
                mine.exemplars[i] = (exemplar[0], exemplar[1], exemplar[2])


# ---- Triton's statistics extension ----


class BatchTotals:
    """A version's batcher counters, summed over the loads of it that were retired."""

    __slots__ = ("batch_sizes", "batches", "compute_seconds", "last_inference", "queue_seconds", "requests")

    def __init__(self) -> None:
        self.batches = 0
        self.requests = 0
        self.queue_seconds = 0.0
        self.compute_seconds = 0.0
        self.batch_sizes: dict[int, list[float]] = {}
        self.last_inference = 0.0  # time.time() of its last batch

    def add(self, counts: Batcher | NativeBatcher | BatchTotals) -> None:
        """Add a batcher's counters, or totals already summed (a version's retired loads')."""
        self.batches += counts.batches
        self.requests += counts.requests
        self.queue_seconds += counts.queue_seconds
        self.compute_seconds += counts.compute_seconds
        for size, (count, seconds) in counts.batch_sizes.items():
            mine = self.batch_sizes.setdefault(size, [0, 0.0])
            mine[0] += count
            mine[1] += seconds
        last = counts.last_inference if isinstance(counts, BatchTotals) else wall_time(counts.last_dispatch)
        self.last_inference = max(self.last_inference, last)

    def add_reported(self, stats: Mapping[str, Any], batch_sizes: Mapping[int, list[float]],
                     last_dispatch: float | None) -> None:
        """Add the counters another loop's batcher reported (`server/front.py` `stats`)."""
        self.batches += stats["batches"]
        self.requests += stats["requests"]
        self.queue_seconds += stats["queue_seconds"]
        self.compute_seconds += stats["compute_seconds"]
        for size, (count, seconds) in batch_sizes.items():
            mine = self.batch_sizes.setdefault(int(size), [0, 0.0])
            mine[0] += count
            mine[1] += seconds
        self.last_inference = max(self.last_inference, wall_time(last_dispatch))


def wall_time(monotonic: float | None) -> float:
    """time.time() of a time.monotonic() reading (0 for None)."""
    if monotonic is None:
        return 0.0
    return time.time() - (time.monotonic() - monotonic)


def statistics(registry: ModelRegistry, name: str | None = None, version: str | None = None,
               fronts: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Triton's statistics extension: per model version (of `name`, or every model; of
    `version`, or every one served or retired), requests, queue and compute time; `fronts`:
    what the front loops counted (`server/loops.py` `Loops.stats`), added in."""
    metrics = registry.metrics
    reported: dict[tuple[str, str], list[dict[str, Any]]] = {}
    if fronts:
        metrics = metrics.combined([row for front in fronts for row in front["requests"]])
        for front in fronts:
            for m in front["models"]:
                reported.setdefault((m["name"], m["version"]), []).append(m)
    if name is not None and name not in registry.routes:
        registry.get(name)  # ModelNotFound, with the registry's message
    out: list[dict[str, Any]] = []
    for model in sorted(registry.records) if name is None else [name]:
        record = registry.records[model]
        numbers = sorted(set(record.serving) | set(record.unloading) | {
            int(v) for (m, v) in registry.totals if m == model})
        if version is not None:
            numbers = [registry.get(model, version).number]
        for v in numbers:
            totals = BatchTotals()
            retired = registry.totals.get((model, str(v)))
            if retired is not None:
                totals.add(retired)
            for handle in (record.serving.get(v), record.unloading.get(v)):
                if handle is not None and handle.batcher is not None:
                    totals.add(handle.batcher)
            for m in reported.get((model, str(v)), ()):
                totals.add_reported(m["batcher"], m["batch_sizes"], m["last_dispatch"])
            out.append(triton_statistics(model, str(v), metrics.stats(model, str(v)), totals))
    return out


def _duration(count: int, seconds: float) -> dict[str, int]:
    return {"count": count, "ns": int(seconds * 1e9)}


def triton_statistics(name: str, version: str, requests: RequestStats, batches: Any) -> dict[str, Any]:
    """One model version's statistics in the format of Triton's statistics extension.

    `batches`: the version's batcher counters (batches, requests, queue_seconds,
    compute_seconds, batch_sizes, last_inference). Queue and compute durations are
    counted per request, as Triton counts them (a batch's run time once for each of its
    requests). Input and output conversion happen inside the batch's run and in the
    codec: their durations are part of compute_infer and success, and reported as 0."""
    answered = batches.requests
    return {
        "name": name,
        "version": version,
        "last_inference": int(batches.last_inference * 1000),
        "inference_count": requests.samples,
        "execution_count": batches.batches,
        "inference_stats": {
            "success": _duration(requests.success, requests.duration_us / 1e6),
            "fail": _duration(sum(requests.failures.values()), requests.fail_us / 1e6),
            "queue": _duration(answered, batches.queue_seconds),
            "compute_input": _duration(answered, 0.0),
            "compute_infer": _duration(answered, batches.compute_seconds),
            "compute_output": _duration(answered, 0.0),
            "cache_hit": _duration(0, 0.0),
            "cache_miss": _duration(0, 0.0),
        },
        "batch_stats": [
            {
                "batch_size": size,
                "compute_input": _duration(int(count), 0.0),
                "compute_infer": _duration(int(count), seconds),
                "compute_output": _duration(int(count), 0.0),
            }
            for size, (count, seconds) in sorted(batches.batch_sizes.items())
        ],
        "memory_usage": [],
    }
