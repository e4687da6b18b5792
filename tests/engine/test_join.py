"""The engine's join point (layer-level joining), with a pure-Python staged model in every engine."""

from __future__ import annotations

import array
import sys

import pytest

from aserve.engine import ModelSpec, Pool
from aserve.errors import EngineError, ModelError
from aserve.tensor import Tensor

from ..conftest import STAGED_MODEL as STAGED
from ..conftest import until

ENGINES = ["private", "main"] + (["subinterp"] if sys.version_info >= (3, 12) else [])



def rows(*values: float) -> Tensor:
    """One row of 4 per value: [v, v+1, v+2, v+3]."""
    flat = [v + i for v in values for i in range(4)]
    return Tensor("FP32", (len(values), 4), array.array("f", flat).tobytes())


def expected(*values: float) -> list[float]:
    out = []
    for v in values:
        for i in range(4):
            x = v + i
            for k in range(3):
                x = 2 * x + k
            out.append(x)
    return out


def floats(t: Tensor) -> list[float]:
    return array.array("f", bytes(t.view())).tolist()


async def until_stage(pool: Pool, run: object, stage: int) -> None:
    def reached() -> bool:
        state = pool.progress(run)  # type: ignore[arg-type]
        return state is not None and state[0] >= stage

    await until(reached, what=f"the batch to reach stage {stage}", every=0.002)


async def load(pool: Pool, model_dir, delay: float, **params: float):  # type: ignore[no-untyped-def]
    folder = model_dir(STAGED)
    return await pool.load(ModelSpec(name="staged", path=str(folder), parameters={"delay": delay, **params}))


@pytest.mark.parametrize("engine", ENGINES)
async def test_offered_groups_join_and_results_equal_running_alone(engine: str, model_dir) -> None:  # type: ignore[no-untyped-def]
    async with Pool(engine=engine, interpreters=1) as pool:
        info = await load(pool, model_dir, 0.03)
        assert info.stages == 3
        run = pool.infer_staged("staged", {"X": rows(1.0, 2.0)})
        first = pool.offer(run, {"X": rows(10.0)}, 2)
        second = pool.offer(run, {"X": rows(20.0, 30.0)}, 2)
        assert first is not None and second is not None
        outputs, seconds = await run.result
        assert first.result() is True and second.result() is True
        assert outputs["Y"].shape == (5, 4)
        assert floats(outputs["Y"]) == expected(1.0, 2.0, 10.0, 20.0, 30.0)
        assert len(seconds) == 3 and all(s >= 0.02 for s in seconds)
        alone = await pool.infer("staged", {"X": rows(20.0, 30.0)})
        assert floats(alone["Y"]) == expected(20.0, 30.0)
        assert pool.progress(run) is None  # complete


async def test_an_offer_too_late_is_refused_or_turned_away(model_dir) -> None:  # type: ignore[no-untyped-def]
    async with Pool(engine="private", interpreters=1) as pool:
        await load(pool, model_dir, 0.05)
        run = pool.infer_staged("staged", {"X": rows(1.0)})
        await until_stage(pool, run, 2)  # the last stage is running: no boundary left
        assert pool.offer(run, {"X": rows(5.0)}, 2) is None  # past last_stage: refused at once
        late = pool.offer(run, {"X": rows(5.0)}, 3)  # posted, but no boundary comes
        assert late is not None
        outputs, _ = await run.result
        assert late.result() is False
        assert floats(outputs["Y"]) == expected(1.0)


async def test_progress_of_a_queued_batch_and_a_failing_one(model_dir) -> None:  # type: ignore[no-untyped-def]
    async with Pool(engine="private", interpreters=1) as pool:
        await load(pool, model_dir, 0.02, fail_on=7.0)
        running = pool.infer_staged("staged", {"X": rows(1.0)})
        queued = pool.infer_staged("staged", {"X": rows(2.0)})
        state = pool.progress(queued)
        assert state is not None and state[1] == -1.0  # still waiting for the interpreter
        joiner = pool.offer(running, {"X": rows(7.0)}, 2)  # makes the joined batch fail
        assert joiner is not None
        with pytest.raises(ModelError, match="refuses 7.0"):
            await running.result
        assert joiner.result() is True  # it was absorbed: its requests failed with the batch
        outputs, _ = await queued.result
        assert floats(outputs["Y"]) == expected(2.0)


async def test_a_model_without_stages_cannot_run_staged(model_dir) -> None:  # type: ignore[no-untyped-def]
    plain = "from aserve.runtime import Model\nclass P(Model):\n    def __call__(self, inputs):\n        return {}\n"
    async with Pool(engine="private", interpreters=1) as pool:
        info = await pool.load(ModelSpec(name="plain", path=str(model_dir(plain, name="plain"))))
        assert info.stages == 0
        with pytest.raises(EngineError, match="no stages"):
            pool.infer_staged("plain", {"X": rows(1.0)})


async def test_stages_must_be_callable(model_dir) -> None:  # type: ignore[no-untyped-def]
    bad = "from aserve.runtime import Model\nclass B(Model):\n    stages = [print, 3]\n"
    async with Pool(engine="private", interpreters=1) as pool:
        with pytest.raises(Exception, match=r"stages\[1\] is not callable"):
            await pool.load(ModelSpec(name="bad", path=str(model_dir(bad, name="bad"))))
