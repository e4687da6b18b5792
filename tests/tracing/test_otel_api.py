"""The OpenTelemetry API in model code, and W3C Trace Context (traceparent, tracestate,
baggage), from a real server to a real OTLP/HTTP receiver and a real downstream service."""

from __future__ import annotations

import array
import asyncio
import os
import pathlib
import random
import shutil
import signal
import sys
import urllib.parse
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from aserve.tracing.recorder import parse_tracestate

from ..conftest import EXAMPLES, spawns, until, wait_ready
from ..peers import Receiver, serving
from .conftest import attrs

# the engines whose interpreters import the OpenTelemetry SDK (3.11: private libpython copies; 3.13: PEP 684)
ENGINES = ["private", "main"] if sys.version_info < (3, 12) else ["subinterp", "main"]


class Features:
    """A downstream service the example model calls: it answers the scale and keeps the headers it got."""

    def __init__(self) -> None:
        self.headers: list[dict[str, str]] = []

    async def scale(self, request: web.Request) -> web.Response:
        self.headers.append({k.lower(): v for k, v in request.headers.items()})
        return web.Response(text="3.0")


@pytest.fixture
async def features() -> AsyncIterator[tuple[Features, str]]:
    f = Features()
    async with serving([("GET", "/scale", f.scale)]) as port:
        yield f, f"http://127.0.0.1:{port}/scale"


def traced_example(folder: pathlib.Path, feature_url: str) -> pathlib.Path:
    """A repository with the bundled `traced` example, pointed at the feature service."""
    shutil.copytree(EXAMPLES / "traced", folder / "traced")
    config = folder / "traced" / "config.toml"
    config.write_text(config.read_text().replace("# feature_url = \"http://features:8080/scale\"",
                                                 f"feature_url = {feature_url!r}"))
    return folder


def x_body(rows: list[list[float]]) -> dict[str, Any]:
    return {"inputs": [{"name": "X", "datatype": "FP32", "shape": [len(rows), 4], "data": [v for row in rows for v in row]}]}


def hexid(b: bytes) -> str:
    return b.hex()


