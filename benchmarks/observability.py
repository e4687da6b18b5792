"""What the hand-written observability code buys: each part against the library that does
the same, in the same run.

    python -m benchmarks.observability [--json FILE] [--rounds 9] [--seconds 0.2]

- `exposition`: one /metrics scrape of a server with `--models` models (the series
  `aserve.server.metrics` makes of each: request counts, the duration histogram with
  exemplars, the batcher's and the adaptive policy's numbers) and a pool, on the event
  loop. aserve's writer (`metrics.Exposition`, what /metrics runs: text format and
  OpenMetrics) against the same families as `prometheus_client` Metric objects written
  by its text and OpenMetrics writers. Both pairs of outputs are parsed by
  prometheus_client's parsers and compared sample by sample first.
- `otlp`: encoding the spans of `--requests` traced requests (each its server span with
  `decode`, `queue` and `encode`, and its batch's span and run: six spans) into one OTLP
  ExportTraceServiceRequest, from the numeric records the loop makes.
  `aserve._native.otlp_encode` (what the exporter runs) against the same spans built as
  `opentelemetry-proto` messages and serialised (what using the library would take). Both
  outputs are decoded and compared span by span first.
- `sampler`: deciding whether a request is traced, and its ids, per request.
  `Recorder.start` (aserve's native sampler, on the loop) against the SDK's
  `ParentBased(TraceIdRatioBased(r))` with its `RandomIdGenerator` and, for a request with
  a `traceparent`, `TraceContextTextMapPropagator().extract`, for requests without and
  with a caller's traceparent, at r = 1% and 100%.

- `model_context`: what a traced batch costs in its interpreter (a private interpreter,
  a model that echoes its input), per batch through the pool: untraced; traced as before
  model code could trace (`trace=True`: times only); traced with the OpenTelemetry
  context (the run span made current, tracestate and baggage, what aserve does now) and a
  model that opens no span; the same with a model that opens one span with the API. The
  first traced batch of a fresh interpreter, which imports the SDK, is timed on its own.
  CPU time of the process per batch (the loop's and the worker's: the pool does not spin),
  less moved by other work on the machine than the round trip's wall time.

Each figure is the median over `--rounds` rounds (each round runs each configuration for
about `--seconds`), the configurations of a part alternating within every round, so that a
drift of the machine weighs on both alike. One JSON record per configuration, then one
summary record; `python`, `cpus` and the load average before the run in every record.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import json
import math
import os
import pathlib
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry.context import Context
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import Decision, ParentBased, TraceIdRatioBased
from opentelemetry.trace import get_current_span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from prometheus_client.exposition import generate_latest as classic_text
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_text
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Exemplar, Sample

from aserve._native import TRACE_BATCH_FIELDS, TRACE_LINK_FIELDS, TRACE_REQUEST_FIELDS, otlp_encode
from aserve.dataplane.stats import RequestStats
from aserve.server import metrics
from aserve.tracing import Tracer
from aserve.tracing.config import Resolved

# ---- `exposition` with the library: prometheus_client's writers --------------------------
# The same families as aserve.server.metrics.Exposition makes, as prometheus_client Metric
# objects, written by its text-format and OpenMetrics writers (exemplars included).


class LibraryExposition:
    def __init__(self, openmetrics: bool = False) -> None:
        self._families: dict[str, Metric] = {}
        self.om = openmetrics

    def add(self, name: str, kind: str, help: str, value: float, labels: Mapping[str, str] | None = None,
            *, suffix: str = "", exemplar: Any = None) -> None:
        family = self._families.get(name)
        if family is None:
            base = name[:-6] if kind == "counter" and name.endswith("_total") else name
            family = self._families[name] = Metric(base, help, "unknown" if kind == "untyped" else kind)
        family.samples.append(Sample(name + suffix, dict(labels or {}), value, None,
                                     None if exemplar is None else Exemplar(dict(exemplar[0]), exemplar[1],
                                                                             exemplar[2])))

    def collect(self) -> Any:
        return self._families.values()

    def text(self) -> str:
        return bytes(classic_text(self)).decode()

    def openmetrics(self) -> str:
        text: bytes = openmetrics_text(self)  # type: ignore[no-untyped-call]
        return text.decode()


# ---- exposition ----

BATCHER_STATS: dict[str, Any] = {
    "batches": 91_234, "requests": 402_118, "refused": 12, "timed_out": 3, "queued_samples": 7,
    "queued_requests": 5, "running_batches": 2, "joins": 0, "joined_requests": 0, "offers_turned_away": 0,
    "queue_seconds": 812.25, "compute_seconds": 2210.5, "cancelled": 0,
    "policy": {"latency_budget_s": 0.05, "interpreters": 2, "arrival_rate_samples_per_s": 1834.2,
               "cost": {"form": "affine", "batch1_seconds": 0.0021, "throughput_optimal_batch": 16,
                        "throughput_optimal_samples_per_s": 5120.0, "max_batch_size": 32, "observations": 90_112,
                        "points": [(b, 0.002 + 0.0003 * b) for b in (1, 2, 4, 8, 16, 32)],
                        "params": {"a": 0.002, "c": 0.0003}}},
}


def request_stats(seed: int) -> RequestStats:
    stats = RequestStats()
    for k in range(400):
        stats.succeeded((50 + (k * 7919 + seed) % 100_000) / 1e6, 1 + k % 4,
                        f"{k * 2654435761 + seed:032x}" if k % 25 == 0 else None)
    stats.failed("model")
    return stats


def exposition_workload(models: int) -> Callable[[Any], str]:
    """render(out): the series of `models` models and a pool, written by `out`."""
    per_model = [({"model": f"model_{i}", "version": "1"}, request_stats(i)) for i in range(models)]
    pool = {"interpreters": 2, "ready": 2, "active": 2, "busy": 1, "queued": 0, "lost": 0, "spinning": 0}

    def render(out: Any) -> str:
        for labels, stats in per_model:
            out.add("aserve_model_ready", "gauge", "1 when the model answers requests.", 1, labels)
            metrics._requests(out, labels, stats)
            metrics._batcher(out, labels, BATCHER_STATS)
        for key, value in pool.items():
            out.add(f"aserve_pool_{key}", "gauge", f"{key!r} as the pool reports it.", value, {"engine": "private"})
        return str(out.openmetrics() if getattr(out, "om", False) else out.text())

    return render


class OpenMetricsExposition(metrics.Exposition):
    om = True


def same_series(handwritten: str, library: str, openmetrics: bool) -> bool:
    """Whether two expositions parse to the same samples (names, labels, values, exemplars)."""
    parse = openmetrics_families if openmetrics else text_string_to_metric_families

    def series(text: str) -> list[Any]:
        return sorted((f.name, f.type, s.name, sorted(s.labels.items()), s.value,
                       None if s.exemplar is None else (s.exemplar.labels, s.exemplar.value))
                      for f in parse(text) for s in f.samples)

    return series(handwritten) == series(library)


# ---- otlp ----


def traced_records(requests: int) -> tuple[list[Any], bytes, bytes, bytes]:
    """The numeric records of `requests` traced requests, each served by a batch of its own,
    made by the loop's own recorder."""

    class Queued:
        def __init__(self, trace: Any) -> None:
            self.trace = trace
            self.arrival = time.monotonic()

    async def make() -> tuple[list[Any], bytes, bytes, bytes]:
        env = {"OTEL_BSP_MAX_EXPORT_BATCH_SIZE": str(10 * requests + 1), "OTEL_BSP_MAX_QUEUE_SIZE": str(10 * requests)}
        tracer = Tracer(Resolved(sampler="always_on", ratio=1.0, exporter_env=env))
        route = tracer.add_route("r", "POST /v2/models/{model}/infer", {
            "http.request.method": "POST", "http.route": "/v2/models/{model}/infer", "url.scheme": "http",
            "url.path": "/v2/models/simple/infer", "server.address": "127.0.0.1", "server.port": 8000,
            "network.protocol.version": "1.1", "aserve.model": "simple", "aserve.version": "latest",
            "aserve.protocol": "v2-json"})
        model = tracer.add_route(("batch", "simple"), "batch simple", {"aserve.model": "simple"})
        for _ in range(requests):
            trace = tracer.start({})
            assert trace is not None
            trace.route = route
            trace.stamp(0)
            trace.stamp(1)
            q = Queued(trace)
            now = time.monotonic_ns()
            tracer.core.batch(model, [q], 1, time.monotonic(), (0, now, now + 20_000, None))
            trace.stamp(4)
            trace.stamp(5)
            assert trace.end(200)
        _, req, bat, lnk = tracer.core.take()
        return [list(entry) for entry in tracer._table], req, bat, lnk

    return asyncio.run(make())


