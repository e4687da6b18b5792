"""AdaptivePolicy through the real Batcher in virtual time (benchmarks.sim.simulation): exact
schedules in small scenarios, and behaviour under Poisson load and overload against a fixed window
and no batching. The curves and `policy` are tests/batching/test_adaptive.py's."""

from __future__ import annotations

import functools
import random
import statistics
from typing import NamedTuple

import pytest

from aserve.batching.policy import WindowPolicy
from benchmarks.sim.simulation import Arrival, SimResult, poisson, simulate
from tests.batching.test_adaptive import (
    CNN,
    CNN_BUSY,
    LINEAR,
    OVERHEAD,
    UNIT,
    UNIT_FLAT,
    capacity,
    curve,
    policy,
)


def test_lone_requests_run_at_once() -> None:
    p = policy(LINEAR, budget=0.05)
    result = simulate(p, [0.0, 0.1, 0.2], LINEAR, interpreters=2, max_batch_size=32)
    assert result.groups() == [(0,), (1,), (2,)]
    assert [b.start for b in result.batches] == [0.0, 0.1, 0.2]
    assert result.latencies == [pytest.approx(LINEAR(1))] * 3


def test_queued_work_runs_one_by_one_where_batching_does_not_pay() -> None:
    # L(b) = 1 + 2b s, one interpreter: #0 runs 0-3; #1..#3 queue meanwhile. One by one
    # they end at 6, 9, 12 (sum 27); as one batch all at 10 (sum 30): one by one.
    p = policy(UNIT, budget=100.0, interpreters=1)
    assert not p.batching_pays()
    result = simulate(p, [0.0, 0.1, 0.2, 0.3], UNIT, interpreters=1, max_batch_size=32)
    assert result.groups() == [(0,), (1,), (2,), (3,)]
    assert result.latencies == pytest.approx([3.0, 5.9, 8.8, 11.7])
    # L(b) = 4 + 0.5b: one by one 9, 13.5, 18 (sum 40.5); one batch at 10 (sum 30)
    p = policy(UNIT_FLAT, budget=100.0, interpreters=1)
    assert p.batching_pays()
    result = simulate(p, [0.0, 0.1, 0.2, 0.3], UNIT_FLAT, interpreters=1, max_batch_size=32)
    assert result.groups() == [(0,), (1, 2, 3)]


def test_spreads_over_free_interpreters() -> None:
    for cost in (UNIT, UNIT_FLAT):  # two alone in parallel beat one batch of two on either curve
        result = simulate(policy(cost, budget=100.0), [0.0, 0.0], cost, interpreters=2, max_batch_size=32)
        assert result.groups() == [(0,), (1,)] and [b.start for b in result.batches] == [0.0, 0.0]


def test_batches_grow_only_as_far_as_the_budgets_need() -> None:
    # L(b) = 1 + 2b s, one interpreter, budget 14 s: #0 runs 0-3, #1..#4 queue. At 3, one by
    # one would end #4 at 15 (late); (#1 #2) end at 8, then #3 and #4 at 13 as a pair or
    # at 11 and 14 alone: every budget holds, so the smallest batches that keep them do.
    p = policy(UNIT, budget=14.0, interpreters=1)
    assert (p.largest_batch(14.0, 32), p.backlog_batch(14.0, 32)) == (3, 3)  # 2 L(3) = 14
    result = simulate(p, [0.0, 0.1, 0.2, 0.3, 0.4], UNIT, interpreters=1, max_batch_size=32)
    assert result.groups() == [(0,), (1, 2), (3,), (4,)]
    assert result.latencies == pytest.approx([3.0, 7.9, 7.8, 10.7, 13.6])
    # one more at 0.5 would end at 16 at the earliest (14.5 allowed): it is refused, and
    # told to retry after at least one batch of the backlog size (L(3) = 7 s)
    result = simulate(policy(UNIT, budget=14.0, interpreters=1), [0.0, 0.1, 0.2, 0.3, 0.4, 0.5], UNIT,
                      interpreters=1, max_batch_size=32)
    assert result.refused == [5] and result.retry_after == (pytest.approx(7.0),)
    assert result.latencies[:5] == pytest.approx([3.0, 7.9, 7.8, 10.7, 13.6])


