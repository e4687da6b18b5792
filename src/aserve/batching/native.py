"""A front's model whose requests are batched in the pool, by the window rule or the
adaptive policy, in C.

Every front loop queues each request of such a model on the pool's shared queue as it
comes (`Link.request`), so the requests of every loop wait in one queue per
model and join the same batches: a worker takes one when the model's policy says its batch
may start, gathers the queued requests it chose, copies their inputs into one block, runs
the model once and gives each request its rows (native/host/pool_coalesce.c). The window
rule (full, nothing of the model running, its window closed, or its deadline near:
`WindowPolicy`'s rule, `_native.window_rule`) or, for a model with the adaptive policy, its
`_native.Plan` (native/host/plan.c: `AdaptivePolicy`'s rules over the cost curve the host
fits and publishes, `PlanFeed`). A completion goes to the loop that queued the request.

What stays on the request's own loop: admission (`max_queue_size` over every loop, the
model's `_native.Counter`, and the Plan's where the model has one), the deadline (one timer per model, at the earliest deadline;
a request still queued when it passes is cancelled in the pool), withdrawal, and the
counts its statistics read. Per request that is C (`_native.FrontQueue`,
native/host/front_queue.c: submit, the flush once per loop iteration, the completion);
the timer, withdrawal and closing are here. The batch's leader reports the batch (its
rows and run time), so every batch is counted once, by the loop whose request led it.

A model with stages whose adaptive policy joins (layer joining) joins in the pool too: the
request that leads a batch runs it stage by stage, and the requests queued while every
interpreter is busy are offered to the running batches by the Plan's planner
(native/host/pool_join.c, plan_join.c; `JoinPlanner`'s rules, over the stage shares the
warm-up measured and the pool refines).

`Batcher` stays the reference: the host's loop runs it, and a front runs it beside this queue
for its requests that are traced or carry a caller's context (`ModelHandle.traced`;
`PlanAdmission` where the model has a Plan).
"""

from __future__ import annotations

import asyncio
import heapq
import math
from collections.abc import Callable, Sequence
from time import monotonic
from typing import TYPE_CHECKING, Any, Protocol

from .._native import FrontQueue, Plan
from ..errors import EngineError, ModelError, Overloaded, RequestTimeout
from ..tensor import Tensor, wrong_rows
from .adaptive import AdaptivePolicy
from .batcher import count_batch, queue_full
from .costmodel import CostModel
from .policy import WindowPolicy

if TYPE_CHECKING:
    from .joining import Joining

# how often the host folds the batches that ended into a Plan's cost model (`PlanFeed`)
FEED_PERIOD_S = 0.05

# (outputs or None, error or None, rows of the batch it led (0: none), run start and end, ns)
NativeDone = Callable[[dict[str, Tensor] | None, BaseException | None, int, int, int], None]


def curve(cost: CostModel, tolerance: float) -> tuple[list[float], int, int, int]:
    """What a Plan plans with (`Plan.publish`'s arguments): the predicted seconds of a batch of
    1 to 2 x max_batch_size samples (whether batching pays compares a batch with one twice its
    size), the cost model's max_batch_size and its throughput-optimal and efficient sizes."""
    top = cost.max_batch_size
    return ([cost.predict(b) for b in range(1, 2 * top + 1)], top, cost.throughput_optimal_batch(),
            cost.efficient_batch(tolerance))


