"""The batch latency curve: fits on synthetic curves, refinement, summary."""

from __future__ import annotations

import json
import random

import pytest

from aserve.batching.costmodel import (
    CostModel,
    contention,
    fit_affine,
    fit_logistic,
    ladder,
    logistic_latency,
    monotone,
    warmup,
)
from aserve.engine import ModelSpec, Pool

LOGISTIC = (2e-3, 2e-4, 8.0, 1.5)  # per-sample 2 ms alone, 0.2 ms when amortised, bend near 8


def affine(b: int) -> float:
    return 1e-3 + 4e-3 * b


def logistic(b: int) -> float:
    return logistic_latency(LOGISTIC, b)


def held_out(max_batch_size: int) -> list[int]:
    rungs = set(ladder(max_batch_size))
    return [b for b in range(1, max_batch_size + 1) if b not in rungs]


def test_ladder() -> None:
    assert ladder(64) == [1, 2, 4, 8, 16, 32, 64]
    assert ladder(10) == [1, 2, 4, 8, 10]
    assert ladder(1) == [1]
    assert ladder(0) == [1]


def test_monotone_pools_violators_and_averages_repeats() -> None:
    assert monotone([(1, 1.0), (2, 3.0), (4, 2.0), (8, 5.0)]) == [(1, 1.0), (2, 2.5), (4, 2.5), (8, 5.0)]
    assert monotone([(2, 1.0), (1, 0.5), (2, 3.0)]) == [(1, 0.5), (2, 2.0)]


@pytest.mark.parametrize("form", ["interp", "affine", "logistic"])
def test_affine_curve_is_recovered_between_rungs(form: str) -> None:
    cost = CostModel([(b, affine(b)) for b in ladder(64)], max_batch_size=64, form=form)
    for b in held_out(64):
        assert cost.predict(b) == pytest.approx(affine(b), rel=0.02), b


@pytest.mark.parametrize("form,tolerance", [("interp", 0.12), ("logistic", 0.01)])
def test_logistic_curve_is_recovered_between_rungs(form: str, tolerance: float) -> None:
    cost = CostModel([(b, logistic(b)) for b in ladder(64)], max_batch_size=64, form=form)
    for b in held_out(64):
        assert cost.predict(b) == pytest.approx(logistic(b), rel=tolerance), b


def test_affine_misses_a_bent_curve() -> None:
    """Why the affine fit is not the default: per-request overhead plus a bend."""
    a, c = fit_affine([(b, logistic(b)) for b in ladder(64)])
    worst = max(abs(a + c * b - logistic(b)) / logistic(b) for b in held_out(64))
    assert worst > 0.1


def test_fits_with_noise_stay_close() -> None:
    rng = random.Random(7)
    points = [(b, logistic(b) * rng.uniform(0.97, 1.03)) for b in ladder(64) for _ in range(3)]
    params = fit_logistic(points)
    cost = CostModel(points, max_batch_size=64, form="interp")
    for b in held_out(64):
        assert logistic_latency(params, b) == pytest.approx(logistic(b), rel=0.1)
        assert cost.predict(b) == pytest.approx(logistic(b), rel=0.15)


def test_throughput_optimal_and_efficient_batch() -> None:
    # latency 1 + b for b <= 8, then 9 + 2 (b - 8): throughput peaks at 8 (8/9 per s)
    points = [(1, 2.0), (2, 3.0), (4, 5.0), (8, 9.0), (16, 25.0), (32, 57.0)]
    cost = CostModel(points, max_batch_size=32, form="interp")
    assert cost.throughput_optimal_batch() == 8
    assert cost.throughput(8) == pytest.approx(8 / 9)
    # 95% of 8/9 is 0.844: b / (1 + b) reaches it at b = 6 (6/7 = 0.857; 5/6 = 0.833)
    assert cost.efficient_batch(0.05) == 6
    assert cost.smallest_batch_for(0.5) == 1
    assert cost.smallest_batch_for(0.8) == 4
    assert cost.smallest_batch_for(1.0) is None
    # an affine curve gets better all the way: the optimum is the largest batch
    assert CostModel([(b, affine(b)) for b in ladder(64)], max_batch_size=64).throughput_optimal_batch() == 64


def test_largest_batch_within_a_time() -> None:
    cost = CostModel([(b, affine(b)) for b in ladder(32)], max_batch_size=32)  # 1 ms + 4 ms per sample
    assert cost.largest_batch_within(0.025) == 6  # L(6) = 25 ms
    assert cost.largest_batch_within(0.0249) == 5
    assert cost.largest_batch_within(0.001) == 1  # not even one sample fits: still 1
    assert cost.largest_batch_within(10.0) == 32  # never past max_batch_size


def test_affine_sizes_match_a_scan_of_every_size() -> None:
    # the affine form solves for the sizes in closed form: it must agree with checking each
    # size, rounding included (exact boundaries, no size, every size)
    rng = random.Random(11)
    for _ in range(300):
        top = rng.choice([1, 2, 7, 32, 64])
        a, c = rng.uniform(1e-5, 5e-3), rng.uniform(1e-4, 5e-3)
        cost = CostModel([(b, a + c * b) for b in ladder(top)], max_batch_size=top)
        curve = [cost.predict(b) for b in range(1, top + 1)]
        for seconds in (curve[rng.randrange(top)], rng.uniform(0.0, 1.2 * curve[-1]), 1e-6, 10.0):
            within = [b for b in range(1, top + 1) if curve[b - 1] <= seconds]
            assert cost.largest_batch_within(seconds) == (within[-1] if within else 1)
        best = cost.throughput_optimal_batch()
        for rate in (cost.throughput(rng.randint(1, best)), rng.uniform(0.0, 1.1 * cost.throughput(best)), 0.0):
            serving = [b for b in range(1, best + 1) if cost.throughput(b) >= rate]
            assert cost.smallest_batch_for(rate) == (serving[0] if serving else None)


