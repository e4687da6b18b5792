"""The simulated batcher calls a policy exactly as the real one does."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from aserve.batching.policy import Decision, Pending
from aserve.batching.simulate import Arrival, simulate

WAIT = Decision(0, None)


class Scripted:
    """Answers from a script keyed by call number; records every call."""

    def __init__(self, script: dict[int, Decision], default: Decision = WAIT) -> None:
        self.script = script
        self.default = default
        self.calls: list[tuple[float, int, int, int]] = []  # now, queued, idle, running
        self.observed: list[tuple[int, float]] = []

    def decide(self, now: float, queue: Sequence[Pending], *, idle: int, running: int,
               max_batch_size: int) -> Decision:
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
    result = simulate(policy, [0.0, 0.0, 0.0], cost, interpreters=2, max_batch_size=8)
    # two batches start at once; the third waits for a completion (at 1.5)
    assert [(c[0], c[2], c[3]) for c in policy.calls] == [(0.0, 2, 0), (0.0, 1, 1), (1.5, 1, 1)]
    assert [b.start for b in result.batches] == [0.0, 0.0, 1.5]


def test_take_stops_at_a_request_that_does_not_fit() -> None:
    policy = Scripted({}, default=Decision(0, None))
    policy.script = {3: Decision(3, None)}
    result = simulate(policy, [Arrival(0.0, 5), Arrival(0.1, 4), Arrival(0.2, 3)], cost,
                      interpreters=1, max_batch_size=8)
    assert result.groups()[0] == (0,)


def test_deadline_in_the_queue_times_out() -> None:
    policy = Scripted({1: Decision(1, None)}, default=Decision(0, None))
    result = simulate(policy, [Arrival(0.0, 1), Arrival(0.5, 1, 1.0)], cost, interpreters=1, max_batch_size=8)
    assert result.timed_out == [1]
    assert result.latencies == [1.5, None]
    assert result.over(10.0) == 0.5


def test_admission_refuses_and_summaries() -> None:
    class Refusing(Scripted):
        def admit(self, now: float, queued_samples: int) -> float | None:
            return 1.0 if queued_samples >= 2 else None

    policy = Refusing({}, default=Decision(0, None))
    result = simulate(policy, [0.0, 0.1, 0.2, 0.3], cost, interpreters=1, max_batch_size=8, admit=True)
    assert result.refused == [2, 3]
    plain = simulate(Scripted({}, default=Decision(1, None)), [0.0, 10.0], cost, interpreters=1, max_batch_size=8)
    assert plain.mean() == pytest.approx(1.5) and plain.percentile(99) == 1.5 and plain.sizes() == [1, 1]


def test_requests_carry_their_own_budget() -> None:
    seen: list[tuple[float | None, ...]] = []

    class Recording(Scripted):
        def decide(self, now: float, queue: Sequence[Pending], *, idle: int, running: int,
                   max_batch_size: int) -> Decision:
            seen.append(tuple(p.budget for p in queue))
            return Decision(len(queue), None)

    # Arrival(time, samples, deadline, budget), and the older forms without a budget
    arrivals = [Arrival(0.0, 1, None, 2.0), Arrival(0.0, 1), (0.0, 1), 0.0]
    result = simulate(Recording({}), arrivals, cost, interpreters=1, max_batch_size=8)
    assert seen[0] == (2.0,) and seen[-1] == (None, None, None)
    assert result.latencies == [1.5, 4.0, 4.0, 4.0]
    assert result.budgets == (2.0, None, None, None)
    # over budget: request 0 against its own 2 s (met), the others against the 3 s given
    assert result.over(3.0) == 0.75
    assert result.over(4.0) == 0.0
    assert result.throughput() == pytest.approx(4 / 4.0)
