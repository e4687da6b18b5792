"""AdaptivePolicy: exact decisions in hand-built scenarios, and behaviour under load (simulated)."""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable
from typing import NamedTuple

import pytest

from aserve.batching.adaptive import AdaptivePolicy
from aserve.batching.costmodel import CostModel, ladder
from aserve.batching.policy import Decision, WindowPolicy
from aserve.batching.simulate import Arrival, SimRequest, poisson, simulate


def curve(overhead: float, per_sample: float) -> Callable[[int], float]:
    return lambda b: overhead + per_sample * b


def policy(cost: Callable[[int], float], *, max_batch_size: int = 32, budget: float = 0.1,
           interpreters: int = 2, delay: float = 0.02) -> AdaptivePolicy:
    model = CostModel([(b, cost(b)) for b in ladder(max_batch_size)], max_batch_size=max_batch_size)
    return AdaptivePolicy(model, latency_budget_s=budget, interpreters=interpreters, max_queue_delay_s=delay)


def queue(*arrivals: float, samples: int = 1, budget: float | None = None) -> list[SimRequest]:
    return [SimRequest(t, samples, None, i, budget) for i, t in enumerate(arrivals)]


OVERHEAD = curve(0.010, 0.0005)  # batching is nearly free
LINEAR = curve(0.001, 0.004)  # per-sample work dominates
BENT = curve(0.010, 0.002)
CNN = curve(0.0042, 0.0041)  # the bundled staged CNN, measured on this machine


def capacity(cost: Callable[[int], float], max_batch_size: int, interpreters: int = 2) -> float:
    return interpreters * max(b / cost(b) for b in range(1, max_batch_size + 1))


# ---- exact decisions ----


def test_lone_requests_run_at_once() -> None:
    p = policy(LINEAR, budget=0.05)
    result = simulate(p, [0.0, 0.1, 0.2], LINEAR, interpreters=2, max_batch_size=32)
    assert result.groups() == [(0,), (1,), (2,)]
    assert [b.start for b in result.batches] == [0.0, 0.1, 0.2]
    assert result.latencies == [pytest.approx(LINEAR(1))] * 3


def test_a_free_interpreter_serves_the_queue_up_to_the_budget_size() -> None:
    p = policy(OVERHEAD)
    assert p.decide(0.03, queue(0.0, 0.01, 0.02, 0.03), idle=1, running=1, max_batch_size=32) == Decision(4, None)
    # per-sample work dominates: still one batch (splitting only pays the overhead twice),
    # but at most the budget size: L(12) = 0.049 <= 0.1 / 2 < L(13)
    p = policy(LINEAR)
    assert p.budget_batch(0.1, 32) == 12
    arrivals = [0.001 * i for i in range(20)]
    assert p.decide(0.019, queue(*arrivals), idle=1, running=1, max_batch_size=32) == Decision(12, None)


def test_spreads_over_free_slots() -> None:
    p = policy(OVERHEAD)
    assert p.decide(0.03, queue(0.0, 0.01, 0.02, 0.03), idle=2, running=0, max_batch_size=32) == Decision(2, None)


def test_budget_size_follows_each_requests_own_budget() -> None:
    arrivals = [0.001 * i for i in range(20)]
    p = policy(LINEAR, budget=0.1)
    # the head's own budget (50 ms) sets the budget size: L(6) = 0.025 <= 0.05 / 2 < L(7)
    assert p.decide(0.019, queue(*arrivals, budget=0.05), idle=1, running=1, max_batch_size=32) == Decision(6, None)
    assert policy(LINEAR, budget=0.05).decide(0.019, queue(*arrivals), idle=1, running=1,
                                              max_batch_size=32) == Decision(6, None)
    assert p.budget_of(SimRequest(0.0, 1, None, 0)) == 0.1
    assert p.limit_of(SimRequest(0.0, 1, 0.03, 0, 0.05)) == 0.03  # a sooner deadline wins
    assert p.limit_of(SimRequest(0.0, 1, 0.09, 0, 0.05)) == 0.05


