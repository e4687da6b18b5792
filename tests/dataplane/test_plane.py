"""The data plane without HTTP: decode against a schema, infer, read the typed response."""

from __future__ import annotations

import array
import asyncio
import json
import pathlib
import sys

import pytest

from aserve.config import ServerSettings
from aserve.dataplane import DataPlane
from aserve.errors import InvalidInput, ModelNotFound, ModelNotReady, RequestTimeout
from aserve.inference import InferRequest
from aserve.protocol import decode_infer, decode_predict
from aserve.tensor import Tensor

from ..conftest import until
from ..server.conftest import MODELS, write_repository

ENGINES = ["main", "private"] + (["subinterp"] if sys.version_info >= (3, 12) else [])

BROKEN = ("raise RuntimeError('this model cannot load')\n", "max_batch_size = 0\n")


@pytest.fixture
async def plane(tmp_path: pathlib.Path, request: pytest.FixtureRequest):
    engine = getattr(request, "param", "main")
    repo = write_repository(tmp_path / "repo", {**MODELS, "broken": BROKEN})
    p = DataPlane(repo, ServerSettings(engine=engine, interpreters=2))
    await p.start()
    try:
        yield p
    finally:
        await p.close(timeout=5)


def add_request(plane: DataPlane, a: list[list[int]], b: list[list[int]], **parameters: object) -> InferRequest:
    rows = len(a)
    body = json.dumps({
        "id": "r1",
        "inputs": [
            {"name": "A", "datatype": "INT32", "shape": [rows, 4], "data": a},
            {"name": "B", "datatype": "INT32", "shape": [rows, 4], "data": b},
        ],
        "parameters": parameters,
    }).encode()
    return decode_infer(body, content_type="application/json", header_length=None, schema=plane.schema("add"))


def ints(t: Tensor) -> list[int]:
    return array.array("i", bytes(t.view())).tolist()


@pytest.mark.parametrize("plane", ENGINES, indirect=True)
async def test_infer_answers_a_decoded_request(plane: DataPlane) -> None:
    request = add_request(plane, [[1, 2, 3, 4], [5, 6, 7, 8]], [[1, 1, 1, 1], [2, 2, 2, 2]])
    assert request.samples == 2  # derived from the inputs' batch dimension
    response = await plane.infer("add", None, request)
    assert (response.model_name, response.model_version, response.id) == ("add", "1", "r1")
    assert ints(response.outputs["SUM"]) == [2, 3, 4, 5, 7, 8, 9, 10]
    assert ints(response.outputs["DIFF"]) == [0, 1, 2, 3, 3, 4, 5, 6]
    assert response.outputs["SUM"].shape == (2, 4)
    stats = plane.metrics.stats("add", "1")
    assert (stats.success, stats.samples) == (1, 2)


async def test_many_concurrent_requests_each_get_their_own_answer(plane: DataPlane) -> None:
    requests = [add_request(plane, [[i, i, i, i]], [[1, 2, 3, 4]]) for i in range(200)]
    responses = await asyncio.gather(*(plane.infer("add", None, r) for r in requests))
    assert [ints(r.outputs["SUM"]) for r in responses] == [[i + 1, i + 2, i + 3, i + 4] for i in range(200)]
    batcher = plane.model("add").batcher
    assert batcher is not None and batcher.batches < 200  # they shared batches


async def test_tf_serving_requests_take_the_same_path(plane: DataPlane) -> None:
    body = json.dumps({"instances": [{"A": [1, 2, 3, 4], "B": [4, 3, 2, 1]}]}).encode()
    request = decode_predict(body, schema=plane.schema("add"))
    response = await plane.infer("add", None, request)
    assert ints(response.outputs["SUM"]) == [5, 5, 5, 5]


async def test_unknown_and_unready_models_are_named(plane: DataPlane) -> None:
    with pytest.raises(ModelNotFound, match="unknown model 'nope'"):
        plane.schema("nope")
    with pytest.raises(ModelNotReady, match="model 'broken' is unavailable: .*cannot load"):
        plane.schema("broken")
    assert not plane.ready  # one model failed to load


async def test_budget_outside_the_timeout_is_refused(plane: DataPlane) -> None:
    request = add_request(plane, [[1, 2, 3, 4]], [[1, 2, 3, 4]])
    request.latency_budget_ms = 10_000_000.0  # a front that skipped the codec's check
    with pytest.raises(InvalidInput, match=r"parameters.latency_budget_ms: expected milliseconds in \(0, "):
        await plane.infer("add", None, request)


def slow_request(plane: DataPlane, ms: float, **parameters: object) -> InferRequest:
    body = json.dumps({"inputs": [{"name": "MS", "datatype": "FP32", "shape": [1], "data": [ms]}],
                       "parameters": parameters}).encode()
    return decode_infer(body, content_type=None, header_length=None, schema=plane.schema("slow"))


async def test_the_request_timeout_becomes_a_deadline(plane: DataPlane) -> None:
    running = asyncio.ensure_future(plane.infer("slow", None, slow_request(plane, 300)))
    batcher = plane.model("slow").batcher
    assert batcher is not None
    await until(lambda: batcher.running == 1, what="the slow request to run")
    with pytest.raises(RequestTimeout, match="in the queue"):  # parameters.timeout is in microseconds
        await plane.infer("slow", None, slow_request(plane, 1, timeout=20_000))
    assert (await running).outputs["MS"].shape == (1,)
    assert plane.metrics.stats("slow", "1").failures["timeout"] == 1


async def test_a_caller_that_goes_away_frees_its_place(plane: DataPlane) -> None:
    batcher = plane.model("slow").batcher
    assert batcher is not None
    running = asyncio.ensure_future(plane.infer("slow", None, slow_request(plane, 200)))
    await until(lambda: batcher.running == 1, what="the slow request to run")
    waiting = asyncio.ensure_future(plane.infer("slow", None, slow_request(plane, 1)))
    await until(lambda: batcher.queued == 1, what="the second request to queue")
    waiting.cancel()
    await until(lambda: batcher.queued == 0, what="the cancelled request to leave the queue")
    await running
    assert plane.metrics.stats("slow", "1").failures["cancelled"] == 1


HEAVY = '''
from aserve.runtime import Model, TensorSpec

class Heavy(Model):
    inputs = [TensorSpec("X", "UINT8", (1,))]
    outputs = [TensorSpec("Y", "UINT8", (1,))]

    def load(self):
        self.weights = bytearray(b"\\x01" * (48 << 20))  # 48 MiB, every page touched

    def __call__(self, inputs):
        return {"Y": bytes([self.weights[inputs["X"][0]]])}
'''


async def test_each_model_reports_the_memory_its_load_added(tmp_path: pathlib.Path) -> None:
    repo = write_repository(tmp_path / "repo", {"heavy": (HEAVY, "max_batch_size = 0\n"), "add": MODELS["add"]})
    p = DataPlane(repo, ServerSettings(engine="private", interpreters=2))
    await p.start()
    try:
        heavy, light = p.model("heavy"), p.model("add")
        assert heavy.memory_bytes >= 2 * (40 << 20)  # 48 MiB in each of the two interpreters
        assert light.memory_bytes < heavy.memory_bytes / 4
        assert heavy.parameters()["memory_bytes"] == heavy.memory_bytes
    finally:
        await p.close(timeout=5)
