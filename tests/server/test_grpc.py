"""The gRPC front against a real server, with tritonclient.grpc (its asyncio client, and its
own generated messages and stub where a test needs fields the client does not expose):
health and metadata, infer with raw and typed contents, parameters, output selection,
error codes, the deadline, tokens, limits, metrics, access logs, drain."""

from __future__ import annotations

import asyncio
import logging
import pathlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import grpc
import numpy as np
import pytest
import tritonclient.grpc.aio as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from ..conftest import until
from .conftest import MODELS, logged


@pytest.fixture
async def grpc_server(start_server, repository: pathlib.Path) -> AsyncIterator[tuple[Any, str]]:
    server, url = await start_server(repository, grpc=True)
    yield server, url


def target(server: Any) -> str:
    return f"127.0.0.1:{server.grpc_port}"


@pytest.fixture
async def client(grpc_server: tuple[Any, str]) -> AsyncIterator[grpcclient.InferenceServerClient]:
    c = grpcclient.InferenceServerClient(target(grpc_server[0]))
    yield c
    await c.close()


@pytest.fixture
async def stub(grpc_server: tuple[Any, str]) -> AsyncIterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    """tritonclient's generated stub over a plain grpc.aio channel (trailers, raw messages)."""
    async with grpc.aio.insecure_channel(target(grpc_server[0])) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def running(server: Any, model: str) -> int:
    """Batches of `model` running in its interpreters now, whichever loop queued them."""
    handle = server.plane.model(model)
    return sum(key == handle.key for _, key, _ in handle.pool.running_jobs())


async def counted(stub: service_pb2_grpc.GRPCInferenceServiceStub, model: str) -> tuple[int, int, int]:
    """(successes, failures, batches run) of `model`, as its statistics count them over every loop."""
    (stats,) = (await stub.ModelStatistics(service_pb2.ModelStatisticsRequest(name=model))).model_stats
    return stats.inference_stats.success.count, stats.inference_stats.fail.count, stats.execution_count


async def queued(url: str, model: str) -> float:
    """Requests of `model` waiting in its queue now, over every loop (/metrics)."""
    from .test_metrics import scrape, value

    async with aiohttp.ClientSession() as http:
        return value(await scrape(http, url), "aserve_queue_requests", model=model)


def add_inputs(a: np.ndarray, b: np.ndarray) -> list[grpcclient.InferInput]:
    inputs = []
    for name, value in (("A", a), ("B", b)):
        i = grpcclient.InferInput(name, list(value.shape), "INT32")
        i.set_data_from_numpy(value)
        inputs.append(i)
    return inputs


def wrap32(x: np.ndarray) -> np.ndarray:
    return ((x.astype(np.int64) + 2**31) % 2**32 - 2**31).astype(np.int32)


def slow_request(ms: float, **parameters: int) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="slow")
    tensor = request.inputs.add(name="MS", datatype="FP32", shape=[1])
    tensor.contents.fp32_contents.append(ms)
    for key, value in parameters.items():
        request.parameters[key].int64_param = value
    return request


async def test_health_and_metadata(client: grpcclient.InferenceServerClient) -> None:
    assert await client.is_server_live() and await client.is_server_ready()
    assert await client.is_model_ready("add") and await client.is_model_ready("add", "1")
    meta = await client.get_server_metadata(as_json=True)
    assert meta["name"] == "aserve" and "statistics" in meta["extensions"]
    model = await client.get_model_metadata("add", as_json=True)
    assert model["name"] == "add" and model["versions"] == ["1"] and model["platform"] == "aserve"
    assert [(t["name"], t["datatype"], t["shape"]) for t in model["inputs"]] == [
        ("A", "INT32", ["-1", "4"]), ("B", "INT32", ["-1", "4"])]  # int64 as JSON strings (protobuf's JSON)
    assert [t["name"] for t in model["outputs"]] == ["SUM", "DIFF"]
    with pytest.raises(InferenceServerException) as info:
        await client.is_model_ready("absent")
    assert info.value.status() == "StatusCode.NOT_FOUND" and "absent" in info.value.message()


