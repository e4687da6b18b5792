"""One model's micro-batcher: queue requests, dispatch batches as its policy says, split results back.

Requests wait in a FIFO queue with their input tensors. Whenever something changes
(an arrival, a completion, a timer the policy asked for) the batcher asks the policy
how many requests to dispatch; it concatenates their inputs along the batch
dimension with one copy per input, runs the batch on the pool, and hands each
request zero-copy slices of the outputs. At most `interpreters` batches of the model
run at once. With a `scheduler` (fair.py: the interpreters of a pool shared by
several models), a batch also needs one of the pool's slots, which go round-robin to
the models with work as batches end; without one, only the model's own limit counts.

If a batch of several requests fails with a model error, each of its requests is
run again alone (in the same interpreter slot), so that only the request that makes
the model fail gets the error.

With `join` (a staged model, layer-level joining, see join.py) every batch runs
staged, and while no interpreter is free the head of the queue is offered to a
running batch whenever the planner predicts the joined batch still meets every
budget. A group the engine turns away (the batch moved past the offer's last
stage) returns to the head of the queue.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import math
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, NamedTuple, Protocol

from ..errors import EngineError, InvalidInput, ModelError, Overloaded, RequestTimeout
from ..runtime.datatypes import element_count
from ..tensor import Tensor
from .fair import FairScheduler, Seat
from .join import JoinPlanner, tightest
from .policy import BatchPolicy

Runner = Callable[[str, Mapping[str, Tensor]], Awaitable[dict[str, Tensor]]]


class StagedPool(Protocol):
    """What joining needs of the engine (aserve.engine.Pool has it)."""

    def infer_staged(self, model: str, inputs: Mapping[str, Tensor], /) -> Any: ...

    def offer(self, run: Any, inputs: Mapping[str, Tensor], last_stage: int, /) -> asyncio.Future[bool] | None: ...

    def progress(self, run: Any, /) -> tuple[int, float] | None: ...


class Joining(NamedTuple):
    """Layer-level joining for one model: the engine, the planner, the default budget (s),
    and whether a join must also lower total latency (benefit) or only fit the budgets."""

    pool: StagedPool
    planner: JoinPlanner
    budget: float
    benefit: bool = True

_QUEUED, _RUNNING, _DONE = 0, 1, 2


class _Request:
    """A queued request; `arrival`, `samples`, `deadline` and `budget` are what the policy sees."""

    __slots__ = ("arrival", "budget", "deadline", "future", "inputs", "samples", "state", "timer")

    def __init__(self, arrival: float, samples: int, deadline: float | None,
                 inputs: Mapping[str, Tensor], future: asyncio.Future[dict[str, Tensor]],
                 budget: float | None = None) -> None:
        self.arrival = arrival
        self.samples = samples
        self.deadline = deadline
        self.budget = budget
        self.inputs = inputs
        self.future = future
        self.timer: asyncio.TimerHandle | None = None
        self.state = _QUEUED

    def finish(self, result: dict[str, Tensor] | None = None, error: BaseException | None = None) -> None:
        self.state = _DONE
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.future.done():
            return
        if error is not None:
            self.future.set_exception(error)
        else:
            assert result is not None
            self.future.set_result(result)


def _compatible(head: Mapping[str, Tensor], other: Mapping[str, Tensor]) -> bool:
    """Whether two requests' inputs can share a batch: same names, datatypes and per-sample shapes."""
    if head.keys() != other.keys():
        return False
    for name, t in head.items():
        o = other[name]
        if o.datatype != t.datatype or o.shape[1:] != t.shape[1:]:
            return False
    return True


def concat_inputs(requests: list[Mapping[str, Tensor]], samples: int) -> dict[str, Tensor]:
    """Each input of `requests` concatenated along the batch dimension: one copy into a fresh bytearray.

    BYTES inputs concatenate the same way: their length-prefixed layout has no header."""
    out: dict[str, Tensor] = {}
    for name, first in requests[0].items():
        views = [r[name].view() for r in requests]
        buf = bytearray(sum(v.nbytes for v in views))
        mv = memoryview(buf)
        offset = 0
        for v in views:
            end = offset + v.nbytes
            mv[offset:end] = v
            offset = end
        out[name] = Tensor(first.datatype, (samples, *first.shape[1:]), buf)
    return out


