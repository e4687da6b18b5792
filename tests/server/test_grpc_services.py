"""The gRPC front beyond single infer calls: streaming infer, model configuration, statistics,
the repository and trace settings through tritonclient.grpc; gRPC's health service and
server reflection through their own stubs; the shipped protocol files; the flags."""

from __future__ import annotations

import asyncio
import os
import pathlib
import sys
from collections.abc import AsyncIterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc.aio as grpcclient
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from aserve.cli import build_parser, settings_from_args
from aserve.protocol.grpc import protos

from ..conftest import spawns, until
from .conftest import MODELS
from .test_grpc import add_inputs


@pytest.fixture
async def served(start_server, repository: pathlib.Path) -> AsyncIterator[tuple[Any, str]]:
    server, _ = await start_server(repository, grpc=True)
    yield server, f"127.0.0.1:{server.grpc_port}"


@pytest.fixture
async def client(served: tuple[Any, str]) -> AsyncIterator[grpcclient.InferenceServerClient]:
    c = grpcclient.InferenceServerClient(served[1])
    yield c
    await c.close()



async def test_stream_of_100_requests(served: tuple[Any, str], client: grpcclient.InferenceServerClient) -> None:
    """100 requests on one stream are batched like any others; each answer carries its id, and
    the one request that makes the model fail (a row starting with -999) fails alone."""
    rng = np.random.default_rng(7)
    sent: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    async def requests() -> AsyncIterator[dict[str, Any]]:
        for n in range(100):
            a = rng.integers(-1000, 1000, (1 + n % 3, 4), dtype=np.int32)
            if n == 41:
                a[0, 0] = -999
            b = rng.integers(-1000, 1000, a.shape, dtype=np.int32)
            sent[f"req-{n}"] = (a, b)
            yield {"model_name": "add", "inputs": add_inputs(a, b), "request_id": f"req-{n}"}

    answers: dict[str, Any] = {}
    errors: list[str] = []
    async for result, error in client.stream_infer(requests()):
        if error is not None:
            errors.append(error.message())
        else:
            answers[result.get_response().id] = result
        if len(answers) + len(errors) == 100:
            break
    assert len(errors) == 1 and "A starts with -999" in errors[0]
    assert set(answers) == set(sent) - {"req-41"}
    for request_id, result in answers.items():
        a, b = sent[request_id]
        np.testing.assert_array_equal(result.as_numpy("SUM"), a + b)
        np.testing.assert_array_equal(result.as_numpy("DIFF"), a - b)
    (stats,) = (await client.get_inference_statistics("add", as_json=True))["model_stats"]  # every loop's
    requests, batches = int(stats["inference_stats"]["success"]["count"]), int(stats["execution_count"])
    assert requests == 99 and batches < requests  # requests shared batches


async def test_stream_answers_each_failure_with_its_id(served: tuple[Any, str]) -> None:
    """Over tritonclient's own stub: an unknown model and a malformed request fail with their ids."""
    from tritonclient.grpc import service_pb2_grpc

    async with grpc.aio.insecure_channel(served[1]) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        good = service_pb2.ModelInferRequest(model_name="slow", id="good")
        good.inputs.add(name="MS", datatype="FP32", shape=[1]).contents.fp32_contents.append(2.0)
        bad = service_pb2.ModelInferRequest(model_name="slow", id="bad")
        bad.inputs.add(name="MS", datatype="FP32", shape=[2]).contents.fp32_contents.extend([1.0, 2.0])
        unknown = service_pb2.ModelInferRequest(model_name="absent", id="unknown")
        call = stub.ModelStreamInfer(iter([bad, unknown, good]))
        answers = {a.infer_response.id: a async for a in call}
    assert set(answers) == {"good", "bad", "unknown"}
    assert "inputs[0].shape" in answers["bad"].error_message
    assert "absent" in answers["unknown"].error_message
    assert answers["good"].error_message == ""
    assert np.frombuffer(answers["good"].infer_response.raw_output_contents[0], np.float32).tolist() == [2.0]


