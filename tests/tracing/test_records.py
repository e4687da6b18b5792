"""What the loop records travels to the exporter as numbers and comes out as the same spans
as the ones recorded whole: the recorder's message, the exporter's conversion and the
native OTLP encoder, read back with opentelemetry-proto."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from aserve._native import otlp_encode
from aserve.dataplane.plane import end_trace, start_trace
from aserve.inference import InferCall
from aserve.protocol import V2
from aserve.server.spans import http_span
from aserve.tracing import Resolved, Tracer, recorder
from aserve.tracing.batches import trace_batch
from aserve.tracing.exporter import TraceExporter

from .test_traces import attrs


def _exporter() -> TraceExporter:
    """The exporter's encoding half, with no OTLP client."""
    exporter = TraceExporter.__new__(TraceExporter)
    exporter._tables = {}
    exporter._encode = otlp_encode
    exporter._resource, exporter._version = {"service.name": "t"}, "0"
    return exporter


def _export(tracer: Tracer, exporter: TraceExporter | None = None) -> list[Any]:
    """Flush the tracer into one message and pass it through the exporter's conversion and encoder."""
    messages: list[bytes] = []

    def export(payload: bytes) -> asyncio.Future[Any]:
        messages.append(payload)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        future.set_result(0)
        return future

    tracer._export = export
    tracer.flush()
    exporter = exporter or _exporter()
    spans: list[Any] = []
    for m in messages:
        encoded = exporter.encode(msgspec.msgpack.decode(m))
        request = trace_service_pb2.ExportTraceServiceRequest()
        request.ParseFromString(encoded)
        spans += [s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]
    return spans


async def _one_request(tracer: Tracer, host: str, status: int, error: BaseException | None) -> Any:
    call = InferCall(codec=V2, model="add", content_type="application/json", route="/v2/models/{model}/infer",
                     host=host, describe=http_span)
    trace = start_trace(tracer, call)
    assert trace is not None
    trace.decode = (trace.start + 10, trace.start + 20)
    request = SimpleNamespace(trace=trace, arrival=0.0)  # what tracing reads of a queued request
    trace_batch(tracer, "add", [request], 2, 0.0, (1, 5, 9, None), None)  # numbers only: no model spans
    trace.encode = (trace.start + 30, trace.start + 40)
    end_trace(trace, call, error)
    return trace