def _bytes_boundaries(view: memoryview, elements: int, per_sample: int, model: str, name: str) -> list[int]:
    """Byte offsets of each sample's start in a BYTES buffer, found by walking the length prefixes."""
    bounds = [0]
    pos, end = 0, len(view)
    for i in range(elements):
        if pos + 4 > end:
            raise ModelError(f"model {model!r}: BYTES output {name!r} ends inside element {i}'s length prefix")
        pos += 4 + int.from_bytes(view[pos:pos + 4], "little")
        if pos > end:
            raise ModelError(f"model {model!r}: BYTES output {name!r}: element {i} runs past the buffer")
        if (i + 1) % per_sample == 0:
            bounds.append(pos)
    return bounds


def split_outputs(outputs: Mapping[str, Tensor], samples: list[int], model: str) -> list[dict[str, Tensor]]:
    """Per-request outputs: zero-copy slices of each output along the batch dimension."""
    total = sum(samples)
    results: list[dict[str, Tensor]] = [{} for _ in samples]
    for name, t in outputs.items():
        if not t.shape or t.shape[0] != total:
            raise ModelError(
                f"model {model!r}: output {name!r} has shape {list(t.shape)}, but the batch holds {total} "
                f"samples: its first dimension must be {total}"
            )
        view = t.view()
        rest = t.shape[1:]
        if t.datatype == "BYTES":
            per = element_count(rest)
            if per == 0:
                starts = [0] * (len(samples) + 1)
            else:
                bounds = _bytes_boundaries(view, total * per, per, model, name)
                starts = [0]
                k = 0
                for s in samples:
                    k += s
                    starts.append(bounds[k])
        else:
            stride = view.nbytes // total if total else 0
            starts = [0]
            for s in samples:
                starts.append(starts[-1] + s * stride)
        for i, s in enumerate(samples):
            results[i][name] = Tensor(t.datatype, (s, *rest), view[starts[i]:starts[i + 1]])
    return results


class _Staged:
    """A staged batch in flight: its requests, then the groups offered to it, in order."""

    __slots__ = ("groups", "limit", "requests", "run", "samples")

    def __init__(self, run: Any, requests: list[_Request], samples: int, limit: float) -> None:
        self.run = run
        self.requests = requests
        self.samples = samples  # with the groups offered and not turned away
        self.limit = limit  # earliest finish limit among its requests and groups
        self.groups: list[tuple[asyncio.Future[bool], list[_Request]]] = []


