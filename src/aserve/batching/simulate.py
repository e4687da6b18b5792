"""A deterministic discrete-event simulation of one model's batcher.

`simulate` drives any `BatchPolicy` with a fake clock exactly as `Batcher` does:
  - on every arrival, completion and policy timer it asks `decide` again and again
    while the queue is not empty and fewer than `interpreters` batches run, and
    dispatches `take` requests from the head (whole requests, never more samples
    than max_batch_size);
  - a `Decision(0, wake_at)` sets the one timer (a different `wake_at` replaces it;
    `Decision(0, None)` keeps a timer already set); a dispatch that empties the
    queue cancels the timer;
  - after each batch it reports `observe(samples, seconds)`, then frees the slot;
  - a request still queued at its deadline leaves the queue (timed out).
A batch of b samples takes `cost(b)` seconds of simulated time. Events at the same
instant run completions first, then arrivals, then the timer, each kind in order.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

from .policy import BatchPolicy

_COMPLETION, _ARRIVAL, _TIMER, _EXPIRY = 0, 1, 2, 3


class Arrival(NamedTuple):
    """One simulated request: when it arrives, how many samples, optional absolute
    deadline, optional latency budget in seconds (None: the policy's own)."""

    time: float
    samples: int = 1
    deadline: float | None = None
    budget: float | None = None


class SimRequest:
    """What the policy sees of a simulated queued request."""

    __slots__ = ("arrival", "budget", "deadline", "index", "samples")

    def __init__(self, arrival: float, samples: int, deadline: float | None, index: int,
                 budget: float | None = None) -> None:
        self.arrival = arrival
        self.samples = samples
        self.deadline = deadline
        self.index = index
        self.budget = budget

    def __repr__(self) -> str:
        return f"SimRequest(#{self.index}, arrival={self.arrival:.6f}, samples={self.samples})"


class Done(NamedTuple):
    requests: list[SimRequest]
    samples: int
    seconds: float


class SimBatch(NamedTuple):
    start: float
    end: float
    requests: tuple[int, ...]  # indices into the arrivals
    samples: int


class SimResult(NamedTuple):
    """latencies[i]: seconds from arrival to completion of request i (None: timed out or refused)."""

    latencies: list[float | None]
    batches: list[SimBatch]
    refused: list[int]  # indices refused by admission control
    timed_out: list[int]  # indices whose deadline passed in the queue
    end: float  # simulated time of the last event
    budgets: tuple[float | None, ...] = ()  # budgets[i]: request i's own budget, if any

    def sizes(self) -> list[int]:
        """Samples per batch, in dispatch order."""
        return [b.samples for b in self.batches]

    def groups(self) -> list[tuple[int, ...]]:
        """Request indices per batch, in dispatch order."""
        return [b.requests for b in self.batches]

    def served(self) -> list[float]:
        return [x for x in self.latencies if x is not None]

    def mean(self) -> float:
        s = self.served()
        return sum(s) / len(s) if s else math.nan

    def percentile(self, q: float) -> float:
        """The q-th percentile (0..100, nearest rank) of served latencies."""
        s = sorted(self.served())
        if not s:
            return math.nan
        k = max(0, min(len(s) - 1, math.ceil(q / 100.0 * len(s)) - 1))
        return s[k]

    def over(self, budget: float) -> float:
        """Fraction of requests not served within their budget: their own where they
        have one, else `budget` seconds (timeouts and refusals count)."""
        if not self.latencies:
            return 0.0
        own = self.budgets or (None,) * len(self.latencies)
        bad = sum(1 for x, b in zip(self.latencies, own) if x is None or x > (budget if b is None else b))
        return bad / len(self.latencies)

    def throughput(self) -> float:
        """Requests served per simulated second, from time 0 to the last event."""
        return len(self.served()) / self.end if self.end > 0.0 else 0.0


def simulate(
    policy: BatchPolicy,
    arrivals: Sequence[Arrival | tuple[float, int] | float],
    cost: Callable[[int], float],
    *,
    interpreters: int,
    max_batch_size: int,
    admit: bool = False,
) -> SimResult:
    """Run the arrivals through `policy` with `interpreters` slots; deterministic.

    arrivals: Arrival, (time, samples[, deadline[, budget]]) or a bare time (one
      sample); any order.
    cost: seconds a batch of b samples takes.
    admit: call the policy's `admit(now, queued_samples)` before queueing each
      request and refuse it when that returns a Retry-After.
    """
    if interpreters < 1:
        raise ValueError(f"interpreters must be >= 1, got {interpreters}")
    items = [a if isinstance(a, Arrival) else Arrival(*a) if isinstance(a, tuple) else Arrival(float(a))
             for a in arrivals]
    events: list[tuple[float, int, int, object]] = []
    seq = 0

    def push(t: float, kind: int, payload: object) -> None:
        nonlocal seq
        heapq.heappush(events, (t, kind, seq, payload))
        seq += 1

    for i, a in enumerate(items):
        push(a.time, _ARRIVAL, i)

    queue: list[SimRequest] = []
    queued_samples = 0
    running = 0
    timer: tuple[float, int] | None = None  # (when, id)
    timer_ids = 0
    latencies: list[float | None] = [None] * len(items)
    batches: list[SimBatch] = []
    refused: list[int] = []
    timed_out: list[int] = []
    now = 0.0
    admit_fn = getattr(policy, "admit", None) if admit else None

    def schedule() -> None:
        nonlocal running, timer, timer_ids, queued_samples
        while queue:
            idle = interpreters - running
            if idle <= 0:
                return
            d = policy.decide(now, queue, idle=idle, running=running, max_batch_size=max_batch_size)
            if d.take <= 0:
                if d.wake_at is not None:
                    if timer is not None and timer[0] != d.wake_at:
                        timer = None
                    if timer is None:
                        timer_ids += 1
                        timer = (d.wake_at, timer_ids)
                        push(max(d.wake_at, now), _TIMER, timer_ids)
                return
            head = queue.pop(0)
            batch = [head]
            total = head.samples
            while len(batch) < d.take and queue:
                nxt = queue[0]
                if max_batch_size <= 0 or total + nxt.samples > max_batch_size:
                    break
                batch.append(queue.pop(0))
                total += nxt.samples
            queued_samples -= total
            running += 1
            if timer is not None and not queue:
                timer = None
            seconds = cost(total)
            end = now + seconds
            batches.append(SimBatch(now, end, tuple(r.index for r in batch), total))
            push(end, _COMPLETION, Done(batch, total, seconds))

    while events:
        now, kind, _, payload = heapq.heappop(events)
        if kind == _ARRIVAL:
            assert isinstance(payload, int)
            a = items[payload]
            if admit_fn is not None and queue and admit_fn(now, queued_samples) is not None:
                refused.append(payload)
                continue
            req = SimRequest(a.time, a.samples, a.deadline, payload, a.budget)
            queue.append(req)
            queued_samples += a.samples
            if a.deadline is not None:
                push(a.deadline, _EXPIRY, req)
            schedule()
        elif kind == _COMPLETION:
            assert isinstance(payload, Done)
            policy.observe(payload.samples, payload.seconds)
            for r in payload.requests:
                if r.deadline is None or now <= r.deadline:
                    latencies[r.index] = now - r.arrival
                else:
                    timed_out.append(r.index)
            running -= 1
            schedule()
        elif kind == _TIMER:
            if timer is not None and timer[1] == payload:
                timer = None
                schedule()
        else:  # expiry of a request still queued
            assert isinstance(payload, SimRequest)
            if any(r is payload for r in queue):
                queue.remove(payload)
                queued_samples -= payload.samples
                timed_out.append(payload.index)
                schedule()
    return SimResult(latencies, batches, refused, timed_out, now, tuple(a.budget for a in items))
