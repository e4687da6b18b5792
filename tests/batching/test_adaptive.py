"""AdaptivePolicy: exact decisions in hand-built scenarios, and behaviour under load (simulated)."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from aserve.batching.adaptive import AdaptivePolicy
from aserve.batching.costmodel import CostModel, ladder
from aserve.batching.policy import Decision
from aserve.batching.simulate import Arrival, SimRequest, simulate


def curve(overhead: float, per_sample: float) -> Callable[[int], float]:
    return lambda b: overhead + per_sample * b


def policy(cost: Callable[[int], float], *, max_batch_size: int = 32, budget: float = 0.1,
           interpreters: int = 2, delay: float = 0.02) -> AdaptivePolicy:
    model = CostModel([(b, cost(b)) for b in ladder(max_batch_size)], max_batch_size=max_batch_size)
    return AdaptivePolicy(model, latency_budget_s=budget, interpreters=interpreters, max_queue_delay_s=delay)


def queue(*arrivals: float, samples: int = 1) -> list[SimRequest]:
    return [SimRequest(t, samples, None, i) for i, t in enumerate(arrivals)]


OVERHEAD = curve(0.010, 0.0005)  # batching is nearly free
LINEAR = curve(0.001, 0.004)  # per-sample work dominates (like the bundled CNN)
BENT = curve(0.010, 0.002)


def poisson(rate: float, seconds: float, seed: int, samples: Callable[[random.Random], int] | None = None
            ) -> list[Arrival]:
    rng = random.Random(seed)
    t = 0.0
    out: list[Arrival] = []
    while True:
        t += rng.expovariate(rate)
        if t >= seconds:
            return out
        out.append(Arrival(t, samples(rng) if samples else 1))


def capacity(cost: Callable[[int], float], max_batch_size: int, interpreters: int = 2) -> float:
    return interpreters * max(b / cost(b) for b in range(1, max_batch_size + 1))


# ---- exact decisions ----


def test_lone_requests_run_at_once() -> None:
    p = policy(LINEAR, budget=0.05)
    result = simulate(p, [0.0, 0.1, 0.2], LINEAR, interpreters=2, max_batch_size=32)
    assert result.groups() == [(0,), (1,), (2,)]
    assert [b.start for b in result.batches] == [0.0, 0.1, 0.2]
    assert result.latencies == [pytest.approx(LINEAR(1))] * 3


def test_joins_when_batching_is_cheap_and_one_slot_is_free() -> None:
    p = policy(OVERHEAD)
    assert p.decide(0.03, queue(0.0, 0.01, 0.02, 0.03), idle=1, running=1, max_batch_size=32) == Decision(4, None)


def test_spreads_over_free_slots_instead_of_joining() -> None:
    p = policy(OVERHEAD)
    assert p.decide(0.03, queue(0.0, 0.01, 0.02, 0.03), idle=2, running=0, max_batch_size=32) == Decision(1, None)


def test_no_join_when_per_sample_work_dominates() -> None:
    p = policy(LINEAR)
    assert p.decide(0.03, queue(0.0, 0.01, 0.02, 0.03), idle=1, running=1, max_batch_size=32) == Decision(1, None)


def test_budget_limits_the_batch_and_a_late_head_goes_at_keep_up_size() -> None:
    arrivals = [0.03 * i / 7 for i in range(8)]  # 233 requests/s: keep-up size 3 on BENT
    p = policy(BENT, budget=0.051)
    # 0.03 + L(5) = 0.05 <= 0.051 < 0.03 + L(6)
    assert p.decide(0.03, queue(*arrivals), idle=1, running=1, max_batch_size=32) == Decision(5, None)
    assert p.keep_up_batch(0.03, 32) == 3
    late = policy(BENT, budget=0.045)  # not even L(3) fits: keep-up size, no more
    assert late.decide(0.03, queue(*arrivals), idle=1, running=1, max_batch_size=32) == Decision(3, None)


def test_waits_for_a_keep_up_batch_while_arrivals_can_fill_it() -> None:
    p = policy(BENT, delay=0.02)
    q = queue(0.0, 0.002)  # 500 requests/s: keep-up size 9
    # 7 more arrive in 0.014 s: fill by 0.016 <= min(0 + 0.02, 0.1 - L(9))
    assert p.decide(0.002, q, idle=1, running=1, max_batch_size=32) == Decision(0, 0.02)
    assert p.keep_up_batch(0.002, 32) == 9
    impatient = policy(BENT, delay=0.01)  # the window closes before the batch fills
    assert impatient.decide(0.002, q, idle=1, running=1, max_batch_size=32) == Decision(2, None)


def test_multi_sample_requests_are_placed_whole() -> None:
    p = policy(OVERHEAD, max_batch_size=8)
    q = [SimRequest(0.0, 5, None, 0), SimRequest(0.1, 4, None, 1), SimRequest(0.2, 3, None, 2)]
    assert p.decide(0.2, q, idle=1, running=1, max_batch_size=8) == Decision(1, None)
    result = simulate(policy(OVERHEAD, max_batch_size=8), [Arrival(0.0, 5), Arrival(0.0, 4), Arrival(0.0, 3)],
                      OVERHEAD, interpreters=1, max_batch_size=8)
    assert result.groups() == [(0,), (1, 2)]


def test_no_decision_without_a_free_slot_and_no_batching_model() -> None:
    p = policy(LINEAR)
    assert p.decide(0.0, queue(0.0), idle=0, running=2, max_batch_size=32) == Decision(0, None)
    assert p.decide(0.0, queue(0.0, 0.0), idle=1, running=0, max_batch_size=0) == Decision(1, None)


def test_arrival_rate_tracks_gaps_and_decays_in_silence() -> None:
    p = policy(LINEAR)
    q = queue(*[0.01 * i for i in range(50)])
    p.decide(0.49, q, idle=0, running=2, max_batch_size=32)
    assert p.arrival_rate(0.49) == pytest.approx(100.0)
    p.decide(0.49, q, idle=0, running=2, max_batch_size=32)  # the same queue again: nothing new
    assert p.arrival_rate(0.49) == pytest.approx(100.0)
    assert p.arrival_rate(1.49) == pytest.approx(1 / (0.01 + 0.05 * (1.0 - 0.01)))
    assert p.arrival_rate(100.0) < 1.0


# ---- under load ----


@pytest.mark.parametrize("cost", [OVERHEAD, LINEAR, BENT], ids=["overhead", "linear", "bent"])
def test_budget_is_met_at_moderate_load(cost: Callable[[int], float]) -> None:
    budget = 0.05
    arrivals = poisson(0.5 * capacity(cost, 32), 20.0, seed=1)
    result = simulate(policy(cost, budget=budget), arrivals, cost, interpreters=2, max_batch_size=32)
    assert len(result.served()) == len(arrivals)
    assert result.over(budget) <= 0.01


def test_overload_degrades_to_throughput_optimal_batches() -> None:
    arrivals = poisson(2.0 * capacity(BENT, 32), 5.0, seed=2)
    p = policy(BENT)
    best = p.cost.throughput_optimal_batch()
    assert best == 32
    result = simulate(p, arrivals, BENT, interpreters=2, max_batch_size=32)
    # while arrivals outpace capacity (after the first second), every batch is the best size
    late = [b.samples for b in result.batches if 1.0 <= b.start < 5.0]
    assert late and all(s == best for s in late)
    served_rate = sum(late) / (max(b.end for b in result.batches if b.start < 5.0) - 1.0)
    assert served_rate >= 0.95 * capacity(BENT, 32)


def test_admission_refuses_beyond_the_budget_factor() -> None:
    p = policy(BENT, budget=0.05)
    per_second = 2 * 32 / BENT(32)
    assert p.admit(0.0, int(0.09 * per_second)) is None
    retry = p.admit(0.0, int(0.2 * per_second))
    assert retry is not None and retry == pytest.approx(0.2 - 0.05, rel=0.05)
    arrivals = poisson(2.0 * capacity(BENT, 32), 5.0, seed=3)
    result = simulate(policy(BENT, budget=0.05), arrivals, BENT, interpreters=2, max_batch_size=32, admit=True)
    unbounded = simulate(policy(BENT, budget=0.05), arrivals, BENT, interpreters=2, max_batch_size=32)
    assert result.refused and not unbounded.refused
    # admitted: at most admit_factor budgets of queueing plus a few batches
    assert max(result.served()) <= 2 * 0.05 + 3 * BENT(32)
    assert max(unbounded.served()) > 1.0


@pytest.mark.parametrize("cost", [OVERHEAD, LINEAR], ids=["overhead", "linear"])
def test_lower_mean_latency_than_the_window_at_low_load(cost: Callable[[int], float]) -> None:
    policy_module = pytest.importorskip("aserve.batching.policy", reason="the window policy is not there yet")
    window_class = getattr(policy_module, "WindowPolicy", None)
    if window_class is None:
        pytest.skip("aserve.batching.policy has no WindowPolicy yet")
    arrivals = poisson(0.25 * capacity(cost, 32), 20.0, seed=4)
    window = simulate(window_class(max_queue_delay=0.01), arrivals, cost, interpreters=2, max_batch_size=10)
    adaptive = simulate(policy(cost), arrivals, cost, interpreters=2, max_batch_size=32)
    assert adaptive.mean() < window.mean()