class Batcher:
    """The queue and dispatcher of one model.

    run: the coroutine that runs a batch (pool.infer); max_batch_size 0 = the model
    does not batch (every request runs alone); interpreters: most batches in flight;
    max_queue_size: most samples waiting before new requests get Overloaded;
    scheduler: the slots of the pool shared with other models (None: not shared).
    """

    def __init__(
        self, *, model: str, run: Runner, policy: BatchPolicy, max_batch_size: int, interpreters: int,
        max_queue_size: int, join: Joining | None = None, scheduler: FairScheduler | None = None,
    ) -> None:
        if interpreters < 1:
            raise ValueError(f"interpreters must be >= 1, got {interpreters}")
        self.model = model
        self.policy = policy
        self.max_batch_size = max_batch_size
        self.interpreters = interpreters
        self.max_queue_size = max_queue_size
        self._run_batch = run
        self._join = join if max_batch_size > 0 else None
        self._staged: list[_Staged] = []
        # optional admission control: a policy with admit(now, queued_samples) -> Retry-After seconds | None
        self._admit: Callable[[float, int], float | None] | None = getattr(policy, "admit", None)
        self._queue: collections.deque[_Request] = collections.deque()
        self._queued_samples = 0
        self._running = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False
        self._idle = asyncio.Event()
        self._idle.set()
        self.batches = 0  # batches dispatched
        self.requests = 0  # requests answered by a batch
        self.refused = 0  # requests refused (Overloaded)
        self.timed_out = 0  # requests whose deadline passed
        self.queue_seconds = 0.0  # summed over requests: from arrival to dispatch (or offer)
        self.compute_seconds = 0.0  # summed over requests: their batch's run time
        self.joins = 0  # groups absorbed into running batches
        self.joined_requests = 0
        self.offers_turned_away = 0
        self._seat: Seat | None = None if scheduler is None else scheduler.join(self, interpreters=interpreters)

    # ---- state ----

    @property
    def queued(self) -> int:
        """Samples waiting."""
        return self._queued_samples

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
        }
        if self._join is not None:
            out["joins"] = self.joins
            out["joined_requests"] = self.joined_requests
            out["offers_turned_away"] = self.offers_turned_away
            out["join"] = self._join.planner.as_dict()
        state = getattr(self.policy, "as_dict", None)
        if state is not None:
            out["policy"] = state(asyncio.get_running_loop().time())
        return out

    # ---- requests ----

    async def submit(
        self, inputs: Mapping[str, Tensor], samples: int, /, *, deadline: float | None = None,
        budget: float | None = None,
    ) -> dict[str, Tensor]:
        """Queue one request and wait for its outputs (split from its batch's outputs).

        deadline: loop.time() after which the request fails with RequestTimeout;
        budget: this request's latency budget in seconds (None: the policy's own).

        Raises InvalidInput (over max_batch_size), Overloaded (queue full),
        RequestTimeout (deadline passed), ModelError (the model raised on it)."""
        if self._closed:
            raise EngineError(f"model {self.model!r} is shutting down")
        if self.max_batch_size > 0 and samples > self.max_batch_size:
            raise InvalidInput(
                f"model {self.model!r}: the request holds {samples} samples, max_batch_size is {self.max_batch_size}"
            )
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self._admit is not None and self._queue:
            wait = self._admit(now, self._queued_samples)
            if wait is not None:
                self.refused += 1
                raise Overloaded(
                    f"model {self.model!r}: {self._queued_samples} samples are queued, more than it can answer "
                    f"within its latency budget; retry in {wait:.2f} s",
                    retry_after=wait,
                )
        if self._queue and self._queued_samples + samples > self.max_queue_size:
            self.refused += 1
            raise Overloaded(
                f"model {self.model!r}: {self._queued_samples} samples are queued (max_queue_size "
                f"{self.max_queue_size}); retry later",
                retry_after=1.0,
            )
        if deadline is not None and deadline <= now:
            raise RequestTimeout(f"model {self.model!r}: the request's deadline passed before it was queued")
        req = _Request(now, samples, deadline, inputs, loop.create_future(), budget)
        if deadline is not None:
            req.timer = loop.call_at(deadline, self._expire, req)
        self._queue.append(req)
        self._queued_samples += samples
        self._idle.clear()
        self._schedule()
        try:
            return await req.future
        except asyncio.CancelledError:
            if req.state == _QUEUED:  # the caller went away before dispatch: free its place
                self._remove(req)
                req.finish(error=asyncio.CancelledError())
                self._schedule()
            raise

    def _remove(self, req: _Request) -> None:
        self._queue.remove(req)
        self._queued_samples -= req.samples
        self._check_idle()

    def _expire(self, req: _Request) -> None:
        req.timer = None
        now = asyncio.get_running_loop().time()
        waited = (now - req.arrival) * 1000
        if req.state != _DONE:
            self.timed_out += 1
        if req.state == _QUEUED:
            self._remove(req)
            req.finish(error=RequestTimeout(
                f"model {self.model!r}: request timed out after waiting {waited:.1f} ms in the queue"
            ))
            self._schedule()
        elif req.state == _RUNNING:
            req.finish(error=RequestTimeout(
                f"model {self.model!r}: request timed out after {waited:.1f} ms; its batch is still running"
            ))

    # ---- scheduling ----

    def _on_timer(self) -> None:
        self._timer = None
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
                self._offer_joins()
                return started  # a completion calls back (with a scheduler: offers a slot)
            loop = asyncio.get_running_loop()
            decision = self.policy.decide(
                loop.time(), queue, idle=idle, running=self._running, max_batch_size=self.max_batch_size
            )
            if decision.take <= 0:
                if decision.wake_at is not None:
                    if self._timer is not None and self._timer.when() != decision.wake_at:
                        self._timer.cancel()
                        self._timer = None
                    if self._timer is None:
                        self._timer = loop.call_at(decision.wake_at, self._on_timer)
                return started
            self._dispatch(self._take(decision.take))
            started = True
            if once:
                return True
        return started

    def _take(self, n: int) -> list[_Request]:
        queue = self._queue
        head = queue.popleft()
        batch = [head]
        total = head.samples
        limit = self.max_batch_size
        while len(batch) < n and queue:
            nxt = queue[0]
            if limit <= 0 or total + nxt.samples > limit or not _compatible(head.inputs, nxt.inputs):
                break
            batch.append(queue.popleft())
            total += nxt.samples
        self._queued_samples -= total
        return batch

    def _dispatch(self, batch: list[_Request]) -> None:
        now = asyncio.get_running_loop().time()
        for r in batch:
            r.state = _RUNNING
            self.queue_seconds += now - r.arrival
        if self._seat is not None:
            self._seat.take()
        self._running += 1
        self.batches += 1
        if self._timer is not None and not self._queue:
            self._timer.cancel()
            self._timer = None
        task = asyncio.get_running_loop().create_task(self._run(batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, batch: list[_Request]) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            if self._join is not None:
                await self._run_staged(batch, self._join, loop)
                return
            if len(batch) == 1:
                await self._run_alone(batch[0], loop)
                return
            samples = [r.samples for r in batch]
            total = sum(samples)
            inputs = concat_inputs([r.inputs for r in batch], total)
            started = loop.time()
            try:
                outputs = await self._run_batch(self.model, inputs)
            except ModelError:
                # find the culprit: run each request alone, so only it fails
                for r in batch:
                    if not r.future.done():
                        await self._run_alone(r, loop)
                return
            except BaseException as e:
                self._fail(batch, e)
                if not isinstance(e, Exception):
                    raise
                return
            self.policy.observe(total, loop.time() - started)
            del inputs
            self._deliver(batch, outputs)
        finally:
            self.compute_seconds += (loop.time() - started) * len(batch)
            self._running -= 1
            self._check_idle()
            if self._seat is None:
                self._schedule()
            else:
                self._seat.release()  # offers the slot round-robin, this model included
                if self._queue and self._staged:
                    self._schedule()  # no slot came back to it: its running batches may take joins

    # ---- layer-level joining ----

    def _limit(self, req: _Request, join: Joining) -> float:
        return tightest(req.arrival, req.budget if req.budget is not None else join.budget, req.deadline)

    async def _run_staged(self, batch: list[_Request], join: Joining, loop: asyncio.AbstractEventLoop) -> None:
        total = sum(r.samples for r in batch)
        inputs = batch[0].inputs if len(batch) == 1 else concat_inputs([r.inputs for r in batch], total)
        started = loop.time()
        try:
            run = join.pool.infer_staged(self.model, inputs)
        except BaseException as e:
            self._fail(batch, e)
            if not isinstance(e, Exception):
                raise
            return
        staged = _Staged(run, batch, total, min(self._limit(r, join) for r in batch))
        self._staged.append(staged)
        try:
            outputs, seconds = await run.result
        except BaseException as e:
            everyone = batch + [r for _, group in self._absorbed(staged) for r in group]
            if isinstance(e, ModelError) and len(everyone) > 1:
                for r in everyone:  # find the culprit: each alone, so only it fails
                    if not r.future.done():
                        await self._run_alone(r, loop)
                return
            self._fail(everyone, e)
            if not isinstance(e, Exception):
                raise
            return
        finally:
            self._staged.remove(staged)
        absorbed = self._absorbed(staged)
        requests = batch + [r for _, group in absorbed for r in group]
        self.compute_seconds += (loop.time() - started) * (len(requests) - len(batch))  # joiners, roughly
        if absorbed:
            self.joins += len(absorbed)
            self.joined_requests += len(requests) - len(batch)
        else:  # a batch that ran as it was dispatched teaches the curve and the stage shares
            self.policy.observe(total, loop.time() - started)
            join.planner.profile.observe(seconds)
        del inputs
        self._deliver(requests, outputs)

    def _deliver(self, requests: list[_Request], outputs: Mapping[str, Tensor]) -> None:
        """Answer each request of a batch with its slice of the outputs (all fail if they do not split)."""
        try:
            parts = split_outputs(outputs, [r.samples for r in requests], self.model)
        except ModelError as e:
            for r in requests:
                r.finish(error=e)
            return
        for r, part in zip(requests, parts):
            r.finish(part)
        self.requests += len(requests)

    @staticmethod
    def _fail(requests: list[_Request], error: BaseException) -> None:
        """Fail every request with `error` (the caller re-raises what is not an Exception)."""
        for r in requests:
            r.finish(error=error)

    @staticmethod
    def _absorbed(staged: _Staged) -> list[tuple[asyncio.Future[bool], list[_Request]]]:
        # the engine completes every offer of a batch before the batch itself
        return [(f, g) for f, g in staged.groups if f.done() and not f.cancelled() and f.result()]

    @staticmethod
    def _offered(staged: _Staged) -> list[tuple[asyncio.Future[bool], list[_Request]]]:
        """Groups offered to a batch and not turned away (absorbed, or waiting at its join point)."""
        return [(f, g) for f, g in staged.groups if not f.done() or (not f.cancelled() and f.result())]

    def _offer_joins(self) -> None:
        """No interpreter is free: offer the head of the queue to running staged batches."""
        join = self._join
        queue = self._queue
        if join is None or not self._staged:
            return
        now = asyncio.get_running_loop().time()
        planner = join.planner
        running = []
        free_at = math.inf  # the earliest predicted end of a running batch: when a slot frees
        for staged in self._staged:
            progress = join.pool.progress(staged.run)
            if progress is None:
                continue
            running.append((staged, progress))
            if progress[1] >= 0.0:
                free_at = min(free_at, planner.own_end(
                    start=now - progress[1], now=now, samples=staged.samples,
                    offered=[sum(r.samples for r in g) for _, g in self._offered(staged)], done=progress[0],
                ))
        for staged, (done, elapsed) in running:
            if not queue:
                return
            sizes: list[int] = []
            limits: list[float] = []
            total, limit = 0, math.inf
            for r in queue:
                if staged.samples + total + r.samples > self.max_batch_size or not _compatible(staged.requests[0].inputs, r.inputs):
                    break
                total += r.samples
                limit = min(limit, self._limit(r, join))
                sizes.append(total)
                limits.append(limit)
            if not sizes:
                continue
            groups = self._offered(staged)
            plan = planner.plan(
                now, done=done, elapsed=elapsed, samples=staged.samples, limit=staged.limit,
                sizes=sizes, limits=limits, max_batch_size=self.max_batch_size,
                offered=[sum(r.samples for r in g) for _, g in groups],
                requests=len(staged.requests) + sum(len(g) for _, g in groups),
                free_at=free_at if join.benefit else None,
            )
            if plan is None:
                continue
            group = [queue.popleft() for _ in range(plan.take)]
            samples = sizes[plan.take - 1]
            inputs = group[0].inputs if len(group) == 1 else concat_inputs([r.inputs for r in group], samples)
            future = join.pool.offer(staged.run, inputs, plan.last_stage)
            if future is None:  # the batch completed or moved on meanwhile
                queue.extendleft(reversed(group))
                continue
            self._queued_samples -= samples
            for r in group:
                r.state = _RUNNING
                self.queue_seconds += now - r.arrival
            staged.samples += samples
            staged.limit = min(staged.limit, limits[plan.take - 1])
            staged.groups.append((future, group))
            future.add_done_callback(functools.partial(self._offer_done, staged, group, samples, now))

    def _offer_done(self, staged: _Staged, group: list[_Request], samples: int, offered: float,
                    future: asyncio.Future[bool]) -> None:
        if not future.cancelled() and future.result():
            return  # absorbed: the batch's completion answers the group
        self.offers_turned_away += 1
        staged.samples -= samples
        for r in reversed(group):
            if r.state == _RUNNING and not r.future.done():  # not timed out or cancelled meanwhile
                r.state = _QUEUED
                self.queue_seconds -= offered - r.arrival  # counted again at its dispatch
                self._queue.appendleft(r)
                self._queued_samples += r.samples
        self._check_idle()
        self._schedule()

    async def _run_alone(self, req: _Request, loop: asyncio.AbstractEventLoop) -> None:
        started = loop.time()
        try:
            outputs = await self._run_batch(self.model, req.inputs)
        except BaseException as e:
            req.finish(error=e)
            if not isinstance(e, Exception):
                raise
            return
        self.policy.observe(req.samples, loop.time() - started)
        if self.max_batch_size > 0:
            for name, t in outputs.items():
                if not t.shape or t.shape[0] != req.samples:
                    req.finish(error=ModelError(
                        f"model {self.model!r}: output {name!r} has shape {list(t.shape)}, but the batch holds "
                        f"{req.samples} samples: its first dimension must be {req.samples}"
                    ))
                    return
        req.finish(outputs)
        self.requests += 1

    def _check_idle(self) -> None:
        if not self._queue and self._running == 0:
            self._idle.set()

    # ---- lifecycle ----

    async def close(self, *, timeout: float | None = None) -> None:
        """Refuse new requests and wait (up to `timeout` s) until every accepted one is answered."""
        self._closed = True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            for r in list(self._queue):
                self._remove(r)
                r.finish(error=EngineError(f"model {self.model!r} shut down before the request ran"))
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._seat is not None:
            self._seat.leave()
