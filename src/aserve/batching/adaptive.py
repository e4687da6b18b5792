"""Batch sizes chosen from a model's latency curve under a latency budget (LBCI).

`AdaptivePolicy` plans with the cost model's curve L(b), scaled by how much longer
real batches hold an interpreter (the slowdown), the arrival rate, the batches in
flight and each request's budget. It batches only as far as keeping up with the
arrivals or draining a backlog within the budget needs: where the per-batch overhead
is small next to the per-sample cost, a larger batch only adds latency. Its
admission control refuses (503, Retry-After) a request predicted to finish past its
budget, so that what it admits meets it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence

from .costmodel import SLOWDOWN_RANGE, CostModel
from .policy import Decision, Pending

WAIT = Decision(0, None)
# Admission and the backlog size plan with batches this many mean deviations slower than
# the slowdown: batch times jitter, and a request admitted on the mean would miss its
# budget whenever its batch runs long.
CAUTION = 3.0
# The overload reserve waits until the arrivals have outpaced every batch size this long:
# below capacity a burst lifts the rate estimate past it for a moment, and a reserve then
# only refuses requests that would end in time.
OVERLOAD_SUSTAINED_S = 0.5
# Whole requests of s samples on average leave about this many times (s - 1) samples of
# a batch unused (the next request does not fit), so a queue needs more batches than
# its samples over the batch size.
PACKING = 0.75

# what counting an arrival changes: gap, samples, arrivals, last arrival, keep-up size, outpaced since
_Arrivals = tuple[float | None, float, int, float | None, int | None, float | None]


def _prefix(sizes: Sequence[int], limit: int) -> int:
    """How many requests from the head fit in `limit` samples (cumulative `sizes`), at least 1."""
    take = 1
    for i, s in enumerate(sizes):
        if s > limit:
            break
        take = i + 1
    return take


class AdaptivePolicy:
    """LBCI-style batching policy for one model.

    cost: the model's batch latency curve; `observe` refines it.
    latency_budget_s: target end-to-end (queue + execution) seconds of a request that
      has no budget of its own.
    interpreters: how many interpreters serve the model (batches that run at once).
    max_queue_delay_s: longest a request is held back on purpose while an
      interpreter is free (the budget may stop the wait earlier).
    headroom: the keep-up size serves `headroom` times the arrival rate.
    rate_alpha: weight of one inter-arrival gap in the rate estimate.
    admit_factor: admission refuses a request whose predicted finish is beyond this
      many of its budgets.
    overload_reserve: under sustained overload (arrivals beyond what any batch size
      serves, for OVERLOAD_SUSTAINED_S) the share of that limit admission keeps back.
    tolerance: the efficient size is the smallest within `tolerance` of the best
      throughput.
    slowdown_alpha: weight of one batch in the slowdown.
    contention: the slowdown to plan with before any batch has been observed: how much
      longer a batch runs while every interpreter runs one (`costmodel.contention`, measured
      at warm-up), its distance from 1 the spread. A burst that meets a server fresh from its
      warm-up is admitted on it, not on the curve of a batch run alone; the first observed
      batch replaces both.
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
        admit_factor: float = 1.0,
        overload_reserve: float = 0.0,
        tolerance: float = 0.05,
        slowdown_alpha: float = 0.2,
        contention: float = 1.0,
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
        if not admit_factor > 0.0:
            raise ValueError(f"admit_factor must be > 0, got {admit_factor}")
        if not 0.0 <= overload_reserve < 1.0:
            raise ValueError(f"overload_reserve must be in [0, 1), got {overload_reserve}")
        if not 0.0 <= tolerance < 1.0:
            raise ValueError(f"tolerance must be in [0, 1), got {tolerance}")
        if not 0.0 <= slowdown_alpha <= 1.0:
            raise ValueError(f"slowdown_alpha must be in [0, 1], got {slowdown_alpha}")
        low, high = SLOWDOWN_RANGE
        if not low <= contention <= high:
            raise ValueError(f"contention must be in [{low}, {high}], got {contention}")
        self.cost = cost
        self.latency_budget_s = latency_budget_s
        self.interpreters = interpreters
        self.max_queue_delay_s = max_queue_delay_s
        self.headroom = headroom
        self.rate_alpha = rate_alpha
        self.admit_factor = admit_factor
        self.overload_reserve = overload_reserve
        self.tolerance = tolerance
        self.slowdown_alpha = slowdown_alpha
        self._gap: float | None = None  # mean seconds between arrivals
        self._samples = 1.0  # mean samples per request
        self._arrivals = 0  # arrivals counted
        self._last_arrival: float | None = None
        self._tail: object | None = None  # the newest request already counted
        self._keep_up: int | None = None  # the keep-up size at the last decision
        self._outpaced_since: float | None = None  # since when no batch size keeps up (None: one does)
        self._flight: list[tuple[float, float]] = []  # batches in flight: (dispatched, predicted L(b))
        self._observed = 0
        self.contention = contention
        # mean absolute deviation of a batch's ratio from the slowdown: before any batch, the
        # distance between a batch alone and one with every interpreter busy
        self._spread = max(0.0, contention - 1.0)
        self._slowdown = contention  # batches' seconds over the cost model's prediction, averaged
        self._cautious = contention + CAUTION * self._spread  # a slow spell's: slowdown + CAUTION x spread
        self._sizes_key: tuple[float, int, int, float, int] | None = None
        self._sizes_cached = (1, 1)
        self._pays_key: tuple[int, int] | None = None
        self._pays = False

    # ---- arrival rate ----

    def _see(self, queue: Sequence[Pending]) -> None:
        """Fold the arrivals not yet seen at the queue's tail (those queued without an
        admission check, which folds its own) into the rate estimate, in order of arrival."""
        new: list[tuple[float, int]] = []
        last = self._last_arrival
        tail = None
        for p in reversed(queue):
            if p is self._tail or (last is not None and p.arrival <= last):  # folded (admit folds its own)
                break
            if tail is None:
                tail = p
            new.append((p.arrival, p.samples))
        if tail is not None:
            self._tail = tail
        self._fold(reversed(new))

    def _fold(self, arrivals: Iterable[tuple[float, int]]) -> None:
        """Fold (arrival, samples) pairs, in time order, into the rate estimate."""
        for arrival, samples in arrivals:
            self._arrivals += 1
            a = max(self.rate_alpha, 1.0 / self._arrivals)  # plain means until there is history
            if self._last_arrival is not None:
                gap = max(0.0, arrival - self._last_arrival)
                weight = max(self.rate_alpha, 1.0 / (self._arrivals - 1))  # the gaps are one fewer
                self._gap = gap if self._gap is None else self._gap + weight * (gap - self._gap)
            self._samples += a * (samples - self._samples)
            self._last_arrival = arrival

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

    # ---- the measured slowdown ----

    @property
    def slowdown(self) -> float:
        """How much longer than the cost model predicts batches hold an interpreter (1: as predicted)."""
        return self._slowdown

    @property
    def slowdown_cautious(self) -> float:
        """The slowdown of a slow spell, that admission plans with: slowdown + CAUTION x spread."""
        return self._cautious

    def effective(self, samples: int, *, cautious: bool = False) -> float:
        """Seconds a batch of `samples` is expected to hold an interpreter: s * L(b)
        (`cautious`: in a slow spell, (s + CAUTION x the ratios' mean deviation) L(b))."""
        return (self._cautious if cautious else self._slowdown) * self.cost.predict(samples)

    # ---- batch sizes ----

    def budget_of(self, request: Pending) -> float:
        """The request's latency budget in seconds: its own, else the policy's."""
        return self.latency_budget_s if request.budget is None else request.budget

    def limit_of(self, request: Pending) -> float:
        """When the request must finish: its arrival in the server (queued, less the time
        it waited before) + its budget, or its deadline if sooner."""
        limit = request.arrival - request.waited + self.budget_of(request)
        return limit if request.deadline is None else min(limit, request.deadline)

    def batching_pays(self) -> bool:
        """Whether one batch of two queued requests beats running them one after the other:
        L(2m) < 1.5 L(m) for the mean request of m samples (on an affine curve a + c b:
        the per-batch overhead a exceeds c m)."""
        m = max(1, round(self._samples))
        key = (self.cost.observations, m)
        if key != self._pays_key:
            predict = self.cost.predict
            self._pays = predict(2 * m) < 1.5 * predict(m)
            self._pays_key = key
        return self._pays

    def largest_batch(self, budget: float, max_batch_size: int) -> int:
        """G: the largest batch that, started within one interpreter's turn of a backlog,
        ends within `budget`: (1 + 1/n) s L(G) <= budget (at least 1)."""
        return self._sizes(budget, max_batch_size)[0]

    def backlog_batch(self, budget: float, max_batch_size: int) -> int:
        """C: the batch size that drains a backlog (G, or at most the efficient size
        where batching does not pay)."""
        return self._sizes(budget, max_batch_size)[1]

    def _sizes(self, budget: float, max_batch_size: int) -> tuple[int, int]:
        """(G, C), recomputed only when the budget, the curve, the slowdown or the mean
        request's samples (whether batching pays) changed."""
        key = (budget, max_batch_size, self.cost.observations, self._cautious, max(1, round(self._samples)))
        if self._sizes_key != key:
            top = max(1, max_batch_size)
            turn = 1.0 + 1.0 / self.interpreters
            if turn * self.effective(1, cautious=True) > budget:  # not even one sample fits: serve efficiently
                g = c = min(self.cost.efficient_batch(self.tolerance), top)
            else:
                g = min(self.cost.largest_batch_within(budget / (turn * self._cautious)), top)
                c = g if self.batching_pays() else max(1, min(g, self.cost.efficient_batch(self.tolerance)))
            self._sizes_cached = (g, c)
            self._sizes_key = key
        return self._sizes_cached

    def keep_up_batch(self, now: float, max_batch_size: int) -> int | None:
        """Smallest batch size that keeps up with the arrivals, with `headroom` where the
        curve allows it, or None when even the throughput-optimal size cannot; 1 until
        1 / rate_alpha arrivals were seen (the rate of a handful is noise)."""
        if self._arrivals * self.rate_alpha < 1.0:
            return 1
        rate = self.arrival_rate(now) * self._slowdown / self.interpreters
        b = self.cost.smallest_batch_for(rate * self.headroom)
        if b is None:
            b = self.cost.smallest_batch_for(rate)
        if b is None:
            return None
        return min(b, max(1, max_batch_size))

    # ---- the policy ----

    def decide(
        self, now: float, queue: Sequence[Pending], *, idle: int, running: int, max_batch_size: int,
        queued: int | None = None,
    ) -> Decision:
        """The rules, in order ("budget" is the head request's):
          1. no free interpreter: wait for a completion; a model that does not batch:
             dispatch the head request alone.
          2. where batching pays (`batching_pays`) and a batch of the model runs, wait
             for the keep-up size K (`keep_up_batch`) while the predicted arrivals fill
             it before the head must start, within max_queue_delay_s, and the wait costs
             the queued requests less than the overhead it saves (`_fill_by`).
          3. otherwise dispatch a FIFO prefix of whole requests of at most the backlog
             size C (`backlog_batch`) and at least min(K, C) samples: the one whose plan
             for the queue (this batch, then batches of at least K as interpreters free)
             has the fewest requests past their limits, then the earliest finishes in
             sum (`_best_take`). At low load that is one request per batch, spread over
             the free interpreters."""
        self._see(queue)
        while len(self._flight) > running:  # batches that ended without being observed (failed, joined)
            self._land()
        if idle <= 0 or not queue:
            return WAIT
        if max_batch_size <= 0:
            return self._dispatch(now, 1, queue[0].samples)
        if len(queue) == 1 and (running == 0 or not self.batching_pays()):
            # a lone request, and no reason to wait for company (rule 2 needs both a batch
            # that pays and one running): rule 3 takes it alone. The common case at low
            # load, decided without the batch sizes.
            self._update_keep_up(now, max_batch_size)
            return self._dispatch(now, 1, queue[0].samples)
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
        backlog = self.backlog_batch(budget, max_batch_size)
        keep_up = self._update_keep_up(now, max_batch_size)
        if self.batching_pays() and running > 0 and keep_up is not None and queued < keep_up \
                and self._samples < keep_up:
            wake = self._fill_by(now, queue, queued, keep_up)  # rule 2
            if wake is not None:
                return Decision(0, wake)
        top = _prefix(sizes, backlog)  # rule 3
        if keep_up is None:
            low = top
        else:
            low = min(top, _prefix(sizes, min(keep_up, backlog)))
        floor = backlog if keep_up is None else max(1, min(keep_up, backlog))
        take = self._best_take(queue, sizes, self._frees(now, idle), low, top, floor)
        return self._dispatch(now, take, sizes[take - 1])

    def _update_keep_up(self, now: float, max_batch_size: int) -> int | None:
        """The keep-up size now, remembered for admission, and since when none keeps up."""
        keep_up = self._keep_up = self.keep_up_batch(now, max_batch_size)
        if keep_up is not None:
            self._outpaced_since = None
        elif self._outpaced_since is None:
            self._outpaced_since = now
        return keep_up

    def _dispatch(self, now: float, take: int, samples: int) -> Decision:
        """Dispatch `take` requests (`samples` samples), remembering the batch."""
        self._flight.append((now, self.cost.predict(samples)))
        return Decision(take, None)

    def _land(self) -> None:
        """A batch in flight ended: forget the one predicted to end first."""
        flight = self._flight
        if flight:
            flight.remove(min(flight, key=lambda f: f[0] + f[1]))

    def _frees(self, now: float, idle: int | None = None, *, cautious: bool = False) -> list[float]:
        """When each interpreter can start a batch, soonest first: `idle` of them now (by
        default those no batch of this model holds), the others when their batch ends
        (`cautious`: as late as batches of a slow spell end)."""
        scale = self._cautious if cautious else self._slowdown
        ends = sorted(max(now, start + scale * seconds) for start, seconds in self._flight)
        free = self.interpreters - len(ends) if idle is None else idle
        return [now] * max(0, free) + ends

    def _slots(self, now: float) -> list[tuple[float, float]]:
        """Each interpreter as admission sees it, soonest first: when it can start a batch
        (its batch's end at the mean slowdown; now if idle) and the predicted seconds of
        that batch (0 if idle), whose jitter is one of the margins a finish needs."""
        slowdown = self._slowdown
        ends = sorted((max(now, start + slowdown * seconds), seconds) for start, seconds in self._flight)
        return [(now, 0.0)] * max(0, self.interpreters - len(ends)) + ends

    def _best_take(self, queue: Sequence[Pending], sizes: Sequence[int], frees: list[float], low: int,
                   high: int, floor: int) -> int:
        """How many requests the next batch takes (`low` to `high`): the plan whose queued
        requests are predicted to miss their limits least often, then to finish soonest in
        sum; the batch after it holds `floor` samples or as many as it (FIFO, whole requests)."""
        if low >= high:
            return high
        best, best_key = low, (math.inf, math.inf)
        horizon = 2 * len(frees) * sizes[high - 1]  # samples whose finish the choice affects
        effective = self.effective
        limit_of = self.limit_of
        for take in range(low, high + 1):
            first = sizes[take - 1]
            target = max(first, floor)
            avail = list(frees)
            start = avail[0]
            end = start + effective(first)
            avail[0] = end
            late = 0
            total = 0.0
            for p in itertools.islice(queue, take):
                total += end
                if end > limit_of(p):
                    late += 1
            batch: list[Pending] = []
            filled = 0
            seen = first
            for p in itertools.islice(queue, take, None):
                if batch and filled + p.samples > target:
                    late, total = self._close(batch, filled, avail, late, total)
                    batch, filled = [], 0
                    if seen >= horizon:
                        break
                batch.append(p)
                filled += p.samples
                seen += p.samples
            else:
                if batch:
                    late, total = self._close(batch, filled, avail, late, total)
            key = (late, total)
            if key < best_key:
                best, best_key = take, key
        return best

    def _close(self, batch: Sequence[Pending], samples: int, avail: list[float], late: int,
               total: float) -> tuple[int, float]:
        """Plan `batch` on the interpreter that frees first; count its requests' finishes."""
        i = avail.index(min(avail))
        end = avail[i] + self.effective(samples)
        avail[i] = end
        for p in batch:
            total += end
            if end > self.limit_of(p):
                late += 1
        return late, total

    def _fill_by(self, now: float, queue: Sequence[Pending], queued: int, target: int) -> float | None:
        """When to dispatch if waiting for a batch of `target` samples pays (rule 2): the
        head's latest start, or None (dispatch now) when the batch would not fill before
        it, or when the queued requests would lose more to the wait than the batch
        overhead it saves."""
        rate = self.arrival_rate(now)
        if rate <= 0.0:
            return None
        limit = min(self.limit_of(p) for p in queue)
        predict = self.cost.predict
        latest = min(queue[0].arrival + self.max_queue_delay_s, limit - self.effective(target))
        fill = (target - queued) / rate
        saving = predict(queued) + predict(target - queued) - predict(target)
        if now >= latest or now + fill > latest or fill * len(queue) > saving:
            return None
        return latest

    def observe(self, samples: int, seconds: float) -> None:
        """A batch of `samples` held an interpreter for `seconds` (from its dispatch to the
        moment the loop saw it end): update the slowdown, refine the cost model."""
        self._land()
        if samples >= 1 and seconds > 0.0 and math.isfinite(seconds):
            low, high = SLOWDOWN_RANGE
            ratio = min(high, max(low, seconds / self.cost.predict(samples)))
            self._observed += 1
            weight = max(self.slowdown_alpha, 1.0 / self._observed)  # plain means until it has history
            # the deviation averages over four times as many batches: it sets the margin
            self._spread += max(weight / 4, 1.0 / self._observed) * (abs(ratio - self._slowdown) - self._spread)
            self._slowdown += weight * (ratio - self._slowdown)
            self._cautious = self._slowdown + CAUTION * self._spread
        self.cost.observe(samples, seconds)

    # ---- admission ----

    def predicted_finish(self, now: float, queued_samples: int, samples: int = 1, *,
                         within: float = math.inf) -> float:
        """When a request of `samples` arriving at `now` behind `queued_samples` is predicted
        to finish, with a margin for the batches' jitter: the queue drained in batches of one
        size b, each on the interpreter that frees first, b from the keep-up size at the last
        decision (the backlog size when arrivals outpace it) up to the backlog size; the first
        b that finishes by `within`, else the backlog size."""
        c = self.backlog_batch(self.latency_budget_s, self.cost.max_batch_size)
        low = c if self._keep_up is None else min(self._keep_up, c)
        slots = self._slots(now)
        n = len(slots)
        position = queued_samples + samples
        finish = math.inf
        mean = max(1.0, self._samples)
        margin = self._cautious - self._slowdown
        for b in range(low, c + 1):
            per = max(mean, b - PACKING * (mean - 1.0))
            m = int((position - 1) // per)  # the batch the request ends up in, filled by those after it
            k = m // n  # the batches before its own on its interpreter
            before = self.cost.predict(math.ceil(per))  # each as full as whole requests fill b on average
            own = self.cost.predict(max(b, math.ceil(per)))  # its own may be full
            end, ahead = slots[m % n]
            # the batch ahead, those k and its own jitter independently: one caution over their
            # summed variance, not one per batch (that refuses requests that would end in time)
            finish = (end + (k * before + own) * self._slowdown
                      + margin * math.sqrt(ahead * ahead + k * before * before + own * own))
            if finish <= within:
                break
        return finish

    def arrive(self, now: float, samples: int = 1) -> None:
        """A request of `samples` arrived at `now`, admitted or not: it counts in the rate at
        once, and the keep-up size is brought up to date (while every interpreter is busy no
        decision runs, and in a burst a keep-up size from before it would predict the small
        batches of a light load, where the batches that will run have the backlog size)."""
        self._fold(((now, samples),))
        self._update_keep_up(now, self.cost.max_batch_size)

    def admits_surely(self, now: float, queued_samples: int, samples: int = 1, budget: float | None = None,
                      waited: float = 0.0) -> bool:
        """Whether `admit` would admit the request whatever batch size its prediction tries:
        the latest finish any of them predicts (the request behind the queue in batches of
        one request each, each batch as long as the largest batch's, on the interpreter that
        frees last) is within the tightest limit `admit` may set. Counts nothing. From a
        request's head, asked with the loosest budget the request may carry, it spares the
        full prediction where a refusal is impossible; the request is judged in full with its
        body (so a bound that errs only moves a refusal from the head to the body). `admit`
        asks it first when asked ahead."""
        factor = self.admit_factor * (1.0 - self.overload_reserve)
        limit = now - waited + factor * (self.latency_budget_s if budget is None else budget)
        frees = self._frees(now, cautious=True)
        largest = self.largest_batch(self.latency_budget_s, self.cost.max_batch_size)
        batch = self.effective(max(largest, math.ceil(max(1.0, self._samples, samples))), cautious=True)
        turns = (queued_samples + samples - 1) // len(frees) + 1
        return frees[-1] + turns * batch <= limit

    def admit(self, now: float, queued_samples: int, samples: int = 1, budget: float | None = None,
              waited: float = 0.0, *, count: bool = True) -> float | None:
        """None to admit a new request, or a Retry-After in seconds to refuse it (503).

        Refuses when the request's predicted finish is beyond admit_factor x its own
        budget (`budget`, else the policy's) from its arrival in the server (`waited`
        seconds before now), less overload_reserve of it once the
        arrivals have outpaced every batch size for OVERLOAD_SUSTAINED_S; the
        Retry-After is how much later it would be predicted to finish (at least one
        interpreter's turn). The request's arrival counts first (`arrive`).

        count False: the question is asked ahead of the request (from its head, before its
        body is read), the bound `admits_surely` first. The answer is the one `admit` gives now,
        but nothing is counted:
        the caller counts the arrival (`arrive`) of a request it refuses there, and one it
        lets on is counted when it is asked again with its body."""
        if not count:
            if self.admits_surely(now, queued_samples, samples, budget, waited):
                return None  # asked again, in full, once the body says what the request holds
            kept = self._arrival_state()
            try:
                return self.admit(now, queued_samples, samples, budget, waited)
            finally:
                self._restore_arrivals(kept)
        self.arrive(now, samples)
        factor = self.admit_factor
        since = self._outpaced_since  # set only while no batch size keeps up
        if since is not None and now - since >= OVERLOAD_SUSTAINED_S:
            factor *= 1.0 - self.overload_reserve
        limit = now - waited + factor * (self.latency_budget_s if budget is None else budget)
        finish = self.predicted_finish(now, queued_samples, samples, within=limit)
        if finish <= limit:
            return None
        c = self.backlog_batch(self.latency_budget_s, self.cost.max_batch_size)
        return max(finish - limit, self.effective(c) / self.interpreters)

    def admission_rate(self) -> float:
        """Requests per second the model's interpreters serve while a backlog drains (batches of
        the backlog size, each as long as the slowdown makes it): the most admission lets in,
        sustained."""
        c = self.backlog_batch(self.latency_budget_s, self.cost.max_batch_size)
        return self.interpreters * c / self.effective(c) / max(1.0, self._samples)

    def refuses(self, now: float, queued_samples: int, samples: int = 1, budget: float | None = None,
                waited: float = 0.0) -> float | None:
        """`admit` where only a refusal counts: its Retry-After, the arrival counted as `admit`
        counts it, or None with nothing counted (the request is then asked about in full, by
        `admit`). For a request already known, the one `admit` refused before, sent again."""
        kept = self._arrival_state()
        wait = self.admit(now, queued_samples, samples, budget, waited)
        if wait is None:
            self._restore_arrivals(kept)
        return wait

    def _arrival_state(self) -> _Arrivals:
        """What counting an arrival changes (`arrive`)."""
        return (self._gap, self._samples, self._arrivals, self._last_arrival, self._keep_up, self._outpaced_since)

    def _restore_arrivals(self, kept: _Arrivals) -> None:
        self._gap, self._samples, self._arrivals, self._last_arrival, self._keep_up, self._outpaced_since = kept

    def as_dict(self, now: float) -> dict[str, object]:
        """JSON-ready state for metrics: budget, arrival rate, batch sizes, slowdown, cost model."""
        top = self.cost.max_batch_size
        backlog = self.backlog_batch(self.latency_budget_s, top)
        return {
            "policy": "adaptive",
            "latency_budget_s": self.latency_budget_s,
            "interpreters": self.interpreters,
            "arrival_rate_samples_per_s": self.arrival_rate(now),
            "batching_pays": self.batching_pays(),
            "largest_batch": self.largest_batch(self.latency_budget_s, top),
            "backlog_batch": backlog,
            "slowdown": self._slowdown,
            "slowdown_cautious": self._cautious,
            "contention": self.contention,
            "drain_rate_samples_per_s": self.interpreters * backlog / self.effective(backlog),
            "cost": self.cost.as_dict(),
        }