async def test_config_statistics_repository(served: tuple[Any, str], client: grpcclient.InferenceServerClient
                                            ) -> None:
    config = (await client.get_model_config("add", as_json=True))["config"]
    assert config["name"] == "add" and config["max_batch_size"] == 8
    assert [(i["name"], i["data_type"], i["dims"]) for i in config["input"]] == [
        ("A", "TYPE_INT32", ["4"]), ("B", "TYPE_INT32", ["4"])]  # without the batch dimension, as Triton
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == "2000"
    upper = (await client.get_model_config("upper", as_json=True))["config"]
    assert upper["input"][0]["data_type"] == "TYPE_STRING"

    a = np.ones((3, 4), np.int32)
    for _ in range(2):
        await client.infer("add", add_inputs(a, a))
    stats = await client.get_inference_statistics("add", as_json=True)
    (row,) = stats["model_stats"]
    assert row["name"] == "add" and row["version"] == "1"
    assert row["inference_count"] == "6" and row["inference_stats"]["success"]["count"] == "2"
    everything = await client.get_inference_statistics(as_json=True)
    assert {r["name"] for r in everything["model_stats"]} == set(MODELS)

    index = await client.get_model_repository_index(as_json=True)
    assert {(m["name"], m["state"]) for m in index["models"]} == {(name, "READY") for name in MODELS}
    await client.unload_model("upper")
    assert not await client.is_model_ready("upper")
    with pytest.raises(InferenceServerException) as info:
        await client.infer("upper", [grpcclient.InferInput("TEXT", [1, 2], "BYTES")])
    assert info.value.status() in ("StatusCode.NOT_FOUND", "StatusCode.UNAVAILABLE")
    await client.load_model("upper")
    assert await client.is_model_ready("upper")
    # a config laid over config.toml for this load
    await client.load_model("add", config='{"max_batch_size": 4}')
    assert (await client.get_model_config("add", as_json=True))["config"]["max_batch_size"] == 4
    with pytest.raises(InferenceServerException) as info:
        await client.load_model("add", config="[1]")
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT" and "parameters.config" in info.value.message()
    with pytest.raises(InferenceServerException) as info:
        await client.load_model("absent")
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"  # as HTTP answers 400
    assert "failed to load 'absent': absent: not a folder" in info.value.message()

    settings = await client.get_trace_settings(as_json=True)
    assert settings["settings"]["trace_level"]["value"] == ["OFF"]  # no tracer in this server
    with pytest.raises(InferenceServerException) as info:
        await client.update_trace_settings(settings={"trace_rate": "2"})
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT" and "tracing is off" in info.value.message()


async def test_health_service_follows_readiness(served: tuple[Any, str]) -> None:
    server, address = served
    async with grpc.aio.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        serving = health_pb2.HealthCheckResponse.SERVING
        for service in ("", "inference.GRPCInferenceService", "liveness"):
            assert (await health.Check(health_pb2.HealthCheckRequest(service=service))).status == serving
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await health.Check(health_pb2.HealthCheckRequest(service="other"))
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        watch = health.Watch(health_pb2.HealthCheckRequest(service=""))
        assert (await watch.read()).status == serving
        server.drain()  # not ready while draining: probes take the server out
        assert (await watch.read()).status == health_pb2.HealthCheckResponse.NOT_SERVING
        watch.cancel()
        check = await health.Check(health_pb2.HealthCheckRequest(service=""))
        assert check.status == health_pb2.HealthCheckResponse.NOT_SERVING
        alive = await health.Check(health_pb2.HealthCheckRequest(service="liveness"))
        assert alive.status == serving


async def test_reflection_lists_and_describes_the_service(served: tuple[Any, str]) -> None:
    async with grpc.aio.insecure_channel(served[1]) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        call = stub.ServerReflectionInfo(iter([
            reflection_pb2.ServerReflectionRequest(list_services=""),
            reflection_pb2.ServerReflectionRequest(file_containing_symbol="inference.GRPCInferenceService"),
        ]))
        listed, described = [answer async for answer in call]
    names = {s.name for s in listed.list_services_response.service}
    assert {"inference.GRPCInferenceService", "grpc.health.v1.Health",
            "grpc.reflection.v1alpha.ServerReflection"} <= names
    pool = descriptor_pool.DescriptorPool()
    for raw in described.file_descriptor_response.file_descriptor_proto:
        pool.Add(descriptor_pb2.FileDescriptorProto.FromString(raw))
    service = pool.FindServiceByName("inference.GRPCInferenceService")
    assert {"ModelInfer", "ModelStreamInfer", "ModelReady"} <= set(service.methods_by_name)
    assert service.methods_by_name["ModelInfer"].input_type.fields_by_name["raw_input_contents"].number == 7