def test_multi_sample_requests_are_placed_whole() -> None:
    result = simulate(policy(OVERHEAD, max_batch_size=8), [Arrival(0.0, 5), Arrival(0.0, 4), Arrival(0.0, 3)],
                      OVERHEAD, interpreters=1, max_batch_size=8)
    assert result.groups() == [(0,), (1, 2)]


# ---- the targets, simulated: adaptive against serial and fixed10 on the same arrivals ----
# 2 interpreters, max_batch_size 32, Poisson arrivals at a share of the capacity
# (2 x 32 / L(32) samples/s; multi-sample requests of k uniform in 1..10 samples arrive at
# that / 5.5 requests/s), budget 50 ms for single-sample requests and 100 ms for
# multi-sample ones, max_queue_delay half the budget, admission control on. fixed10: a
# 10 ms window, batches of at most 10; serial: every request alone. Deterministic.

SEEDS = (1, 2, 3)
CURVES = {"cnn": CNN, "busy": CNN_BUSY, "flat": OVERHEAD}
SECONDS = {"cnn": 10.0, "busy": 10.0, "flat": 3.0}  # the flat curve serves 6x the requests per second


class Summary(NamedTuple):
    mean: float  # seconds, mean over seeds
    p99: float
    over: float  # fraction over budget (refused and timed out count)
    served: int  # requests served, all seeds
    throughput: float  # requests/s


@functools.cache
def runs(curve_name: str, requests: str, load: float, name: str) -> tuple[SimResult, ...]:
    cost = CURVES[curve_name]
    multi = requests == "multi"
    budget = 0.1 if multi else 0.05
    rate = load * capacity(cost, 32) / (5.5 if multi else 1.0)
    out = []
    for seed in SEEDS:
        arrivals = poisson(rate, SECONDS[curve_name], seed, (lambda rng: rng.randint(1, 10)) if multi else None)
        if name == "adaptive":
            result = simulate(policy(cost, budget=budget, delay=budget / 2), arrivals, cost, interpreters=2,
                              max_batch_size=32)
        elif name == "fixed10":
            result = simulate(WindowPolicy(max_queue_delay=0.010), arrivals, cost, interpreters=2, max_batch_size=10)
        else:
            result = simulate(WindowPolicy(max_queue_delay=0.0), arrivals, cost, interpreters=2, max_batch_size=0)
        out.append(result)
    return tuple(out)


def summary(curve_name: str, requests: str, load: float, name: str) -> Summary:
    budget = 0.1 if requests == "multi" else 0.05
    rs = runs(curve_name, requests, load, name)
    return Summary(
        statistics.fmean(r.mean() for r in rs),
        statistics.fmean(r.percentile(99) for r in rs),
        statistics.fmean(r.over(budget) for r in rs),
        sum(len(r.served()) for r in rs),
        statistics.fmean(r.throughput() for r in rs),
    )


@pytest.mark.parametrize("curve_name", ["cnn", "busy"])
@pytest.mark.parametrize("load", [0.1, 0.25, 0.4])
def test_never_slower_than_no_batching_where_that_keeps_up(curve_name: str, load: float) -> None:
    # Serial (every request alone, at once) keeps up to about 55% load on the CNN's curve.
    # Adaptive knows from the curve that batching queued work does not pay there and runs
    # requests alone, spread over the interpreters, until the arrivals need batches.
    adaptive, serial = summary(curve_name, "single", load, "adaptive"), summary(curve_name, "single", load, "serial")
    assert adaptive.mean <= serial.mean * (1 + 1e-9)
    assert adaptive.served == serial.served


def test_no_slower_than_no_batching_at_half_load_and_far_faster_where_serial_queues() -> None:
    adaptive, serial = summary("cnn", "single", 0.5, "adaptive"), summary("cnn", "single", 0.5, "serial")
    assert adaptive.mean <= 0.7 * serial.mean  # serial's interpreters are 91% busy; adaptive batches some
    for requests in ("single", "multi"):
        for load in (0.25, 0.5):  # multi-sample: within 0.5% (a few early requests share a batch)
            a, s = summary("cnn", requests, load, "adaptive"), summary("cnn", requests, load, "serial")
            assert a.mean <= s.mean * (1.0 if requests == "single" else 1.005), (requests, load)


@pytest.mark.parametrize("load", [0.25, 0.5])
def test_cnn_single_mean_latency_a_quarter_below_fixed10(load: float) -> None:
    adaptive, fixed = summary("cnn", "single", load, "adaptive"), summary("cnn", "single", load, "fixed10")
    assert adaptive.mean <= 0.75 * fixed.mean
    assert adaptive.served >= fixed.served  # equal or higher throughput: every request served
    assert adaptive.over <= 0.01