RESOURCE = {"service.name": "aserve", "telemetry.sdk.language": "python", "telemetry.sdk.name": "opentelemetry",
            "telemetry.sdk.version": "1.40.0"}


def native_encode(records: tuple[list[Any], bytes, bytes, bytes]) -> bytes:
    return otlp_encode(RESOURCE, "aserve", "0.1.0", [], records)


_M64 = (1 << 64) - 1


def _child_id(parent: int, k: int) -> int:
    """native/host/otlp.c's child_id: the span id of a request's k-th child (splitmix64)."""
    z = (parent + 0x9E3779B97F4A7C15 * (k + 1)) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    z ^= z >> 31
    return z or 1


def _any(v: Any) -> common_pb2.AnyValue:
    if isinstance(v, str):
        return common_pb2.AnyValue(string_value=v)
    if isinstance(v, bool):
        return common_pb2.AnyValue(bool_value=v)
    if isinstance(v, int):
        return common_pb2.AnyValue(int_value=v)
    return common_pb2.AnyValue(double_value=float(v))


def _kvs(attributes: Mapping[str, Any]) -> list[common_pb2.KeyValue]:
    return [common_pb2.KeyValue(key=k, value=_any(v)) for k, v in attributes.items()]


def proto_encode(records: tuple[list[Any], bytes, bytes, bytes]) -> bytes:
    """The same spans as otlp_encode writes, as opentelemetry-proto messages."""
    table, req, bat, lnk = records
    r, b, lk = array.array("Q", req), array.array("Q", bat), array.array("Q", lnk)
    spans: list[trace_pb2.Span] = []
    flags = 0x1 | 0x100
    internal, server = trace_pb2.Span.SPAN_KIND_INTERNAL, trace_pb2.Span.SPAN_KIND_SERVER
    for i in range(0, len(r), TRACE_REQUEST_FIELDS):
        v = r[i:i + TRACE_REQUEST_FIELDS]
        trace_id = (v[0] << 64 | v[1]).to_bytes(16, "big")
        span_id = v[2].to_bytes(8, "big")
        for k, name in enumerate(("decode", "queue", "encode")):
            start, end = v[8 + 2 * k], v[9 + 2 * k]
            if start:
                spans.append(trace_pb2.Span(trace_id=trace_id, span_id=_child_id(v[2], k).to_bytes(8, "big"),
                                            parent_span_id=span_id, name=name, kind=internal,
                                            start_time_unix_nano=start, end_time_unix_nano=end, flags=flags))
        name, attributes = table[v[14]]
        kvs = _kvs(attributes)
        kvs.append(common_pb2.KeyValue(key="http.response.status_code", value=_any(v[5])))
        if v[15]:
            kvs += _kvs({"aserve.batch_size": v[15], "aserve.batch_samples": v[16], "aserve.compute_us": v[17] / 10})
            if v[18]:
                kvs.append(common_pb2.KeyValue(key="aserve.interpreter", value=_any(v[18] - 1)))
            tenths = math.floor((v[11] - v[10]) / 100 + 0.5)  # C's round(): halves away from zero
            kvs.append(common_pb2.KeyValue(key="aserve.queue_us", value=_any(tenths / 10)))
        span = trace_pb2.Span(trace_id=trace_id, span_id=span_id, name=name, kind=server, start_time_unix_nano=v[6],
                              end_time_unix_nano=v[7], attributes=kvs, flags=flags | (0x200 if v[4] else 0))
        if v[3]:
            span.parent_span_id = v[3].to_bytes(8, "big")
        spans.append(span)
    k = 0
    n_links = len(lk) // TRACE_LINK_FIELDS
    for i in range(0, len(b), TRACE_BATCH_FIELDS):
        v = b[i:i + TRACE_BATCH_FIELDS]
        trace_id = (v[0] << 64 | v[1]).to_bytes(16, "big")
        name, attributes = table[v[11]]
        links = []
        while k < n_links and lk[k * TRACE_LINK_FIELDS] == v[2]:
            link = lk[k * TRACE_LINK_FIELDS:(k + 1) * TRACE_LINK_FIELDS]
            links.append(trace_pb2.Span.Link(trace_id=(link[1] << 64 | link[2]).to_bytes(16, "big"),
                                             span_id=link[3].to_bytes(8, "big"), flags=flags))
            k += 1
        facts = {"aserve.batch_size": v[9], "aserve.batch_samples": v[10]}
        if v[8]:
            facts["aserve.interpreter"] = v[8] - 1
        spans.append(trace_pb2.Span(trace_id=trace_id, span_id=v[2].to_bytes(8, "big"), name=name, kind=internal,
                                    start_time_unix_nano=v[4], end_time_unix_nano=v[5],
                                    attributes=_kvs(attributes) + _kvs(facts), links=links, flags=flags))
        if v[3]:
            run = {"aserve.interpreter": v[8] - 1} if v[8] else {}
            spans.append(trace_pb2.Span(trace_id=trace_id, span_id=v[3].to_bytes(8, "big"),
                                        parent_span_id=v[2].to_bytes(8, "big"), name="run in interpreter",
                                        kind=internal, start_time_unix_nano=v[6], end_time_unix_nano=v[7],
                                        attributes=_kvs(run) + _kvs(attributes), flags=flags))
    message = trace_service_pb2.ExportTraceServiceRequest()
    rs = message.resource_spans.add()
    rs.resource.attributes.extend(_kvs(RESOURCE))
    ss = rs.scope_spans.add()
    ss.scope.name, ss.scope.version = "aserve", "0.1.0"
    ss.spans.extend(spans)
    return bytes(message.SerializeToString())


