"""Batch sizes chosen from a model's latency curve under a latency budget (LBCI).

`AdaptivePolicy` answers the batcher's `decide` from three quantities:
  - the cost model: predicted seconds L(b) of a batch of b samples (`CostModel`);
  - the arrival rate: an exponentially weighted mean of the gaps between the
    arrivals it sees in the queue, and of their sample counts;
  - the budget: every request should finish within `latency_budget_s` of arriving
    (and before its own deadline, if it has one).

From the arrival rate it derives the keep-up size: the smallest batch at which the
model's interpreters serve the arriving samples with `headroom` to spare. At low load
that is 1, so a request runs the moment an interpreter is free: waiting could only
add latency. As load rises the keep-up size grows toward the throughput-optimal
batch, and a free interpreter waits for the queue to reach it, but only while the
predicted arrivals fill it before the oldest request's budget (or
`max_queue_delay_s`) runs out; otherwise it dispatches what is there.

When it dispatches, it takes the largest FIFO prefix of whole requests (a request is
never split; one that does not fit waits for the next batch) that
  - is at least the keep-up size, at most the throughput-optimal size,
  - spreads the queue over the free interpreters (queued samples / idle), and
  - finishes every taken request within its budget and deadline, as predicted.
When no batch of the keep-up size can meet the budget, the model is overloaded and
the policy degrades predictably: throughput-optimal batches, oldest first, so the
queue drains as fast as the machine allows.

Admission control: the batcher calls `admit(now, queued_samples)` before queueing a
request. It predicts the queueing delay of a new arrival as the queued samples over
the model's best throughput (all interpreters at the throughput-optimal size); when
that exceeds `admit_factor` times the budget it returns a Retry-After in seconds (the
time until the backlog would have drained to within budget), else None (admit).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from .costmodel import CostModel
from .policy import Decision, Pending

WAIT = Decision(0, None)


def _prefix(sizes: Sequence[int], limit: int) -> int:
    """How many requests from the head fit in `limit` samples (cumulative `sizes`), at least 1."""
    take = 1
    for i, s in enumerate(sizes):
        if s > limit:
            break
        take = i + 1
    return take


class AdaptivePolicy:
    """LBCI-style batching policy for one model (see the module doc).

    cost: the model's batch latency curve; `observe` refines it.
    latency_budget_s: target end-to-end (queue + execution) seconds per request.
    interpreters: how many interpreters serve the model (batches that run at once).
    max_queue_delay_s: longest a request is held back on purpose while an
      interpreter is free (the budget may stop the wait earlier).
    headroom: the keep-up size serves `headroom` times the arrival rate.
    rate_alpha: weight of one inter-arrival gap in the rate estimate.
    admit_factor: admission refuses requests once the predicted queueing delay exceeds
      this many budgets.
    tolerance: batches grow past the keep-up size only up to the efficient size, the
      smallest within `tolerance` of the best throughput.
    """

    def __init__(
        self,
        cost: CostModel,
        *,
        latency_budget_s: float,
        interpreters: int,
        max_queue_delay_s: float,
        headroom: float = 1.25,
        rate_alpha: float = 0.05,
        admit_factor: float = 2.0,
        tolerance: float = 0.05,
    ) -> None:
        if not latency_budget_s > 0:
            raise ValueError(f"latency_budget_s must be > 0, got {latency_budget_s}")
        if interpreters < 1:
            raise ValueError(f"interpreters must be >= 1, got {interpreters}")
        if max_queue_delay_s < 0:
            raise ValueError(f"max_queue_delay_s must be >= 0, got {max_queue_delay_s}")
        if headroom < 1.0:
            raise ValueError(f"headroom must be >= 1, got {headroom}")
        if not 0.0 < rate_alpha <= 1.0:
            raise ValueError(f"rate_alpha must be in (0, 1], got {rate_alpha}")
        if admit_factor < 1.0:
            raise ValueError(f"admit_factor must be >= 1, got {admit_factor}")
        self.cost = cost
        self.latency_budget_s = latency_budget_s
        self.interpreters = interpreters
        self.max_queue_delay_s = max_queue_delay_s
        self.headroom = headroom
        self.rate_alpha = rate_alpha
        self.admit_factor = admit_factor
        self.tolerance = tolerance
        self._gap: float | None = None  # mean seconds between arrivals
        self._samples = 1.0  # mean samples per request
        self._last_arrival: float | None = None
        self._tail: object | None = None  # the newest request already counted

    # ---- arrival rate ----

    def _see(self, queue: Sequence[Pending]) -> None:
        """Fold the arrivals not yet seen (at the queue's tail) into the rate estimate."""
        new: list[Pending] = []
        last = self._last_arrival
        for p in reversed(queue):
            if p is self._tail or (last is not None and p.arrival < last):
                break
            new.append(p)
        if not new:
            return
        a = self.rate_alpha
        for p in reversed(new):
            if self._last_arrival is not None:
                gap = max(0.0, p.arrival - self._last_arrival)
                self._gap = gap if self._gap is None else self._gap + a * (gap - self._gap)
                self._samples += a * (p.samples - self._samples)
            else:
                self._samples = float(p.samples)
            self._last_arrival = p.arrival
        self._tail = new[0]

    def arrival_rate(self, now: float) -> float:
        """Estimated arriving samples per second (0 before two arrivals were seen).

        The silence since the last arrival counts as a gap in progress (as if a request
        arrived now), so the estimate decays when traffic stops but one long gap, common
        in Poisson traffic, barely moves it."""
        if self._gap is None or self._last_arrival is None:
            return 0.0
        silence = now - self._last_arrival
        gap = self._gap if silence <= self._gap else self._gap + self.rate_alpha * (silence - self._gap)
        if gap <= 0.0:
            return math.inf
        return self._samples / gap

    def keep_up_batch(self, now: float, max_batch_size: int) -> int | None:
        """Smallest batch size that keeps up with the arrivals, with `headroom` where the
        curve allows it, or None when even the throughput-optimal size cannot (overload)."""
        rate = self.arrival_rate(now) / self.interpreters
        b = self.cost.smallest_batch_for(rate * self.headroom)
        if b is None:
            b = self.cost.smallest_batch_for(rate)
        if b is None:
            return None
        return min(b, max(1, max_batch_size))

    # ---- the policy ----

    def decide(
        self, now: float, queue: Sequence[Pending], *, idle: int, running: int, max_batch_size: int
    ) -> Decision:
        self._see(queue)
        if idle <= 0 or not queue:
            return WAIT
        if max_batch_size <= 0:
            return Decision(1, None)
        cost = self.cost
        best = min(cost.throughput_optimal_batch(), max_batch_size)
        efficient = min(cost.efficient_batch(self.tolerance), best)
        need = self.keep_up_batch(now, max_batch_size)
        # Overloaded: arrivals beyond what the best batches serve, and a backlog that no
        # longer drains within one budget (a noisy rate estimate alone does not count).
        # A backlog alone (a burst, or load that just stopped) drains at the efficient size.
        backlog = self.queueing_delay(sum(p.samples for p in queue)) > self.latency_budget_s
        overloaded = need is None and backlog
        if overloaded:
            target = best
        elif need is None or backlog:
            target = max(need or 1, efficient)
        else:
            target = need

        # Whole requests from the head that fit one batch, with cumulative samples and
        # the tightest finish time (budget from arrival, own deadline) among them.
        sizes: list[int] = []
        limits: list[float] = []
        total = 0
        limit = math.inf
        for p in queue:
            if sizes and total + p.samples > max_batch_size:
                break
            total += p.samples
            limit = min(limit, p.arrival + self.latency_budget_s)
            if p.deadline is not None:
                limit = min(limit, p.deadline)
            sizes.append(total)
            limits.append(limit)

        if sizes[-1] < target and self._samples < target and not overloaded and len(sizes) == len(queue):
            # Too few samples to keep up (and requests are smaller than the keep-up size
            # on average, so batches must be gathered): wait for more while predicted
            # arrivals fill the batch before the oldest request must start.
            head = queue[0]
            latest = min(
                head.arrival + self.max_queue_delay_s,
                limits[-1] - cost.predict(target),
            )
            rate = self.arrival_rate(now)
            if rate > 0.0 and now < latest:
                fill = now + (target - sizes[-1]) / rate
                if fill <= latest:
                    return Decision(0, latest)

        # Dispatch. Overloaded (arrivals beyond capacity, or a backlog that cannot drain
        # within a budget): throughput-optimal batches, to drain the queue fastest.
        if overloaded:
            return Decision(_prefix(sizes, best), None)
        # Otherwise the smallest prefix that keeps up, then join the next requests while
        # that lowers their total latency, within every taken request's budget and at
        # most the efficient size. A head already past its budget goes at the keep-up size.
        feasible = 0
        for s, lim in zip(sizes, limits):
            if now + cost.predict(s) <= lim:
                feasible = s
        cap = min(max(target, efficient), max(feasible, target))
        take = _prefix(sizes, target)
        if sizes[take - 1] < target and self._samples < target and take < len(sizes) and sizes[take] <= cap:
            take += 1  # whole requests: overshoot the keep-up size rather than fall short
        while take < len(sizes) and sizes[take] <= cap:
            s = sizes[take - 1]
            x = sizes[take] - s
            if not self._join_pays(take, s, x, idle):
                break
            take += 1
        return Decision(take, None)

    def _join_pays(self, k: int, s: int, x: int, idle: int) -> bool:
        """Whether a request of x samples joining a batch of k requests (s samples) lowers
        the sum of their predicted latencies. Joining delays the k by L(s+x) - L(s) and
        finishes the joiner at L(s+x); not joining, it starts when a slot frees (at once
        when another interpreter is idle, else after about L(s)) and takes L(x)."""
        predict = self.cost.predict
        grown = predict(s + x)
        free = 0.0 if idle > 1 else predict(s)
        return k * (grown - predict(s)) + grown < free + predict(x)

    def observe(self, samples: int, seconds: float) -> None:
        """A batch of `samples` took `seconds`: refine the cost model."""
        self.cost.observe(samples, seconds)

    # ---- admission ----

    def queueing_delay(self, queued_samples: int) -> float:
        """Predicted seconds before a request arriving behind `queued_samples` starts."""
        best = self.cost.throughput_optimal_batch()
        capacity = self.interpreters * self.cost.throughput(best)
        return queued_samples / capacity

    def admit(self, now: float, queued_samples: int) -> float | None:
        """None to admit a new request, or a Retry-After in seconds to refuse it (503).

        Refuses when the predicted queueing delay exceeds admit_factor x budget; the
        Retry-After is how long the backlog needs to shrink to within one budget."""
        delay = self.queueing_delay(queued_samples)
        if delay <= self.admit_factor * self.latency_budget_s:
            return None
        return delay - self.latency_budget_s

    def as_dict(self, now: float) -> dict[str, object]:
        """JSON-ready state for metrics: budget, arrival rate and the cost model."""
        return {
            "policy": "adaptive",
            "latency_budget_s": self.latency_budget_s,
            "interpreters": self.interpreters,
            "arrival_rate_samples_per_s": self.arrival_rate(now),
            "cost": self.cost.as_dict(),
        }