def test_descriptor_set_is_compiled_from_the_proto(tmp_path: pathlib.Path) -> None:
    """inference.binpb is what compile.py makes of inference.proto now."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("compile_protos", protos.HERE / "compile.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.compile_descriptor_set(tmp_path / "fresh.binpb")
    fresh = descriptor_pb2.FileDescriptorSet.FromString((tmp_path / "fresh.binpb").read_bytes())
    shipped = descriptor_pb2.FileDescriptorSet.FromString(protos.DESCRIPTOR_SET.read_bytes())
    assert fresh == shipped, "inference.binpb is stale: run python src/aserve/protocol/grpc/protos/compile.py"


def test_messages_match_tritonclients() -> None:
    """Every message, field and method aserve declares has the number, type and label of
    tritonclient's generated ones (the published protocol), so the two talk on the wire."""
    from tritonclient.grpc import service_pb2 as _  # noqa: F401 - registers tritonclient's in the default pool

    theirs_pool = descriptor_pool.Default()
    ours = protos.POOL.FindFileByName("inference.proto")

    def walk(messages: Any) -> Any:
        for m in messages:
            yield m
            yield from walk(m.nested_types)

    checked = 0
    for message in walk(ours.message_types_by_name.values()):
        theirs = theirs_pool.FindMessageTypeByName(message.full_name)
        for field in message.fields:
            other = theirs.fields_by_name[field.name]
            assert (other.number, other.type, other.is_repeated) == (field.number, field.type, field.is_repeated), (
                f"{message.full_name}.{field.name}")
            checked += 1
    assert checked > 100
    service = theirs_pool.FindServiceByName(protos.SERVICE)
    for method in protos.POOL.FindServiceByName(protos.SERVICE).methods:
        other = service.methods_by_name[method.name]
        assert (other.input_type.full_name, other.output_type.full_name) == (
            method.input_type.full_name, method.output_type.full_name)
        assert (other.client_streaming, other.server_streaming) == (method.client_streaming, method.server_streaming)


def test_flags() -> None:
    def parse(*argv: str) -> Any:
        return settings_from_args(build_parser().parse_args(["serve", *argv]))

    env = os.environ.pop("ASERVE_GRPC_PORT", None)
    try:
        assert parse().grpc_port == 8001 and parse().grpc
    finally:
        if env is not None:
            os.environ["ASERVE_GRPC_PORT"] = env
    assert parse("--grpc-port", "9001").grpc_port == 9001
    assert not parse("--no-grpc").grpc


@spawns
async def test_serve_reports_the_grpc_port(repository: pathlib.Path) -> None:
    """`--port 0 --grpc-port 0`: both ports are free ones, reported in the log; `--no-grpc` serves HTTP only."""
    for extra in ([], ["--no-grpc"]):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "aserve.cli", "serve", str(repository), "--engine", "main", "--interpreters", "1",
            "--port", "0", "--grpc-port", "0", "--log-level", "info", *extra, stderr=asyncio.subprocess.PIPE,
        )
        assert proc.stderr is not None
        lines: list[str] = []
        try:
            while not any("aserve listening on http://" in line for line in lines):
                line = (await asyncio.wait_for(proc.stderr.readline(), 60)).decode()
                assert line, "".join(lines)
                lines.append(line)
            if extra:
                assert not any("gRPC" in line for line in lines)
                continue
            while not any("aserve listening for gRPC on 127.0.0.1:" in line for line in lines):  # once it listens
                line = (await asyncio.wait_for(proc.stderr.readline(), 60)).decode()
                assert line, "".join(lines)
                lines.append(line)
            line = next(line for line in lines if "aserve listening for gRPC on 127.0.0.1:" in line)
            port = int(line.rsplit(":", 1)[1])
            assert port != 8001
            client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
            try:
                assert await client.is_server_live()
                await until(client.is_server_ready, what="the models to load", every=0.05)
            finally:
                await client.close()
        finally:
            proc.terminate()
            assert await asyncio.wait_for(proc.wait(), 60) == 0


