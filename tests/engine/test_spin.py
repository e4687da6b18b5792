"""Polling for work (spin_us): an interpreter that ran out of batches polls for the next
one before it blocks, over the window its recent idle gaps predict, the loop polls for a
running batch's answer; both end on time."""

from __future__ import annotations

import array
import asyncio
import sys
import time

import pytest

from aserve.engine import ModelSpec, Pool
from aserve.errors import EngineError
from aserve.tensor import Tensor

from ..conftest import until

pytestmark = pytest.mark.serial  # timed against the CPU it gets: run alone (pyproject's markers)

ENGINES = ["private", "main"] + (["subinterp"] if sys.version_info >= (3, 12) else [])

DOUBLE = """
from aserve.runtime import Model, TensorSpec
class Double(Model):
    inputs = (TensorSpec("x", "INT64", (-1,)),)
    outputs = (TensorSpec("y", "INT64", (-1,)),)
    def __call__(self, inputs):
        return {"y": [2 * v for v in inputs["x"]]}
"""


def _x(*values: int) -> dict[str, Tensor]:
    return {"x": Tensor("INT64", (len(values),), array.array("q", values))}


def _y(outputs: dict[str, Tensor]) -> list[int]:
    return list(memoryview(outputs["y"].data).cast("q"))


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_polling_interpreter_takes_the_next_batch_at_once(engine: str, model_dir) -> None:
    # a spin long enough that only a batch (or closing the pool) can end it
    pool = Pool(engine=engine, interpreters=1, spin_us=5_000_000, spinners=1)
    await pool.start()
    try:
        await pool.load(ModelSpec(name="double", path=str(model_dir(DOUBLE))))
        assert _y(await pool.infer("double", _x(1, 2))) == [2, 4]
        await until(lambda: pool.stats()["spinning"] == 1, what="the interpreter polls after its batch")
        started = time.monotonic()
        assert _y(await pool.infer("double", _x(3))) == [6]
        # the batch ended the spin: the interpreter took it without waiting out its 5 s
        assert time.monotonic() - started < 4.0
        await until(lambda: pool.stats()["spinning"] == 1, what="it polls again after the second batch")
        assert pool.stats()["spin_s"] < 4.0
    finally:
        await pool.close()
    # a closed (parked) pool polls for nothing
    assert pool.stats()["spinning"] == 0


@pytest.mark.parametrize("engine", ENGINES)
async def test_polling_is_bounded_and_off_means_off(engine: str, model_dir) -> None:
    async with Pool(engine=engine, interpreters=2, spin_us=20_000, spinners=2) as pool:
        before = pool.stats()["spin_s"]  # a reused (parked) native pool counts on from where it was
        await pool.load(ModelSpec(name="double", path=str(model_dir(DOUBLE))))
        for i in range(5):
            assert _y(await pool.infer("double", _x(i))) == [2 * i]
        await until(lambda: pool.stats()["spinning"] == 0, what="polling ends once no batch comes")
        spun = pool.stats()["spin_s"] - before
        # at most one spin of 20 ms per interpreter per batch (and one after the load)
        assert 0 < spun <= (5 + 1) * 2 * 0.020 + 0.05
    async with Pool(engine=engine, interpreters=1, spin_us=0) as pool:
        before = pool.stats()["spin_s"]
        await pool.load(ModelSpec(name="double", path=str(model_dir(DOUBLE))))
        assert _y(await pool.infer("double", _x(7))) == [14]
        assert pool.stats()["spin_s"] == before and pool.stats()["spinning"] == 0


@pytest.mark.parametrize("engine", ENGINES)
async def test_batches_answered_by_polling_are_each_answered_once(engine: str, model_dir) -> None:
    """Concurrent callers while the loop polls and the interpreters spin: every answer
    comes back once, to its own caller, whether the poll or the eventfd delivered it."""
    async with Pool(engine=engine, interpreters=2, spin_us=1_000, spinners=2) as pool:
        await pool.load(ModelSpec(name="double", path=str(model_dir(DOUBLE))))

        async def caller(c: int) -> list[list[int]]:
            return [_y(await pool.infer("double", _x(c, i))) for i in range(40)]

        results = await asyncio.wait_for(asyncio.gather(*(caller(c) for c in range(8))), 120)
        assert results == [[[2 * c, 2 * i] for i in range(40)] for c in range(8)]
        answered: list[list[int]] = []
        done = asyncio.get_running_loop().create_future()

        def collect(outputs, error, *_):  # type: ignore[no-untyped-def]
            answered.append(_y(outputs) if error is None else [-1])
            if len(answered) == 50:
                done.set_result(None)

        for i in range(50):  # the batch path the batcher uses: no future per job
            pool.run("double", [Tensor("INT64", (1,), array.array("q", [i]))], collect)
        await asyncio.wait_for(done, 60)
        assert sorted(answered) == [[2 * i] for i in range(50)]
        await pool.close()
        assert pool.stats()["spinning"] == 0


async def _paced(pool: Pool, gap_s: float, batches: int) -> tuple[float, int, float]:
    """`batches` batches, each `gap_s` after the last one's answer (a client in a closed
    loop with a think time): (seconds spent polling, batches that found a poller, seconds)."""
    before, started = pool.stats(), time.monotonic()
    for i in range(batches):
        await asyncio.sleep(gap_s)
        assert _y(await pool.infer("double", _x(i))) == [2 * i]
    after = pool.stats()
    return after["spin_s"] - before["spin_s"], after["polled"] - before["polled"], time.monotonic() - started


