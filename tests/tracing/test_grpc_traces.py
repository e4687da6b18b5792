"""A gRPC call's trace: `traceparent` metadata continues the caller's trace, and its server span
names the method as OpenTelemetry's RPC conventions do."""

from __future__ import annotations

import pathlib
import random

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from ..conftest import until
from ..server.conftest import ADD_CONFIG, ADD_MODEL, write_repository
from .conftest import Receiver, attrs

METHOD = "inference.GRPCInferenceService/ModelInfer"


async def test_traceparent_metadata_continues_the_trace(
    start_server, tmp_path: pathlib.Path, receiver: tuple[Receiver, str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    collector, endpoint = receiver
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    server, _ = await start_server(write_repository(tmp_path / "repo", {"add": (ADD_MODEL, ADD_CONFIG)}), grpc=True)
    tracer = server.plane.tracer
    assert tracer is not None
    parent_trace, parent_span = random.getrandbits(128), random.getrandbits(64)
    request = service_pb2.ModelInferRequest(model_name="add")
    for name in "AB":
        request.inputs.add(name=name, datatype="INT32", shape=[1, 4])
    request.raw_input_contents.extend([np.arange(4, dtype=np.int32).tobytes()] * 2)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        response = await stub.ModelInfer(request, metadata=[
            ("traceparent", f"00-{parent_trace:032x}-{parent_span:016x}-01")])
        assert np.frombuffer(response.raw_output_contents[0], np.int32).tolist() == [0, 2, 4, 6]
        await until(lambda: tracer.stats()["exported"] == tracer.stats()["recorded"] > 0, what="the export")
    await server.close()
    await until(lambda: len(collector.named(METHOD)) == 1, timeout=60, what="the call's span")
    (span,) = collector.named(METHOD)
    assert int.from_bytes(span.trace_id, "big") == parent_trace
    assert int.from_bytes(span.parent_span_id, "big") == parent_span
    a = attrs(span)
    assert (a["rpc.system"], a["rpc.service"], a["rpc.method"]) == ("grpc", "inference.GRPCInferenceService",
                                                                     "ModelInfer")
    assert a["aserve.protocol"] == "grpc" and a["aserve.model"] == "add" and a["server.address"] == "127.0.0.1"
    children = {c.name for c in collector.spans if c.parent_span_id == span.span_id}
    assert children == {"decode", "queue", "encode"}
