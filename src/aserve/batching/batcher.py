"""One model's micro-batcher: queue requests, dispatch batches as its policy says, split results back.

Requests wait in a FIFO queue with their input tensors (in the model's declared
order). Whenever something changes (an arrival, a completion, a timer the policy
asked for) the batcher asks the policy how many requests to dispatch; it
concatenates their inputs along the batch dimension with one copy per input, hands
the batch to the engine, and when the engine calls back it answers each request
with zero-copy slices of the outputs. At most `interpreters` batches of the model
run at once. With a `scheduler` (fair.py: the interpreters of a pool shared by
several models), a batch also needs one of the pool's slots, which go round-robin to
the models with work as batches end; without one, only the model's own limit counts.

The hot path costs one future per request and nothing per batch but the engine's
callback: no task, no timer per request. Deadlines are kept as numbers; one timer
per batcher fires at the earliest deadline among the queued and running requests
(and is re-armed from there), and one more wakes the policy when it asked to wait.
Both remember the time they were armed for, so nothing asks a timer handle for its
time (uvloop's handles for near deadlines cannot tell it). Times are read from
`time.monotonic()`, the clock `loop.call_at` counts in, at full resolution: uvloop's
`loop.time()` is that clock cut to whole milliseconds and cached per loop iteration,
too coarse to time sub-millisecond batches.

If a batch of several requests fails with a model error, each of its requests is
run again alone (in the same interpreter slot), so that only the request that makes
the model fail gets the error.

With `join` (a model with stages), batches run stage by stage and, while no
interpreter is free, the head of the queue is offered to running batches
(layer-level joining: joining.py at run time, join.py plans). The batcher keeps the
queue and answers every request, those that joined a batch included.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from time import monotonic
from typing import Any, Protocol

from .._native import RequestTrace
from ..errors import EngineError, ModelError, Overloaded, RequestTimeout
from ..tensor import Tensor, concat_inputs, same_sample_shapes, split_outputs, wrong_rows
from ..tracing.batches import BatchContext, batch_context, batch_untraced_context, trace_batch
from ..tracing.recorder import Tracer
from .fair import FairScheduler, Seat
from .joining import Joining, LayerJoin
from .policy import Admit, BatchPolicy
from .request import DONE, QUEUED, RUNNING, Request

Done = Callable[[dict[str, Tensor] | None, BaseException | None], None]
# Runs one batch: run(model, inputs in declared order, done); the engine calls done(outputs, None)
# or done(None, error) later, from the event loop (aserve.engine.Pool.run). It may return the
# batch's job id, which a Canceller (aserve.engine.Pool.cancel) takes.
Runner = Callable[[str, Sequence[Tensor], Done], Any]


class SharedCount(Protocol):
    """A count several batchers of one model add to, each from its own event loop
    (`_native.Counter`)."""

    def add(self, n: int, /) -> None: ...
    def total(self) -> int: ...

Canceller = Callable[[Any], bool]


_NEVER = math.inf


def queue_full(model: str, queued: int, samples: int, max_queue_size: int, *, waiting: bool = False) -> Overloaded | None:
    """The queue bound: Overloaded when `samples` more would take a queue of `queued` samples
    past max_queue_size, unless it is empty (`waiting`: requests wait in it, whatever their
    samples): an empty queue admits any request."""
    if (waiting or queued > 0) and queued + samples > max_queue_size:
        return Overloaded(f"model {model!r}: {queued} samples are queued (max_queue_size {max_queue_size}); "
                          f"retry later", retry_after=1.0)
    return None


def count_batch(sizes: dict[int, list[float]], samples: int, seconds: float) -> None:
    """One batch of `samples` that ran `seconds`, in a batcher's batch_sizes."""
    counted = sizes.get(samples)
    if counted is None:
        sizes[samples] = [1, seconds]
    else:
        counted[0] += 1
        counted[1] += seconds