async def test_infer_raw_contents(client: grpcclient.InferenceServerClient) -> None:
    rng = np.random.default_rng(1)
    a = rng.integers(-2**31, 2**31, (3, 4), dtype=np.int64).astype(np.int32)
    b = rng.integers(-2**31, 2**31, (3, 4), dtype=np.int64).astype(np.int32)
    result = await client.infer("add", add_inputs(a, b), request_id="r-7")
    np.testing.assert_array_equal(result.as_numpy("SUM"), wrap32(a.astype(np.int64) + b))
    np.testing.assert_array_equal(result.as_numpy("DIFF"), wrap32(a.astype(np.int64) - b))
    response = result.get_response()
    assert response.id == "r-7" and response.model_name == "add" and response.model_version == "1"
    assert len(response.raw_output_contents) == 2  # as Triton answers
    # output selection: one output, by name
    only = await client.infer("add", add_inputs(a, b), outputs=[grpcclient.InferRequestedOutput("DIFF")])
    assert [o.name for o in only.get_response().outputs] == ["DIFF"]
    np.testing.assert_array_equal(only.as_numpy("DIFF"), wrap32(a.astype(np.int64) - b))
    # BYTES in and out
    text = np.array([[b"ab", "é".encode()], [b"", b"xyz"]], dtype=np.object_)
    t = grpcclient.InferInput("TEXT", [2, 2], "BYTES")
    t.set_data_from_numpy(text)
    upper = await client.infer("upper", [t])
    assert upper.as_numpy("UPPER").tolist() == [[v.upper() for v in row] for row in text.tolist()]
    np.testing.assert_array_equal(upper.as_numpy("LENGTH"), [[len(v) for v in row] for row in text.tolist()])


async def test_infer_typed_contents_and_parameters(stub: service_pb2_grpc.GRPCInferenceServiceStub) -> None:
    a = np.array([[1, -2, 3, 2**31 - 1], [5, 6, 7, 8]], np.int32)
    b = np.array([[10, 20, 30, 1], [0, 0, 0, 0]], np.int32)
    request = service_pb2.ModelInferRequest(model_name="add", id="typed")
    for name, value in (("A", a), ("B", b)):
        tensor = request.inputs.add(name=name, datatype="INT32", shape=list(value.shape))
        tensor.contents.int_contents.extend(value.ravel().tolist())
    # typed answers: no output asks for raw data
    request.parameters["binary_data_output"].bool_param = False
    request.parameters["latency_budget_ms"].int64_param = 1000
    response = await stub.ModelInfer(request)
    assert response.id == "typed" and not response.raw_output_contents
    by_name = {o.name: o for o in response.outputs}
    assert list(by_name["SUM"].shape) == [2, 4]
    assert list(by_name["SUM"].contents.int_contents) == wrap32(a.astype(np.int64) + b).ravel().tolist()
    assert list(by_name["DIFF"].contents.int_contents) == (a - b).ravel().tolist()
    # classification of one output (Triton's extension): its top 2 per row, typed as BYTES
    request.ClearField("parameters")
    wanted = request.outputs.add(name="SUM")
    wanted.parameters["classification"].int64_param = 2
    wanted.parameters["binary_data"].bool_param = False
    response = await stub.ModelInfer(request)
    (out,) = response.outputs
    assert out.datatype == "BYTES" and list(out.shape) == [2, 2]
    sums = wrap32(a.astype(np.int64) + b)
    expected = []
    for row in sums:
        order = sorted(range(4), key=lambda i: (-int(row[i]), i))[:2]
        expected += [f"{int(row[i])}:{i}".encode() for i in order]
    assert list(out.contents.bytes_contents) == expected
    # FP32 typed contents in, raw out (the default)
    response = await stub.ModelInfer(slow_request(1.5))
    assert np.frombuffer(response.raw_output_contents[0], np.float32).tolist() == [1.5]