def test_waits_only_when_the_overhead_saved_pays_for_the_wait() -> None:
    q = queue(0.0, 0.002)  # 500 requests/s: keep-up size 4 on OVERHEAD
    p = policy(OVERHEAD, delay=0.02)
    # 2 more arrive by 0.006; the wait costs 2 requests 4 ms each <= L(2) + L(2) - L(4) = 10 ms
    assert p.decide(0.002, q, idle=1, running=1, max_batch_size=32) == Decision(0, 0.02)
    assert p.keep_up_batch(0.002, 32) == 4
    # the head's own budget brings its latest start forward: 0.02 - L(4) = 0.008
    tight = policy(OVERHEAD, delay=0.02).decide(0.002, queue(0.0, 0.002, budget=0.02), idle=1, running=1,
                                                max_batch_size=32)
    assert tight.take == 0 and tight.wake_at == pytest.approx(0.008)
    # nothing running: no batch is on its way to fill, run at once
    assert policy(OVERHEAD).decide(0.002, q, idle=1, running=0, max_batch_size=32) == Decision(2, None)
    # the window closes (0.005) before the batch fills (0.006)
    assert policy(OVERHEAD, delay=0.005).decide(0.002, q, idle=1, running=1, max_batch_size=32) == Decision(2, None)
    # per-sample work dominates: 400 requests/s, keep-up size 5, filling it costs 2 x 7.5 ms
    # of waiting to save one 4.2 ms overhead: dispatch now
    p = policy(CNN)
    assert p.decide(0.0025, queue(0.0, 0.0025), idle=1, running=1, max_batch_size=32) == Decision(2, None)
    assert p.keep_up_batch(0.0025, 32) == 5


def test_overload_takes_efficient_batches() -> None:
    p = policy(BENT, budget=0.05)
    # budget size 7 (L(7) = 0.024 <= 0.025): 2 x 7 / L(7) = 583 samples/s; efficient size 24
    assert (p.budget_batch(0.05, 32), p.cost.efficient_batch(0.05), p.overload_batch(0.05, 32)) == (7, 24, 24)
    fast = [0.001 * i for i in range(40)]  # 1000 requests/s
    # arrivals beyond 583/s and 40 samples queued > 0.05 x 583 = 29: overloaded
    assert p.decide(0.039, queue(*fast), idle=1, running=1, max_batch_size=32) == Decision(24, None)
    assert p.overloaded(0.039, 40, 0.05, 32) and not p.overloaded(0.039, 29, 0.05, 32)
    # a fast rate with a short queue, or a long queue at a slow rate, is not overload
    assert policy(BENT, budget=0.05).decide(0.019, queue(*fast[:20]), idle=1, running=1,
                                            max_batch_size=32) == Decision(7, None)
    slow = [0.01 * i for i in range(40)]
    assert policy(BENT, budget=0.05).decide(0.39, queue(*slow), idle=1, running=1,
                                            max_batch_size=32) == Decision(7, None)
    # the overload size is never below the budget size (a flat curve's B may exceed it)
    assert policy(OVERHEAD).overload_batch(0.1, 32) == 32


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


def test_invalid_settings_are_refused() -> None:
    model = CostModel([(1, 0.01)], max_batch_size=1)
    for bad in ({"latency_budget_s": 0.0}, {"interpreters": 0}, {"max_queue_delay_s": -1.0}, {"headroom": 0.5},
                {"rate_alpha": 0.0}, {"admit_factor": 0.5}, {"tolerance": 1.0}):
        options: dict[str, float] = {"latency_budget_s": 0.05, "interpreters": 1, "max_queue_delay_s": 0.0}
        options.update(bad)
        with pytest.raises(ValueError):
            AdaptivePolicy(model, **options)  # type: ignore[arg-type]


# ---- overload and admission ----