class _Batch:
    """A batch in flight: its requests and when it started; `done` is the engine's callback."""

    __slots__ = ("batcher", "context", "job", "requests", "samples", "started", "traced")

    def __init__(self, batcher: Batcher, requests: list[Request], samples: int, started: float,
                 traced: bool = False) -> None:
        self.job: Any = None  # the engine's job id, until it is cancelled
        self.batcher = batcher
        self.requests = requests
        self.samples = samples
        self.started = started
        self.traced = traced  # a request of it is sampled: the engine reports where and when it ran
        self.context: BatchContext | None = None  # then its ids, drawn before it runs

    def done(self, outputs: dict[str, Tensor] | None, error: BaseException | None, ran: Any = None) -> None:
        self.batcher._batch_done(self, outputs, error, ran)


class Batcher:
    """The queue and dispatcher of one model.

    run: hands a batch to the engine (Pool.run); max_batch_size 0 = the model does not
    batch (every request runs alone); interpreters: most batches in flight;
    max_queue_size: most samples waiting before new requests get Overloaded;
    scheduler: the slots of the pool shared with other models (None: not shared);
    uniform: every request has the same per-sample shapes (no variable dimension but
    the batch), so any two may share a batch without comparing shapes.
    clock: what "now" is, in the seconds `loop.call_at` counts (time.monotonic; a
    simulation on a virtual-time loop passes that loop's time);
    join: layer-level joining for a model with stages (ignored when max_batch_size is 0);
    shared: the model's queued samples over every event loop's batcher of it (`--loops`:
    the host's `_native.Counter`), which max_queue_size bounds instead of this one's own;
    waiting: `run` takes waiting=(samples, requests), which the engine counts in `shared`
    while the batch waits for an interpreter (a front's engine: other loops' batches may
    hold the interpreters this batcher sees free).
    """

    def __init__(
        self, *, model: str, run: Runner, policy: BatchPolicy, max_batch_size: int, interpreters: int,
        max_queue_size: int, join: Joining | None = None, scheduler: FairScheduler | None = None,
        uniform: bool = False, clock: Callable[[], float] = monotonic, key: str | None = None,
        cancel: Canceller | None = None, shared: SharedCount | None = None, waiting: bool = False,
    ) -> None:
        if interpreters < 1:
            raise ValueError(f"interpreters must be >= 1, got {interpreters}")
        self.model = model
        self.key = key or model  # the loaded instance in the engine (one version's one load)
        self.policy = policy
        self.max_batch_size = max_batch_size
        self.interpreters = interpreters
        self.max_queue_size = max_queue_size
        self._run_batch = run
        self._uniform = uniform
        self._clock = clock
        # optional admission control: a policy with admit(now, queued_samples, samples, budget, waited)
        # -> Retry-After seconds | None, and arrive(now, samples) for the requests refused ahead (policy.py)
        self._admit: Admit | None = getattr(policy, "admit", None)
        self._arrive: Callable[[float, int], None] | None = getattr(policy, "arrive", None)
        # and refuses(now, queued_samples, samples, budget, waited): admit, counting only a refusal
        self._refuses: Callable[..., float | None] | None = getattr(policy, "refuses", None)
        # admission_rate() -> requests/s it admits while overloaded, which its refusals carry
        self._rate: Callable[[], float] | None = getattr(policy, "admission_rate", None)
        # a policy that sees more of the model than this batcher (every loop's queue and batches)
        # is asked about every request, and decides itself which must wait
        self._asks: bool = getattr(policy, "asks_always", False)
        # the policy's own latency budget, which its refusals name when the request has none
        self._budget: float | None = getattr(policy, "latency_budget_s", None)
        self._queue: collections.deque[Request] = collections.deque()
        self._queued_samples = 0
        self._shared = shared
        self._waiting = waiting
        self._joiner = None if join is None or max_batch_size <= 0 else LayerJoin(
            join, key=self.key, max_batch_size=max_batch_size, uniform=uniform, clock=clock, queue=self._queue,
            drop_withdrawn=self._drop_withdrawn, take=self._take_into_batch, put_back=self._put_back,
        )
        self._running = 0
        self._batches: set[_Batch] = set()  # plain batches in flight (for their deadlines)
        self._tasks: set[asyncio.Task[None]] = set()  # staged batches and failure isolation
        self._wake: asyncio.Handle | None = None  # the policy's timer, armed for _wake_at
        self._wake_at = _NEVER
        self._expiry: asyncio.Handle | None = None  # the deadline timer, armed for _expiry_at
        self._expiry_at = _NEVER
        self._closed = False
        self._drained: asyncio.Future[None] | None = None  # close() waits on it
        self.tracer: Tracer | None = None  # while tracing is on: batches of sampled requests get spans
        self._traced = 0  # sampled requests queued (at least): a batch is searched for them only then
        self._contexts = 0  # likewise, unsampled requests with a caller's context for model code
        self._loop: asyncio.AbstractEventLoop | None = None
        self.batches = 0  # batches dispatched
        self.requests = 0  # requests answered by a batch
        self.refused = 0  # requests refused (Overloaded)
        self.timed_out = 0  # requests whose deadline passed
        self.queue_seconds = 0.0  # summed over requests: from arrival to dispatch (or offer)
        self.compute_seconds = 0.0  # summed over requests: their batch's run time
        self.batch_sizes: dict[int, list[float]] = {}  # samples -> [batches that ran, their seconds summed]
        self._cancel = cancel  # cancels a running batch whose requests all timed out (Pool.cancel)
        self.cancelled = 0  # batches cancelled (their requests had all timed out)
        self.last_dispatch: float | None = None  # clock time of the last batch dispatched
        self._seat: Seat | None = None if scheduler is None else scheduler.join(self, interpreters=interpreters)

    # ---- state ----

    @property
    def queued(self) -> int:
        """Samples waiting."""
        return self._queued_samples

    def _count(self, samples: int) -> None:
        """Samples joined (> 0) or left (< 0) the queue."""
        self._queued_samples += samples
        if self._shared is not None:
            self._shared.add(samples)

    @property
    def running(self) -> int:
        """Batches in flight."""
        return self._running

    def stats(self) -> dict[str, object]:
        """Counters and policy state for metrics and model metadata (JSON-ready)."""
        out: dict[str, object] = {
            "queued_samples": self._queued_samples,
            "queued_requests": len(self._queue),
            "running_batches": self._running,
            "batches": self.batches,
            "requests": self.requests,
            "refused": self.refused,
            "timed_out": self.timed_out,
            "queue_seconds": self.queue_seconds,
            "compute_seconds": self.compute_seconds,
            "cancelled": self.cancelled,
        }
        if self._joiner is not None:
            out.update(self._joiner.stats())
        state = getattr(self.policy, "as_dict", None)
        if state is not None:
            out["policy"] = state(self._clock())
        return out

    # ---- requests ----

    def submit(
        self, inputs: Sequence[Tensor], samples: int, /, *, deadline: float | None = None,
        budget: float | None = None, trace: RequestTrace | None = None, waited: float = 0.0,
        context: str | None = None, held: bool = False,
    ) -> asyncio.Future[dict[str, Tensor]]:
        """Queue one request; the future resolves to its outputs (split from its batch's outputs).

        inputs: the model's inputs in declared order, each `samples` rows long when the
        model batches (the codec derived `samples` from them and checked it against
        max_batch_size: aserve.protocol decides that, once per request);
        deadline: the clock time after which the request fails with RequestTimeout;
        budget: this request's latency budget in seconds (None: the policy's own);
        trace: the request's RequestTrace when it is sampled (its queue span and its
        batch's spans are recorded);
        context: when it is not sampled, the caller's W3C context model code runs in
        (`tracing.batches.untraced_context`);
        waited: seconds the request already spent in the server (reading, decoding, behind
        other requests on the event loop): its budget counts them;
        held: part of that wait was a hold of its connection after a refusal (the request
        waited it out unread): admission judges it even where it would run at once.

        Raises Overloaded (the queue is full, or the policy's admission control refuses it:
        `_admission`), RequestTimeout (deadline already passed) and EngineError (closing).
        The future fails with RequestTimeout (deadline passed) or ModelError (the model
        raised on it).
        Cancelling the future withdraws the request if it has not run yet."""
        if self._closed:
            raise EngineError(f"model {self.model!r} is shutting down")
        assert self.max_batch_size <= 0 or samples <= self.max_batch_size, (samples, self.max_batch_size)
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        now = self._clock()
        waited = max(0.0, waited)
        refused = self._admission(now, samples, budget, waited, held=held)
        if refused is not None:
            self.refused += 1
            raise refused
        queue = self._queue
        if deadline is not None:
            if deadline <= now:
                raise RequestTimeout(f"model {self.model!r}: the request's deadline passed before it was queued")
            if deadline < self._expiry_at:
                self._arm_expiry(loop, deadline)
        future: asyncio.Future[dict[str, Tensor]] = loop.create_future()
        queue.append(Request(now, samples, deadline, inputs, future, budget, trace, waited, context))
        if trace is not None:
            self._traced += 1
        elif context is not None:
            self._contexts += 1
        self._queued_samples += samples  # `_count`, inline on the hot path
        if self._shared is not None:
            self._shared.add(samples)
        self._schedule()
        return future

    def refuse_ahead(self, *, budget: float | None = None, waited: float = 0.0) -> None:
        """Raise Overloaded, counted as `submit` counts its refusals, when `submit` would refuse
        every request now: asked from a request's head, before its body is read, so with the
        least it may hold (one sample) and `budget`, the loosest latency budget it may carry
        (None: the policy's own). `submit` still decides with the request itself; a closing
        batcher is left to it too."""
        if self._closed:
            return
        now = self._clock()
        refused = self._admission(now, 1, budget, max(0.0, waited), ahead=True)
        if refused is not None:
            if self._arrive is not None:
                self._arrive(now, 1)  # its arrival counts in the policy's rate, as in submit
            self.refused += 1
            raise refused

    def refuse_again(self, samples: int, /, *, budget: float | None = None, waited: float = 0.0,
                     held: bool = False) -> Overloaded | None:
        """`submit`'s admission alone, for a request it refused before, byte for byte again
        (a client that does not wait as told): the Overloaded `submit` would raise, counted as
        `submit` counts a refusal (the policy's arrival included where the policy was asked),
        or None where `submit` would admit it, with nothing counted (the caller then submits
        it). Spares a refusal the decoding and the queueing."""
        if self._closed:
            return None
        now = self._clock()
        waited = max(0.0, waited)
        asked = self._admit is not None and (self._queue or held or self._running >= self.interpreters or self._asks)
        refuses = self._refuses
        counted = False  # the policy counted the arrival itself
        refused = None
        if asked:
            if refuses is not None:  # counts the arrival of what it refuses, and nothing else
                refused = self._policy_refusal(refuses(now, self._queued_samples, samples, budget, waited), budget,
                                               held)
                counted = refused is not None
            else:
                refused = self._policy_refusal(self._admit(now, self._queued_samples, samples, budget,  # type: ignore[misc]
                                                           waited, count=False), budget, held)
        if refused is None:
            refused = self._queue_refusal(samples)
        if refused is not None:
            if asked and not counted and self._arrive is not None:
                self._arrive(now, samples)  # the policy was asked: its arrival counts, as in submit
            self.refused += 1
        return refused

    def _admission(self, now: float, samples: int, budget: float | None, waited: float, *,
                   ahead: bool = False, held: bool = False) -> Overloaded | None:
        """The admission rule (None: admitted). A request that must wait (others queued, or
        every interpreter busy), or that waited out a hold of its connection (`held`), is
        refused when the policy's admission control says so; one that would take the queue
        past max_queue_size, always. `ahead`: asked before the request is known
        (`refuse_ahead`), so the policy counts nothing."""
        admit = self._admit
        if admit is not None and (self._queue or held or self._running >= self.interpreters or self._asks):
            if ahead:
                wait = admit(now, self._queued_samples, samples, budget, waited, count=False)
            else:
                wait = admit(now, self._queued_samples, samples, budget, waited)
            if wait is not None:
                return self._policy_refusal(wait, budget, held)
        shared = self._shared  # `_queue_refusal`, inline on the hot path
        queued = self._queued_samples if shared is None else shared.total()
        return queue_full(self.model, queued, samples, self.max_queue_size, waiting=bool(self._queue))

    def _policy_refusal(self, wait: float | None, budget: float | None, held: bool) -> Overloaded | None:
        """The refusal of the policy's admission control, whose Retry-After is `wait` (None: none)."""
        if wait is None:
            return None
        return Overloaded(
            f"model {self.model!r} cannot answer the request within its latency budget "
            f"({self._queued_samples} samples queued, {self._running} of {self.interpreters} interpreters busy"
            f"{', after a hold of its connection' if held else ''}); retry in {wait:.2f} s",
            retry_after=wait, budget=budget if budget is not None else self._budget,
            rate=None if self._rate is None else self._rate(),
        )

    def _queue_refusal(self, samples: int) -> Overloaded | None:
        """The queue bound's refusal of `samples` more, over every loop's queue of the model."""
        shared = self._shared
        queued = self._queued_samples if shared is None else shared.total()
        return queue_full(self.model, queued, samples, self.max_queue_size, waiting=bool(self._queue))

    def withdraw(self, future: asyncio.Future[dict[str, Tensor]]) -> None:
        """The caller stopped waiting for `future`: free its place if it has not run yet."""
        for r in self._queue:
            if r.future is future:
                if r.state == QUEUED:
                    self._queue.remove(r)
                    self._count(-r.samples)
                    r.finish(error=asyncio.CancelledError())
                    self._check_drained()
                    self._schedule()
                return

    # ---- deadlines ----

    def _arm_expiry(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
        self._expiry_at = when
        self._expiry = loop.call_at(when, self._expire)

    def _expire(self) -> None:
        """The earliest deadline came: fail every request past its deadline, re-arm for the next."""
        self._expiry = None
        self._expiry_at = _NEVER
        loop = self._loop
        assert loop is not None
        now = self._clock()
        nearest = _NEVER
        queue = self._queue
        if queue:
            expired = [r for r in queue if r.deadline is not None and r.deadline <= now]
            if expired:
                gone = set(map(id, expired))
                kept = [r for r in queue if id(r) not in gone]
                queue.clear()
                queue.extend(kept)
                for r in expired:
                    self._count(-r.samples)
                    if not r.future.done():
                        self.timed_out += 1
                    r.finish(error=RequestTimeout(
                        f"model {self.model!r}: request timed out after waiting "
                        f"{(now - r.arrival) * 1000:.1f} ms in the queue"
                    ))
            for r in queue:
                if r.deadline is not None and r.deadline < nearest:
                    nearest = r.deadline
        running = [r for b in self._batches for r in b.requests]
        if self._joiner is not None:
            running.extend(self._joiner.in_flight())
        for r in running:
            if r.deadline is None or r.future.done():
                continue
            if r.deadline <= now:
                self.timed_out += 1
                r.future.set_exception(RequestTimeout(
                    f"model {self.model!r}: request timed out after {(now - r.arrival) * 1000:.1f} ms; "
                    f"its batch is still running"
                ))
            elif r.deadline < nearest:
                nearest = r.deadline
        if nearest < _NEVER:
            self._arm_expiry(loop, nearest)
        if self._cancel is not None:
            self._cancel_abandoned()
        self._check_drained()
        self._schedule()

    def _cancel_abandoned(self) -> None:
        """Cancel the running batches nobody waits for any more (every request timed out or
        went away): the interpreter stops the model and comes back for the next batch."""
        assert self._cancel is not None
        for b in self._batches:
            if b.job is not None and all(r.future.done() for r in b.requests):
                job, b.job = b.job, None
                self.cancelled += self._cancel(job)
        if self._joiner is not None:
            for run in self._joiner.abandoned():
                self.cancelled += self._cancel(run)

    # ---- scheduling ----

    def _on_wake(self) -> None:
        self._wake = None
        self._wake_at = _NEVER
        self._schedule()

    def offer_slot(self) -> bool:
        """The shared scheduler offers a free slot: start one batch if the policy wants to."""
        seat = self._seat
        if not self._queue or self._running >= self.interpreters or seat is None or seat.room() <= 0:
            return False
        return self._schedule(once=True)

    def _schedule(self, *, once: bool = False) -> bool:
        """Dispatch what the policy says while interpreters are free (one batch if `once`);
        True if a batch started."""
        queue = self._queue
        seat = self._seat
        started = False
        while queue:
            idle = self.interpreters - self._running
            if seat is not None and idle > 0:
                idle = min(idle, seat.room())
            if idle <= 0:
                if self._joiner is not None:
                    self._joiner.offer()
                return started  # a completion calls back (with a scheduler: offers a slot)
            loop = self._loop
            assert loop is not None
            decision = self.policy.decide(
                self._clock(), queue, idle=idle, running=self._running, max_batch_size=self.max_batch_size,
                queued=self._queued_samples,
            )
            if decision.take <= 0:
                wake_at = decision.wake_at
                if wake_at is not None and wake_at != self._wake_at:
                    if self._wake is not None:
                        self._wake.cancel()
                    self._wake_at = wake_at
                    self._wake = loop.call_at(wake_at, self._on_wake)
                return started
            batch = self._take(decision.take)
            if batch:
                self._dispatch(batch)
                started = True
                if once:
                    return True
        return started

    def _take(self, n: int) -> list[Request]:
        """Up to n requests from the head that fit one batch; withdrawn ones are dropped."""
        queue = self._queue
        batch: list[Request] = []
        total = 0
        limit = self.max_batch_size
        uniform = self._uniform
        while len(batch) < n and queue:
            nxt = queue[0]
            if nxt.future.done():  # withdrawn (cancelled) while queued
                queue.popleft()
                self._count(-nxt.samples)
                nxt.state = DONE
                continue
            if batch and (limit <= 0 or total + nxt.samples > limit
                          or not (uniform or same_sample_shapes(batch[0].inputs, nxt.inputs))):
                break
            batch.append(queue.popleft())
            total += nxt.samples
        self._queued_samples -= total  # `_count`, inline on the hot path
        if self._shared is not None:
            self._shared.add(-total)
        return batch

    # the queue's part in layer-level joining (joining.LayerJoin reads the queue, moves requests through these)

    def _drop_withdrawn(self) -> None:
        """Drop the requests withdrawn (cancelled) while queued from the head of the queue."""
        queue = self._queue
        while queue and queue[0].future.done():
            dropped = queue.popleft()
            dropped.state = DONE
            self._count(-dropped.samples)

    def _take_into_batch(self, n: int, now: float) -> list[Request]:
        """The first n queued requests, offered to a running batch at `now`."""
        queue = self._queue
        group = [queue.popleft() for _ in range(n)]
        self._count(-sum(r.samples for r in group))
        for r in group:
            r.state = RUNNING
            self.queue_seconds += now - r.arrival
        return group

    def _put_back(self, group: list[Request], offered: float) -> None:
        """An offer made at `offered` was turned away: its requests that still wait go back
        to the head of the queue, in order, and are dispatched again."""
        for r in reversed(group):
            if r.state == RUNNING and not r.future.done():  # not timed out or cancelled meanwhile
                r.state = QUEUED
                self.queue_seconds -= offered - r.arrival  # counted again at its dispatch
                self._queue.appendleft(r)
                self._count(r.samples)
        self._check_drained()
        self._schedule()

    def _dispatch(self, batch: list[Request]) -> None:
        loop = self._loop
        assert loop is not None
        now = self._clock()
        for r in batch:
            r.state = RUNNING
            self.queue_seconds += now - r.arrival
        if self._seat is not None:
            self._seat.take()
        self._running += 1
        self.batches += 1
        self.last_dispatch = now
        if not self._queue and self._wake is not None:
            self._wake.cancel()
            self._wake = None
            self._wake_at = _NEVER
        if self._joiner is not None and self._joiner.active:
            self._spawn(self._run_staged(batch, self._joiner))
            return
        if len(batch) == 1:
            samples = batch[0].samples
            inputs: Sequence[Tensor] = batch[0].inputs
        else:
            samples = sum(r.samples for r in batch)
            inputs = concat_inputs([r.inputs for r in batch], samples)
        run = _Batch(self, batch, samples, now)
        self._batches.add(run)
        run_batch = self._run_batch
        if self._waiting:
            run_batch = functools.partial(run_batch, waiting=(samples, len(batch)))  # type: ignore[call-arg]
        try:
            if self._traced and self._is_traced(batch):
                assert self.tracer is not None
                run.traced = True
                run.context = batch_context(self.tracer, batch)
                run.job = run_batch(self.key, inputs, run.done, trace=run.context.header)  # type: ignore[call-arg]
            elif self._contexts and (context := self._untraced_context(batch)) is not None:
                run.job = run_batch(self.key, inputs, run.done, context=context)  # type: ignore[call-arg]
            else:
                run.job = run_batch(self.key, inputs, run.done)
        except Exception as e:  # noqa: BLE001 - the engine refused the batch: answer it from the loop
            loop.call_soon(run.done, None, e)

    def _is_traced(self, batch: list[Request]) -> bool:
        """Whether a sampled request is in the batch (counted off the queued ones)."""
        n = sum(r.trace is not None for r in batch)
        self._traced = max(0, self._traced - n)
        return n > 0 and self.tracer is not None

    def _untraced_context(self, batch: list[Request]) -> str | None:
        """The callers' context of an untraced batch, if its requests share one (counted off
        the queued ones)."""
        self._contexts = max(0, self._contexts - sum(r.context is not None for r in batch))
        return batch_untraced_context(batch)

    def _spawn(self, coro: Any) -> None:
        assert self._loop is not None
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _batch_done(self, run: _Batch, outputs: dict[str, Tensor] | None, error: BaseException | None,
                    ran: Any = None) -> None:
        """The engine's callback for a plain batch: answer its requests, free its slot."""
        self._batches.discard(run)
        loop = self._loop
        assert loop is not None
        requests = run.requests
        elapsed = self._clock() - run.started
        if run.traced and self.tracer is not None:
            trace_batch(self.tracer, self.model, run.requests, run.samples, run.started, ran, error, context=run.context)
        self.compute_seconds += elapsed * len(requests)
        count_batch(self.batch_sizes, run.samples, elapsed)
        isolating = False
        try:
            if outputs is not None:
                self.policy.observe(run.samples, elapsed)
                self._deliver(requests, outputs)
            elif isinstance(error, ModelError) and len(requests) > 1:
                # find the culprit: run each request alone in this slot, so only it fails
                self._spawn(self._isolate(requests))
                isolating = True
            else:
                for r in requests:
                    r.finish(error=error)
        except Exception as e:
            for r in requests:  # whatever went wrong, no request of the batch is left waiting
                r.finish(error=e)
            raise
        finally:
            if not isolating:
                self._release()

    def _release(self) -> None:
        """A batch ended: free its slot and dispatch what is waiting."""
        self._running -= 1
        self._check_drained()
        if self._seat is None:
            self._schedule()
        else:
            self._seat.release()  # offers the slot round-robin, this model included
            if self._queue and self._joiner is not None and self._joiner.running:
                self._schedule()  # no slot came back to it: its running batches may take joins

    def _run_one(self, inputs: Sequence[Tensor]) -> asyncio.Future[dict[str, Tensor]]:
        assert self._loop is not None
        fut: asyncio.Future[dict[str, Tensor]] = self._loop.create_future()

        def done(outputs: dict[str, Tensor] | None, error: BaseException | None) -> None:
            if fut.done():
                return
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(outputs)  # type: ignore[arg-type]

        try:
            self._run_batch(self.key, inputs, done)
        except Exception as e:  # noqa: BLE001 - answered through the future
            fut.set_exception(e)
        return fut

    async def _isolate(self, requests: list[Request]) -> None:
        """Run each request of a failed batch alone, in the batch's slot."""
        try:
            for r in requests:
                if not r.future.done():
                    await self._run_alone(r)
        finally:
            self._release()

    async def _run_alone(self, req: Request) -> None:
        assert self._loop is not None
        started = self._clock()
        try:
            outputs = await self._run_one(req.inputs)
        except Exception as e:  # noqa: BLE001 - the request's own failure
            req.finish(error=e)
            return
        self.policy.observe(req.samples, self._clock() - started)
        self._deliver([req], outputs)

    def _deliver(self, requests: list[Request], outputs: Mapping[str, Tensor]) -> None:
        """Answer each request of a batch with its slice of the outputs (all fail if they do not split)."""
        if len(requests) == 1:
            r = requests[0]
            if self.max_batch_size > 0:
                for name, t in outputs.items():
                    if not t.shape or t.shape[0] != r.samples:
                        r.finish(error=wrong_rows(self.model, name, t.shape, r.samples))
                        return
            r.finish(outputs if isinstance(outputs, dict) else dict(outputs))
            self.requests += 1
            return
        try:
            parts = split_outputs(outputs, [r.samples for r in requests], self.model)
        except ModelError as e:
            for r in requests:
                r.finish(error=e)
            return
        for r, part in zip(requests, parts):
            r.finish(part)
        self.requests += len(requests)

    def _check_drained(self) -> None:
        drained = self._drained
        if drained is not None and not self._queue and self._running == 0 and not drained.done():
            drained.set_result(None)

    # ---- a staged batch (layer-level joining) ----

    async def _run_staged(self, batch: list[Request], joiner: LayerJoin) -> None:
        try:
            await self._run_staged_batch(batch, joiner)
        finally:
            self._release()

    async def _run_staged_batch(self, batch: list[Request], joiner: LayerJoin) -> None:
        """Run a batch stage by stage; answer its requests and those of the groups that joined it."""
        total = sum(r.samples for r in batch)
        inputs = batch[0].inputs if len(batch) == 1 else concat_inputs([r.inputs for r in batch], total)
        started = self._clock()
        try:
            staged = joiner.start(batch, inputs, total)
        except Exception as e:  # noqa: BLE001 - the engine refused the batch
            for r in batch:
                r.finish(error=e)
            return
        traced = self._traced > 0 and self._is_traced(batch)
        try:
            outputs, seconds = await joiner.result(staged)
        except Exception as e:  # noqa: BLE001 - every request of the batch gets an answer
            everyone = staged.everyone()
            self.compute_seconds += (self._clock() - started) * len(everyone)
            if isinstance(e, ModelError) and len(everyone) > 1:
                for r in everyone:  # find the culprit: each alone, so only it fails
                    if not r.future.done():
                        await self._run_alone(r)
                return
            for r in everyone:
                r.finish(error=e)
            return
        finally:
            joiner.end(staged)
        requests = staged.everyone()
        joined = len(requests) - len(batch)
        if self.tracer is not None and (traced or any(r.trace is not None for r in requests)):
            trace_batch(self.tracer, self.model, requests, sum(r.samples for r in requests), started, None, None,
                        stages=seconds, joined=joined)
        elapsed = self._clock() - started
        self.compute_seconds += elapsed * len(requests)
        count_batch(self.batch_sizes, sum(r.samples for r in requests), elapsed)
        if not joined:  # a batch that ran as it was dispatched teaches the curve
            self.policy.observe(total, self._clock() - started)
        del inputs
        self._deliver(requests, outputs)

    # ---- lifecycle ----

    async def close(self, *, timeout: float | None = None) -> None:
        """Refuse new requests and wait (up to `timeout` s) until every accepted one is answered."""
        self._closed = True
        loop = asyncio.get_running_loop()
        self._loop = self._loop or loop
        if self._queue or self._running:
            self._drained = loop.create_future()
            self._check_drained()
            try:
                await asyncio.wait_for(asyncio.shield(self._drained), timeout)
            except TimeoutError:
                for r in list(self._queue):
                    r.finish(error=EngineError(f"model {self.model!r} shut down before the request ran"))
                self._queue.clear()
                self._queued_samples = 0
        for handle in (self._wake, self._expiry):
            if handle is not None:
                handle.cancel()
        self._wake = self._expiry = None
        self._wake_at = self._expiry_at = _NEVER
        if self._seat is not None:
            self._seat.leave()