def decoded(payload: bytes) -> list[tuple[Any, ...]]:
    message = trace_service_pb2.ExportTraceServiceRequest()
    message.ParseFromString(payload)
    return sorted((s.trace_id, s.span_id, s.parent_span_id, s.name, s.kind, s.start_time_unix_nano,
                   s.end_time_unix_nano, sorted((a.key, a.value.SerializeToString()) for a in s.attributes),
                   len(s.links), s.flags)
                  for rs in message.resource_spans for ss in rs.scope_spans for s in ss.spans)


# ---- sampler ----


def native_sampler(ratio: float, traceparent: str | None) -> Callable[[], Any]:
    tracer = Tracer(Resolved(sampler="parentbased_traceidratio", ratio=ratio, exporter_env={}))
    headers = {"traceparent": traceparent} if traceparent else {"host": "127.0.0.1:8000"}
    start = tracer.start
    return lambda: start(headers)


def sdk_sampler(ratio: float, traceparent: str | None) -> Callable[[], Any]:
    sampler = ParentBased(TraceIdRatioBased(ratio))
    ids = RandomIdGenerator()
    propagator = TraceContextTextMapPropagator()
    headers = {"traceparent": traceparent} if traceparent else {"host": "127.0.0.1:8000"}

    def decide() -> Any:
        context = propagator.extract(headers) if "traceparent" in headers else Context()
        parent = get_current_span(context).get_span_context()
        trace_id = parent.trace_id if parent.is_valid else ids.generate_trace_id()
        result = sampler.should_sample(context, trace_id, "POST /v2/models/{model}/infer")
        sampled = result.decision in (Decision.RECORD_AND_SAMPLE,)
        return (trace_id, ids.generate_span_id()) if sampled else None

    return decide


