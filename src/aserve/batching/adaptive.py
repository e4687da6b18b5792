"""Batch sizes chosen from a model's latency curve under a latency budget (LBCI).

`AdaptivePolicy` answers the batcher's `decide` from three quantities:
  - the cost model: predicted seconds L(b) of a batch of b samples (`CostModel`);
  - the arrival rate: an exponentially weighted mean of the gaps between the
    arrivals it sees in the queue, and of their sample counts;
  - the budget: every request should finish within its budget of arriving (its own
    `budget` when it has one, else `latency_budget_s`), and before its deadline.

Two batch sizes follow from them (n is the number of interpreters):
  - the budget size B: the largest b with L(b) <= budget / 2. A request that arrives
    just after a batch of B started waits at most about one batch for an
    interpreter, then runs in one: 2 L(B) fits the budget. Batches of the
    throughput-optimal size would not: on an affine curve that is max_batch_size,
    on the bundled CNN 32 samples, 135 ms, against a 50 ms budget.
  - the keep-up size K: the smallest batch at which the interpreters serve the
    arriving samples with `headroom` to spare (1 at low load).

The rules, in order (the queue is never empty; "budget" is the head request's):
  1. no free interpreter: wait for a completion; a model that does not batch
     (max_batch_size 0): dispatch the head request alone.
  2. overload: the arrivals exceed what batches of B serve (n * B / L(B) samples/s)
     and the queue holds more than one head budget of work at that rate (a noisy
     rate estimate alone, or a burst alone, does not count). The budget cannot be
     met, so the policy degrades predictably: batches of max(B, efficient size),
     oldest first, where the efficient size is the smallest within `tolerance` of
     the best throughput (on the CNN 12 samples, 53 ms, instead of 32, 135 ms, for
     5% less throughput). Admission control (below) bounds the queue.
  3. wait for a batch: fewer than K samples are queued, requests are smaller than K
     on average, another batch of the model is running (so more requests are on
     their way; with every interpreter idle a request runs at once), the predicted
     arrivals fill K before the head must start (its budget or deadline minus
     L(K)) and within `max_queue_delay_s` of its arrival, and waiting pays: it
     delays each of the q queued requests by the fill time f, and saves the free
     interpreter one batch overhead, L(s) + L(K - s) - L(K) for s queued samples,
     so it waits only when q * f is at most that saving. When batching is nearly
     free (a dominant overhead) it waits; when per-sample work dominates (the CNN)
     it does not, since the queue fills batches by itself while interpreters are
     busy and a free interpreter left idle only adds latency.
  4. otherwise dispatch at once the largest FIFO prefix of whole requests (a
     request is never split; one that does not fit waits for the next batch) of at
     most B samples, and at most the queued samples spread over the free
     interpreters (rounded up), and at least the head request. This is joining at
     dispatch: a free interpreter serves everything queued, up to B. On an affine
     curve L(a + b) < L(a) + L(b), so running what is already queued as two
     batches on one interpreter only pays the overhead twice, and a request left
     behind waits for the next free interpreter; with several interpreters free,
     spreading the queue runs it in parallel instead.

The rules were tuned in the deterministic simulator (`simulate`, tests in
tests/batching/test_adaptive.py) on the bundled CNN's measured curve
(L(b) = 4.2 ms + 4.1 ms * b, 2 interpreters) and on a flat one (10 ms + 0.5 ms * b):
never waiting on the CNN lowered mean latency against the old keep-up wait, and a
cap of B = L^-1(budget / 2) met the budget more often than caps of 2/3 or 3/4 of
the budget, or the throughput-optimal size.

Admission control: the batcher calls `admit(now, queued_samples)` before queueing a
request. It predicts the queueing delay of a new arrival as the queued samples over
what the interpreters serve in the batches the policy uses once a backlog builds
(max(B, efficient size), rule 2); when that exceeds `admit_factor` times the budget
it returns a Retry-After in seconds (the time until the backlog would have drained
to within one budget), else None (admit). The queue therefore never holds more than
about admit_factor budgets of work.
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
    latency_budget_s: target end-to-end (queue + execution) seconds of a request that
      has no budget of its own.
    interpreters: how many interpreters serve the model (batches that run at once).
    max_queue_delay_s: longest a request is held back on purpose while an
      interpreter is free (the budget may stop the wait earlier).
    headroom: the keep-up size serves `headroom` times the arrival rate.
    rate_alpha: weight of one inter-arrival gap in the rate estimate.
    admit_factor: admission refuses requests once the predicted queueing delay exceeds
      this many budgets.
    tolerance: under overload batches have the efficient size, the smallest within
      `tolerance` of the best throughput.
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
        if not 0.0 <= tolerance < 1.0:
            raise ValueError(f"tolerance must be in [0, 1), got {tolerance}")
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
        self._sizes_key: tuple[float, int, int] | None = None
        self._sizes_cached = (1, 1)

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

    # ---- batch sizes ----

    def budget_of(self, request: Pending) -> float:
        """The request's latency budget in seconds: its own, else the policy's."""
        return self.latency_budget_s if request.budget is None else request.budget

    def limit_of(self, request: Pending) -> float:
        """When the request must finish: arrival + its budget, or its deadline if sooner."""
        limit = request.arrival + self.budget_of(request)
        return limit if request.deadline is None else min(limit, request.deadline)

    def budget_batch(self, budget: float, max_batch_size: int) -> int:
        """The budget size B: the largest batch with L(B) <= budget / 2 (at least 1, at
        most max_batch_size)."""
        return self._sizes(budget, max_batch_size)[0]

    def overload_batch(self, budget: float, max_batch_size: int) -> int:
        """Batch size under overload: max(B, the efficient size), at most max_batch_size."""
        return self._sizes(budget, max_batch_size)[1]

    def _sizes(self, budget: float, max_batch_size: int) -> tuple[int, int]:
        """(B, overload size), recomputed only when the budget or the curve changed."""
        key = (budget, max_batch_size, self.cost.observations)
        if self._sizes_key != key:
            top = max(1, max_batch_size)
            b = min(self.cost.largest_batch_within(budget / 2), top)
            self._sizes_cached = (b, min(max(b, self.cost.efficient_batch(self.tolerance)), top))
            self._sizes_key = key
        return self._sizes_cached

    def keep_up_batch(self, now: float, max_batch_size: int) -> int | None:
        """Smallest batch size that keeps up with the arrivals, with `headroom` where the
        curve allows it, or None when even the throughput-optimal size cannot."""
        rate = self.arrival_rate(now) / self.interpreters
        b = self.cost.smallest_batch_for(rate * self.headroom)
        if b is None:
            b = self.cost.smallest_batch_for(rate)
        if b is None:
            return None
        return min(b, max(1, max_batch_size))

    def overloaded(self, now: float, queued_samples: int, budget: float, max_batch_size: int) -> bool:
        """Rule 2: arrivals beyond what batches of the budget size serve, and a backlog
        that batches of that size no longer drain within one budget (a noisy rate
        estimate alone, or a burst alone, does not count)."""
        b = self.budget_batch(budget, max_batch_size)
        serves = self.interpreters * self.cost.throughput(b)
        return self.arrival_rate(now) > serves and queued_samples > budget * serves

    # ---- the policy ----

    def decide(
        self, now: float, queue: Sequence[Pending], *, idle: int, running: int, max_batch_size: int
    ) -> Decision:
        self._see(queue)
        if idle <= 0 or not queue:
            return WAIT
        if max_batch_size <= 0:
            return Decision(1, None)
        head = queue[0]
        budget = self.budget_of(head)
        queued = sum(p.samples for p in queue)
        sizes: list[int] = []  # cumulative samples of the whole requests that fit one batch
        total = 0
        for p in queue:
            if sizes and total + p.samples > max_batch_size:
                break
            total += p.samples
            sizes.append(total)

        if self.overloaded(now, queued, budget, max_batch_size):  # rule 2
            return Decision(_prefix(sizes, self.overload_batch(budget, max_batch_size)), None)

        keep_up = self.keep_up_batch(now, max_batch_size)
        if running > 0 and keep_up is not None and queued < keep_up and self._samples < keep_up:
            wake = self._fill_by(now, queue, queued, keep_up)  # rule 3
            if wake is not None:
                return Decision(0, wake)

        spread = -(-queued // idle)  # rule 4
        return Decision(_prefix(sizes, min(self.budget_batch(budget, max_batch_size), spread)), None)

    def _fill_by(self, now: float, queue: Sequence[Pending], queued: int, target: int) -> float | None:
        """When to dispatch if waiting for a batch of `target` samples pays (rule 3): the
        head's latest start, or None (dispatch now) when the batch would not fill before
        it, or when the queued requests would lose more to the wait than the batch
        overhead it saves."""
        rate = self.arrival_rate(now)
        if rate <= 0.0:
            return None
        limit = min(self.limit_of(p) for p in queue)
        predict = self.cost.predict
        latest = min(queue[0].arrival + self.max_queue_delay_s, limit - predict(target))
        fill = (target - queued) / rate
        saving = predict(queued) + predict(target - queued) - predict(target)
        if now >= latest or now + fill > latest or fill * len(queue) > saving:
            return None
        return latest

    def observe(self, samples: int, seconds: float) -> None:
        """A batch of `samples` took `seconds`: refine the cost model."""
        self.cost.observe(samples, seconds)

    # ---- admission ----

    def queueing_delay(self, queued_samples: int) -> float:
        """Predicted seconds before a request arriving behind `queued_samples` starts,
        with the queue drained in the batches used under a backlog (rule 2)."""
        b = self.overload_batch(self.latency_budget_s, self.cost.max_batch_size)
        return queued_samples / (self.interpreters * self.cost.throughput(b))

    def admit(self, now: float, queued_samples: int) -> float | None:
        """None to admit a new request, or a Retry-After in seconds to refuse it (503).

        Refuses when the predicted queueing delay exceeds admit_factor x budget; the
        Retry-After is how long the backlog needs to shrink to within one budget."""
        delay = self.queueing_delay(queued_samples)
        if delay <= self.admit_factor * self.latency_budget_s:
            return None
        return delay - self.latency_budget_s

    def as_dict(self, now: float) -> dict[str, object]:
        """JSON-ready state for metrics: budget, arrival rate, batch sizes, cost model."""
        top = self.cost.max_batch_size
        return {
            "policy": "adaptive",
            "latency_budget_s": self.latency_budget_s,
            "interpreters": self.interpreters,
            "arrival_rate_samples_per_s": self.arrival_rate(now),
            "budget_batch": self.budget_batch(self.latency_budget_s, top),
            "overload_batch": self.overload_batch(self.latency_budget_s, top),
            "cost": self.cost.as_dict(),
        }
