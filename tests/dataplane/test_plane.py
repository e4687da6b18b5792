"""The data plane without HTTP: an infer call in, the encoded answer out, each step once."""

from __future__ import annotations

import array
import asyncio
import contextlib
import json
import pathlib
import struct
import sys
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest

from aserve.batching.native import NativeBatcher
from aserve.config import ServerSettings
from aserve.dataplane import DataPlane
from aserve.errors import InvalidInput, ModelNotFound, ModelNotReady, RequestTimeout
from aserve.inference import Answer, InferCall
from aserve.protocol import PREDICT, V2

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


def add_call(a: list[list[int]], b: list[list[int]], **parameters: object) -> InferCall:
    rows = len(a)
    body = json.dumps({
        "id": "r1",
        "inputs": [
            {"name": "A", "datatype": "INT32", "shape": [rows, 4], "data": a},
            {"name": "B", "datatype": "INT32", "shape": [rows, 4], "data": b},
        ],
        "parameters": parameters,
    }).encode()
    return InferCall(codec=V2, model="add", body=body, content_type="application/json")


def outputs(answer: Answer) -> dict[str, list[int]]:
    message = json.loads(b"".join(answer.chunks))
    return {o["name"]: o["data"] for o in message["outputs"]}


@pytest.mark.parametrize("plane", ENGINES, indirect=True)
async def test_infer_answers_a_call(plane: DataPlane) -> None:
    answer = await plane.infer(add_call([[1, 2, 3, 4], [5, 6, 7, 8]], [[1, 1, 1, 1], [2, 2, 2, 2]]))
    assert answer.headers == {"Content-Type": "application/json"}
    message = json.loads(b"".join(answer.chunks))
    assert (message["model_name"], message["model_version"], message["id"]) == ("add", "1", "r1")
    assert outputs(answer) == {"SUM": [2, 3, 4, 5, 7, 8, 9, 10], "DIFF": [0, 1, 2, 3, 3, 4, 5, 6]}
    assert message["outputs"][0]["shape"] == [2, 4]
    stats = plane.metrics.stats("add", "1")
    assert (stats.success, stats.samples) == (1, 2)  # the samples derived from the inputs' batch dimension


async def test_binary_and_msgpack_calls_take_the_same_path(plane: DataPlane) -> None:
    a, b = struct.pack("<4i", 1, 2, 3, 4), struct.pack("<4i", 10, 10, 10, 10)
    header = json.dumps({"inputs": [
        {"name": "A", "datatype": "INT32", "shape": [1, 4], "parameters": {"binary_data_size": 16}},
        {"name": "B", "datatype": "INT32", "shape": [1, 4], "parameters": {"binary_data_size": 16}}],
        "outputs": [{"name": "SUM", "parameters": {"binary_data": True}}]}).encode()
    answer = await plane.infer(InferCall(codec=V2, model="add", body=header + a + b, header_length=len(header),
                                         content_type="application/octet-stream"))
    length = int(answer.headers["Inference-Header-Content-Length"])
    assert bytes(b"".join(answer.chunks)[length:]) == struct.pack("<4i", 11, 12, 13, 14)
    packed = msgspec.msgpack.encode({"inputs": [{"name": "A", "datatype": "INT32", "shape": [1, 4], "data": a},
                                                {"name": "B", "datatype": "INT32", "shape": [1, 4], "data": b}]})
    answer = await plane.infer(InferCall(codec=V2, model="add", body=packed, content_type="application/msgpack"))
    assert answer.headers["Content-Type"] == "application/msgpack"
    message = msgspec.msgpack.decode(b"".join(answer.chunks))
    assert array.array("i", message["outputs"][1]["data"]).tolist() == [-9, -8, -7, -6]


async def test_many_concurrent_calls_each_get_their_own_answer(plane: DataPlane) -> None:
    answers = await asyncio.gather(*(plane.infer(add_call([[i, i, i, i]], [[1, 2, 3, 4]])) for i in range(200)))
    assert [outputs(a)["SUM"] for a in answers] == [[i + 1, i + 2, i + 3, i + 4] for i in range(200)]
    batcher = plane.model("add").batcher
    assert batcher is not None and batcher.batches < 200  # they shared batches


async def test_tf_serving_calls_take_the_same_path(plane: DataPlane) -> None:
    body = json.dumps({"instances": [{"A": [1, 2, 3, 4], "B": [4, 3, 2, 1]}]}).encode()
    answer = await plane.infer(InferCall(codec=PREDICT, model="add", body=body))
    assert json.loads(b"".join(answer.chunks)) == {"predictions": [{"SUM": [5, 5, 5, 5], "DIFF": [-3, -1, 1, 3]}]}