# ---- model_context ----

ECHO = """
from opentelemetry import trace
from aserve.runtime import Model, TensorSpec

tracer = trace.get_tracer(__name__)

class Echo(Model):
    inputs = (TensorSpec("X", "UINT8", (-1,)),)
    outputs = (TensorSpec("Y", "UINT8", (-1,)),)
    tensor_format = "memoryview"

    def __call__(self, inputs):
        if self.parameters.get("span"):
            with tracer.start_as_current_span("echo"):
                return {"Y": inputs["X"]}
        return {"Y": inputs["X"]}
"""
CONTEXT = ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\ncongo=t61rcWkgMzE\ntenant=acme")


def model_context(rounds: int, batches: int, folder: pathlib.Path) -> tuple[dict[str, list[float]], float]:
    """CPU µs per batch of each configuration (the process's: the loop's and the worker's, which
    does not spin), alternating, and the first traced batch's wall ms."""
    from aserve.engine import ModelSpec, Pool
    from aserve.tensor import Tensor

    (folder / "echo.py").write_text(ECHO)
    x = [Tensor("UINT8", (16,), bytes(16))]

    async def run() -> tuple[dict[str, list[float]], float]:
        async with Pool(engine="private", interpreters=1) as pool:
            for name, span in (("echo", False), ("echo_span", True)):
                await pool.load(ModelSpec(name=name, path=str(folder / "echo.py"), parameters={"span": span}))
            loop = asyncio.get_running_loop()

            async def one(model: str, trace: bool | str) -> None:
                done: asyncio.Future[tuple[Any, ...]] = loop.create_future()

                def finished(*result: Any) -> None:
                    if not done.done():
                        done.set_result(result)

                pool.run(model, x, finished, trace=trace)
                result = await done
                assert result[1] is None, result[1]

            t0 = time.perf_counter()
            await one("echo", CONTEXT)  # imports the SDK in the interpreter
            first_ms = (time.perf_counter() - t0) * 1e3
            configs: dict[str, tuple[str, bool | str]] = {
                "untraced": ("echo", False), "traced, times only": ("echo", True),
                "traced, OpenTelemetry context, no span": ("echo", CONTEXT),
                "traced, OpenTelemetry context, one span": ("echo_span", CONTEXT)}
            times: dict[str, list[float]] = {name: [] for name in configs}
            for k in range(rounds):
                for name in (list(configs) if k % 2 == 0 else list(reversed(configs))):
                    model, trace = configs[name]
                    t0 = time.process_time()  # the process's CPU: the loop and the worker (no spinning)
                    for _ in range(batches):
                        await one(model, trace)
                    times[name].append((time.process_time() - t0) / batches * 1e6)
            return times, first_ms

    return asyncio.run(run())


