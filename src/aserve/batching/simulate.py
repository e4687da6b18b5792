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
instant run completions first, then stage boundaries (with joining), then arrivals,
then the timer, each kind in order.

With `join` (a `JoinPlanner`) every batch runs staged and the simulation mirrors
the batcher's layer-level joining (`Batcher._offer_joins`, `_run_staged`,
`_offer_done`) and the engine's join point (`join_poll` in native/host/pool.c, the
runtime's stage loop):
  - `stages` are the model's true stage shares (default: the planner's profile at
    the start); they time the simulation and may differ from the planner's profile.
    A batch of N samples runs stage j in shares[j] * cost(N) seconds.
  - whenever the queue is not empty and no slot is free (after an arrival, a
    completion, the timer, an expiry) the head of the queue is offered to each
    running batch in dispatch order, at most one group per batch per pass: the
    whole requests from the head that keep the batch within max_batch_size, asked
    of `join.plan(now, done=, elapsed=now - start, samples=, limit=, sizes=,
    limits=, max_batch_size=, offered=, requests=, free_at=)` with the batch's
    stages done so far, its samples counting groups already offered, the earliest
    finish limit of its requests and groups (arrival + own budget or `budget`, or an
    earlier deadline), the samples of each group offered to it and not turned away,
    its requests as dispatched plus those of these groups, and free_at: the
    earliest predicted end (start + cost model's prediction for its samples with
    the groups offered) of the running batches, computed once per pass before any
    offer (None with `benefit=False`: budgets only). A batch dispatched in the same
    pass is neither offered to nor counted in free_at: the batcher's task that
    starts it has not run yet. The engine takes the offer only if the batch has
    done fewer stages than the plan's last_stage; otherwise the group goes back to
    the queue's head.
  - after each stage but the last (and again after each group it absorbed there)
    the batch polls its offers in order: the first with last_stage >= stages done
    joins: it runs stages 1..k alone (sum(shares[:k]) * cost(n)), then the batch
    goes on with N + n samples; an offer past its last_stage goes back to the
    queue's head, and so does any still pending when the batch completes.
  - a batch that absorbed nothing teaches the policy (`observe`) and the planner's
    stage profile (`profile.observe` of its stage seconds); one that absorbed a
    group teaches neither, as in the batcher.
  - boundaries do not wake the batcher: a group the planner refuses waits for the
    next arrival, completion or timer.
`SimResult.joins` records each absorbed group; `SimBatch.joined` the requests each
batch absorbed. Without `join` the simulation is the plain one above.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Callable, Sequence
from typing import NamedTuple

from .join import JoinPlanner, tightest
from .policy import BatchPolicy

_COMPLETION, _BOUNDARY, _ARRIVAL, _TIMER, _EXPIRY = 0, 1, 2, 3, 4


class Arrival(NamedTuple):
    """One simulated request: when it arrives, how many samples, optional absolute
    deadline, optional latency budget in seconds (None: the policy's own)."""

    time: float
    samples: int = 1
    deadline: float | None = None
    budget: float | None = None


def poisson(rate: float, seconds: float, seed: int, samples: Callable[[random.Random], int] | None = None
            ) -> list[Arrival]:
    """Poisson arrivals at `rate` per second for `seconds`, from `seed`; each of
    `samples(rng)` samples (drawn after its gap), or one."""
    rng = random.Random(seed)
    t = 0.0
    out: list[Arrival] = []
    while True:
        t += rng.expovariate(rate)
        if t >= seconds:
            return out
        out.append(Arrival(t, samples(rng) if samples else 1))


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
    requests: tuple[int, ...]  # indices into the arrivals, as dispatched
    samples: int  # as dispatched
    joined: tuple[int, ...] = ()  # requests it absorbed at stage boundaries, in order


class SimJoin(NamedTuple):
    """A group of queued requests absorbed by a running staged batch."""

    batch: int  # index into SimResult.batches
    offered: float  # when the batcher offered it
    joined: float  # when the batch absorbed it (its boundary, or after earlier groups there)
    stage: int  # it ran stages 1..stage alone, then went on with the batch
    requests: tuple[int, ...]
    samples: int
    last_stage: int  # the plan's latest boundary
    predicted: float  # the planner's predicted finish of the batch when offered


class SimResult(NamedTuple):
    """latencies[i]: seconds from arrival to completion of request i (None: timed out or refused)."""

    latencies: list[float | None]
    batches: list[SimBatch]
    refused: list[int]  # indices refused by admission control
    timed_out: list[int]  # indices whose deadline passed in the queue
    end: float  # simulated time of the last event
    budgets: tuple[float | None, ...] = ()  # budgets[i]: request i's own budget, if any
    joins: tuple[SimJoin, ...] = ()  # groups absorbed by running batches (with `join`)

    def sizes(self) -> list[int]:
        """Samples per batch as dispatched, in dispatch order."""
        return [b.samples for b in self.batches]

    def groups(self) -> list[tuple[int, ...]]:
        """Request indices per batch as dispatched, in dispatch order."""
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