async def test_a_steady_pace_is_met_by_polling_for_a_share_of_the_gap(model_dir) -> None:
    """Gaps of 2 ms with spin_us at 20 ms: polling the whole gap would burn the interpreter's
    thread nearly all the time; polling over the learnt window burns at most about half of
    it and still has batches find their interpreter polling."""
    async with Pool(engine="private", interpreters=2, spin_us=20_000, spinners=1) as pool:
        await pool.load(ModelSpec(name="double", path=str(model_dir(DOUBLE))))
        await _paced(pool, 0.002, 20)  # the interpreters learn the pace
        spun, polled, seconds = await _paced(pool, 0.002, 60)
        assert spun < 0.6 * seconds, (spun, seconds)
        assert polled >= 6, polled


async def test_gaps_longer_than_spin_us_block_at_once(model_dir) -> None:
    """Once an interpreter has seen that its next batch comes after spin_us, it does not poll."""
    async with Pool(engine="private", interpreters=1, spin_us=1_000, spinners=1) as pool:
        await pool.load(ModelSpec(name="double", path=str(model_dir(DOUBLE))))
        await _paced(pool, 0.005, 12)  # learning: it polls 1 ms after each batch
        spun, polled, _ = await _paced(pool, 0.005, 20)
        assert polled == 0 and spun == 0.0, (polled, spun)


SLOW = DOUBLE.replace("    def __call__(self, inputs):\n", "    def __call__(self, inputs):\n        time.sleep(0.03)\n")
SLOW = "import time\n" + SLOW


async def test_the_loop_polls_only_for_lone_batches_short_enough_to_pay(model_dir,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Polling for a batch that runs 30 ms burns the loop for 30 ms to save one wake-up: after
    a few such batches the loop waits for the eventfd; batches that answer fast bring the
    polling back. What pays is set at 10 ms for the test, between the two models' times even
    on a busy machine, where a polled batch of `double` waits a scheduler slice or two for a
    CPU (the default, 100 µs, is what a wake-up costs on an idle one)."""
    from aserve.engine import pool as pool_module

    monkeypatch.setattr(pool_module, "_POLL_PAYS_S", 0.01)
    async with Pool(engine="private", interpreters=1, spin_us=100_000, spinners=1) as pool:
        await pool.load(ModelSpec(name="slow", path=str(model_dir(SLOW))))
        await pool.load(ModelSpec(name="double", path=str(model_dir(DOUBLE))))
        assert pool._lone_pays
        for i in range(8):
            assert _y(await pool.infer("slow", _x(i))) == [2 * i]
        assert not pool._lone_pays
        for i in range(400):  # fast batches: polling pays again once most of the last few were fast
            assert _y(await pool.infer("double", _x(i))) == [2 * i]
            if pool._lone_pays:
                break
        assert pool._lone_pays


async def test_lone_batches_that_outlast_the_polling_count_against_it(model_dir) -> None:
    """A lone batch of 30 ms outlasts the loop's polling (spin_us 1 ms): the loop burnt the
    1 ms for nothing, so the batch counts against polling although the loop had stopped
    polling when its answer came; after a few such batches the loop waits for the eventfd."""
    async with Pool(engine="private", interpreters=1, spin_us=1_000, spinners=1) as pool:
        await pool.load(ModelSpec(name="slow", path=str(model_dir(SLOW))))
        assert pool._lone_pays
        for i in range(8):
            assert _y(await pool.infer("slow", _x(i))) == [2 * i]
        assert not pool._lone_pays


def test_spin_must_not_be_negative() -> None:
    with pytest.raises(EngineError, match="spin_us must be >= 0"):
        Pool(engine="main", interpreters=1, spin_us=-1)


async def test_polling_the_probe_finds_unpaid_is_turned_off(model_dir, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pool measures whether polling pays while batches come (engine/polling.py);
    told that nothing pays, it turns polling off in the interpreters and the loop alike:
    later batches find no interpreter polling for them, and are answered as before."""
    from aserve.engine import polling

    monkeypatch.setattr(polling, "RATE", 1e9)  # no saving is worth any CPU,
    monkeypatch.setattr(polling, "NOTICEABLE", 1e9)  # nor noticeable, even where the CPU it adds measures <= 0
    async with Pool(engine="private", interpreters=1, spin_us=200, spinners=1) as pool:
        await pool.load(ModelSpec(name="double", path=str(model_dir(DOUBLE))))
        probe = pool.probe
        assert probe is not None and probe.on and pool.stats()["polling"] == 1
        started = time.monotonic()
        i = 0
        while probe.verdicts == 0:  # one client, one batch at a time
            assert _y(await pool.infer("double", _x(i))) == [2 * i]
            i += 1
            assert time.monotonic() - started < 60, "no verdict on polling after a minute of batches"
        assert not probe.on and pool.stats()["polling"] == 0
        polled = pool.stats()["polled"]
        for k in range(50):
            assert _y(await pool.infer("double", _x(k))) == [2 * k]
        assert pool.stats()["polled"] == polled and pool.stats()["spinning"] == 0


async def test_spin_always_polls_without_measuring(model_dir) -> None:
    async with Pool(engine="private", interpreters=1, spin_us=200, spinners=1, spin_always=True) as pool:
        await pool.load(ModelSpec(name="double", path=str(model_dir(DOUBLE))))
        assert pool.probe is None
        for i in range(20):
            assert _y(await pool.infer("double", _x(i))) == [2 * i]
        assert pool.stats()["polling"] == 1