# ---- the harness ----


def per_call_us(fn: Callable[[], Any], seconds: float) -> float:
    """µs per call of fn, over about `seconds` (the call count doubled until it takes that long)."""
    n = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds or n >= 1 << 24:
            return elapsed / n * 1e6
        n *= 2 if elapsed < seconds / 4 else 1 + math.ceil(seconds / max(elapsed, 1e-9))


def alternate(configs: dict[str, Callable[[], Any]], rounds: int, seconds: float) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in configs}
    for k in range(rounds):
        names = list(configs) if k % 2 == 0 else list(reversed(configs))  # who goes first alternates too
        for name in names:
            times[name].append(per_call_us(configs[name], seconds))
    return times


def measure(rounds: int, seconds: float, models: int, requests: int, batches: int,
            folder: pathlib.Path) -> list[dict[str, Any]]:
    load = os.getloadavg()[0]
    common = {"bench": "observability", "rounds": rounds, "python": platform.python_version(),
              "cpus": os.cpu_count(), "load_1min_before": round(load, 2)}
    records: list[dict[str, Any]] = []

    def record(part: str, times: dict[str, list[float]], unit: str, per: int = 1, **extra: Any) -> dict[str, float]:
        medians = {}
        for name, ts in times.items():
            us = [t / per for t in ts]
            medians[name] = statistics.median(us)
            records.append({**common, "part": part, "config": name, unit: round(medians[name], 3),
                            "min": round(min(us), 3), "max": round(max(us), 3), **extra})
        return medians

    # exposition
    render = exposition_workload(models)
    classic = render(metrics.Exposition())
    om = render(OpenMetricsExposition())
    samples = sum(1 for line in classic.splitlines() if line and not line.startswith("#"))
    assert "# {" in om and om.endswith("# EOF\n")
    assert same_series(classic, render(LibraryExposition()), False), "the text writers disagree"
    assert same_series(om, render(LibraryExposition(openmetrics=True)), True), "the OpenMetrics writers disagree"
    expo = record("exposition", alternate({
        "hand-written text": lambda: render(metrics.Exposition()),
        "hand-written openmetrics": lambda: render(OpenMetricsExposition()),
        "prometheus_client text": lambda: render(LibraryExposition()),
        "prometheus_client openmetrics": lambda: render(LibraryExposition(openmetrics=True)),
    }, rounds, seconds), "us_per_scrape", models=models, samples=samples)

    # otlp
    records_ = traced_records(requests)
    assert decoded(native_encode(records_)) == decoded(proto_encode(records_)), "the two encoders disagree"
    otlp = record("otlp", alternate({
        "native otlp_encode": lambda: native_encode(records_),
        "opentelemetry-proto": lambda: proto_encode(records_),
    }, rounds, seconds), "us_per_request", per=requests, requests=requests, spans_per_request=6)

    # sampler
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    sampler: dict[str, float] = {}
    for ratio in (0.01, 1.0):
        for header in (None, parent):
            case = f"ratio {ratio:g}, {'traceparent' if header else 'no traceparent'}"
            medians = record("sampler", alternate({
                f"native Recorder.start ({case})": native_sampler(ratio, header),
                f"SDK ParentBased(TraceIdRatioBased) ({case})": sdk_sampler(ratio, header),
            }, rounds, seconds), "us_per_request", ratio=ratio, traceparent=header is not None)
            sampler.update(medians)

    # model_context
    context_times, first_ms = model_context(rounds, batches, folder)
    context = record("model_context", context_times, "cpu_us_per_batch", batches=batches)

    native_root = sampler["native Recorder.start (ratio 0.01, no traceparent)"]
    sdk_root = sampler["SDK ParentBased(TraceIdRatioBased) (ratio 0.01, no traceparent)"]
    summary = {
        "exposition_library_vs_handwritten_text": round(expo["prometheus_client text"] / expo["hand-written text"], 2),
        "exposition_library_vs_handwritten_openmetrics": round(expo["prometheus_client openmetrics"]
                                                               / expo["hand-written openmetrics"], 2),
        "exposition_loop_stall_ms_handwritten_openmetrics": round(expo["hand-written openmetrics"] / 1e3, 2),
        "exposition_loop_stall_ms_library_openmetrics": round(expo["prometheus_client openmetrics"] / 1e3, 2),
        "otlp_library_vs_native": round(otlp["opentelemetry-proto"] / otlp["native otlp_encode"], 1),
        "otlp_library_cores_at_10k_traced_requests_per_s": round(otlp["opentelemetry-proto"] * 1e4 / 1e6, 2),
        "otlp_native_cores_at_10k_traced_requests_per_s": round(otlp["native otlp_encode"] * 1e4 / 1e6, 3),
        "sampler_library_vs_native_1pct_roots": round(sdk_root / native_root, 1),
        "sampler_library_loop_share_at_30k_requests_per_s_pct": round(sdk_root * 3e4 / 1e4, 1),
        "sampler_native_loop_share_at_30k_requests_per_s_pct": round(native_root * 3e4 / 1e4, 2),
        "context_us_per_traced_batch": round(context["traced, OpenTelemetry context, no span"]
                                             - context["traced, times only"], 1),
        "one_model_span_us": round(context["traced, OpenTelemetry context, one span"]
                                   - context["traced, OpenTelemetry context, no span"], 1),
        "first_traced_batch_ms": round(first_ms, 1),
    }
    records.append({**common, "summary": summary})
    return records


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.observability", description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--seconds", type=float, default=0.2, help="each configuration's time per round")
    p.add_argument("--models", type=int, default=8, help="models on the scraped server")
    p.add_argument("--requests", type=int, default=512, help="traced requests per OTLP export")
    p.add_argument("--batches", type=int, default=2000, help="batches per configuration per round (model_context)")
    p.add_argument("--json", type=pathlib.Path, help="also write the records here")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        records = measure(args.rounds, args.seconds, args.models, args.requests, args.batches, pathlib.Path(folder))
    text = json.dumps(records, indent=1)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
