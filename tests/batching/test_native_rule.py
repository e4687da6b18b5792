"""The pool's window rule in C (`_native.window_rule`, what batches the fronts' requests)
against `WindowPolicy`, the Python reference: the same decision in every state, and the
same batches over whole arrival traces, run in virtual time."""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from aserve import _native
from aserve.batching import WindowPolicy
from aserve.batching.policy import Decision


@dataclass
class Req:
    """What a policy sees of a queued request (policy.Pending), in integer nanoseconds."""

    arrival: int
    samples: int
    deadline: int | None
    budget: float | None = None
    waited: float = 0.0


Decide = Callable[[int, list[Req], int, int, int], Decision]


def python_rule(now: int, queue: list[Req], running: int, max_batch_size: int, window: int) -> Decision:
    # times are integers, so the reference compares exactly as the C rule does
    return WindowPolicy(max_queue_delay=window).decide(now, queue, idle=1, running=running,
                                                       max_batch_size=max_batch_size)


def c_rule(now: int, queue: list[Req], running: int, max_batch_size: int, window: int) -> Decision:
    take, wake_at = _native.window_rule(now, [(r.arrival, r.samples, r.deadline or 0) for r in queue], running,
                                        max_batch_size, window)
    return Decision(take, wake_at)


def random_state(rng: random.Random) -> tuple[int, list[Req], int, int, int]:
    max_batch_size = rng.choice([0, 1, 2, 4, 8, 32])
    window = rng.choice([0, 1, 500, 2_000_000])
    now = rng.randrange(1, 10_000_000)
    queue = []
    for _ in range(rng.randrange(1, 12)):
        arrival = now - rng.randrange(0, 3_000_000)
        deadline = None if rng.random() < 0.5 else arrival + rng.randrange(1, 5_000_000)
        queue.append(Req(arrival, rng.randrange(1, max(2, max_batch_size + 1)), deadline))
    queue.sort(key=lambda r: r.arrival)
    return now, queue, rng.randrange(0, 3), max_batch_size, window


@pytest.mark.parametrize("seed", range(8))
def test_the_c_rule_decides_as_the_window_policy_in_every_state(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(2000):
        state = random_state(rng)
        assert c_rule(*state) == python_rule(*state), state


def simulate(decide: Decide, arrivals: list[tuple[int, int]], *, workers: int, max_batch_size: int,
             window: int, service: Callable[[int], int]) -> list[tuple[int, tuple[int, ...]]]:
    """A pool of `workers` in virtual time: requests (arrival ns, samples) queue; whenever
    something happens (an arrival, a batch's end, a window closing) each idle worker asks
    `decide` and starts the batch it says, which runs service(samples) ns. Returns the
    batches started: (when, the indices of their requests)."""
    events: list[tuple[int, int, int]] = []  # (time, kind 0 end / 1 arrival / 2 wake, payload)
    for i, (t, _) in enumerate(arrivals):
        heapq.heappush(events, (t, 1, i))
    queue: list[int] = []
    running = 0
    started: list[tuple[int, tuple[int, ...]]] = []
    wakes: set[int] = set()
    while events:
        now, kind, payload = heapq.heappop(events)
        if kind == 0:
            running -= 1
        elif kind == 1:
            queue.append(payload)
        while queue and running < workers:
            pending = [Req(arrivals[i][0], arrivals[i][1], None) for i in queue]
            decision = decide(now, pending, running, max_batch_size, window)
            if decision.take <= 0:
                if decision.wake_at is not None and decision.wake_at not in wakes:
                    wakes.add(decision.wake_at)
                    heapq.heappush(events, (decision.wake_at, 2, 0))
                break
            batch, queue = queue[:decision.take], queue[decision.take:]
            running += 1
            started.append((now, tuple(batch)))
            heapq.heappush(events, (now + service(sum(arrivals[i][1] for i in batch)), 0, 0))
    return started


@pytest.mark.parametrize("seed", range(6))
def test_the_c_rule_makes_the_same_batches_as_the_window_policy_over_a_trace(seed: int) -> None:
    rng = random.Random(seed)
    t = 0
    arrivals = []
    for _ in range(400):
        t += int(rng.expovariate(1 / rng.choice([20_000, 200_000, 1_000_000])))
        arrivals.append((t, rng.choice([1, 1, 1, 2, 3])))
    settings = {"workers": rng.choice([1, 2, 3]), "max_batch_size": rng.choice([0, 4, 8]),
                "window": rng.choice([0, 300_000, 2_000_000])}

    def service(samples: int) -> int:
        return 150_000 + 40_000 * samples

    reference = simulate(python_rule, arrivals, service=service, **settings)
    native = simulate(c_rule, arrivals, service=service, **settings)
    assert native == reference
    assert sum(len(b) for _, b in native) == len(arrivals)  # every request ran once
    if settings["max_batch_size"]:
        assert any(len(b) > 1 for _, b in native), "the trace should have made some batches"