@pytest.mark.parametrize("table", ["numbers", "full-table"])
async def test_records_become_the_spans_recorded_whole(table: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if table == "full-table":  # a client sending a new Host name each time: its requests travel as spans
        monkeypatch.setattr(recorder, "MAX_ROUTES", 0)
    tracer = Tracer(Resolved(sampler="always_on", ratio=1.0, exporter_env={}))
    ok = await _one_request(tracer, "127.0.0.1:8000", 200, None)
    assert tracer.core.records[0] == (1 if table == "numbers" else 0)
    spans = _export(tracer)
    by_name: dict[str, list[Any]] = {}
    for s in spans:
        by_name.setdefault(s.name, []).append(s)
    (server,) = by_name["POST /v2/models/{model}/infer"]
    assert int.from_bytes(server.trace_id, "big") == ok.trace_id and server.kind == server.SPAN_KIND_SERVER
    a = attrs(server)
    assert a["http.response.status_code"] == 200 and a["server.address"] == "127.0.0.1" and a["server.port"] == 8000
    assert a["aserve.model"] == "add" and a["aserve.batch_size"] == 1 and a["aserve.batch_samples"] == 2
    assert a["aserve.interpreter"] == 1 and a["aserve.queue_us"] >= 0 and a["aserve.compute_us"] >= 0
    children = {s.name: s for s in spans if s.parent_span_id == server.span_id}
    assert set(children) == {"decode", "queue", "encode"}
    assert children["decode"].end_time_unix_nano - children["decode"].start_time_unix_nano == 10
    (batch,) = by_name["batch add"]
    assert [(int.from_bytes(link.trace_id, "big"), link.span_id) for link in batch.links] == [
        (ok.trace_id, server.span_id)]
    (run,) = by_name["run in interpreter"]
    assert run.parent_span_id == batch.span_id and attrs(run) == {"aserve.interpreter": 1, "aserve.model": "add"}
    assert run.start_time_unix_nano == tracer.to_epoch(5) and run.end_time_unix_nano == tracer.to_epoch(9)


async def test_a_failed_request_travels_as_a_span_with_its_exception() -> None:
    tracer = Tracer(Resolved(sampler="always_on", ratio=1.0, exporter_env={}))
    await _one_request(tracer, "localhost", 500, RuntimeError("boom"))
    assert tracer.core.records[:2] == (0, 1)  # the request went as a span
    spans = _export(tracer)
    (server,) = [s for s in spans if s.name == "POST /v2/models/{model}/infer"]
    assert server.status.code == server.status.STATUS_CODE_ERROR and "boom" in server.status.message
    assert server.events[0].name == "exception" and attrs(server)["http.response.status_code"] == 500
    assert attrs(server)["aserve.batch_size"] == 1  # the batch's facts, as on a request recorded in numbers


async def test_records_beyond_the_queue_limit_are_dropped_and_counted() -> None:
    tracer = Tracer(Resolved(sampler="always_on", ratio=1.0, exporter_env={}), max_queue=2)
    await _one_request(tracer, "localhost", 200, None)  # a batch and a request: the queue is full
    second = await _one_request(tracer, "localhost", 200, None)
    assert tracer.core.records[:2] == (1, 1) and tracer.stats() == {"recorded": 2, "exported": 0, "dropped": 2}
    assert second.batch[0] == 1 and second.queue[1] > 0  # the request still got its batch's facts
    assert len(_export(tracer)) == 4 + 2  # the first request's four spans, its batch's two
    assert tracer.core.pending == 0
    await _one_request(tracer, "localhost", 200, None)  # room again
    assert tracer.core.records[:2] == (1, 1)


async def test_each_loops_table_stays_its_own_in_the_one_exporter() -> None:
    """The host's tracer and a front's each number their table of route attributes from 0 and
    send each entry once; the exporter keeps the tables apart, so every request span carries
    the attributes of the loop that recorded it, in the first export and in later ones."""
    exporter = _exporter()
    host = Tracer(Resolved(sampler="always_on", ratio=1.0, exporter_env={}))
    front = Tracer(Resolved(sampler="always_on", ratio=1.0, exporter_env={}), source=1)
    for order in ((host, front), (front, host)):  # the second time, neither sends its entry again
        await _one_request(host, "host-a:8000", 200, None)
        await _one_request(front, "front-b:8000", 200, None)
        spans = [s for t in order for s in _export(t, exporter) if s.name == "POST /v2/models/{model}/infer"]
        assert [attrs(s)["server.address"] for s in spans] == ["host-a" if t is host else "front-b" for t in order]


async def test_an_exporter_that_is_gone_drops_records_and_never_fails_a_request() -> None:
    tracer = Tracer(Resolved(sampler="always_on", ratio=1.0, exporter_env={"OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "2"}))

    def closed(payload: bytes) -> asyncio.Future[Any]:
        raise RuntimeError("the exporter's interpreter is closed")

    tracer._export = closed
    await _one_request(tracer, "localhost", 200, None)  # its second record fills a batch: the export fails inside
    assert tracer.stats() == {"recorded": 2, "exported": 0, "dropped": 2} and tracer.core.pending == 0
    tracer._export = None  # back: the route table the failed export did not carry goes with the next one
    assert tracer._table_sent == 0


def test_a_span_travels_as_the_msgpack_array_the_encoder_reads() -> None:
    fields = [1, 2, 3, 0, False, "batch m", recorder.INTERNAL, 10, 20, {"aserve.model": "m"}, recorder.UNSET, "",
              [["stage 1 done", 15, {"aserve.stage": 1}]], [[1, 2, 5, None]], "vendor=x"]
    span = recorder.Span(*fields[:12], [("stage 1 done", 15, {"aserve.stage": 1})], [(1, 2, 5, None)], "vendor=x")
    assert msgspec.msgpack.encode(span) == msgspec.msgpack.encode(fields)
    request = recorder.RequestSpan(*fields, 1, 2, 3, 4, 5, 6)
    assert msgspec.msgpack.encode(request) == msgspec.msgpack.encode([*fields, 1, 2, 3, 4, 5, 6])


def test_sequence_attributes_and_trace_state_are_encoded() -> None:
    """The OpenTelemetry API's sequence attributes become ArrayValues, and a span's W3C
    tracestate its trace_state."""
    span = recorder.Span(1, 2, 3, 0, False, "m", recorder.INTERNAL, 10, 20,
                         {"tags": ["a", "b"], "sizes": (1, 2, 3), "mixed": [1.5, True]}, recorder.UNSET, "", [], [],
                         "congo=t61rcWkgMzE")
    request = trace_service_pb2.ExportTraceServiceRequest()
    request.ParseFromString(otlp_encode({}, "aserve", "0", [msgspec.msgpack.decode(msgspec.msgpack.encode(span))]))
    (decoded,) = request.resource_spans[0].scope_spans[0].spans
    values = {a.key: [getattr(v, v.WhichOneof("value")) for v in a.value.array_value.values] for a in decoded.attributes}
    assert values == {"tags": ["a", "b"], "sizes": [1, 2, 3], "mixed": [1.5, True]}
    assert decoded.trace_state == "congo=t61rcWkgMzE"
