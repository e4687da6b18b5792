"""OpenTelemetry traces from a real server to a real OTLP/HTTP receiver on loopback."""

from __future__ import annotations

import asyncio
import pathlib
import random
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ..conftest import until
from ..server.conftest import ADD_CONFIG, ADD_MODEL, write_repository
from .conftest import Receiver, attrs

# ADD_MODEL that takes 20 ms per batch; TRACED_ADD also opens a span of its own around the sum.
SLOW_ADD = ADD_MODEL.replace("from aserve.runtime import Model, TensorSpec",
                             "import time\nfrom aserve.runtime import Model, TensorSpec, span").replace(
    "        a = inputs", "        time.sleep(0.02)\n        a = inputs", 1)
TRACED_ADD = SLOW_ADD.replace(
    '        return {"SUM"', '        with span("add rows", rows=len(a) // 4):\n            pass\n        return {"SUM"', 1)
ONE_AT_A_TIME = ADD_CONFIG.replace("max_batch_size = 8", "max_batch_size = 8\ninterpreters = 1").replace(
    "max_queue_delay_ms = 2.0", "max_queue_delay_ms = 50.0")


def body(values: list[int]) -> dict[str, Any]:
    return {"inputs": [{"name": "A", "datatype": "INT32", "shape": [1, 4], "data": values},
                       {"name": "B", "datatype": "INT32", "shape": [1, 4], "data": [1, 1, 1, 1]}]}