async def test_unknown_and_unready_models_are_named(plane: DataPlane) -> None:
    with pytest.raises(ModelNotFound, match="unknown model 'nope'"):
        await plane.infer(InferCall(codec=V2, model="nope", body=b"{}"))
    with pytest.raises(ModelNotReady, match="model 'broken' is unavailable: .*cannot load"):
        await plane.infer(InferCall(codec=V2, model="broken", body=b"{}"))
    assert plane.metrics.stats("broken", "1").failures["unavailable"] == 1
    assert not plane.ready  # one model failed to load


async def test_invalid_calls_are_refused_and_counted(plane: DataPlane) -> None:
    with pytest.raises(InvalidInput, match=r"parameters.latency_budget_ms: expected milliseconds in \(0, "):
        await plane.infer(add_call([[1, 2, 3, 4]], [[1, 2, 3, 4]], latency_budget_ms=10_000_000))
    with pytest.raises(InvalidInput, match=r"inputs\[0\].shape\[0\]: batch size of input 'A' must be 1..8, got 9"):
        await plane.infer(add_call([[1, 2, 3, 4]] * 9, [[1, 2, 3, 4]] * 9))
    assert plane.metrics.stats("add", "1").failures["invalid"] == 2


def slow_call(ms: float, **parameters: object) -> InferCall:
    body = json.dumps({"inputs": [{"name": "MS", "datatype": "FP32", "shape": [1], "data": [ms]}],
                       "parameters": parameters}).encode()
    return InferCall(codec=V2, model="slow", body=body)


async def test_the_request_timeout_becomes_a_deadline(plane: DataPlane) -> None:
    running = asyncio.ensure_future(plane.infer(slow_call(300)))
    batcher = plane.model("slow").batcher
    assert batcher is not None
    await until(lambda: batcher.running == 1, what="the slow request to run")
    with pytest.raises(RequestTimeout, match="in the queue"):  # parameters.timeout is in microseconds
        await plane.infer(slow_call(1, timeout=20_000))
    assert json.loads(b"".join((await running).chunks))["outputs"][0]["shape"] == [1]
    assert plane.metrics.stats("slow", "1").failures["timeout"] == 1


async def test_submit_answers_without_a_task_and_drop_withdraws(plane: DataPlane) -> None:
    """`submit` queues the call at once and tells `then`'s function its answer; a call dropped
    before it ran leaves the queue and is counted as cancelled."""
    loop = asyncio.get_running_loop()
    told: asyncio.Future[tuple[object, object]] = loop.create_future()
    pending = plane.submit(add_call([[1, 2, 3, 4]], [[1, 1, 1, 1]]))
    pending.then(lambda answer, error: told.set_result((answer, error)))
    answer, error = await told
    assert error is None and outputs(answer)["SUM"] == [2, 3, 4, 5]  # type: ignore[arg-type]
    batcher = plane.model("slow").batcher
    assert batcher is not None
    running = plane.submit(slow_call(200))
    await until(lambda: batcher.running == 1, what="the slow request to run")
    waiting = plane.submit(slow_call(1))
    assert batcher.queued == 1
    waiting.drop()
    assert batcher.queued == 0 and plane.metrics.stats("slow", "1").failures["cancelled"] == 1
    assert json.loads(b"".join((await running.answer).chunks))["outputs"][0]["data"] == [200.0]
    with pytest.raises(InvalidInput, match="inputs: missing input"):  # what is wrong raises at once
        plane.submit(InferCall(codec=V2, model="add", body=b'{"inputs": []}'))


async def test_a_caller_that_goes_away_frees_its_place(plane: DataPlane) -> None:
    batcher = plane.model("slow").batcher
    assert batcher is not None
    running = asyncio.ensure_future(plane.infer(slow_call(200)))
    await until(lambda: batcher.running == 1, what="the slow request to run")
    waiting = asyncio.ensure_future(plane.infer(slow_call(1)))
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