def test_overload_degrades_to_efficient_batches() -> None:
    arrivals = poisson(2.0 * capacity(BENT, 32), 5.0, seed=2)
    p = policy(BENT)
    size = p.overload_batch(0.1, 32)
    assert (p.cost.throughput_optimal_batch(), size) == (32, 24)
    result = simulate(p, arrivals, BENT, interpreters=2, max_batch_size=32)
    # while arrivals outpace capacity (after the first second) every batch has the
    # efficient size: 58 ms each instead of 74 ms, for 4% less throughput
    late = [b for b in result.batches if 1.0 <= b.start < 5.0]
    assert late and all(b.samples == size for b in late)
    served_rate = sum(b.samples for b in late) / (max(b.end for b in late) - 1.0)
    assert served_rate >= 0.95 * 2 * size / BENT(size)


def test_admission_bounds_the_queue() -> None:
    p = policy(BENT, budget=0.05)
    per_second = 2 * 24 / BENT(24)  # the interpreters at the overload size
    assert p.queueing_delay(827) == pytest.approx(827 / per_second)
    assert p.admit(0.0, int(0.09 * per_second)) is None
    retry = p.admit(0.0, int(0.2 * per_second))
    assert retry is not None and retry == pytest.approx(0.2 - 0.05, rel=0.01)
    arrivals = poisson(2.0 * capacity(BENT, 32), 5.0, seed=3)
    result = simulate(policy(BENT, budget=0.05), arrivals, BENT, interpreters=2, max_batch_size=32, admit=True)
    unbounded = simulate(policy(BENT, budget=0.05), arrivals, BENT, interpreters=2, max_batch_size=32)
    assert result.refused and not unbounded.refused
    assert len(result.refused) >= 0.4 * len(arrivals)  # about half the load is beyond capacity
    # admitted: at most admit_factor budgets of queue, one batch to wait for, one to run in
    assert max(result.served()) <= 2 * 0.05 + 2 * BENT(24)
    assert max(unbounded.served()) > 1.0


# ---- the targets, simulated ----
# The bundled CNN's measured curve (and a flat one), 2 interpreters, max_batch_size 32,
# Poisson arrivals at 25-100% of capacity (2 x 32 / L(32) samples/s; multi-sample
# requests of k uniform in 1..10 samples arrive at that / 5.5 requests/s), budget 50 ms
# for single-sample requests and 100 ms for multi-sample ones, max_queue_delay half the
# budget, admission control on. Against fixed10 (a 10 ms window, batches of at most 10)
# and serial (every request alone). Deterministic given the seeds.

SEEDS = (1, 2, 3)
CURVES = {"cnn": CNN, "flat": OVERHEAD}
SECONDS = {"cnn": 20.0, "flat": 5.0}  # the flat curve serves 5x the requests per second


class Summary(NamedTuple):
    mean: float  # seconds, mean over seeds
    p99: float
    over: float  # fraction over budget (refused and timed out count)
    served: int  # requests served, all seeds
    throughput: float  # requests/s


@functools.cache
def summary(curve_name: str, requests: str, load: float, name: str) -> Summary:
    cost = CURVES[curve_name]
    multi = requests == "multi"
    budget = 0.1 if multi else 0.05
    rate = load * capacity(cost, 32) / (5.5 if multi else 1.0)
    runs = []
    for seed in SEEDS:
        arrivals = poisson(rate, SECONDS[curve_name], seed, (lambda rng: rng.randint(1, 10)) if multi else None)
        if name == "adaptive":
            result = simulate(policy(cost, budget=budget, delay=budget / 2), arrivals, cost, interpreters=2,
                              max_batch_size=32, admit=True)
        elif name == "fixed10":
            result = simulate(WindowPolicy(max_queue_delay=0.010), arrivals, cost, interpreters=2, max_batch_size=10)
        else:
            result = simulate(WindowPolicy(max_queue_delay=0.0), arrivals, cost, interpreters=2, max_batch_size=0)
        runs.append(result)
    return Summary(
        statistics.fmean(r.mean() for r in runs),
        statistics.fmean(r.percentile(99) for r in runs),
        statistics.fmean(r.over(budget) for r in runs),
        sum(len(r.served()) for r in runs),
        statistics.fmean(r.throughput() for r in runs),
    )