class _Offer(NamedTuple):
    group: list[SimRequest]
    samples: int
    last_stage: int
    offered: float
    predicted: float


class _Staged:
    """A staged batch in flight: the batcher's view (samples, limit) and the engine's
    (stages done, offers waiting at its join point, samples its stages run with)."""

    __slots__ = ("absorbed", "batch", "done", "limit", "offered", "offers", "polling", "requests", "samples",
                 "seconds", "start", "width")

    def __init__(self, batch: int, start: float, requests: list[SimRequest], samples: int, limit: float) -> None:
        self.batch = batch
        self.start = start
        self.requests = list(requests)  # with the groups absorbed
        self.samples = samples  # batcher: with the groups offered and not turned away
        self.limit = limit  # batcher: earliest finish limit of its requests and groups
        self.width = samples  # engine: samples its stages run with
        self.done = 0  # engine: stages done at the last join point
        self.polling = False  # engine: at a boundary, absorbing groups
        self.offered: list[_Offer] = []  # batcher: groups offered and not turned away
        self.offers: deque[_Offer] = deque()  # engine: groups waiting at its join point
        self.absorbed: list[SimJoin] = []
        self.seconds: list[float] = []  # each stage's seconds (the batch's own runs)


def _true_shares(stages: Sequence[float] | None, join: JoinPlanner) -> list[float]:
    shares = list(join.profile.shares) if stages is None else [float(s) for s in stages]
    if len(shares) != join.profile.stages:
        raise ValueError(f"{len(shares)} stage shares for a planner of {join.profile.stages} stages")
    total = sum(shares)
    if any(not s >= 0.0 for s in shares) or not 0.0 < total < math.inf:
        raise ValueError(f"stage shares must be >= 0 with a positive sum, got {shares}")
    return [s / total for s in shares]