@contextlib.asynccontextmanager
async def front_of(tmp_path: pathlib.Path, name: str, model: tuple[str, str],
                   **settings: Any) -> AsyncIterator[tuple[DataPlane, Any, dict[str, Any], Any]]:
    """A plane serving `model` as `name` on one private interpreter, and a front loop's side of
    it on this loop (`--loops 1`): (the plane, the front's LinkEngine, the model as the host
    lists it to fronts, the front's handle of it)."""
    from aserve import _native
    from aserve.server.front_models import LinkEngine, front_handle
    from aserve.server.loops import front_model

    repo = write_repository(tmp_path / "repo", {name: model})
    p = DataPlane(repo, ServerSettings(**{"engine": "private", "interpreters": 1, **settings}))
    p.registry.queue_fronts = 1  # each model's queue Counter, laid out for one front loop
    await p.start()
    link = LinkEngine(_native.link_api(), asyncio.get_running_loop(), lambda pool, job: None)
    try:
        m = front_model(p.model(name), 1)
        handle = front_handle(m, p, link, {}, 0, p.settings)
        link.add(m, handle, 0)
        yield p, link, m, handle
    finally:
        link.close()
        await p.close(timeout=5)


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_fronts_requests_of_one_iteration_run_as_one_batch(tmp_path: pathlib.Path, engine: str) -> None:
    """A front loop (`--loops`) hands the pool the requests it took in during one loop
    iteration together: an interpreter polling for work when the first arrives finds the
    others queued too, and runs them as one batch, as the host's window policy would."""
    async with front_of(tmp_path, "add", MODELS["add"], engine=engine, spin_always=True) as (p, _, _, handle):
        batcher = handle.batcher
        assert isinstance(batcher, NativeBatcher)  # batched in the pool, by the window rule in C
        # one request first: the interpreter then polls for the next (spin_always)
        first = await p.submit(add_call([[0, 0, 0, 0]], [[1, 1, 1, 1]]), handle=handle).answer
        assert outputs(first)["SUM"] == [1, 1, 1, 1]
        for _ in range(20):
            pending = [p.submit(add_call([[i, i, i, i]], [[1, 2, 3, 4]]), handle=handle) for i in range(8)]
            answers = [outputs(a) for a in await asyncio.gather(*(q.answer for q in pending))]
            assert [a["SUM"] for a in answers] == [[i + 1, i + 2, i + 3, i + 4] for i in range(8)]
            assert [a["DIFF"] for a in answers] == [[i - 1, i - 2, i - 3, i - 4] for i in range(8)]
        assert {rows: counts[0] for rows, counts in batcher.batch_sizes.items()} == {1: 1, 8: 20}


async def test_a_fronts_request_is_told_by_the_links_drain_and_one_that_raises_is_reported(
        tmp_path: pathlib.Path) -> None:
    """The Link calls a request's `done` itself as it drains (outputs as Tensors, the batch's
    rows and run times; or the error the host's pool would raise); a `done` that raises is
    reported to the loop's exception handler and the others of the same drain are still told."""
    import numpy as np

    from aserve.errors import ModelError
    from aserve.tensor import Tensor

    loop = asyncio.get_running_loop()
    reported: list[BaseException] = []
    loop.set_exception_handler(lambda _, context: reported.append(context["exception"]))
    async with front_of(tmp_path, "add", MODELS["add"]) as (_, link, m, _):
        told: list[tuple[object, ...]] = []
        everyone = loop.create_future()

        def done(i: int, outputs: dict[str, Tensor] | None, error: BaseException | None, led: int, start: int,
                 end: int) -> None:
            told.append((i, outputs, error, led, start, end))
            if len(told) == 3:
                everyone.set_result(None)
            if i == 0:
                raise RuntimeError("a completion that fails")

        def inputs(k: int) -> list[Tensor]:
            a = np.full((1, 4), k, np.int32)
            return [Tensor("INT32", (1, 4), a.tobytes()), Tensor("INT32", (1, 4), (a * 2).tobytes())]

        link.hold()
        for i in range(3):
            link.request(m["key"], inputs(i), 1, lambda *args, i=i: done(i, *args), window_ns=50_000_000, deadline_ns=0)
        link.release()
        await everyone
        await until(lambda: reported)
        assert [type(e) for e in reported] == [RuntimeError]
        for i, outputs, error, led, start, end in sorted(told, key=lambda t: t[0]):  # type: ignore[arg-type,return-value]
            assert error is None and outputs is not None
            assert {name: (t.datatype, t.shape) for name, t in outputs.items()} == \
                {"SUM": ("INT32", (1, 4)), "DIFF": ("INT32", (1, 4))}
            assert np.frombuffer(outputs["SUM"].data, np.int32).tolist() == [3 * i] * 4
            assert np.frombuffer(outputs["DIFF"].data, np.int32).tolist() == [-i] * 4
            assert 0 < start <= end
        assert sorted(t[3] for t in told) == [0, 0, 3]  # one batch of three, led by one of them
        # a request its model fails on is told the error the host's pool raises for it
        failed = loop.create_future()
        link.request(m["key"], inputs(-999), 1, lambda *args: failed.set_result(args), window_ns=0, deadline_ns=0)
        outputs, error, led, start, end = await failed
        assert outputs is None and isinstance(error, ModelError) and "A starts with -999" in str(error)
        assert (led, start, end) == (0, 0, 0)


