"""JoinPlanner and StageProfile: exact offers in hand-built situations.

The curve is L(b) = 1 + b seconds (a CostModel fitted on exact points), the model has
four stages with shares 0.4, 0.3, 0.2, 0.1, so a batch is through boundary 1, 2, 3
after F = 0.4, 0.7, 0.9 of its time. A batch of 2 samples started at t=0 is asked at
now=0.5 (done=0, elapsed=0.5); a group of n joining after stage k is predicted to
finish at max(now, F_k L(2)) + F_k L(n) + (1 - F_k) L(2 + n):

    n = 1:  k=1: 1.2 + 0.8 + 2.4 = 4.4   k=2: 2.1 + 1.4 + 1.2 = 4.7   k=3: 2.7 + 1.8 + 0.4 = 4.9
    n = 2:  k=1: 1.2 + 1.2 + 3.0 = 5.4   k=2: 2.1 + 2.1 + 1.5 = 5.7   k=3: 2.7 + 2.7 + 0.5 = 5.9
    n = 3:  k=1: 1.2 + 1.6 + 3.6 = 6.4
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Sequence

import pytest

from aserve.batching.costmodel import CostModel, ladder
from aserve.batching.join import JoinPlan, JoinPlanner, StageProfile, tightest

SHARES = [0.4, 0.3, 0.2, 0.1]


def planner(shares: Sequence[float] = SHARES, *, max_batch_size: int = 16, overhead: float = 1.0,
            per_sample: float = 1.0) -> JoinPlanner:
    """A planner on the exact curve L(b) = overhead + per_sample x b."""
    cost = CostModel([(b, overhead + per_sample * b) for b in ladder(max_batch_size)], max_batch_size=max_batch_size)
    return JoinPlanner(cost, StageProfile(len(shares), shares))


def plan(p: JoinPlanner, *, sizes: Sequence[int] = (1,), limits: Sequence[float] | None = None,
         limit: float = 100.0, done: int = 0, now: float = 0.5, elapsed: float = 0.5, samples: int = 2,
         max_batch_size: int = 16, offered: Sequence[int] = (), requests: int = 1,
         free_at: float | None = None) -> JoinPlan | None:
    return p.plan(now, done=done, elapsed=elapsed, samples=samples, limit=limit, sizes=sizes,
                  limits=[100.0] * len(sizes) if limits is None else limits, max_batch_size=max_batch_size,
                  offered=offered, requests=requests, free_at=free_at)


def check(found: JoinPlan | None, take: int, last_stage: int, finish: float) -> None:
    assert found is not None
    assert (found.take, found.last_stage) == (take, last_stage)
    assert found.finish == pytest.approx(finish)


def test_the_cost_model_is_the_exact_curve() -> None:
    p = planner()
    assert [p.cost.predict(b) for b in (1, 2, 3, 5)] == pytest.approx([2.0, 3.0, 4.0, 6.0])
    assert [p.profile.done(k) for k in (1, 2, 3)] == pytest.approx([0.4, 0.7, 0.9])


def test_predicted_finish_per_boundary() -> None:
    p = planner()
    finishes = [p.finish(start=0.0, now=0.5, samples=2, joining=1, k=k) for k in (1, 2, 3)]
    assert finishes == pytest.approx([4.4, 4.7, 4.9])
    # a batch behind its profile has reached the boundary "now" at the latest
    assert p.finish(start=0.0, now=3.0, samples=2, joining=1, k=1) == pytest.approx(3.0 + 0.8 + 2.4)


def test_joins_the_whole_queue_when_every_budget_holds() -> None:
    p = planner()
    check(plan(p), 1, 3, 4.4)
    check(plan(p, sizes=[1, 2]), 2, 3, 5.4)


def test_last_stage_is_the_last_boundary_before_the_first_that_breaks_a_budget() -> None:
    p = planner()
    check(plan(p, limit=4.8), 1, 2, 4.4)  # k=3 would finish at 4.9
    check(plan(p, limit=4.5), 1, 1, 4.4)  # k=2 at 4.7
    assert plan(p, limit=4.3) is None  # even k=1 (4.4) is too late for the running batch
    check(plan(p, limits=[4.75]), 1, 2, 4.4)  # the newcomer's own limit bounds it the same way
    # from a later boundary on (the batch has done one stage): only k=2 and k=3 are candidates
    check(plan(p, done=1, now=1.5, elapsed=1.5, limit=4.8), 1, 2, 4.7)


def test_a_smaller_group_when_the_whole_queue_breaks_the_running_batchs_limit() -> None:
    p = planner()
    # three single requests: all three finish at 6.4, two at 5.4, one at 4.4
    check(plan(p, sizes=[1, 2, 3], limit=4.5), 1, 1, 4.4)
    check(plan(p, sizes=[1, 2, 3], limit=5.8), 2, 2, 5.4)


def test_a_smaller_group_when_the_whole_queue_breaks_a_newcomers_limit() -> None:
    p = planner()
    # the third request must finish by 5.0 (limits are cumulative minima): the first two join
    check(plan(p, sizes=[1, 2, 3], limits=[100.0, 100.0, 5.0]), 2, 3, 5.4)
    # the head itself cannot make it: nothing joins (groups are prefixes of the queue)
    assert plan(p, sizes=[1, 2], limits=[4.0, 4.0]) is None


def test_no_offer_past_the_last_boundary_or_before_the_batch_starts() -> None:
    p = planner()
    assert plan(p, done=3, now=2.8, elapsed=2.8) is None  # boundaries are after stages 1..3
    check(plan(p, done=2, now=2.5, elapsed=2.5), 1, 3, 4.9)  # the last boundary is still ahead
    assert plan(p, elapsed=-1.0) is None  # queued in the engine, not running yet
    assert planner([1.0]).plan(0.5, done=0, elapsed=0.5, samples=2, limit=100.0, sizes=[1],
                               limits=[100.0], max_batch_size=16) is None  # one stage: no boundary


def test_max_batch_size_bounds_the_group() -> None:
    p = planner()
    found = plan(p, sizes=[1, 2], samples=14, max_batch_size=16, limit=math.inf)
    assert found is not None and found.take == 2
    found = plan(p, sizes=[1, 2], samples=15, max_batch_size=16, limit=math.inf)
    assert found is not None and found.take == 1
    assert plan(p, sizes=[1, 2], samples=16, max_batch_size=16, limit=math.inf) is None


def test_groups_offered_before_run_their_stages_first() -> None:
    p = planner()
    # The batch of 2 (t=0) was offered one sample, now counted in its 3 samples. Both groups
    # join at boundary 1 (1.2), each runs stage 1 alone (0.8 s each), then the 4 samples run
    # stages 2-4 (0.6 x 5 = 3.0): the batch finishes at 5.8.
    found = plan(p, samples=3, offered=[1], now=0.6, elapsed=0.6)
    # bound: boundary 1 by 0.4 x (L(3) + L(1)) = 2.4, + 0.8 + 3.0; it covers the true 5.8
    check(found, 1, 3, 6.2)
    # without the earlier group's own stage the prediction (5.4) is too early
    assert p.finish(start=0.0, now=0.6, samples=3, joining=1, k=1) == pytest.approx(5.4)


# ---- the benefit check (free_at given) ----
# A batch of 2 samples started at 0 is asked at now = 0.005 (done=0, E: its own end). A
# group of n joining after stage 1 (F = 0.4) finishes at F L(2) + F L(n) + 0.6 L(2 + n):
# it delays each of the batch's requests by D = end - E = F a + c n and gains
# free_at + L(n) - end over starting when an interpreter frees (on L(b) = a + c b).


def test_joins_where_the_batch_overhead_dominates() -> None:
    # L(b) = 0.020 + 0.0005 b: E = L(2) = 0.021; one sample joining finishes at
    # 0.0084 + 0.0082 + 0.6 x 0.0215 = 0.0295: D = 0.0085, gain = 0.021 + 0.0205 - 0.0295
    # = 0.012 = 0.6 a. One request in the batch: 0.012 > 0.0085, it joins.
    p = planner(overhead=0.020, per_sample=0.0005)
    check(plan(p, now=0.005, elapsed=0.005, limit=1.0, free_at=0.021), 1, 3, 0.0295)
    # two requests in the batch: each is delayed, 2 x 0.0085 > 0.012
    assert plan(p, now=0.005, elapsed=0.005, limit=1.0, free_at=0.021, requests=2) is None
    # the check never overrides a budget: the batch must finish by 0.029
    assert plan(p, now=0.005, elapsed=0.005, limit=0.029, free_at=0.021) is None


def test_refuses_on_a_proportional_curve_although_budgets_fit() -> None:
    # L(b) = 0.0001 + 0.004 b: E = 0.0081, end = 0.00324 + 0.00164 + 0.6 x 0.0121 = 0.01214:
    # D = 0.00404, gain = 0.0081 + 0.0041 - 0.01214 = 0.00006 (0.6 a)
    p = planner(overhead=0.0001, per_sample=0.004)
    assert plan(p, now=0.001, elapsed=0.001, limit=1.0, free_at=0.0081) is None
    check(plan(p, now=0.001, elapsed=0.001, limit=1.0), 1, 3, 0.01214)  # budgets only: it joins


def test_a_smaller_group_when_the_largest_does_not_pay() -> None:
    # L(b) = 0.020 + 0.0005 b, max_batch_size 64, queued: 1 sample, then 40. Both (41
    # samples) would finish at 0.0084 + 0.4 x 0.0405 + 0.6 x 0.0415 = 0.0495, gaining
    # 0.021 + 0.0405 - 0.0495 = 0.012 each (0.024) for D = 0.0285: the head alone joins.
    p = planner(overhead=0.020, per_sample=0.0005, max_batch_size=64)
    check(plan(p, sizes=[1, 41], now=0.005, elapsed=0.005, limit=1.0, max_batch_size=64, free_at=0.021),
          1, 3, 0.0295)
    check(plan(p, sizes=[1, 41], now=0.005, elapsed=0.005, limit=1.0, max_batch_size=64), 2, 3, 0.0495)


def test_an_interpreter_freeing_before_the_batch_ends_lowers_the_gain() -> None:
    # L(b) = 0.020 + 0.0005 b: gain = 0.012 - (E - free_at) against D = 0.0085, so the
    # group joins only if another interpreter frees less than 3.5 ms before E = 0.021
    p = planner(overhead=0.020, per_sample=0.0005)
    check(plan(p, now=0.005, elapsed=0.005, limit=1.0, free_at=0.018), 1, 3, 0.0295)
    assert plan(p, now=0.005, elapsed=0.005, limit=1.0, free_at=0.017) is None
    # an interpreter due already (free_at before now) frees now: gain 0.005 + 0.0205 - 0.0295 < 0
    assert plan(p, now=0.005, elapsed=0.005, limit=1.0, free_at=0.001) is None


@pytest.mark.parametrize(("overhead", "per_sample"), [(0.0027, 0.0031), (0.002, 0.002), (0.0, 0.004)])
def test_no_join_pays_where_the_overhead_is_at_most_the_per_sample_cost(overhead: float, per_sample: float) -> None:
    # the batcher does not ask the planner when may_pay() is False: no state of a running
    # batch, its earlier groups, the queue and the other interpreters may pass the check
    p = planner(overhead=overhead, per_sample=per_sample, max_batch_size=32)
    assert not p.may_pay()
    rng = random.Random(7)
    unit = overhead + per_sample
    for _ in range(3000):
        samples = rng.randint(1, 20)
        offered = [rng.randint(1, 3) for _ in range(rng.randint(0, 2))]
        done = rng.randint(0, 2)
        elapsed = rng.uniform(0.0, 3.0) * unit * samples
        now = 10.0
        own = p.own_end(start=now - elapsed, now=now, samples=samples, offered=offered, done=done)
        free_at = rng.choice([own, own - rng.uniform(0.0, own - now + unit), now - unit])
        sizes = list(itertools.accumulate(rng.randint(1, 3) for _ in range(rng.randint(1, 6))))
        found = plan(p, sizes=sizes, limit=math.inf, limits=[math.inf] * len(sizes), done=done, now=now,
                     elapsed=elapsed, samples=samples, max_batch_size=64, offered=offered,
                     requests=rng.randint(1, samples), free_at=free_at)
        assert found is None


def test_joins_may_pay_where_the_overhead_exceeds_the_per_sample_cost() -> None:
    assert planner(overhead=0.020, per_sample=0.0005).may_pay()
    assert planner(overhead=0.0021, per_sample=0.002).may_pay()
    # other curve forms are not bounded in closed form: the planner is asked
    cost = CostModel([(1, 0.003), (2, 0.005), (4, 0.011)], max_batch_size=4, form="interp")
    assert JoinPlanner(cost, StageProfile(2, [0.5, 0.5])).may_pay()


# ---- the stage profile ----


def test_profile_from_one_measurement_normalised() -> None:
    prof = StageProfile(4, [8.0, 6.0, 4.0, 2.0])
    assert prof.shares == pytest.approx(SHARES) and prof.observations == 1
    assert prof.as_dict() == {"stages": 4, "shares": SHARES, "observations": 1}
    fresh = StageProfile(4)
    assert fresh.shares == [0.25] * 4 and fresh.observations == 0


def test_profile_learns_with_its_weight_and_stays_normalised() -> None:
    prof = StageProfile(4, SHARES, alpha=0.5)
    prof.observe([0.001] * 4)  # a batch with equal stages, at any time scale
    assert prof.shares == pytest.approx([0.325, 0.275, 0.225, 0.175])
    assert sum(prof.shares) == pytest.approx(1.0) and prof.observations == 2
    for _ in range(60):
        prof.observe([3.0, 1.0, 0.0, 0.0])  # a zero stage is a valid timing
    assert prof.shares == pytest.approx([0.75, 0.25, 0.0, 0.0], abs=1e-9)
    assert [prof.done(k) for k in (0, 1, 2, 4, 9)] == pytest.approx([0.0, 0.75, 1.0, 1.0, 1.0])


@pytest.mark.parametrize("seconds", [
    [1.0, 1.0, 1.0],  # wrong number of stages
    [1.0, 1.0, 1.0, 1.0, 1.0],
    [0.0, 0.0, 0.0, 0.0],  # nothing ran
    [1.0, -0.5, 1.0, 1.0],  # a negative stage
    [1.0, math.nan, 1.0, 1.0],
    [1.0, math.inf, 1.0, 1.0],
    [1e308, 1e308, 1.0, 1.0],  # a sum that overflows
])
def test_profile_ignores_malformed_timings(seconds: list[float]) -> None:
    prof = StageProfile(4, SHARES)
    prof.observe(seconds)
    assert prof.shares == pytest.approx(SHARES) and prof.observations == 1
    assert StageProfile(4, seconds).shares == [0.25] * 4


def test_invalid_profiles_are_refused() -> None:
    with pytest.raises(ValueError, match="at least one stage"):
        StageProfile(0)
    with pytest.raises(ValueError, match="alpha"):
        StageProfile(2, alpha=0.0)
    with pytest.raises(ValueError, match="alpha"):
        StageProfile(2, alpha=1.5)


def test_tightest_limit() -> None:
    assert tightest(1.0, 0.5, None) == 1.5
    assert tightest(1.0, 0.5, 1.2) == 1.2
    assert tightest(1.0, 0.5, 2.0) == 1.5