@pytest.mark.parametrize("model_spans", [True, False], ids=["model-spans", "plain"])
async def test_spans_of_requests_and_batches_reach_the_collector(
    start_server, tmp_path: pathlib.Path, receiver: tuple[Receiver, str], monkeypatch: pytest.MonkeyPatch,
    model_spans: bool,
) -> None:
    """Batches that ran plainly travel as numeric records and become spans in the exporter;
    those whose model opened spans of its own (or that failed) travel as spans: both give
    the same tree."""
    collector, endpoint = receiver
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "aserve-under-test")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    repo = write_repository(tmp_path / "repo", {"add": (TRACED_ADD if model_spans else SLOW_ADD, ONE_AT_A_TIME)})
    server, url = await start_server(repo)
    assert server.plane.tracer is not None
    parent_trace, parent_span = random.getrandbits(128), random.getrandbits(64)
    async with aiohttp.ClientSession() as http:
        headers = {"traceparent": f"00-{parent_trace:032x}-{parent_span:016x}-01"}
        async with http.post(f"{url}/v2/models/add/infer", json=body([1, 2, 3, 4]), headers=headers) as r:
            assert r.status == 200
        # one runs, four arrive while it runs and share the next batch
        first = asyncio.ensure_future(http.post(f"{url}/v2/models/add/infer", json=body([10, 0, 0, 0])))
        batcher = server.plane.model("add").batcher
        assert batcher is not None
        await until(lambda: batcher.running == 1, what="the first batch to run")
        rest = [asyncio.ensure_future(http.post(f"{url}/v2/models/add/infer", json=body([20 + i, 0, 0, 0])))
                for i in range(4)]
        for r in [await first, *await asyncio.gather(*rest)]:
            assert r.status == 200
            r.release()
        async with http.post(f"{url}/v2/models/add/infer", json=body([-999, 0, 0, 0])) as r:
            assert r.status == 500  # the model raises on a row starting with -999
        # every record made is sent: seven requests, four batches (/metrics counts them)
        tracer = server.plane.tracer
        await until(lambda: tracer.stats()["exported"] == tracer.stats()["recorded"], what="the export")
        async with http.get(f"{url}/metrics") as r:
            samples = {s.name: s.value for f in text_string_to_metric_families(await r.text()) for s in f.samples}
        assert samples["aserve_trace_recorded_total"] == samples["aserve_trace_exported_total"] >= 7 + 4
        assert samples["aserve_trace_dropped_total"] == 0
    await server.close()
    await until(lambda: len(collector.named("POST /v2/models/{model}/infer")) == 7, timeout=60,
                what="seven request spans")

    assert collector.resources[0]["service.name"] == "aserve-under-test"
    requests = collector.named("POST /v2/models/{model}/infer")
    by_id = {s.span_id: s for s in collector.spans}
    # the caller's trace goes on
    continued = [s for s in requests if int.from_bytes(s.trace_id, "big") == parent_trace]
    assert len(continued) == 1 and int.from_bytes(continued[0].parent_span_id, "big") == parent_span
    for s in requests:
        assert s.kind == s.SPAN_KIND_SERVER
        a = attrs(s)
        assert a["http.request.method"] == "POST" and a["http.route"] == "/v2/models/{model}/infer"
        assert a["url.path"] == "/v2/models/add/infer" and a["server.address"] == "127.0.0.1"
        assert a["aserve.model"] == "add" and a["aserve.protocol"] == "v2-json"
        children = {c.name for c in collector.spans if c.parent_span_id == s.span_id and c.trace_id == s.trace_id}
        assert {"queue"} <= children
        if a["http.response.status_code"] == 200:
            assert children == {"decode", "queue", "encode"}
            assert a["aserve.batch_size"] >= 1 and a["aserve.interpreter"] == 0
            assert a["aserve.queue_us"] >= 0 and a["aserve.compute_us"] > 0
    # batches: a span each, linked to the requests they served, with the run in the interpreter inside
    batches = collector.named("batch add")
    assert max(attrs(b)["aserve.batch_size"] for b in batches) == 4  # the four that arrived together
    served = {(link.trace_id, link.span_id) for b in batches for link in b.links}
    assert served == {(s.trace_id, s.span_id) for s in requests}
    for b in batches:
        assert all(by_id[link.span_id].trace_id != b.trace_id for link in b.links)  # a trace of its own
        for link in b.links:  # each request it served carries its facts
            served_by = attrs(by_id[link.span_id])
            assert served_by["aserve.batch_size"] == attrs(b)["aserve.batch_size"] == len(b.links)
        runs = [c for c in collector.named("run in interpreter") if c.parent_span_id == b.span_id]
        if b.status.code == b.status.STATUS_CODE_ERROR:
            assert not runs and b.events[0].name == "exception"
            continue
        (run,) = runs
        assert b.start_time_unix_nano <= run.start_time_unix_nano <= run.end_time_unix_nano <= b.end_time_unix_nano
        assert attrs(run) == {"aserve.interpreter": 0, "aserve.model": "add"}
        assert attrs(b)["aserve.model"] == "add" and attrs(b)["aserve.interpreter"] == 0
        assert run.trace_id == b.trace_id and not b.parent_span_id
        if not model_spans:
            assert not collector.named("add rows")
            continue
        (model_span,) = [c for c in collector.named("add rows") if c.parent_span_id == run.span_id]
        assert attrs(model_span)["rows"] == attrs(b)["aserve.batch_samples"]
        assert run.start_time_unix_nano <= model_span.start_time_unix_nano <= model_span.end_time_unix_nano
    # the raising model: the request's span says so, with the exception
    (failed,) = [s for s in requests if attrs(s)["http.response.status_code"] == 500]
    assert failed.status.code == failed.status.STATUS_CODE_ERROR
    assert "A starts with -999" in failed.status.message
    assert failed.events[0].name == "exception"


