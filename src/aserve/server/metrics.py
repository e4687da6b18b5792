"""Prometheus metrics: per-request counters, in Prometheus' text format 0.0.4 or
OpenMetrics 1.0 (with exemplars), written by hand.

`Metrics` (aserve.dataplane.stats) holds what the data plane counts of each request
(its outcome, samples and end-to-end duration); `render` adds what the models report
when scraped: each
batcher's `stats()` (queue, batches, refusals, timeouts, and for adaptive models the
latency budget, arrival rate and cost model) and each pool's `stats()`.

Names follow Triton's (`nv_inference_request_success` and friends) with the
`aserve_` prefix and Prometheus' conventions: counters end in `_total`, units are in
the name, durations are microseconds as in Triton. Per-model series carry
`model="name",version="1"`, pool series `engine="private"`. Numeric keys a batcher or
pool reports that this module does not know are still exported, as untyped
`aserve_batcher_<key>` / `aserve_batching_<key>` / `aserve_cost_model_<key>` /
`aserve_pool_<key>` series.

A scraper that asks for OpenMetrics (`Accept: application/openmetrics-text`, as
Prometheus does) gets the same series with exemplars: each bucket of the request
duration histogram carries the trace id of the latest sampled request that fell in it
(`trace_id` label, its duration, when it ended), which Grafana links to the trace.

The writer is this module's own, not prometheus_client's: a scrape runs on the event
loop, which prometheus_client's writers hold several times as long
(`benchmarks/observability.py`). The tests check both formats with prometheus_client's
parsers and with Prometheus itself.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterable, Mapping
from typing import Any

from ..dataplane import ModelHandle
from ..dataplane.stats import DURATION_BUCKETS_US, REASONS, Metrics, RequestStats, failure_reason
from ..engine import Pool
from .app import REFUSALS, App, HttpStats
from .http import Request, Response

__all__ = ["CONTENT_TYPE", "DURATION_BUCKETS_US", "OPENMETRICS_CONTENT_TYPE", "REASONS", "Exposition", "Metrics",
           "RequestStats", "failure_reason", "render"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"

# ---- the exposition format ----

_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_INVALID = re.compile(r"[^a-zA-Z0-9_:]")
Labels = Mapping[str, str]


def metric_name(text: str) -> str:
    """`text` made a valid metric name (other characters become `_`)."""
    name = _INVALID.sub("_", text)
    return name if _NAME.match(name) else "_" + name


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value: float) -> str:
    if isinstance(value, int):  # bool included
        return str(int(value))
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


# An exemplar: its labels (e.g. {"trace_id": ...}), its value, its time (seconds since the epoch).
Exemplar = tuple[Mapping[str, str], float, float]


class Exposition:
    """Metric families in the order first added, each with its HELP, TYPE and samples;
    written as the text format (`text`) or OpenMetrics (`openmetrics`, with exemplars)."""

    def __init__(self) -> None:
        self._families: dict[str, tuple[str, str, list[str]]] = {}
        self._exemplars: dict[tuple[str, int], str] = {}  # (family, sample index) -> " # {...} value time"

    def add(self, name: str, kind: str, help: str, value: float, labels: Labels | None = None,
            *, suffix: str = "", exemplar: Exemplar | None = None) -> None:
        """One sample of family `name` (`suffix`: a histogram's _bucket/_sum/_count; `exemplar`:
        a bucket's, written in OpenMetrics only)."""
        if not _NAME.match(name):
            raise ValueError(f"invalid metric name {name!r}")
        family = self._families.get(name)
        if family is None:
            family = self._families[name] = (kind, help, [])
        elif family[0] != kind:
            raise ValueError(f"metric {name!r} added as {kind}, already a {family[0]}")
        text = ",".join(f'{k}="{_escape_label(v)}"' for k, v in (labels or {}).items())
        if exemplar is not None:
            tags = ",".join(f'{k}="{_escape_label(v)}"' for k, v in exemplar[0].items())
            self._exemplars[name, len(family[2])] = f" # {{{tags}}} {format_value(exemplar[1])} {exemplar[2]:.3f}"
        family[2].append(f"{name}{suffix}{{{text}}} {format_value(value)}" if text
                         else f"{name}{suffix} {format_value(value)}")

    def text(self) -> str:
        """Prometheus' text format 0.0.4 (no exemplars)."""
        lines: list[str] = []
        for name, (kind, help, samples) in self._families.items():
            lines.append(f"# HELP {name} {_escape_help(help)}")
            lines.append(f"# TYPE {name} {kind}")
            lines.extend(samples)
        return "\n".join(lines) + "\n"

    def openmetrics(self) -> str:
        """OpenMetrics 1.0: a counter's family is named without its samples' `_total`, untyped
        is `unknown`, bucket samples carry their exemplars, and `# EOF` ends it."""
        lines: list[str] = []
        exemplars = self._exemplars
        for name, (kind, help, samples) in self._families.items():
            family, om_kind = name, kind
            if kind == "counter":
                if name.endswith("_total"):
                    family = name[:-6]
                else:
                    om_kind = "unknown"  # OpenMetrics counters' samples end in _total
            elif kind == "untyped":
                om_kind = "unknown"
            om_help = _escape_help(help).replace('"', '\\"')  # OpenMetrics escapes quotes in HELP too
            lines.append(f"# HELP {family} {om_help}")
            lines.append(f"# TYPE {family} {om_kind}")
            if not exemplars:
                lines.extend(samples)
                continue
            for i, sample in enumerate(samples):
                lines.append(sample + exemplars[name, i] if (name, i) in exemplars else sample)
        lines.append("# EOF")
        return "\n".join(lines) + "\n"


# ---- what is rendered ----

# Known keys: key -> (metric name, type, help, scale).
_BATCHER: dict[str, tuple[str, str, str, float]] = {
    "batches": ("aserve_inference_exec_count_total", "counter",
                "Batches run on an interpreter (Triton's execution count).", 1),
    "requests": ("aserve_batcher_requests_total", "counter", "Requests answered by the batcher.", 1),
    "refused": ("aserve_inference_refused_total", "counter",
                "Requests refused with 503 (queue full or admission control).", 1),
    "timed_out": ("aserve_inference_timed_out_total", "counter",
                  "Requests whose deadline passed (504), queued or running.", 1),
    "queued_samples": ("aserve_queue_samples", "gauge", "Samples waiting in the batching queue.", 1),
    "queued_requests": ("aserve_queue_requests", "gauge", "Requests waiting in the batching queue.", 1),
    "running_batches": ("aserve_batches_in_flight", "gauge", "Batches running now.", 1),
    "joins": ("aserve_layer_joins_total", "counter",
              "Groups of waiting requests absorbed into running batches at a stage boundary.", 1),
    "joined_requests": ("aserve_layer_joined_requests_total", "counter",
                        "Requests answered by a batch they joined at a stage boundary.", 1),
    "offers_turned_away": ("aserve_layer_join_offers_turned_away_total", "counter",
                           "Join offers a running batch could no longer take (requeued).", 1),
    "queue_seconds": ("aserve_inference_queue_duration_us_total", "counter",
                      "Cumulative time requests waited in the batching queue, microseconds.", 1e6),
    "compute_seconds": ("aserve_inference_compute_duration_us_total", "counter",
                        "Cumulative time requests' batches ran on an interpreter, microseconds.", 1e6),
    "cancelled": ("aserve_batch_cancelled_total", "counter",
                  "Running batches cancelled because every request of them timed out.", 1),
}
_POLICY: dict[str, tuple[str, str, str, float]] = {
    "latency_budget_s": ("aserve_latency_budget_us", "gauge", "The model's latency budget, microseconds.", 1e6),
    "interpreters": ("aserve_batching_interpreters", "gauge", "Interpreters the batching policy plans for.", 1),
    "arrival_rate_samples_per_s": ("aserve_arrival_rate_samples_per_second", "gauge",
                                   "Estimated arriving samples per second.", 1),
}
_COST: dict[str, tuple[str, str, str, float]] = {
    "batch1_seconds": ("aserve_cost_model_batch1_latency_us", "gauge",
                       "Predicted latency of a batch of one sample, microseconds.", 1e6),
    "throughput_optimal_batch": ("aserve_cost_model_throughput_optimal_batch", "gauge",
                                 "Batch size with the highest predicted throughput.", 1),
    "throughput_optimal_samples_per_s": ("aserve_cost_model_throughput_optimal_samples_per_second", "gauge",
                                         "Predicted samples per second of one interpreter at that size.", 1),
    "max_batch_size": ("aserve_cost_model_max_batch_size", "gauge", "Largest batch the cost model covers.", 1),
    "observations": ("aserve_cost_model_observations_total", "counter",
                     "Executed batches folded into the cost model since warm-up.", 1),
}
_POOL_HELP = {
    "interpreters": "Interpreters of the pool.",
    "ready": "Interpreters started and ready.",
    "active": "Interpreters taking jobs.",
    "busy": "Interpreters running a job now.",
    "queued": "Jobs waiting for an interpreter.",
    "lost": "Interpreters given up on: stuck in a cancelled batch (native code), they get no jobs until it returns.",
    "spinning": "Interpreters polling for their next batch now (spin_us).",
    "waiting": "Interpreters blocked until their next batch comes: one queued now wakes one of them.",
    "polling": "1 while interpreters may poll for their next batch: spin_us, and the last measurement found it pays.",
    "colocated": "1 while the interpreters' threads and the loop's are held to one CPU: one client, lone batches (--colocate).",
}
_POOL_COUNTERS = {
    "spin_s": ("aserve_pool_spin_seconds_total",
               ("Seconds the interpreters' threads spent polling for work before blocking (spin_us): CPU "
                "traded for latency at low load.")),
    "polled": ("aserve_pool_polled_batches_total",
               "Batches that found an interpreter polling for them, so no thread had to be woken (spin_us)."),
    "woke_napping": ("aserve_pool_woke_napping_batches_total",
                     "Batches that woke an interpreter asleep until its polling window (they came early)."),
    "woke_blocked": ("aserve_pool_woke_blocked_batches_total",
                     "Batches that woke an interpreter blocked after its polling window, or not polling."),
    "answered": ("aserve_pool_answered_samples_total",
                 "Samples (a batch's rows) the pool's batches answered, host's and front loops' alike."),
    "flight_s": ("aserve_pool_flight_sample_seconds_total",
                 ("Sample-seconds the pool's batches spent from queued to answered (/ answered samples: the mean "
                  "round trip through the interpreters, which polling is judged by).")),
    "holds": ("aserve_pool_colocated_holds_total",
              "Times the interpreters' threads and the loop's were held to the loop's CPU (--colocate)."),
    "coalesced": ("aserve_pool_coalesced_batches_total",
                  "Front loops' batches that ran as one batch with another front's of the same model (--loops)."),
}


def _number(value: object) -> float | None:
    if isinstance(value, (int, float)):
        return value
    return None


def _known_or_generic(out: Exposition, stats: Mapping[str, Any], known: Mapping[str, tuple[str, str, str, float]],
                      prefix: str, labels: Labels, *, skip: Iterable[str] = ()) -> None:
    skipped = set(skip)
    for key, value in stats.items():
        number = _number(value)
        if key in skipped or number is None:
            continue
        if key in known:
            name, kind, help, scale = known[key]
            out.add(name, kind, help, number * scale if scale != 1 else number, labels)
        else:
            out.add(metric_name(f"{prefix}_{key}"), "untyped", f"{key!r} as reported.", number, labels)


def _requests(out: Exposition, labels: Labels, stats: RequestStats) -> None:
    out.add("aserve_inference_request_success_total", "counter", "Requests answered successfully.",
            stats.success, labels)
    for reason, count in stats.failures.items():
        out.add("aserve_inference_request_failure_total", "counter",
                "Requests that failed, by reason (invalid, overloaded, timeout, model, unavailable, cancelled, other).",
                count, {**labels, "reason": reason})
    for protocol in ("http", "grpc"):
        out.add("aserve_inference_request_protocol_total", "counter",
                "Requests answered, successfully or not, by the protocol they came in (http, grpc).",
                stats.protocols.get(protocol, 0), {**labels, "protocol": protocol})
    out.add("aserve_inference_count_total", "counter",
            "Samples answered successfully (Triton's inference count; / exec count = mean batch size).",
            stats.samples, labels)
    name, help = "aserve_inference_request_duration_us", "End-to-end duration of successful requests, microseconds."
    cumulative = 0
    for bound, count, exemplar in zip((*DURATION_BUCKETS_US, math.inf), stats.buckets, stats.exemplars):
        cumulative += count
        le = "+Inf" if bound == math.inf else str(bound)
        out.add(name, "histogram", help, cumulative, {**labels, "le": le}, suffix="_bucket",
                exemplar=None if exemplar is None else
                ({"trace_id": exemplar[0]}, round(exemplar[1], 1), exemplar[2]))
    out.add(name, "histogram", help, stats.duration_us, labels, suffix="_sum")
    out.add(name, "histogram", help, stats.success, labels, suffix="_count")


def _cost_model(out: Exposition, labels: Labels, cost: Mapping[str, Any]) -> None:
    _known_or_generic(out, cost, _COST, "aserve_cost_model", labels)
    form = cost.get("form")
    if isinstance(form, str):
        out.add("aserve_cost_model_info", "gauge", "The cost model's curve form (label form).", 1,
                {**labels, "form": form})
    points = [(int(p[0]), float(p[1])) for p in cost.get("points", ()) if len(p) == 2]
    for b, seconds in points:
        out.add("aserve_cost_model_latency_us", "gauge",
                "The fitted curve's points: batch latency by batch size, microseconds.",
                seconds * 1e6, {**labels, "batch_size": str(b)})
    params = cost.get("params")
    slope: float | None = None
    if form == "affine" and isinstance(params, Mapping) and _number(params.get("c")) is not None:
        slope = float(params["c"])
    elif len(points) >= 2 and points[-1][0] > points[0][0]:
        slope = (points[-1][1] - points[0][1]) / (points[-1][0] - points[0][0])
    if slope is not None:
        out.add("aserve_cost_model_per_sample_latency_us", "gauge",
                "Latency each extra sample adds to a batch (affine: its slope; else between the first and last "
                "points), microseconds.", slope * 1e6, labels)
    if isinstance(params, Mapping):
        for key, value in params.items():
            number = _number(value)
            if number is not None:
                out.add("aserve_cost_model_parameter", "gauge",
                        "The fitted curve's parameters, in the form's own units (seconds for affine a and c).",
                        number, {**labels, "form": str(form), "param": str(key)})


def _batcher(out: Exposition, labels: Labels, stats: Mapping[str, Any]) -> None:
    _known_or_generic(out, stats, _BATCHER, "aserve_batcher", labels, skip=("policy",))
    policy = stats.get("policy")
    if isinstance(policy, Mapping):
        _known_or_generic(out, policy, _POLICY, "aserve_batching", labels, skip=("cost",))
        cost = policy.get("cost")
        if isinstance(cost, Mapping):
            _cost_model(out, labels, cost)


def _by_loop(host: Metrics, fronts: list[dict[str, Any]] | None) -> dict[tuple[str, str], int]:
    """Infer requests answered by each loop, by protocol: the host's counters, and what each
    front reported of its own (before they are added together)."""
    out: dict[tuple[str, str], int] = {}
    for _, stats in host.items():  # noqa: PERF102 - a list of pairs, not a dict
        for protocol, count in stats.protocols.items():
            out["host", protocol] = out.get(("host", protocol), 0) + count
    for front in fronts or ():
        for _, _, counts in front["requests"]:
            for protocol, count in counts.get("protocols", {}).items():
                key = (str(front["index"]), protocol)
                out[key] = out.get(key, 0) + count
    return out


def _loops_combined(fronts: list[dict[str, Any]], tracing: Mapping[str, int] | None,
                    grpc: Mapping[tuple[str, str], int] | None, held: int | None) -> tuple[Any, Any, Any]:
    """The host's trace records, gRPC calls and held streams with every front's added (fronts
    trace their own requests and serve gRPC on the shared port)."""
    tracing = dict(tracing) if tracing is not None else None
    grpc = dict(grpc) if grpc is not None else None
    for front in fronts:
        if tracing is not None:
            for key, count in (front.get("tracing") or {}).items():
                tracing[key] += count
        if grpc is not None and front.get("grpc"):
            for method, code, count in front["grpc"]["calls"]:
                grpc[(method, code)] = grpc.get((method, code), 0) + count
            held = (held or 0) + front["grpc"]["held"]
    return tracing, grpc, held


def render(models: Iterable[ModelHandle], pools: Mapping[str, Pool], metrics: Metrics,
           schedulers: Mapping[str, Any] | None = None, http: HttpStats | None = None,
           tracing: Mapping[str, int] | None = None, *, openmetrics: bool = False,
           fronts: list[dict[str, Any]] | None = None, loops: Any = None,
           grpc: Mapping[tuple[str, str], int] | None = None, grpc_streams_held: int | None = None,
           threads: Mapping[tuple[str, ...], float] | None = None) -> str:
    """The exposition text (OpenMetrics with exemplars when asked): every model (requests,
    batcher, policy), then every pool (with its fair scheduler's slots), then the HTTP
    front (`app.HttpStats`) and the gRPC front's calls by method and code (`grpc`) and its
    streams that read no requests while their answers wait (`grpc_streams_held`), then the
    tracer's records (`Tracer.stats()`, when tracing is on).
    `fronts`: what the front loops counted (`server/loops.py` `Loops.stats`), added to the
    host's; `loops`: the `Loops` themselves (how many serve, how many were started again);
    `threads`: CPU seconds per event loop and interpreter (`threads.ThreadCpu.sample`)."""
    out = Exposition()
    reported: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    by_loop = _by_loop(metrics, fronts) if loops is not None else {}
    if fronts:
        metrics = metrics.combined([row for front in fronts for row in front["requests"]])
        http = _http_combined(http, [front["http"] for front in fronts])
        tracing, grpc, grpc_streams_held = _loops_combined(fronts, tracing, grpc, grpc_streams_held)
        for front in fronts:
            for m in front["models"]:
                reported.setdefault((m["name"], m["version"]), []).append(m["batcher"])
    for handle in sorted(models, key=lambda h: h.name):
        labels = {"model": handle.name, "version": handle.version}
        out.add("aserve_model_ready", "gauge", "1 when the model answers requests.", int(handle.ready), labels)
        out.add("aserve_model_info", "gauge", "The model's engine and batching policy (labels).", 1,
                {**labels, "engine": handle.engine, "batching_policy": handle.config.batching.policy})
        out.add("aserve_model_memory_bytes", "gauge",
                "Process PSS the model's load (in every interpreter) and warm-up added, bytes.", handle.memory_bytes,
                labels)
        _requests(out, labels, metrics.stats(handle.name, handle.version))
        if handle.batcher is not None:
            stats = handle.batcher.stats()
            if handle.plan is not None:  # the fronts' requests are batched (and join) by the policy in C
                stats["policy"] = policy = handle.plan.as_dict(time.monotonic())
                join = policy.get("join")
                if isinstance(join, dict):
                    for key in ("joins", "joined_requests", "offers_turned_away"):
                        stats[key] = stats.get(key, 0) + join[key]
            _batcher(out, labels, _batcher_combined(stats, reported.get((handle.name, handle.version), ())))
    for engine in sorted(pools):
        for key, value in pools[engine].stats().items():
            number = _number(value)
            if number is None:
                continue
            if key in _POOL_COUNTERS:
                name, help = _POOL_COUNTERS[key]
                out.add(name, "counter", help, number, {"engine": engine})
            else:
                help = _POOL_HELP.get(key, f"{key!r} as the pool reports it.")
                out.add(metric_name(f"aserve_pool_{key}"), "gauge", help, number, {"engine": engine})
        scheduler = (schedulers or {}).get(engine)
        if scheduler is not None:
            state = scheduler.stats()
            out.add("aserve_pool_batch_slots", "gauge", "Batch slots the pool's models share (round-robin).",
                    state["slots"], {"engine": engine})
            out.add("aserve_pool_batch_slots_in_use", "gauge", "Batch slots held by running batches.",
                    state["in_flight"], {"engine": engine})
    if http is not None:
        out.add("aserve_http_requests_total", "counter", "HTTP requests answered (refusals included).",
                http.requests)
        out.add("aserve_http_connections", "gauge", "HTTP connections open and served now.", http.connections)
        for reason in REFUSALS:
            out.add("aserve_http_refused_total", "counter",
                    "Requests refused before a handler saw them, by reason: malformed (400), header_size (431), "
                    "body_size (413), timeout (408: not received within --request-timeout), connection_limit "
                    "(503: over --max-connections).", http.refused[reason], {"reason": reason})
    if loops is not None:
        out.add("aserve_event_loops", "gauge", "Front event loops serving connections (--loops).", loops.serving)
        out.add("aserve_event_loop_restarts_total", "counter",
                "Front event loops that ended without being told to, and were started again.", loops.restarts)
        for front in loops.fronts:
            out.add("aserve_event_loop_connections", "gauge",
                    "Connections a front event loop serves now (new ones go to the loop with the fewest).",
                    front.connections, {"loop": str(front.index)})
        for (loop, protocol), count in sorted(by_loop.items()):
            out.add("aserve_event_loop_infer_requests_total", "counter",
                    "Infer requests each event loop answered itself, the host's (loop=\"host\") and each front's, "
                    "by the protocol they came in (http, grpc).", count, {"loop": loop, "protocol": protocol})
    if threads is not None:
        for thread, seconds in sorted(threads.items()):
            if thread[0] == "loop":
                out.add("aserve_event_loop_cpu_seconds_total", "counter",
                        "CPU seconds of each event loop's thread: the host's (loop=\"host\") and each front's.",
                        seconds, {"loop": thread[1]})
        for thread, seconds in sorted(threads.items()):
            if thread[0] == "interpreter":
                out.add("aserve_interpreter_cpu_seconds_total", "counter",
                        "CPU seconds of each interpreter's thread and of the threads its models started.",
                        seconds, {"engine": thread[1], "interpreter": thread[2]})
    if grpc is not None:
        for (method, code), count in sorted(grpc.items()):
            out.add("aserve_grpc_requests_total", "counter",
                    "gRPC calls answered, by method and status code (a stream's requests one by one).", count,
                    {"method": method, "code": code})
    if grpc_streams_held is not None:
        out.add("aserve_grpc_streams_held", "gauge",
                "ModelStreamInfer streams reading no requests now: as many answers as a stream may hold wait "
                "to be written (their clients read no answers).", grpc_streams_held)
    if tracing is not None:
        for key, help in _TRACE_COUNTERS.items():
            out.add(f"aserve_trace_{key}_total", "counter", help, tracing[key])
    return out.openmetrics() if openmetrics else out.text()


def _http_combined(http: HttpStats | None, others: list[Mapping[str, Any]]) -> HttpStats:
    out = HttpStats()
    mine: list[Mapping[str, Any]] = [] if http is None else [
        {"requests": http.requests, "connections": http.connections, "refused": http.refused}]
    for counts in mine + others:
        out.requests += counts["requests"]
        out.connections += counts["connections"]
        for reason, count in counts["refused"].items():
            out.refused[reason] = out.refused.get(reason, 0) + count
    return out


def _batcher_combined(stats: dict[str, Any], others: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """A model's batcher counters with other loops' batchers of the same load added (its
    policy's state is the host's)."""
    for other in others:
        for key, value in other.items():
            mine = stats.get(key)
            if key != "policy" and isinstance(value, (int, float)) and isinstance(mine, (int, float)):
                stats[key] = mine + value
    return stats


_TRACE_COUNTERS = {
    "recorded": "Trace records made (a sampled request, a batch, or a span recorded whole).",
    "exported": "Trace records the exporter sent to the OTLP endpoint.",
    "dropped": "Trace records dropped because OTEL_BSP_MAX_QUEUE_SIZE records were waiting for export.",
}


def wants_openmetrics(accept: str | None) -> bool:
    """Whether an Accept header asks for OpenMetrics text (Prometheus' scrapes do, with
    q-values; a q of 0 refuses it)."""
    if not accept or "application/openmetrics-text" not in accept:
        return False
    for item in accept.split(","):
        media, *params = (part.strip() for part in item.split(";"))
        if media.lower() == "application/openmetrics-text":
            return not any(p.replace(" ", "").lower() in ("q=0", "q=0.0", "q=0.00", "q=0.000") for p in params)
    return False


async def metrics(app: App, request: Request) -> Response:
    """GET /metrics: the text format, or OpenMetrics (with exemplars) when the Accept header asks for it."""
    plane = app.plane
    registry = plane.registry
    openmetrics = wants_openmetrics(request.headers.get("accept"))
    fronts = await app.loops.stats() if app.loops is not None else None
    grpc = app.grpc_stats
    text = render(registry.handles(), registry.pools, plane.metrics, registry.schedulers, http=app.stats,
                  tracing=plane.tracer.stats() if plane.tracer else None, openmetrics=openmetrics,
                  fronts=fronts, loops=app.loops, grpc=grpc.calls if grpc is not None else None,
                  grpc_streams_held=grpc.held if grpc is not None else None,
                  threads=app.threads.sample())
    return Response(200, text.encode(), content_type=OPENMETRICS_CONTENT_TYPE if openmetrics else CONTENT_TYPE)