NAP_MODEL = '''
import time
from aserve.runtime import Model, TensorSpec

class Nap(Model):
    inputs = [TensorSpec("MS", "FP32", (-1, 1))]
    outputs = [TensorSpec("MS", "FP32", (-1, 1))]

    def __call__(self, inputs):
        ms = inputs["MS"].cast("B").cast("f")
        time.sleep(max(ms) / 1000.0)
        return {"MS": [[m] for m in ms]}
'''

NAP_CONFIG = '''
max_batch_size = 4
interpreters = 1
[[inputs]]
name = "MS"
datatype = "FP32"
shape = [-1, 1]
[[outputs]]
name = "MS"
datatype = "FP32"
shape = [-1, 1]
[batching]
max_queue_delay_ms = 1.0
'''


async def test_a_fronts_queue_over_the_link_times_out_withdraws_and_drains(tmp_path: pathlib.Path) -> None:
    """A front's NativeBatcher over a real Link (FrontQueue's path in C to the pool's queue):
    a request whose deadline passes while it waits leaves the pool's queue and fails with
    RequestTimeout; a withdrawn one leaves it too; the one running is answered; closing
    waits for it; every count is the pool's and the loop's, once."""
    import time

    from aserve.tensor import Tensor

    async with front_of(tmp_path, "nap", (NAP_MODEL, NAP_CONFIG)) as (_, link, _, handle):
        batcher = handle.batcher
        assert isinstance(batcher, NativeBatcher) and batcher.link is not None

        def nap(ms: float) -> list[Tensor]:
            return [Tensor("FP32", (1, 1), struct.pack("<f", ms))]

        running = batcher.submit(nap(300.0), 1, deadline=time.monotonic() + 30)
        await until(lambda: batcher.running == 1, what="the long request to run")
        late = batcher.submit(nap(1.0), 1, deadline=time.monotonic() + 0.05)
        gone = batcher.submit(nap(1.0), 1, deadline=time.monotonic() + 30)
        await until(lambda: batcher.queued == 2, what="the two to wait in the pool's queue")
        gone.cancel()
        batcher.withdraw(gone)
        with pytest.raises(RequestTimeout, match="timed out after"):
            await late
        await until(lambda: batcher.queued == 0, what="both to leave the pool's queue")
        closing = asyncio.ensure_future(batcher.close(timeout=10))
        outputs = await running
        assert struct.unpack("<f", bytes(outputs["MS"].data)) == (300.0,) and outputs["MS"].shape == (1, 1)
        await asyncio.wait_for(closing, 10)
        stats = batcher.stats()
        assert (stats["requests"], stats["timed_out"], stats["cancelled"], stats["batches"]) == (1, 1, 0, 1)
        assert not batcher.pending and link.in_flight == 0


async def test_a_fronts_batch_counts_as_queued_only_while_it_waits_for_an_interpreter(tmp_path: pathlib.Path) -> None:
    """A batch a front hands the pool counts in its model's queue (what every loop's admission
    reads) while it waits for an interpreter, and not when an idle one is woken for it: then
    another loop's request, arriving before that interpreter's thread runs, must not be refused
    for a queue that only the batch on its way in fills."""
    from aserve.dataplane.models import wait_slots

    async with front_of(tmp_path, "slow", MODELS["slow"]) as (p, _, _, handle):
        samples, requests, batches, _ = wait_slots(1, 0)
        counts = handle.queued  # the model's Counter, as this front sees it

        def waiting() -> tuple[int, int, int]:
            return counts.get(samples), counts.get(requests), counts.get(batches)

        assert not isinstance(handle.batcher, NativeBatcher)  # max_batch_size 0: a batcher of its own
        pool = p.model("slow").pool
        assert pool is not None  # a reused pool's interpreter may still be freeing the last test's outputs
        await until(lambda: pool.stats()["waiting"] + pool.stats()["spinning"] == 1, what="the interpreter to wait")
        alone = p.submit(slow_call(50), handle=handle)  # the interpreter is idle: woken for it
        assert waiting() == (0, 0, 0) and counts.total() == 0
        assert outputs(await alone.answer)["MS"] == [50.0]
        host = p.submit(slow_call(300))  # the host's batcher takes the interpreter
        await until(lambda: p.model("slow").batcher.running == 1, what="the host's batch to run")  # type: ignore[union-attr]
        queued = p.submit(slow_call(1), handle=handle)  # the front's batch waits for it
        assert waiting() == (1, 1, 1) and counts.total() == 1
        assert [outputs(a)["MS"] for a in await asyncio.gather(host.answer, queued.answer)] == [[300.0], [1.0]]
        assert waiting() == (0, 0, 0) and counts.total() == 0