@spawns
async def test_a_grpc_port_in_use_is_an_error_at_start(repository: pathlib.Path) -> None:
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "aserve.cli", "serve", str(repository), "--engine", "main", "--interpreters", "1",
            "--port", "0", "--grpc-port", str(port), stderr=asyncio.subprocess.PIPE,
        )
        _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 1, err.decode()
    assert f"aserve: cannot listen on 127.0.0.1:{port}: the gRPC front cannot bind it" in err.decode()


async def test_the_synchronous_tritonclient_grpc(served: tuple[Any, str]) -> None:
    """tritonclient.grpc's classic client (blocking calls, a stream with a callback), from a thread
    of its own as an application would use it."""
    import queue

    import tritonclient.grpc as sync_client

    def use() -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
        client = sync_client.InferenceServerClient(served[1])
        try:
            assert client.is_server_ready() and client.is_model_ready("add")
            a = np.arange(8, dtype=np.int32).reshape(2, 4)
            inputs = [sync_client.InferInput("A", [2, 4], "INT32"), sync_client.InferInput("B", [2, 4], "INT32")]
            inputs[0].set_data_from_numpy(a)
            inputs[1].set_data_from_numpy(a * 10)
            result = client.infer("add", inputs, outputs=[sync_client.InferRequestedOutput("SUM")])
            sums = [result.as_numpy("SUM")]
            answers: queue.Queue[Any] = queue.Queue()
            client.start_stream(callback=lambda result, error: answers.put((result, error)))
            for n in range(10):
                row = np.full((1, 4), n, np.int32)
                inputs[0].set_shape([1, 4])
                inputs[1].set_shape([1, 4])
                inputs[0].set_data_from_numpy(row)
                inputs[1].set_data_from_numpy(row * 2)
                client.async_stream_infer("add", inputs, request_id=str(n))
            by_id = {}
            for _ in range(10):
                result, error = answers.get(timeout=30)
                assert error is None, error
                by_id[result.get_response().id] = result.as_numpy("SUM")
            client.stop_stream()
            return sums, by_id
        finally:
            client.close()

    sums, by_id = await asyncio.to_thread(use)
    a = np.arange(8, dtype=np.int32).reshape(2, 4)
    np.testing.assert_array_equal(sums[0], a + a * 10)
    assert sorted(by_id, key=int) == [str(n) for n in range(10)]
    for request_id, total in by_id.items():  # each answer is its own request's: n + 2n
        np.testing.assert_array_equal(total, np.full((1, 4), 3 * int(request_id), np.int32))


@spawns
async def test_serving_grpc_starts_no_thread_of_grpcs(repository: pathlib.Path) -> None:
    """`aserve serve` with two front loops answers unary calls and a stream over gRPC, and its
    process holds no thread grpc's core makes (its event engine's, its timer's; one a loop's
    thread starts takes that thread's name): the gRPC front's HTTP/2 runs on the loops
    themselves. A thread created in a front's link-map namespace and exiting there is what
    DESIGN's glibc facts warn against."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "aserve.cli", "serve", str(repository), "--loops", "2", "--interpreters", "1",
        "--port", "0", "--grpc-port", "0", "--log-level", "info", stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stderr is not None
    lines: list[str] = []
    try:
        while not any("aserve listening for gRPC on 127.0.0.1:" in line for line in lines):
            line = (await asyncio.wait_for(proc.stderr.readline(), 60)).decode()
            assert line, "".join(lines)
            lines.append(line)
        port = int(next(x for x in lines if "aserve listening for gRPC on" in x).rsplit(":", 1)[1])
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        try:
            await until(client.is_server_ready, what="the models to load", every=0.05)
            a = np.arange(4, dtype=np.int32).reshape(1, 4)
            for _ in range(8):  # connections spread over both fronts
                result = await client.infer("add", add_inputs(a, a))
                np.testing.assert_array_equal(result.as_numpy("SUM"), 2 * a)
        finally:
            await client.close()
        tasks = pathlib.Path(f"/proc/{proc.pid}/task")
        names = sorted((t / "comm").read_text().strip() for t in tasks.iterdir())
        assert sum(name.startswith("aserve-loop") for name in names) == 2, names
        grpcs = [name for name in names if name in ("event_engine", "grpc_global_tim", "lifeguard")]
        assert grpcs == [], names
    finally:
        proc.terminate()
        assert await asyncio.wait_for(proc.wait(), 60) == 0