@pytest.mark.parametrize("engine", ENGINES)
async def test_model_spans_of_the_opentelemetry_api_are_children_of_the_run(
    start_server, tmp_path: pathlib.Path, receiver: tuple[Receiver, str], features: tuple[Features, str],
    monkeypatch: pytest.MonkeyPatch, engine: str,
) -> None:
    """The bundled example opens spans with the standard API, reads baggage and calls a
    feature service with the context injected: its spans land under `run in interpreter`,
    the downstream call carries the batch's trace, the caller's tracestate and baggage."""
    collector, endpoint = receiver
    service, feature_url = features
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_always_off")  # a caller's sampled flag decides
    server, url = await start_server(traced_example(tmp_path, feature_url), engine=engine, interpreters=1)
    tracer = server.plane.tracer
    assert tracer is not None
    caller_trace, caller_span = random.getrandbits(128) | 1, random.getrandbits(64) | 1
    state = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"
    rows = [[1.0, 2.0, 3.5, -4.0]]
    async with aiohttp.ClientSession() as http:
        headers = {"traceparent": f"00-{caller_trace:032x}-{caller_span:016x}-01", "tracestate": state,
                   "baggage": "tenant=acme%20corp,plan=gold"}
        async with http.post(f"{url}/v2/models/traced/infer", json=x_body(rows), headers=headers) as r:
            assert r.status == 200, await r.text()
            (out,) = (await r.json())["outputs"]
        want = [float(array.array("f", [v * 3.0])[0]) for v in rows[0]]  # the service's scale, in FP32
        assert out["data"] == want
        # a caller that did not sample its trace: no span of the model is exported, but its call
        # downstream continues the caller's trace, unsampled, with the tracestate and baggage
        unsampled = f"00-{random.getrandbits(128) | 1:032x}-{random.getrandbits(64) | 1:016x}-00"
        headers = {"traceparent": unsampled, "tracestate": "rojo=1", "baggage": "tenant=beta"}
        async with http.post(f"{url}/v2/models/traced/infer", json=x_body(rows), headers=headers) as r:
            assert r.status == 200 and (await r.json())["outputs"][0]["data"] == want
        # no caller's trace and not sampled: the baggage alone reaches the model and its call
        async with http.post(f"{url}/v2/models/traced/infer", json=x_body(rows), headers={"baggage": "tenant=gamma"}) as r:
            assert r.status == 200 and (await r.json())["outputs"][0]["data"] == want
        await until(lambda: tracer.stats()["exported"] == tracer.stats()["recorded"] > 0, what="the export")
    await server.close()
    await until(lambda: len(collector.named("scale rows")) >= 1, what="the model's spans")

    assert len(collector.named("scale rows")) == 1 and len(collector.named("fetch scale")) == 1
    (request,) = collector.named("POST /v2/models/{model}/infer")
    (batch,) = collector.named("batch traced")
    (run,) = collector.named("run in interpreter")
    (fetch,) = collector.named("fetch scale")
    (scaled,) = collector.named("scale rows")
    # the request continues the caller's trace, with its tracestate on its span and its children
    assert int.from_bytes(request.trace_id, "big") == caller_trace
    assert int.from_bytes(request.parent_span_id, "big") == caller_span
    children = [s for s in collector.spans if s.parent_span_id == request.span_id]
    assert {c.name for c in children} == {"decode", "queue", "encode"}
    assert request.trace_state == state and all(c.trace_state == state for c in children)
    # the batch: a trace of its own linked to the request; the model's spans under its run
    assert [(link.trace_id, link.span_id) for link in batch.links] == [(request.trace_id, request.span_id)]
    assert run.parent_span_id == batch.span_id and batch.trace_state == run.trace_state == state
    for s in (fetch, scaled):
        assert s.trace_id == batch.trace_id and s.parent_span_id == run.span_id and s.trace_state == state
        assert run.start_time_unix_nano <= s.start_time_unix_nano <= s.end_time_unix_nano <= run.end_time_unix_nano
    assert fetch.kind == fetch.SPAN_KIND_CLIENT and scaled.kind == scaled.SPAN_KIND_INTERNAL
    assert attrs(fetch) == {"scale": 3.0}
    assert attrs(scaled) == {"rows": 1, "tenant": "acme corp"}  # baggage, decoded by the standard API
    # the downstream call: the context the model's client injected (only the sampled request's)
    (sent,) = service.headers[:1]
    assert sent["traceparent"] == f"00-{hexid(batch.trace_id)}-{hexid(fetch.span_id)}-01"
    assert sent["tracestate"] == state
    entries = dict(kv.split("=", 1) for kv in sent["baggage"].split(","))
    assert {k: urllib.parse.unquote_plus(v) for k, v in entries.items()} == {"tenant": "acme corp", "plan": "gold"}
    assert len(service.headers) == 3
    version, trace_id, _, flags = service.headers[1]["traceparent"].split("-")  # the model's (unrecorded) span
    assert (version, trace_id, flags) == ("00", unsampled[3:35], "00") and service.headers[1]["tracestate"] == "rojo=1"
    assert service.headers[1]["baggage"] == "tenant=beta"
    assert service.headers[2]["baggage"] == "tenant=gamma"
    # the model's span there is a root the interpreter's sampler does not sample: a trace of its own, unsampled
    flags = int(service.headers[2]["traceparent"].split("-")[3], 16)
    assert not flags & 1 and service.headers[2]["traceparent"][3:35] not in {unsampled[3:35], hexid(batch.trace_id)}