def test_refinement_keeps_the_curve_monotone() -> None:
    # a neighbour moves further than the rest: a point close below the next one may pass it
    cost = CostModel([(1, 1.0), (2, 1.001), (4, 3.0)], max_batch_size=4, form="interp", alpha=1.0)
    cost.observe(1, 1.2)
    times = [t for _, t in cost.points]
    assert times == sorted(times) and times[0] > 1.0


def test_online_refinement_converges_to_a_shifted_curve() -> None:
    cost = CostModel([(b, affine(b)) for b in ladder(32)], max_batch_size=32)
    rng = random.Random(3)
    for _ in range(2000):
        b = rng.randint(1, 32)
        cost.observe(b, 1.5 * affine(b) * rng.uniform(0.98, 1.02))
    for b in (1, 3, 8, 20, 32):
        assert cost.predict(b) == pytest.approx(1.5 * affine(b), rel=0.05), b
    assert cost.observations == 2000


def test_one_outlier_moves_the_curve_a_bounded_step() -> None:
    cost = CostModel([(b, affine(b)) for b in ladder(32)], max_batch_size=32, alpha=0.1, clip=3.0)
    before = cost.predict(8)
    cost.observe(8, 100 * before)  # a stalled batch
    assert before < cost.predict(8) <= before * (1 + 0.1 * 3 * 0.05) + 1e-12
    for _ in range(50):
        cost.observe(8, before)
    assert cost.predict(8) == pytest.approx(before, rel=5e-3)


def test_observations_between_rungs_refine_both_neighbours() -> None:
    cost = CostModel([(4, 1.0), (8, 2.0)], max_batch_size=8, form="interp")
    for _ in range(300):
        cost.observe(6, 3.0)
    assert cost.predict(6) == pytest.approx(3.0, rel=0.01)
    assert cost.points[0][1] > 1.0 and cost.points[1][1] > 2.0


def test_refinement_disabled_and_bad_observations_ignored() -> None:
    cost = CostModel([(1, 1.0), (2, 2.0)], max_batch_size=2, alpha=0.0)
    cost.observe(1, 5.0)
    assert cost.predict(1) == 1.0
    live = CostModel([(1, 1.0), (2, 2.0)], max_batch_size=2)
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        live.observe(1, bad)
    live.observe(0, 1.0)
    assert live.predict(1) == 1.0 and live.observations == 0


@pytest.mark.parametrize("form", ["interp", "affine", "logistic"])
def test_as_dict_is_json(form: str) -> None:
    cost = CostModel([(b, logistic(b)) for b in ladder(16)], max_batch_size=16, form=form)
    cost.observe(3, logistic(3))
    d = json.loads(json.dumps(cost.as_dict()))
    assert d["form"] == form and d["max_batch_size"] == 16 and d["observations"] == 1
    assert d["throughput_optimal_batch"] == cost.throughput_optimal_batch()
    assert [b for b, _ in d["points"]] == ladder(16)


def test_invalid_models_are_refused() -> None:
    with pytest.raises(ValueError, match="at least one"):
        CostModel([], max_batch_size=4)
    with pytest.raises(ValueError, match="form"):
        CostModel([(1, 1.0)], max_batch_size=4, form="cubic")
    with pytest.raises(ValueError, match="seconds > 0"):
        CostModel([(1, 0.0)], max_batch_size=4)
    with pytest.raises(ValueError, match="batch size must be >= 1"):
        CostModel([(0, 1.0)], max_batch_size=4)


LOCKED = '''
import fcntl
import time
from aserve.runtime import Model, TensorSpec

class Locked(Model):
    """Y = X, each batch holding one file lock for `hold` seconds: two batches at once take
    one hold and two, whichever interpreters run them."""
    inputs = (TensorSpec("X", "FP32", (-1, 2)),)
    outputs = (TensorSpec("Y", "FP32", (-1, 2)),)

    def load(self):
        self.lock = open(self.parameters["lock"], "w")
        self.hold = float(self.parameters["hold"])

    def __call__(self, inputs):
        fcntl.flock(self.lock, fcntl.LOCK_EX)
        try:
            time.sleep(self.hold)
        finally:
            fcntl.flock(self.lock, fcntl.LOCK_UN)
        return {"Y": inputs["X"]}
'''


@pytest.mark.serial  # its ratio is of two timings: a test beside it on the same core skews one of them
async def test_contention_is_measured_with_every_interpreter_running_a_batch(model_dir, tmp_path) -> None:
    """`contention`: batches run on every interpreter at once, against the curve measured one
    at a time. Batches serialised by a lock take one hold and two when two run at once: their
    median is 1.5 holds, against one hold alone; with one interpreter nothing runs (1.0)."""
    folder = model_dir(LOCKED)
    parameters = {"lock": str(tmp_path / "lock"), "hold": 0.1}
    async with Pool(engine="private", interpreters=2) as pool:
        info = await pool.load(ModelSpec(name="locked", path=str(folder), parameters=parameters))
        cost = await warmup(pool, info, 4, repeats=2)  # alone: one hold (and the pool's own time)
        ratio = await contention(pool, info, cost, 4, repeats=2)
        assert 1.25 < ratio < 4.0, ratio
        one = await pool.load(ModelSpec(name="one", path=str(folder), parameters=parameters), interpreters=1)
        assert await contention(pool, one, cost, 4) == 1.0