def test_cnn_single_meets_the_budget_up_to_three_quarters_load() -> None:
    for load in (0.25, 0.5, 0.75):
        assert summary("cnn", "single", load, "adaptive").over <= 0.01, load
    # fixed10 misses 3% at 75%, serial cannot keep up
    assert summary("cnn", "single", 0.75, "fixed10").over > 0.02
    assert summary("cnn", "single", 0.75, "serial").over > 0.9


def test_cnn_multi_meets_the_budget_at_low_load_and_misses_least_at_three_quarters() -> None:
    for load in (0.25, 0.5):
        adaptive, fixed = summary("cnn", "multi", load, "adaptive"), summary("cnn", "multi", load, "fixed10")
        assert adaptive.over <= 0.01 and adaptive.served >= 0.999 * fixed.served
        assert adaptive.mean <= 0.9 * fixed.mean
    # A request of k samples runs in a batch of at least k: L(k) averages 19.75 ms for k
    # in 1..10, more than 75% of fixed10's mean at 25% load: no policy cuts that by 25%.
    assert statistics.fmean(CNN(k) for k in range(1, 11)) > 0.75 * summary("cnn", "multi", 0.25, "fixed10").mean
    # At 75% whole requests of up to 10 samples (33.7 ms alone) leave little room within
    # 100 ms: adaptive refuses about 3%, fixed10 and serial let about 10% run late.
    adaptive = summary("cnn", "multi", 0.75, "adaptive")
    assert adaptive.over <= 0.5 * summary("cnn", "multi", 0.75, "fixed10").over
    assert adaptive.over <= 0.5 * summary("cnn", "multi", 0.75, "serial").over


@pytest.mark.parametrize("requests", ["single", "multi"])
def test_flat_curve_meets_the_budget_up_to_three_quarters(requests: str) -> None:
    for load in (0.25, 0.5, 0.75):
        adaptive = summary("flat", requests, load, "adaptive")
        assert adaptive.over <= 0.01
        assert adaptive.mean <= 1.05 * summary("flat", requests, load, "fixed10").mean


# ---- overload: admission holds the budget of what it admits ----


def overload(factor: float, alpha: float, load: float, seed: int) -> dict[str, SimResult]:
    """The CNN's curve in the policy, an engine `factor` times slower, arrivals at `load`
    times what the engine serves in batches of 32; the server's default window policy
    (1 ms, max_batch_size 32, max_queue_size 4096) and fixed10 on the same arrivals."""
    truth = curve(factor * 0.0027, factor * 0.0031)
    arrivals = poisson(load * capacity(truth, 32), 4.0, seed)
    return {
        "adaptive": simulate(policy(CNN, budget=0.05, delay=0.001, alpha=alpha), arrivals, truth, interpreters=2,
                             max_batch_size=32),
        "window": simulate(WindowPolicy(max_queue_delay=0.001), arrivals, truth, interpreters=2, max_batch_size=32,
                           max_queue_size=4096),
        "fixed10": simulate(WindowPolicy(max_queue_delay=0.010), arrivals, truth, interpreters=2,
                            max_batch_size=10, max_queue_size=4096),
    }


def in_time(result: SimResult, budget: float, start: float, end: float) -> float:
    """Requests answered within budget per second between start and end (goodput)."""
    done = sum(1 for a, x in zip(result.arrivals, result.latencies)
               if x is not None and x <= budget and start <= a + x <= end)
    return done / (end - start)