async def test_off_unless_asked_and_sdk_disabled_wins(
    start_server, repository: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_TRACES_EXPORTER"):
        monkeypatch.delenv(name, raising=False)
    server, url = await start_server(repository)
    assert server.plane.tracer is None
    async with aiohttp.ClientSession() as http, http.get(f"{url}/v2/trace/setting") as r:
        assert (await r.json())["trace_level"] == ["OFF"]
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    server, _ = await start_server(repository)
    assert server.plane.tracer is None


async def test_trace_setting_drives_the_sampling_rate(
    start_server, repository: pathlib.Path, receiver: tuple[Receiver, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, endpoint = receiver
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    server, url = await start_server(repository)
    tracer = server.plane.tracer
    assert tracer is not None
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{url}/v2/trace/setting") as r:
            assert (await r.json())["trace_level"] == ["TIMESTAMPS"]
        async with http.post(f"{url}/v2/trace/setting", json={"trace_rate": "100"}) as r:
            assert r.status == 200 and (await r.json())["trace_rate"] == "100"
        assert tracer.ratio == pytest.approx(0.01)
        sampled = sum(tracer.start({}) is not None for _ in range(20000))
        assert 100 <= sampled <= 320  # one in a hundred
        async with http.post(f"{url}/v2/models/add/trace/setting", json={"trace_level": ["OFF"]}) as r:
            assert (await r.json())["trace_level"] == ["OFF"]
        assert tracer.start({}) is None
        async with http.post(f"{url}/v2/trace/setting", json={"trace_rate": "zero"}) as r:
            assert r.status == 400 and "trace_rate: expected a whole number >= 1" in (await r.json())["error"]


async def test_json_logs_carry_the_trace_of_the_request(
    start_server, repository: pathlib.Path, receiver: tuple[Receiver, str], monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    import json
    import logging

    from aserve import logs

    collector, endpoint = receiver
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    logs.configure("info", "json")
    try:
        server, url = await start_server(repository, access_log=True)
        # one connection: the second request, not traced, must not log the first one's trace
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as http:
            async with http.post(f"{url}/v2/models/add/infer", json=body([-999, 0, 0, 0])) as r:
                assert r.status == 500
            async with http.post(f"{url}/v2/trace/setting", json={"trace_level": ["OFF"]}) as r:
                assert r.status == 200
            async with http.post(f"{url}/v2/models/add/infer", json=body([-999, 1, 0, 0])) as r:
                assert r.status == 500
        await server.close()
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        logs.trace_ids_logged = False
    await until(lambda: bool(collector.named("POST /v2/models/{model}/infer")), what="the request span")
    (span,) = collector.named("POST /v2/models/{model}/infer")
    records = [json.loads(line) for line in capfd.readouterr().err.splitlines() if line.startswith("{")]
    failure, untraced = [r for r in records if r["logger"] == "aserve.server" and "model error" in r["message"]]
    assert failure["trace_id"] == span.trace_id.hex() and failure["span_id"] == span.span_id.hex()
    assert "trace_id" not in untraced and "span_id" not in untraced
    assert failure["level"] == "info" and failure["time"].endswith("+00:00")
    access, setting, access_untraced = [r for r in records if r["logger"] == "aserve.access"]
    assert "trace_id" not in setting and "trace_id" not in access_untraced
    assert access["status"] == 500 and access["request"] == "POST /v2/models/add/infer HTTP/1.1"
    assert access["trace_id"] == span.trace_id.hex() and access["duration_ms"] > 0  # from a slow line to its trace
    assert '"POST /v2/models/add/infer HTTP/1.1" 500' in access["message"]  # the common log format


async def test_a_front_loop_sends_what_it_recorded_before_it_closes(
    start_server, tmp_path: pathlib.Path, receiver: tuple[Receiver, str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Spans a front recorded and had not yet handed to the exporter when the server closes
    reach the collector, and the close does not wait on them past their export."""
    collector, endpoint = receiver
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "5000")  # the fronts hold their records while it closes
    server, url = await start_server(write_repository(tmp_path / "repo", {"add": (ADD_MODEL, ADD_CONFIG)}), loops=2)
    sessions = [aiohttp.ClientSession() for _ in range(4)]
    try:
        for i, s in enumerate(sessions):
            async with s.post(f"{url}/v2/models/add/infer", json=body([i, 0, 0, 0])) as r:
                assert r.status == 200
    finally:
        for s in sessions:
            await s.close()
    await asyncio.wait_for(server.close(), 30)
    await until(lambda: len(collector.named("POST /v2/models/{model}/infer")) == 4, timeout=30,
                what="the four request spans the fronts held at close")


async def test_each_front_loop_traces_the_requests_it_reads(
    start_server, tmp_path: pathlib.Path, receiver: tuple[Receiver, str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With two front loops, clients on eight connections (four on each front) each send a
    request in a trace of their own: every one is answered with its sum by the loop that read
    it, and every one's span tree reaches the collector whole, continuing its caller's trace,
    linked from the batch that served it, with the span the model opened inside the batch's
    run. The host's trace settings reach the fronts: trace_level OFF stops their sampling."""
    collector, endpoint = receiver
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    server, url = await start_server(write_repository(tmp_path / "repo", {"add": (TRACED_ADD, ADD_CONFIG)}), loops=2)
    callers = {i: (random.getrandbits(128), random.getrandbits(64)) for i in range(8)}
    sessions = [aiohttp.ClientSession() for _ in callers]

    async def call(i: int, session: aiohttp.ClientSession) -> None:
        trace, parent = callers[i]
        headers = {"traceparent": f"00-{trace:032x}-{parent:016x}-01"}
        async with session.post(f"{url}/v2/models/add/infer", json=body([i, 2 * i, 0, 0]), headers=headers) as r:
            assert r.status == 200
            assert (await r.json())["outputs"][0]["data"] == [i + 1, 2 * i + 1, 1, 1]

    async def recorded() -> float:
        async with sessions[0].get(f"{url}/metrics") as r:
            samples = {s.name: s.value for f in text_string_to_metric_families(await r.text()) for s in f.samples}
        return samples["aserve_trace_recorded_total"]

    try:
        for s in sessions:  # one connection each, handed to the front with the fewest
            async with s.get(f"{url}/v2/health/live") as r:
                assert r.status == 200
        assert [f.connections for f in server.loops.fronts] == [4, 4]
        await asyncio.gather(*(call(i, s) for i, s in enumerate(sessions)))
        # answered where they were read: no connection went to the host's loop, whose tracer recorded none
        assert (server.loops.connections, server.app.stats.connections) == (8, 0)
        assert server.plane.tracer.stats()["recorded"] == 0
        fronts = await server.loops.stats()
        assert sum(f["tracing"]["recorded"] for f in fronts) >= 8 and all(f["tracing"] for f in fronts)
        # trace_level OFF, set on the host, stops every front's sampling
        async with sessions[0].post(f"{url}/v2/trace/setting", json={"trace_level": ["OFF"]}) as r:
            assert r.status == 200
        before = await recorded()
        await asyncio.gather(*(call(i, s) for i, s in enumerate(sessions)))
        assert await recorded() == before
    finally:
        for s in sessions:
            await s.close()
    await server.close()
    await until(lambda: len(collector.named("POST /v2/models/{model}/infer")) == 8, timeout=60,
                what="eight request spans")
    requests = collector.named("POST /v2/models/{model}/infer")
    assert {(int.from_bytes(s.trace_id, "big"), int.from_bytes(s.parent_span_id, "big")) for s in requests} == set(
        callers.values())
    for s in requests:
        children = {c.name for c in collector.spans if c.parent_span_id == s.span_id and c.trace_id == s.trace_id}
        assert children == {"decode", "queue", "encode"} and attrs(s)["http.response.status_code"] == 200
        assert attrs(s)["aserve.batch_size"] >= 1 and attrs(s)["http.route"] == "/v2/models/{model}/infer"
    batches = collector.named("batch add")
    served = {(link.trace_id, link.span_id) for b in batches for link in b.links}
    assert served == {(s.trace_id, s.span_id) for s in requests}
    for b in batches:  # the run in the interpreter, and inside it the span model code opened in its context
        (run,) = [c for c in collector.named("run in interpreter") if c.parent_span_id == b.span_id]
        (model_span,) = [c for c in collector.named("add rows") if c.parent_span_id == run.span_id]
        assert model_span.trace_id == b.trace_id and attrs(model_span)["rows"] == attrs(b)["aserve.batch_samples"]