MALFORMED = {
    "upper-case hex": "00-{t}-{s}-01",
    "version ff": "ff-{t}-{s}-01",
    "trace id of zeros": "00-" + "0" * 32 + "-{s}-01",
    "parent id of zeros": "00-{t}-" + "0" * 16 + "-01",
    "version 00 with more fields": "00-{t}-{s}-01-extra",
    "short trace id": "00-{t_short}-{s}-01",
    "not hex": "00-{t_bad}-{s}-01",
    "two headers joined": "00-{t}-{s}-01, 00-{t}-{s}-01",
}


async def test_a_malformed_traceparent_starts_a_new_trace_and_drops_its_tracestate(
    start_server, repository: pathlib.Path, receiver: tuple[Receiver, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """W3C Trace Context: a traceparent that does not parse is ignored (a new root trace, the
    tracestate with it); a later version's extra fields are read as version 00's."""
    collector, endpoint = receiver
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    server, url = await start_server(repository)
    tracer = server.plane.tracer
    assert tracer is not None
    sent: dict[str, int] = {}
    body = {"inputs": [{"name": "A", "datatype": "INT32", "shape": [1, 4], "data": [1, 2, 3, 4]},
                       {"name": "B", "datatype": "INT32", "shape": [1, 4], "data": [1, 1, 1, 1]}]}
    async with aiohttp.ClientSession() as http:
        cases = {**MALFORMED, "version 01 with a field more": "01-{t}-{s}-01-abcd"}
        for k, (case, pattern) in enumerate(cases.items()):
            trace_id = (k + 1) << 64 | 0xABCDEF
            t = f"{trace_id:032x}"
            value = pattern.format(t=t.upper() if case == "upper-case hex" else t, s=f"{k + 1:016x}",
                                   t_short=t[:31], t_bad=t[:31] + "g")
            headers = {"traceparent": value, "tracestate": "vendor=v1"}
            async with http.post(f"{url}/v2/models/add/infer", json=body, headers=headers) as r:
                assert r.status == 200
            sent[case] = trace_id
        await until(lambda: tracer.stats()["exported"] == tracer.stats()["recorded"], what="the export")
    await server.close()
    await until(lambda: len(collector.named("POST /v2/models/{model}/infer")) == len(sent), what="the requests' spans")
    spans = sorted(collector.named("POST /v2/models/{model}/infer"), key=lambda s: s.start_time_unix_nano)
    for (case, trace_id), span in zip(sent.items(), spans, strict=True):
        if case == "version 01 with a field more":
            assert int.from_bytes(span.trace_id, "big") == trace_id and span.trace_state == "vendor=v1", case
            continue
        assert int.from_bytes(span.trace_id, "big") != trace_id, case
        assert not span.parent_span_id and span.trace_state == "", case


@pytest.mark.parametrize(("header", "kept"), [
    ("rojo=00f067aa0ba902b7", "rojo=00f067aa0ba902b7"),
    (" congo=t61rcWkgMzE , ,rojo=1 ", "congo=t61rcWkgMzE,rojo=1"),  # optional white space, empty members
    ("tenant@vendor=x", "tenant@vendor=x"),
    ("Rojo=1", None),  # keys are lower-case
    ("rojo=1,rojo=2", None),  # a key twice
    ("rojo", None),
    ("rojo=a=b,x=1", None),  # '=' in a value
    ("rojo=" + "x" * 257, None),
    (",".join(f"k{i}=v" for i in range(33)), None),  # at most 32 members
    ("", None),
])
def test_tracestate_is_kept_only_when_valid(header: str, kept: str | None) -> None:
    assert parse_tracestate(header) == kept


async def test_aserve_span_records_spans_where_the_sdk_cannot_be_imported(
    start_server, tmp_path: pathlib.Path, receiver: tuple[Receiver, str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`aserve.runtime.span` without the SDK: the spans are recorded by the runtime alone and
    land under the run span all the same (the `main` engine shares this process's runtime
    module, where the SDK is marked as missing)."""
    from aserve.runtime import trace as runtime_trace

    from ..server.conftest import write_repository
    from .test_traces import ONE_AT_A_TIME, TRACED_ADD

    monkeypatch.setattr(runtime_trace, "_otel", False)
    collector, endpoint = receiver
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    server, url = await start_server(write_repository(tmp_path / "repo", {"add": (TRACED_ADD, ONE_AT_A_TIME)}),
                                     engine="main")
    tracer = server.plane.tracer
    body = {"inputs": [{"name": "A", "datatype": "INT32", "shape": [2, 4], "data": [1, 2, 3, 4, 5, 6, 7, 8]},
                       {"name": "B", "datatype": "INT32", "shape": [2, 4], "data": [0] * 8}]}
    async with aiohttp.ClientSession() as http, http.post(f"{url}/v2/models/add/infer", json=body) as r:
        assert r.status == 200
    await until(lambda: tracer.stats()["exported"] == tracer.stats()["recorded"] > 0, what="the export")
    await server.close()
    await until(lambda: collector.named("add rows"), what="the model's span")
    (span,) = collector.named("add rows")
    (run,) = collector.named("run in interpreter")
    assert span.parent_span_id == run.span_id and span.trace_id == run.trace_id
    assert attrs(span) == {"rows": 2}
    assert run.start_time_unix_nano <= span.start_time_unix_nano <= span.end_time_unix_nano <= run.end_time_unix_nano


OWN_PROVIDER = '''
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from aserve.runtime import Model, TensorSpec

class Own(Model):
    inputs = (TensorSpec("X", "FP32", (-1, 4)),)
    outputs = (TensorSpec("SEEN", "UINT64", (-1, 3)),)

    def load(self):
        self.exported = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(self.exported))
        trace.set_tracer_provider(provider)

    def __call__(self, inputs):
        with trace.get_tracer(__name__).start_as_current_span("own"):
            pass
        (span,) = self.exported.get_finished_spans()[-1:]
        ctx = span.get_span_context()
        rows = len(inputs["X"].cast("B")) // 16
        return {"SEEN": [[len(self.exported.get_finished_spans()), span.parent.span_id, ctx.trace_id >> 64]] * rows}
'''

OWN_CONFIG = '''
max_batch_size = 4
interpreters = 1
[[inputs]]
name = "X"
datatype = "FP32"
shape = [-1, 4]
[[outputs]]
name = "SEEN"
datatype = "UINT64"
shape = [-1, 3]
'''


@spawns
async def test_a_model_with_a_tracer_provider_of_its_own_keeps_it(
    tmp_path: pathlib.Path, receiver: tuple[Receiver, str],
) -> None:
    """Model code that set its own TracerProvider (its own exporter) keeps it: its spans are
    children of the run span, exported by its processor, not twice by aserve. A server
    process of its own: an interpreter's global provider is set once, and this one's must
    be the model's."""
    from ..server.conftest import write_repository
    from .test_exemplars import free_port

    collector, endpoint = receiver
    repo = write_repository(tmp_path / "repo", {"own": (OWN_PROVIDER, OWN_CONFIG)})
    port = free_port()
    env = dict(os.environ, ASERVE_LOG_LEVEL="warning", OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
               OTEL_BSP_SCHEDULE_DELAY="50")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "aserve.cli", "serve", str(repo), "--engine", ENGINES[0], "--port", str(port),
        env=env, stderr=asyncio.subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http:
            await wait_ready(http, url, proc)
            body = x_body([[1.0, 2.0, 3.0, 4.0]])
            async with http.post(f"{url}/v2/models/own/infer", json=body) as r:
                assert r.status == 200, await r.text()
                (seen,) = (await r.json())["outputs"]
        proc.send_signal(signal.SIGTERM)  # closing sends every span recorded
        assert await asyncio.wait_for(proc.wait(), 60) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    await until(lambda: collector.named("run in interpreter"), what="the run span")
    (run,) = collector.named("run in interpreter")
    assert seen["data"] == [1, int.from_bytes(run.span_id, "big"), int.from_bytes(run.trace_id[:8], "big")]
    assert not collector.named("own")