@pytest.mark.parametrize("load", [0.25, 0.5])
def test_cnn_single_mean_latency_a_quarter_below_fixed10(load: float) -> None:
    adaptive, fixed = summary("cnn", "single", load, "adaptive"), summary("cnn", "single", load, "fixed10")
    assert adaptive.mean <= 0.75 * fixed.mean
    assert adaptive.served >= fixed.served  # equal or higher throughput: every request served
    assert adaptive.over <= 0.01


@pytest.mark.parametrize("load", [0.25, 0.5])
def test_cnn_multi_meets_the_budget_and_beats_fixed10(load: float) -> None:
    adaptive, fixed = summary("cnn", "multi", load, "adaptive"), summary("cnn", "multi", load, "fixed10")
    assert adaptive.over <= 0.01
    assert adaptive.served >= fixed.served
    assert adaptive.mean <= 0.92 * fixed.mean
    # A request of k samples runs in a batch of at least k: its latency is at least L(k),
    # E[L(k)] = 4.2 + 4.1 x 5.5 = 26.75 ms for k uniform in 1..10, more than 75% of
    # fixed10's mean at 25% load: no policy can cut that mean by 25% there.
    bound = statistics.fmean(CNN(k) for k in range(1, 11))
    assert bound == pytest.approx(0.02675)
    assert summary("cnn", "multi", 0.25, "fixed10").mean * 0.75 < bound


def test_cnn_at_three_quarters_load_misses_least() -> None:
    # 354 requests/s of 50 ms budget: a batch must finish within the budget, so b <= 11
    # (L(11) = 49.3 ms) even with no wait at all, and those batches serve at most
    # 446/s; a batch that leaves half the budget to wait (b <= 5) serves 405/s, 87%
    # busy. At that utilisation Poisson bursts push a few percent of requests past
    # 50 ms under any FIFO policy (the best fixed cap found by search misses 4.2%),
    # so the 1% target is out of reach at 75%. The adaptive policy misses about 5%,
    # fixed10 about 18%, serial nearly all (it cannot keep up at all).
    adaptive = summary("cnn", "single", 0.75, "adaptive")
    fixed = summary("cnn", "single", 0.75, "fixed10")
    assert adaptive.over <= 0.06 and adaptive.over <= fixed.over / 3
    assert adaptive.mean < fixed.mean and adaptive.served >= fixed.served
    assert summary("cnn", "single", 0.75, "serial").over > 0.9
    # multi-sample: whole requests of up to 10 samples (45 ms alone) leave little room;
    # every policy misses the 100 ms budget for about a quarter of them, adaptive least
    adaptive = summary("cnn", "multi", 0.75, "adaptive")
    assert adaptive.over < summary("cnn", "multi", 0.75, "fixed10").over
    assert adaptive.over < summary("cnn", "multi", 0.75, "serial").over


@pytest.mark.parametrize("requests", ["single", "multi"])
def test_cnn_full_load_keeps_throughput_and_bounds_latency(requests: str) -> None:
    adaptive = summary("cnn", requests, 1.0, "adaptive")
    fixed = summary("cnn", requests, 1.0, "fixed10")
    assert adaptive.throughput >= 0.97 * fixed.throughput
    budget = 0.1 if requests == "multi" else 0.05
    # admission: at most 2 budgets of queue, one batch to wait for, one to run in
    assert adaptive.p99 <= 2 * budget + 2 * CNN(12)
    assert fixed.p99 > 1.0  # the window's queue grows without bound


@pytest.mark.parametrize("requests", ["single", "multi"])
def test_flat_curve_meets_the_budget_up_to_three_quarters(requests: str) -> None:
    for load in (0.25, 0.5, 0.75):
        adaptive = summary("flat", requests, load, "adaptive")
        assert adaptive.over <= 0.01
        assert adaptive.mean <= 1.05 * summary("flat", requests, load, "fixed10").mean
