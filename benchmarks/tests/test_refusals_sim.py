"""Admission judged by what it refuses: each refused request replayed admitted in virtual
time (benchmarks.sim.simulation.refused_in_time), and the share of refusals that would
have met their budget under load with jittered batch times."""

from __future__ import annotations

import random

import pytest

from aserve.batching.adaptive import AdaptivePolicy
from aserve.batching.costmodel import CostModel, ladder
from benchmarks.batching import _ten
from benchmarks.sim.simulation import Arrival, poisson, refused_in_time, simulate
from tests.batching.test_adaptive import CNN, UNIT, capacity


def fresh(cost, *, budget: float, admit_factor: float = 1.0, max_batch_size: int = 1,
          interpreters: int = 1):  # type: ignore[no-untyped-def]
    def make() -> tuple[AdaptivePolicy, None]:
        model = CostModel([(b, cost(b)) for b in ladder(max_batch_size)], max_batch_size=max_batch_size)
        return AdaptivePolicy(model, latency_budget_s=budget, interpreters=interpreters,
                              max_queue_delay_s=0.0, admit_factor=admit_factor, contention=1.0), None
    return make


@pytest.mark.parametrize("factor, made", [(1.0, []), (0.5, [1, 2, 3])])
def test_each_refusal_is_replayed_admitted(factor: float, made: list[int]) -> None:
    # L(1) = 3 s, one interpreter, one request a batch, four at once, budget 8 s: they would
    # end at 3, 6, 9, 12. Admission to 8 s refuses #2 and #3, and admitted alone each ends
    # at 9 (the others of them refused): late. Admission to 4 s refuses #1 to #3; admitted
    # alone each ends at 6: in time.
    make = fresh(UNIT, budget=8.0, admit_factor=factor)
    arrivals = [Arrival(0.0)] * 4
    result = simulate(make()[0], arrivals, UNIT, interpreters=1, max_batch_size=1, budget=8.0)
    assert result.refused == ([2, 3] if factor == 1.0 else [1, 2, 3])
    assert refused_in_time(make, arrivals, UNIT, result, interpreters=1, max_batch_size=1, budget=8.0) == made


def test_few_refusals_would_have_made_it_under_jitter() -> None:
    # the bundled CNN's curve, batch times +-25% at random, multi-sample requests at 3/4 of
    # capacity: admission's margin is one caution over the batches' summed variance, and a
    # batch ahead holds the samples whole requests fill on average, so it refuses few
    budget, top = 0.1, 32
    arrivals = poisson(0.75 * capacity(CNN, top) / 5.5, 6.0, 1, _ten)

    def jittered() -> object:
        rng = random.Random(7)
        return lambda b: CNN(b) * (1.0 + 0.25 * (2.0 * rng.random() - 1.0))

    make = fresh(CNN, budget=budget, max_batch_size=top, interpreters=2)
    result = simulate(make()[0], arrivals, jittered(), interpreters=2, max_batch_size=top, budget=budget)
    assert result.over(budget, admitted=True) == 0.0
    assert 0 < len(result.refused) < 0.06 * len(arrivals)
    made = refused_in_time(make, arrivals, jittered(), result, interpreters=2, max_batch_size=top, budget=budget)
    assert set(made) <= set(result.refused)