async def code_of(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value


async def test_bad_input_and_unknown_model(stub: service_pb2_grpc.GRPCInferenceServiceStub) -> None:
    def add(shape_a: list[int], data_a: bytes, shape_b: list[int] | None = None,
            data_b: bytes | None = None) -> service_pb2.ModelInferRequest:
        request = service_pb2.ModelInferRequest(model_name="add")
        request.inputs.add(name="A", datatype="INT32", shape=shape_a)
        request.inputs.add(name="B", datatype="INT32", shape=shape_b or shape_a)
        request.raw_input_contents.extend([data_a, data_b if data_b is not None else data_a])
        return request

    cases = [
        (add([1, 4], bytes(12)), "raw_input_contents[0]: INT32 [1, 4] needs 16 bytes, got 12"),
        (add([1, 3], bytes(12)), "inputs[0].shape"),
        (add([9, 4], bytes(144)), "batch size"),
        (add([1, -4], bytes(16)), "inputs[0].shape: expected dimensions >= 0"),
    ]
    one = add([1, 4], bytes(16))
    del one.raw_input_contents[1]
    cases.append((one, "raw_input_contents: expected one entry per input (2), got 1"))
    typed = service_pb2.ModelInferRequest(model_name="add")
    for name in "AB":
        typed.inputs.add(name=name, datatype="INT32", shape=[1, 4]).contents.fp32_contents.extend([1.0] * 4)
    cases.append((typed, ("inputs[0].contents.fp32_contents: input 'A' is INT32: its elements go in "
                          "contents.int_contents")))
    for request, words in cases:
        error = await code_of(stub.ModelInfer(request))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
        assert words in error.details(), error.details()
    error = await code_of(stub.ModelInfer(service_pb2.ModelInferRequest(model_name="absent")))
    assert error.code() == grpc.StatusCode.NOT_FOUND and "absent" in error.details()
    error = await code_of(stub.ModelInfer(service_pb2.ModelInferRequest(model_name="add", model_version="9")))
    assert error.code() == grpc.StatusCode.NOT_FOUND


async def test_model_error_is_internal_with_an_error_id(start_server, repository: pathlib.Path,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    server, _ = await start_server(repository, grpc=True, expose_model_errors=False, log_level="info")
    async with grpc.aio.insecure_channel(target(server)) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = service_pb2.ModelInferRequest(model_name="add")
        for name in "AB":
            request.inputs.add(name=name, datatype="INT32", shape=[1, 4])
        request.raw_input_contents.extend([np.array([-999, 0, 0, 0], np.int32).tobytes(), bytes(16)])
        with caplog.at_level(logging.INFO, logger="aserve.server"):
            error = await code_of(stub.ModelInfer(request))
            assert error.code() == grpc.StatusCode.INTERNAL
            trailers = dict(error.trailing_metadata() or ())
            error_id = trailers["error-id"]
            assert error.details() == f"model 'add' version 1 failed (error id {error_id})"  # no internals
            await logged(caplog, where=lambda r: error_id in r.getMessage() and "A starts with -999" in r.getMessage(),
                         what="the failure's log record, with its error id")


async def test_deadline_reaches_the_batcher(grpc_server: tuple[Any, str],
                                            stub: service_pb2_grpc.GRPCInferenceServiceStub) -> None:
    server, _ = grpc_server
    slow = asyncio.ensure_future(stub.ModelInfer(slow_request(600)))
    await until(lambda: running(server, "slow") == 1, what="the slow request to run")
    # queued behind it with a 100 ms deadline: it never runs, and the client hears DEADLINE_EXCEEDED
    error = await code_of(stub.ModelInfer(slow_request(1), timeout=0.1))
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    await slow
    # one answered, one failed (timed out, or cancelled as its client left), one batch: the expired one never ran
    async def settled() -> bool:  # the failure is counted as its loop sees it end
        return await counted(stub, "slow") == (1, 1, 1)

    await until(settled, what="one request answered, one failed, one batch run")
    # the request's own timeout parameter (microseconds) also shortens the deadline
    slow = asyncio.ensure_future(stub.ModelInfer(slow_request(300)))
    await until(lambda: running(server, "slow") == 1, what="the slow request to run")
    error = await code_of(stub.ModelInfer(slow_request(1, timeout=50_000)))
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED and "timed out" in error.details()
    await slow


@pytest.mark.parametrize("compression", [grpc.Compression.Gzip, grpc.Compression.Deflate])
async def test_compressed_messages_are_inflated_within_the_body_limits(start_server, repository: pathlib.Path,
                                                                      compression: grpc.Compression) -> None:
    """A client that compresses its messages (grpc's gzip or deflate) is answered as one that
    does not; a message that inflates past --max-body-bytes is RESOURCE_EXHAUSTED, as its
    uncompressed self would be."""
    server, _ = await start_server(repository, grpc=True, max_body_bytes=4096)
    async with grpc.aio.insecure_channel(target(server), compression=compression) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = service_pb2.ModelInferRequest(model_name="add")
        for name in "AB":
            request.inputs.add(name=name, datatype="INT32", shape=[1, 4])
            request.raw_input_contents.append(np.arange(4, dtype=np.int32).tobytes())
        response = await stub.ModelInfer(request)
        assert np.frombuffer(response.raw_output_contents[0], np.int32).tolist() == [0, 2, 4, 6]
        stream = stub.ModelStreamInfer()
        await stream.write(request)
        assert not (await stream.read()).error_message
        await stream.done_writing()
        big = service_pb2.ModelInferRequest(model_name="upper")
        big.inputs.add(name="TEXT", datatype="BYTES", shape=[1, 1])
        big.raw_input_contents.append((8000).to_bytes(4, "little") + bytes(8000))  # compresses to little
        error = await code_of(stub.ModelInfer(big))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error


async def test_a_call_its_client_cancels_leaves_the_queue(grpc_server: tuple[Any, str],
                                                          stub: service_pb2_grpc.GRPCInferenceServiceStub) -> None:
    """A ModelInfer queued behind a running one, cancelled by its client: it leaves the model's
    queue (it never runs), and the gRPC counter says CANCELLED once; the server goes on."""
    server, url = grpc_server
    slow = asyncio.ensure_future(stub.ModelInfer(slow_request(400)))
    await until(lambda: running(server, "slow") == 1, what="the slow request to run")
    waiting = stub.ModelInfer(slow_request(1))

    async def one_queued() -> bool:
        return await queued(url, "slow") == 1

    await until(one_queued, what="the second request to wait")
    waiting.cancel()

    async def none_queued() -> bool:
        return await queued(url, "slow") == 0

    await until(none_queued, what="the cancelled request to leave the queue")
    await slow

    async def cancelled() -> bool:  # gRPC's own counter, over every loop
        from .test_metrics import scrape, value

        async with aiohttp.ClientSession() as http:
            return value(await scrape(http, url), "aserve_grpc_requests_total", method="ModelInfer",
                         code="CANCELLED") == 1

    await until(cancelled, what="the cancelled call counted")

    async def settled() -> bool:  # one answered, one failed as its client left, one batch: it never ran
        return await counted(stub, "slow") == (1, 1, 1)

    await until(settled, what="one request answered, one cancelled, one batch run")


async def test_overload_is_unavailable_with_retry_advice(grpc_server: tuple[Any, str],
                                                         stub: service_pb2_grpc.GRPCInferenceServiceStub) -> None:
    server, url = grpc_server
    slow = asyncio.ensure_future(stub.ModelInfer(slow_request(1000)))
    await until(lambda: running(server, "slow") == 1, what="the slow request to run")
    waiting = [asyncio.ensure_future(stub.ModelInfer(slow_request(1))) for _ in range(2)]

    async def two_queued() -> bool:
        return await queued(url, "slow") == 2

    await until(two_queued, what="two requests queued")
    error = await code_of(stub.ModelInfer(slow_request(1)))
    assert not slow.done()
    assert error.code() == grpc.StatusCode.UNAVAILABLE and "max_queue_size 2" in error.details()
    pushback = dict(error.trailing_metadata() or ())["grpc-retry-pushback-ms"]
    assert int(pushback) >= 1
    await asyncio.gather(slow, *waiting)


async def test_tokens_from_authorization_metadata(start_server, repository: pathlib.Path) -> None:
    server, _ = await start_server(repository, grpc=True, api_token="api-secret", admin_token="admin-secret")
    async with grpc.aio.insecure_channel(target(server)) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = service_pb2.ModelMetadataRequest(name="add")
        error = await code_of(stub.ModelMetadata(request))
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED and "authorization" in error.details()
        error = await code_of(stub.ModelMetadata(request, metadata=[("authorization", "Bearer wrong")]))
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED
        assert (await stub.ModelMetadata(request, metadata=[("authorization", "Bearer api-secret")])).name == "add"
        # health stays open; the repository takes the admin token only
        assert (await stub.ServerLive(service_pb2.ServerLiveRequest())).live
        index = service_pb2.RepositoryIndexRequest()
        error = await code_of(stub.RepositoryIndex(index, metadata=[("authorization", "Bearer api-secret")]))
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED
        listed = await stub.RepositoryIndex(index, metadata=[("authorization", "Bearer admin-secret")])
        assert {m.name for m in listed.models} == set(MODELS)
    # tritonclient sends it as headers
    client = grpcclient.InferenceServerClient(target(server))
    try:
        a = np.ones((1, 4), np.int32)
        result = await client.infer("add", add_inputs(a, a), headers={"authorization": "Bearer api-secret"})
        np.testing.assert_array_equal(result.as_numpy("SUM"), 2 * a)
    finally:
        await client.close()


async def test_message_size_limit_matches_http(start_server, repository: pathlib.Path) -> None:
    server, _ = await start_server(repository, grpc=True, max_body_bytes=1000, max_header_bytes=1024)
    async with grpc.aio.insecure_channel(target(server)) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = service_pb2.ModelInferRequest(model_name="upper")
        request.inputs.add(name="TEXT", datatype="BYTES", shape=[1, 2])
        request.raw_input_contents.append((600).to_bytes(4, "little") + bytes(600) + (600).to_bytes(4, "little")
                                          + bytes(600))
        error = await code_of(stub.ModelInfer(request))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        request.raw_input_contents[0] = (2).to_bytes(4, "little") + b"ab" + (1).to_bytes(4, "little") + b"c"
        response = await stub.ModelInfer(request)
        assert response.raw_output_contents[0] == (2).to_bytes(4, "little") + b"AB" + (1).to_bytes(4, "little") + b"C"
        # metadata larger in all than --max-header-bytes
        error = await code_of(stub.ModelInfer(request, metadata=[("x-large", "v" * 1100)]))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert (await stub.ModelInfer(request, metadata=[("x-small", "v" * 100)])).raw_output_contents


async def test_metrics_and_access_log_name_the_protocol(start_server, repository: pathlib.Path, http: Any,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    server, url = await start_server(repository, grpc=True, access_log=True, log_level="info")
    caplog.set_level(logging.INFO, logger="aserve.access")
    async with grpc.aio.insecure_channel(target(server)) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for _ in range(3):
            await stub.ModelInfer(slow_request(0))
        await code_of(stub.ModelInfer(service_pb2.ModelInferRequest(model_name="absent")))
    async with http.get(f"{url}/v2/health/live") as r:
        assert r.status == 200
    body = {"inputs": [{"name": "MS", "datatype": "FP32", "shape": [1], "data": [0.0]}]}
    async with http.post(f"{url}/v2/models/slow/infer", json=body) as r:
        assert r.status == 200
    async with http.get(f"{url}/metrics") as r:
        text = await r.text()
    assert 'aserve_inference_request_protocol_total{model="slow",version="1",protocol="grpc"} 3' in text
    assert 'aserve_inference_request_protocol_total{model="slow",version="1",protocol="http"} 1' in text
    assert 'aserve_grpc_requests_total{method="ModelInfer",code="OK"} 3' in text
    assert 'aserve_grpc_requests_total{method="ModelInfer",code="NOT_FOUND"} 1' in text
    assert 'aserve_inference_request_success_total{model="slow",version="1"} 4' in text
    rpc = [r for r in caplog.records if getattr(r, "protocol", None) == "grpc"]
    assert [r.grpc_status for r in rpc] == ["OK", "OK", "OK", "NOT_FOUND"]  # type: ignore[attr-defined]
    assert rpc[0].request == "POST /inference.GRPCInferenceService/ModelInfer HTTP/2"  # type: ignore[attr-defined]
    assert rpc[0].remote == "127.0.0.1" and rpc[-1].status == grpc.StatusCode.NOT_FOUND.value[0]  # type: ignore
    http_lines = await logged(caplog, 2, lambda r: getattr(r, "protocol", None) == "http"
                              and r.request != "GET /metrics HTTP/1.1", "two HTTP access lines")  # type: ignore[attr-defined]
    assert [r.request for r in http_lines] == [  # type: ignore[attr-defined]
        "GET /v2/health/live HTTP/1.1", "POST /v2/models/slow/infer HTTP/1.1"]


async def test_drain_and_shutdown_answer_what_was_accepted(grpc_server: tuple[Any, str]) -> None:
    server, _ = grpc_server
    async with grpc.aio.insecure_channel(target(server)) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        server.drain()
        assert not (await stub.ServerReady(service_pb2.ServerReadyRequest())).ready
        accepted = asyncio.ensure_future(stub.ModelInfer(slow_request(300)))
        await until(lambda: running(server, "slow") == 1, what="the accepted request to run")
        closing = asyncio.ensure_future(server.close())
        response = await accepted
        assert np.frombuffer(response.raw_output_contents[0], np.float32).tolist() == [300.0]
        await closing
        error = await code_of(stub.ServerLive(service_pb2.ServerLiveRequest(), timeout=5))
        assert error.code() == grpc.StatusCode.UNAVAILABLE


async def test_shutdown_ends_open_streams_after_their_answers(start_server, repository: pathlib.Path) -> None:
    """A health Watch and a ModelStreamInfer left open by their clients do not hold the
    shutdown for its whole timeout: the stream answers the request it took, then both end."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    server, _ = await start_server(repository, grpc=True, shutdown_timeout_s=30)
    async with grpc.aio.insecure_channel(target(server)) as channel:
        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""))
        assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
        stream = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer()
        request = slow_request(300)
        request.id = "in-flight"
        await stream.write(request)
        await until(lambda: running(server, "slow") == 1, what="the stream's request to run")
        loop = asyncio.get_running_loop()
        began = loop.time()
        await server.close()
        assert loop.time() - began < 10  # not the 30 s timeout
        answer = await stream.read()
        assert answer.error_message == "" and answer.infer_response.id == "in-flight"
        assert np.frombuffer(answer.infer_response.raw_output_contents[0], np.float32).tolist() == [300.0]
        assert await stream.read() == grpc.aio.EOF
        assert await stream.code() == grpc.StatusCode.OK
        assert (await watch.read()).status == health_pb2.HealthCheckResponse.NOT_SERVING
        assert await watch.read() == grpc.aio.EOF