@pytest.mark.parametrize(("factor", "alpha"), [(1.0, 0.1), (1.5, 0.1), (1.5, 0.0)])
def test_overload_admitted_requests_meet_their_budget(factor: float, alpha: float) -> None:
    # The engine runs `factor` times slower than the policy's cost model; with alpha 0 the
    # cost model does not learn it at all and only the measured slowdown does. At 3x
    # what the pool can serve, admission refuses most requests (503 with a Retry-After),
    # and 99% of those it admits finish within the 50 ms budget, from the first second on.
    # Throughput: a batch that ends within 50 ms holds at most L^-1(50 ms) samples, so no
    # policy that keeps the budget can match the throughput of the window policy's
    # batches of 32 (102 ms each on the CNN); adaptive runs batches of 9 (6 when the
    # engine is 1.5x slower), 94% (90%) of it, as much as fixed10 within 5%. The window
    # policy and fixed10 queue without bound: their answers come seconds late.
    truth = curve(factor * 0.0027, factor * 0.0031)
    for seed in (1, 2):
        r = overload(factor, alpha, 3.0, seed)
        adaptive, window, fixed = r["adaptive"], r["window"], r["fixed10"]
        assert adaptive.refused and all(0.0 < t < 1.0 for t in adaptive.retry_after)
        assert adaptive.over(0.05, admitted=True) <= 0.01
        assert adaptive.throughput(1.0, 4.0) >= 0.95 * fixed.throughput(1.0, 4.0)
        # the bound: batches of the largest size that ends in time after one turn, (1 + 1/2) L(b) <= 50 ms
        size = max(b for b in range(1, 33) if 1.5 * truth(b) <= 0.05)
        assert adaptive.throughput(1.0, 4.0) >= 0.97 * 2 * size / truth(size)
        assert adaptive.throughput(1.0, 4.0) >= (0.93 if factor == 1.0 else 0.85) * window.throughput(1.0, 4.0)
        assert in_time(adaptive, 0.05, 1.0, 4.0) >= 0.99 * adaptive.throughput(1.0, 4.0)
        assert in_time(window, 0.05, 1.0, 4.0) == in_time(fixed, 0.05, 1.0, 4.0) == 0.0
        assert window.percentile(50) > 1.0


@pytest.mark.parametrize("seed", [1, 2])
def test_overload_with_jittery_batches(seed: int) -> None:
    # Each batch takes the curve's time times a factor uniform in 0.9..1.1: admission and
    # the backlog size plan with the batches' mean ratio plus three mean deviations.
    rng = random.Random(seed)

    def jittery(b: int) -> float:
        return CNN(b) * rng.uniform(0.9, 1.1)

    arrivals = poisson(3.0 * capacity(CNN, 32), 4.0, seed)
    adaptive = simulate(policy(CNN, budget=0.05, delay=0.025), arrivals, jittery, interpreters=2, max_batch_size=32)
    assert adaptive.over(0.05, admitted=True) <= 0.01
    assert adaptive.throughput(1.0, 4.0) >= 0.9 * capacity(CNN, 32)


def bursts(seed: int, *, size: int = 200, spread: float = 0.004, seconds: float = 5.0) -> list[float]:
    """Poisson arrivals at half the CNN's capacity, and every second a burst of `size`
    requests within `spread` seconds (clients refused together come back together)."""
    rng = random.Random(seed)
    times = [a.time for a in poisson(0.5 * capacity(CNN, 32), seconds, seed)]
    for k in range(1, int(seconds)):
        times += [k + rng.uniform(0.0, spread) for _ in range(size)]
    return sorted(times)


@pytest.mark.parametrize("slower", [1.0, 1.5])
def test_bursts_admit_only_what_the_batches_of_the_burst_finish_in_time(slower: float) -> None:
    # A burst comes while both interpreters are busy, so no decision runs until one frees:
    # admission must count the burst's arrivals itself. With the keep-up size of the light
    # load before it, it predicted small batches for the first few dozen and admitted them,
    # then the arrivals outpaced every size, the batches had the backlog size, and 1.4-1.7%
    # of the admitted requests ended late on an exact curve.
    truth = curve(slower * 0.0027, slower * 0.0031)
    for seed in (1, 2, 3):
        result = simulate(policy(CNN, budget=0.05, delay=0.001), bursts(seed), truth, interpreters=2,
                          max_batch_size=32)
        assert len(result.refused) > 500  # each burst is far more than 50 ms of work
        assert result.over(0.05, admitted=True) <= 0.005, seed


def test_overload_at_full_load_keeps_throughput_and_bounds_latency() -> None:
    for requests in ("single", "multi"):
        adaptive, fixed = summary("cnn", requests, 1.0, "adaptive"), summary("cnn", requests, 1.0, "fixed10")
        budget = 0.1 if requests == "multi" else 0.05
        assert adaptive.throughput >= 0.95 * fixed.throughput
        assert adaptive.p99 <= budget  # admitted requests keep the budget
        assert fixed.p99 > 0.3  # the window's queue grows
        assert statistics.fmean(r.over(budget, admitted=True) for r in runs("cnn", requests, 1.0, "adaptive")) <= 0.01
