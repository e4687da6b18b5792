"""The simulation: the real Batcher on a virtual-time loop with a simulated engine.

Scripted policies pin down exactly when the batcher asks its policy, what it
dispatches, how timers, deadlines and admission behave, and what the results record."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from aserve.batching.adaptive import AdaptivePolicy
from aserve.batching.costmodel import CostModel, ladder
from aserve.batching.policy import Decision, Pending, WindowPolicy
from benchmarks.sim.simulation import Arrival, Simulation, poisson, simulate

WAIT = Decision(0, None)


class Scripted:
    """Answers from a script keyed by call number; records every call."""

    def __init__(self, script: dict[int, Decision], default: Decision = WAIT) -> None:
        self.script = script
        self.default = default
        self.calls: list[tuple[float, int, int, int]] = []  # now, queued, idle, running
        self.observed: list[tuple[int, float]] = []

    def decide(self, now: float, queue: Sequence[Pending], *, idle: int, running: int,
               max_batch_size: int, queued: int | None = None) -> Decision:
        self.calls.append((now, len(queue), idle, running))
        return self.script.get(len(self.calls), self.default)

    def observe(self, samples: int, seconds: float) -> None:
        self.observed.append((samples, seconds))


def cost(b: int) -> float:
    return 1.0 + 0.5 * b


def test_wait_until_then_take_all() -> None:
    policy = Scripted({1: Decision(0, 5.0), 4: Decision(3, None)})
    result = simulate(policy, [0.0, 1.0, 2.0], cost, interpreters=1, max_batch_size=8)
    # decide on each arrival, then when the timer set at call 1 fires
    assert [c[0] for c in policy.calls] == [0.0, 1.0, 2.0, 5.0]
    assert result.groups() == [(0, 1, 2)]
    assert result.batches[0].start == 5.0 and result.batches[0].end == 7.5
    assert result.latencies == [7.5, 6.5, 5.5]
    assert policy.observed == [(3, 2.5)]


def test_a_later_wake_at_replaces_the_timer_and_none_keeps_it() -> None:
    policy = Scripted({1: Decision(0, 9.0), 2: Decision(0, 4.0), 3: Decision(0, None), 4: Decision(3, None)})
    simulate(policy, [0.0, 1.0, 2.0], cost, interpreters=1, max_batch_size=8)
    # 9.0 was replaced by 4.0; None at t=2 kept the 4.0 timer; 9.0 never fires
    assert [c[0] for c in policy.calls] == [0.0, 1.0, 2.0, 4.0]


def test_decide_repeats_while_slots_are_free_and_never_when_full() -> None:
    policy = Scripted({}, default=Decision(1, None))
    sim = Simulation(interpreters=2)
    sim.model("m", policy, cost, max_batch_size=8)
    sim.arrive("m", [0.0, 0.0, 0.0])
    result = sim.run()["m"]
    # the first arrival is dispatched at once; the second takes the other interpreter;
    # the third waits for a completion (at 1.5) without the policy being asked
    assert [(c[0], c[2], c[3]) for c in policy.calls] == [(0.0, 2, 0), (0.0, 1, 1), (1.5, 1, 1)]
    assert [b.start for b in result.batches] == [0.0, 0.0, 1.5]
    assert sim.engine.most_busy == 2  # the batcher never handed the engine a third batch


def test_take_stops_at_a_request_that_does_not_fit() -> None:
    policy = Scripted({1: WAIT, 2: WAIT, 3: Decision(3, None)}, default=Decision(1, None))
    result = simulate(policy, [Arrival(0.0, 5), Arrival(0.1, 4), Arrival(0.2, 3)], cost,
                      interpreters=1, max_batch_size=8)
    assert result.groups() == [(0,), (1,), (2,)]  # 5 + 4 > 8: the batch stops before #1


def test_deadlines_in_the_queue_and_while_running_time_out() -> None:
    policy = Scripted({}, default=Decision(1, None))
    arrivals = [Arrival(0.0, 1), Arrival(0.5, 1, 1.0), Arrival(0.6, 1, 5.0), Arrival(0.7, 1, 2.0)]
    result = simulate(policy, arrivals, cost, interpreters=1, max_batch_size=8)
    # #1 expires queued at 1.0 (#0 runs to 1.5); #2 runs 1.5-3.0; #3 expires queued at 2.0
    assert result.timed_out == [1, 3]
    assert result.latencies == [1.5, None, pytest.approx(2.4), None]
    assert result.over(10.0) == 0.5
    running = simulate(Scripted({}, default=Decision(1, None)), [Arrival(0.0, 1, 1.0)], cost, interpreters=1,
                       max_batch_size=8)
    assert running.timed_out == [0] and running.latencies == [None]  # its batch ran past its deadline


def test_admission_refusals_and_summaries() -> None:
    class Refusing(Scripted):
        def __init__(self) -> None:
            super().__init__({1: Decision(1, None)}, default=WAIT)
            self.asked: list[tuple[float, int, int, float | None]] = []

        def admit(self, now: float, queued_samples: int, samples: int, budget: float | None,
                  waited: float) -> float | None:
            self.asked.append((now, queued_samples, samples, budget))
            return 2.5 if queued_samples + samples > 2 else None

        def decide(self, now: float, queue: Sequence[Pending], *, idle: int, running: int,
                   max_batch_size: int, queued: int | None = None) -> Decision:
            super().decide(now, queue, idle=idle, running=running, max_batch_size=max_batch_size, queued=queued)
            return Decision(len(queue), None) if running == 0 else WAIT

    policy = Refusing()
    arrivals = [Arrival(0.0), Arrival(0.1), Arrival(0.2, 1, None, 9.0), Arrival(0.3), Arrival(0.4, 2)]
    result = simulate(policy, arrivals, cost, interpreters=1, max_batch_size=8)
    # #0 finds an idle interpreter: not asked. Then every arrival must wait: asked with
    # what is queued ahead of it, its samples and its own budget
    assert policy.asked == [(0.1, 0, 1, None), (0.2, 1, 1, 9.0), (0.3, 2, 1, None), (0.4, 2, 2, None)]
    assert result.refused == [3, 4] and result.retry_after == (2.5, 2.5)
    assert result.latencies == [1.5, pytest.approx(3.4), pytest.approx(3.3), None, None]
    assert result.stats["refused"] == 2
    assert result.over(4.0) == pytest.approx(2 / 5)
    assert result.over(4.0, admitted=True) == 0.0
    unadmitted = simulate(Refusing(), arrivals, cost, interpreters=1, max_batch_size=8, admit=False)
    assert unadmitted.refused == []
    plain = simulate(Scripted({}, default=Decision(1, None)), [0.0, 10.0], cost, interpreters=1, max_batch_size=8)
    assert plain.mean() == pytest.approx(1.5) and plain.percentile(99) == 1.5 and plain.sizes() == [1, 1]


def test_requests_carry_their_own_budget() -> None:
    seen: list[tuple[float | None, ...]] = []

    class Recording(Scripted):
        def decide(self, now: float, queue: Sequence[Pending], *, idle: int, running: int,
                   max_batch_size: int, queued: int | None = None) -> Decision:
            seen.append(tuple(p.budget for p in queue))
            return Decision(len(queue), None)

    # Arrival(time, samples, deadline, budget), and the shorter forms without a budget
    arrivals = [Arrival(0.0, 1, None, 2.0), Arrival(0.0, 1), (0.0, 1), 0.0]
    result = simulate(Recording({}), arrivals, cost, interpreters=1, max_batch_size=8)
    assert seen[0] == (2.0,) and seen[-1] == (None, None, None)
    assert result.latencies == [1.5, 4.0, 4.0, 4.0]
    assert result.budgets == (2.0, None, None, None)
    # over budget: request 0 against its own 2 s (met), the others against the 3 s given
    assert result.over(3.0) == 0.75
    assert result.over(4.0) == 0.0
    assert result.throughput() == pytest.approx(4 / 4.0)
    assert result.throughput(2.0, 4.0) == pytest.approx(3 / 2.0)  # the answers between 2 s and 4 s


def test_the_same_seed_gives_the_same_run() -> None:
    def run() -> object:
        curve = CostModel([(b, 0.0027 + 0.0031 * b) for b in ladder(32)], max_batch_size=32)
        policy = AdaptivePolicy(curve, latency_budget_s=0.05, interpreters=2, max_queue_delay_s=0.025)
        arrivals = poisson(700.0, 2.0, seed=5, samples=lambda rng: rng.randint(1, 3))
        return simulate(policy, arrivals, lambda b: 0.003 + 0.0031 * b, interpreters=2, max_batch_size=32)

    first, second = run(), run()
    assert first == second
    assert poisson(100.0, 1.0, 3) == poisson(100.0, 1.0, 3) != poisson(100.0, 1.0, 4)


def test_models_sharing_a_pool_take_turns() -> None:
    # Two models on one pool of 2 interpreters through the real FairScheduler: "hot" is
    # flooded at twice what the pool serves it (batches of 4 in 8 ms), "cold" sends a
    # request now and then. Each cold request waits for at most one batch of hot.
    sim = Simulation(interpreters=2, fair=True)
    sim.model("hot", WindowPolicy(max_queue_delay=0.0), lambda b: 0.004 + 0.001 * b, max_batch_size=4)
    sim.model("cold", WindowPolicy(max_queue_delay=0.0), lambda b: 0.002, max_batch_size=4)
    sim.arrive("hot", [0.0005 * i for i in range(4000)])
    sim.arrive("cold", [0.05 + 0.1 * i for i in range(10)])
    results = sim.run()
    cold, hot = results["cold"], results["hot"]
    assert len(cold.served()) == 10 and max(cold.served()) <= 0.008 + 0.002 + 1e-9
    assert len(hot.served()) == 4000 and max(hot.served()) > 1.0  # hot queues behind itself
    assert sim.engine.most_busy == 2 and sim.engine.most_waiting == 0  # batches start when a slot is free
    alone = Simulation(interpreters=2)  # no scheduler: each batcher counts only its own interpreters
    alone.model("hot", WindowPolicy(max_queue_delay=0.0), lambda b: 0.004 + 0.001 * b, max_batch_size=4)
    alone.model("cold", WindowPolicy(max_queue_delay=0.0), lambda b: 0.002, max_batch_size=4)
    alone.arrive("hot", [0.0005 * i for i in range(4000)])
    alone.arrive("cold", [0.05 + 0.1 * i for i in range(10)])
    alone.run()
    assert alone.engine.most_waiting == 1  # cold's batch waited in the engine's queue behind hot's