class PlanFeed:
    """The host's side of one model load's adaptive policy in C (`_native.Plan`): made from
    the `AdaptivePolicy` its warm-up fitted, it is what the pool batches the fronts' requests by
    and what their admission asks. `feed` folds the batches that ended into the policy's cost
    model and publishes the refined curve; the arrival rate, the slowdown and the batches in
    flight are the Plan's own (every loop and worker changes them)."""

    def __init__(self, policy: AdaptivePolicy, joining: Joining | None = None) -> None:
        self.policy = policy
        self.joining = joining
        self._timer: asyncio.TimerHandle | None = None
        self.plan = Plan(
            interpreters=policy.interpreters, latency_budget_s=policy.latency_budget_s,
            max_queue_delay_s=policy.max_queue_delay_s, headroom=policy.headroom, rate_alpha=policy.rate_alpha,
            admit_factor=policy.admit_factor, overload_reserve=policy.overload_reserve,
            slowdown_alpha=policy.slowdown_alpha, contention=policy.contention,
        )
        if joining is not None:
            profile = joining.planner.profile
            self.plan.join_setup(profile.shares, joining.benefit, profile.alpha)
        self.publish()

    @property
    def address(self) -> int:
        return int(self.plan.address)

    def publish(self) -> None:
        self.plan.publish(*curve(self.policy.cost, self.policy.tolerance))
        if self.joining is not None:  # whether a join can pay follows the refined curve
            self.plan.may_pay(self.joining.planner.may_pay())

    def feed(self) -> int:
        """Refine the cost model with the batches that ended since the last call; how many."""
        done = self.plan.observed()
        for samples, seconds in done:
            self.policy.cost.observe(samples, seconds)
        if done:
            self.publish()
        return len(done)

    def start(self) -> None:
        """Feed the cost model every FEED_PERIOD_S on the running loop, until `stop`."""
        self._timer = asyncio.get_running_loop().call_later(FEED_PERIOD_S, self._tick)

    def _tick(self) -> None:
        self.feed()
        self._timer = asyncio.get_running_loop().call_later(FEED_PERIOD_S, self._tick)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def as_dict(self, now: float) -> dict[str, object]:
        """`AdaptivePolicy.as_dict`'s shape, from the Plan's state and the curve refined with every
        batch that ended until now."""
        self.feed()
        state = self.plan.read(now)
        policy = self.policy
        return {
            "policy": "adaptive",
            "latency_budget_s": policy.latency_budget_s,
            "interpreters": policy.interpreters,
            **state,
            "contention": policy.contention,
            "cost": policy.cost.as_dict(),
        }


class PlanAdmission(WindowPolicy):
    """The window rule with a model's adaptive admission: the policy of a front's `traced`
    batcher of a model the pool batches by its Plan. Its requests (sampled for tracing, or
    carrying a caller's context) run in batches of their own, which the pool counts in the
    Plan's batches in flight and the model's running ones (`Link.infer` with the plan), and are
    admitted, refused and counted in the arrival rate by the same Plan as the model's other
    requests. It is asked about every request (`asks_always`): one must wait when any loop has
    requests of the model queued or its batches run on every interpreter (`shared`: the model's
    Counter), as `FrontQueue.submit` judges."""

    asks_always = True

    def __init__(self, *, max_queue_delay: float, latency_budget_s: float, interpreters: int, link: Any,
                 target: Callable[[], Any], shared: Any) -> None:
        super().__init__(max_queue_delay=max_queue_delay)
        self.latency_budget_s = latency_budget_s  # what a refusal names when the request has none
        self._interpreters = interpreters
        self._link = link
        self._target = target
        self._shared = shared

    def _ask(self, now: float, samples: int, budget: float | None, waited: float, mode: int) -> float | None:
        """The Plan's answer (Link.plan_admit's `mode`) for a request that must wait, else None
        (a request counted, mode 1, still counts in the rate)."""
        target = self._target()
        if target is None:
            return None
        total = int(self._shared.total())
        if total > 0 or int(self._shared.running) >= self._interpreters:
            wait: float | None = self._link.plan_admit(target, now, total, samples, budget, waited, mode)
            return wait
        if mode == 1:
            self._link.plan_arrive(target, now, samples)
        return None

    def admit(self, now: float, queued_samples: int, samples: int, budget: float | None, waited: float, /, *,
              count: bool = True) -> float | None:
        return self._ask(now, samples, budget, waited, 1 if count else 0)

    def refuses(self, now: float, queued_samples: int, samples: int, budget: float | None,
                waited: float) -> float | None:
        return self._ask(now, samples, budget, waited, 2)

    def arrive(self, now: float, samples: int) -> None:
        target = self._target()
        if target is not None:
            self._link.plan_arrive(target, now, samples)

    def admission_rate(self) -> float | None:
        target = self._target()
        rate: float | None = None if target is None else self._link.plan_rate(target)
        return rate