def simulate(
    policy: BatchPolicy,
    arrivals: Sequence[Arrival | tuple[float, int] | float],
    cost: Callable[[int], float],
    *,
    interpreters: int,
    max_batch_size: int,
    admit: bool = False,
    join: JoinPlanner | None = None,
    stages: Sequence[float] | None = None,
    budget: float | None = None,
    benefit: bool = True,
) -> SimResult:
    """Run the arrivals through `policy` with `interpreters` slots; deterministic.

    arrivals: Arrival, (time, samples[, deadline[, budget]]) or a bare time (one
      sample); any order.
    cost: seconds a batch of b samples takes.
    admit: call the policy's `admit(now, queued_samples)` before queueing each
      request and refuse it when that returns a Retry-After.
    join: layer-level joining with this planner (see the module doc); ignored when
      max_batch_size is 0 (the model does not batch), as in the batcher.
    stages: the true stage shares timing staged batches (normalised to sum 1).
    budget: with `join`, the latency budget (s) of requests without their own.
    benefit: with `join`, a group joins only if that also lowers the total latency
      (the planner's benefit check, as `Joining.benefit`); False: budgets only.
    """
    if interpreters < 1:
        raise ValueError(f"interpreters must be >= 1, got {interpreters}")
    if join is not None and max_batch_size <= 0:
        join = None
    shares: list[float] = []
    if join is not None:
        if budget is None or not budget > 0.0:
            raise ValueError(f"joining needs the default latency budget in seconds, got {budget}")
        shares = _true_shares(stages, join)
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
    joins: list[SimJoin] = []
    staged: list[_Staged] = []  # staged batches in flight, in dispatch order
    now = 0.0
    admit_fn = getattr(policy, "admit", None) if admit else None

    def limit_of(r: SimRequest) -> float:
        assert budget is not None
        return tightest(r.arrival, r.budget if r.budget is not None else budget, r.deadline)

    def requeue(group: list[SimRequest]) -> None:
        """A group turned away goes back to the queue's head, less those whose deadline
        passed while it was offered (the batcher answered them with a timeout then)."""
        nonlocal queued_samples
        back = [r for r in group if r.deadline is None or now < r.deadline]
        timed_out.extend(r.index for r in group if r.deadline is not None and now >= r.deadline)
        queue[:0] = back
        queued_samples += sum(r.samples for r in back)

    def schedule() -> None:
        nonlocal running, timer, timer_ids, queued_samples
        fresh: list[_Staged] = []  # dispatched in this pass: their tasks have not started
        while queue:
            idle = interpreters - running
            if idle <= 0:
                offer_joins(fresh)
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
            if join is None:
                seconds = cost(total)
                end = now + seconds
                batches.append(SimBatch(now, end, tuple(r.index for r in batch), total))
                push(end, _COMPLETION, Done(batch, total, seconds))
            else:
                batches.append(SimBatch(now, math.nan, tuple(r.index for r in batch), total))
                run = _Staged(len(batches) - 1, now, batch, total, min(limit_of(r) for r in batch))
                staged.append(run)
                fresh.append(run)
                run_stage(run)

    def offer_joins(fresh: list[_Staged]) -> None:
        """Batcher._offer_joins: the head of the queue to each running batch."""
        nonlocal queued_samples
        if join is None or not staged:
            return
        free_at = math.inf  # the earliest predicted end of a running batch: when a slot frees
        for run in staged:
            if not any(run is f for f in fresh):
                free_at = min(free_at, join.own_end(start=run.start, now=now, samples=run.samples,
                                                    offered=[o.samples for o in run.offered], done=run.done))
        for run in staged:
            if not queue:
                return
            if any(run is f for f in fresh):
                continue
            sizes: list[int] = []
            limits: list[float] = []
            total, limit = 0, math.inf
            for r in queue:
                if run.samples + total + r.samples > max_batch_size:
                    break
                total += r.samples
                limit = min(limit, limit_of(r))
                sizes.append(total)
                limits.append(limit)
            if not sizes:
                continue
            plan = join.plan(now, done=run.done, elapsed=now - run.start, samples=run.samples, limit=run.limit,
                             sizes=sizes, limits=limits, max_batch_size=max_batch_size,
                             offered=[o.samples for o in run.offered],
                             requests=len(batches[run.batch].requests) + sum(len(o.group) for o in run.offered),
                             free_at=free_at if benefit else None)
            if plan is None:
                continue
            group = queue[:plan.take]
            del queue[:plan.take]
            if run.done >= plan.last_stage:  # the engine refuses the offer: the batch moved on
                queue[:0] = group
                continue
            samples = sizes[plan.take - 1]
            queued_samples -= samples
            run.samples += samples
            run.limit = min(run.limit, limits[plan.take - 1])
            offer = _Offer(group, samples, plan.last_stage, now, plan.finish)
            run.offers.append(offer)
            run.offered.append(offer)

    def run_stage(run: _Staged) -> None:
        """The batch runs its next stage with every sample it holds."""
        seconds = shares[run.done] * cost(run.width)
        run.seconds.append(seconds)
        last = run.done + 1 == len(shares)
        push(now + seconds, _COMPLETION if last else _BOUNDARY, run)

    def boundary(run: _Staged) -> None:
        """The join point after a stage (or after a group it absorbed there)."""
        if not run.polling:
            run.done += 1
        while run.offers:
            offer = run.offers.popleft()
            if run.done <= offer.last_stage:
                run.width += offer.samples
                run.requests.extend(offer.group)
                run.absorbed.append(SimJoin(run.batch, offer.offered, now, run.done,
                                            tuple(r.index for r in offer.group), offer.samples,
                                            offer.last_stage, offer.predicted))
                run.polling = True
                push(now + sum(shares[:run.done]) * cost(offer.samples), _BOUNDARY, run)
                return
            turned_away(run, offer)
        run.polling = False
        run_stage(run)

    def turned_away(run: _Staged, offer: _Offer) -> None:
        """Batcher._offer_done for a group the engine did not absorb."""
        run.samples -= offer.samples
        run.offered.remove(offer)
        requeue(offer.group)
        schedule()

    def complete_staged(run: _Staged) -> None:
        nonlocal running
        staged.remove(run)
        while run.offers:
            turned_away(run, run.offers.popleft())
        if not run.absorbed:
            assert join is not None
            policy.observe(run.width, now - run.start)
            join.profile.observe(run.seconds)
        b = batches[run.batch]
        batches[run.batch] = b._replace(end=now, joined=tuple(i for j in run.absorbed for i in j.requests))
        joins.extend(run.absorbed)
        finish(run.requests)
        running -= 1
        schedule()

    def finish(requests: list[SimRequest]) -> None:
        for r in requests:
            if r.deadline is None or now <= r.deadline:
                latencies[r.index] = now - r.arrival
            else:
                timed_out.append(r.index)

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
            if isinstance(payload, _Staged):
                complete_staged(payload)
                continue
            assert isinstance(payload, Done)
            policy.observe(payload.samples, payload.seconds)
            finish(payload.requests)
            running -= 1
            schedule()
        elif kind == _BOUNDARY:
            assert isinstance(payload, _Staged)
            boundary(payload)
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
    joins.sort(key=lambda j: (j.joined, j.batch))
    return SimResult(latencies, batches, refused, timed_out, now, tuple(a.budget for a in items), tuple(joins))