class NativeQueue(Protocol):
    """Where a NativeBatcher queues its requests (a front's LinkEngine)."""

    def request(self, model: str, inputs: Sequence[Tensor], samples: int, done: NativeDone, /, *,
                window_ns: int, deadline_ns: int) -> Any: ...
    def cancel_request(self, job: Any, /) -> str | None: ...
    def hold(self) -> None: ...
    def release(self) -> None: ...


class SharedQueued(Protocol):
    """The model's queued samples over every loop (`_native.Counter`: this loop's view, which
    adds to its own slot) and this loop's slots."""

    def add(self, n: int, /) -> None: ...
    def total(self) -> int: ...
    def get(self, slot: int, /) -> int: ...


class NativeBatcher(FrontQueue):
    """One model on one front loop, batched in the pool; `Batcher`'s interface for the
    data plane (submit, refuse_ahead, withdraw, close, stats and the counters).

    The per-request path is `_native.FrontQueue`'s, in C: `submit` (admission, the
    deadline, the request's record and future), `flush` (once per loop iteration) and each
    request's completion (the batch it led counted, its future told). Here: the deadline
    timer, withdrawal, closing and the statistics, over the same state.

    queue: the pool's side (a front's LinkEngine, whose Link the C side calls directly);
    slots: this loop's slots of the model's Counter: the samples and requests its requests
    hold while they wait in the pool's queue, and the batches its requests lead, running."""

    tracer = None  # traced requests go to the model's `traced` Batcher: none is submitted here

    def __init__(self, *, model: str, key: str, queue: NativeQueue, max_batch_size: int, max_queue_size: int,
                 max_queue_delay: float, shared: SharedQueued, slots: tuple[int, int, int],
                 adaptive: tuple[float, int] | None = None) -> None:
        super().__init__(model=model, key=key, queue=queue, shared=shared, max_batch_size=max_batch_size,
                         max_queue_size=max_queue_size, window_ns=round(max_queue_delay * 1e9),
                         errors=(EngineError, RequestTimeout, ModelError), rules=(queue_full, wrong_rows, count_batch),
                         link=getattr(queue, "link", None), targets=getattr(queue, "targets", None),
                         plan_refusal=None if adaptive is None else self._plan_refusal,
                         interpreters=1 if adaptive is None else adaptive[1])
        # the rule the pool applies, in C: the window rule, or the model's adaptive policy (the
        # host's Plan, reached through the Link: `budget` is its latency budget)
        self.policy = WindowPolicy(max_queue_delay=max_queue_delay) if adaptive is None else None
        self.budget: float | None = None if adaptive is None else adaptive[0]
        self.interpreters = 1 if adaptive is None else adaptive[1]
        self._queue = queue
        self._shared = shared
        self._slots = slots
        self._expiry: asyncio.TimerHandle | None = None

    # ---- state ----

    @property
    def queued(self) -> int:
        """Samples of this loop's requests waiting in the pool's queue."""
        return self._shared.get(self._slots[0])

    @property
    def running(self) -> int:
        """Batches led by this loop's requests, running now."""
        return self._shared.get(self._slots[2])

    def stats(self) -> dict[str, object]:
        """`Batcher.stats`'s counters; queued and running read from the model's Counter."""
        samples, requests, running = (self._shared.get(slot) for slot in self._slots)
        return {
            "queued_samples": samples,
            "queued_requests": requests,
            "running_batches": running,
            "batches": self.batches,
            "requests": self.requests,
            "refused": self.refused,
            "timed_out": self.timed_out,
            "queue_seconds": self.queue_seconds,
            "compute_seconds": self.compute_seconds,
            "cancelled": self.cancelled,
        }

    # ---- requests (submit and flush: FrontQueue's) ----

    def refuse_ahead(self, *, budget: float | None = None, waited: float = 0.0) -> None:
        """`Batcher.refuse_ahead`: Overloaded when any request would be refused now (the adaptive
        policy asked from the head, nothing counted but a refusal's arrival)."""
        if self.closed:
            return
        refused = self._admission(1, budget, max(0.0, waited), mode=0)
        if refused is not None:
            self.refused += 1
            raise refused

    def refuse_again(self, samples: int, /, *, budget: float | None = None, waited: float = 0.0,
                     held: bool = False) -> Overloaded | None:
        """`Batcher.refuse_again`: the refusal `submit` would raise, counted, or None (nothing counted)."""
        if self.closed:
            return None
        refused = self._admission(samples, budget, max(0.0, waited), mode=2, held=held)
        if refused is not None:
            self.refused += 1
        return refused

    def _admission(self, samples: int, budget: float | None, waited: float, *, mode: int,
                   held: bool = False) -> Overloaded | None:
        """The adaptive policy's refusal where the request must wait (mode: Link.plan_admit's), then
        the queue bound's."""
        total = self._shared.total()
        link = self.link
        if self.budget is not None and (total > 0 or held or self._shared_running() >= self.interpreters):
            target = self._target()
            if target is not None and link is not None:
                now = monotonic()
                wait = link.plan_admit(target, now, total, samples, budget, waited, mode)
                if wait is not None:
                    if mode == 0:  # its arrival counts in the rate, as submit's refusals do
                        link.plan_arrive(target, now, samples)
                    return self._plan_refusal(wait, budget, held)
        return queue_full(self.model, total, samples, self.max_queue_size)

    def _target(self) -> Any:
        targets = getattr(self._queue, "targets", None)
        found = None if targets is None else targets.get(self.key)
        return None if found is None else found[1]

    def _shared_running(self) -> int:
        running = getattr(self._shared, "running", 0)
        return int(running)

    def _plan_refusal(self, wait: float, budget: float | None, held: bool) -> Overloaded:
        """The adaptive policy's refusal (`Batcher._policy_refusal`'s), Retry-After `wait` s."""
        target, link = self._target(), self.link
        rate = None if target is None or link is None else link.plan_rate(target)
        return Overloaded(
            f"model {self.model!r} cannot answer the request within its latency budget "
            f"({self._shared.total()} samples queued, {self._shared_running()} of {self.interpreters} interpreters "
            f"busy{', after a hold of its connection' if held else ''}); retry in {wait:.2f} s",
            retry_after=wait, budget=budget if budget is not None else self.budget, rate=rate,
        )

    def withdraw(self, future: asyncio.Future[dict[str, Tensor]]) -> None:
        """The caller stopped waiting: a request still queued in the pool leaves it."""
        for req in self.pending:
            if req.future is future:
                if req.job is not None:  # not yet handed on: the flush drops it
                    self._queue.cancel_request(req.job)  # queued: it completes now, failed; running: it runs on
                return

    # ---- deadlines ----

    def _arm(self, when: float) -> None:
        """Fire `_expire` at `when`, the earliest deadline now (submit calls it)."""
        if self._expiry is not None:
            self._expiry.cancel()
        self.expiry_at = when
        assert self.loop is not None
        self._expiry = self.loop.call_at(when, self._expire)

    def _expire(self) -> None:
        """The earliest deadline came: fail the requests past theirs; one still queued in the
        pool leaves the queue, one running alone is cancelled in its interpreter."""
        self._expiry = None
        self.expiry_at = math.inf
        now = monotonic()
        heap, pending = self.deadlines, self.pending
        while heap and (heap[0][1] not in pending or heap[0][0] <= now):
            _, req = heapq.heappop(heap)
            if req not in pending or req.future.done():
                continue
            self.timed_out += 1
            req.future.set_exception(RequestTimeout(
                f"model {self.model!r}: request timed out after {(now - req.arrival) * 1000:.1f} ms"
            ))
            if req.job is not None and self._queue.cancel_request(req.job) == "running":
                self.cancelled += 1  # a queued one just left the queue: no batch was cancelled
        if heap:
            self._arm(heap[0][0])

    # ---- lifecycle ----

    async def close(self, *, timeout: float | None = None) -> None:
        """Refuse new requests and wait (up to `timeout` s) until every accepted one is answered:
        a request the pool holds is answered by the pool, which never drops one."""
        self.closed = True
        loop = asyncio.get_running_loop()
        if self.pending:
            drained = self.drained = loop.create_future()
            try:
                await asyncio.wait_for(asyncio.shield(drained), timeout)
            except TimeoutError:
                for req in list(self.pending):
                    if not req.future.done():
                        req.future.set_exception(EngineError(f"model {self.model!r} shut down before the request ran"))
                    if req.job is not None:
                        self._queue.cancel_request(req.job)
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
            self.expiry_at = math.inf
