"""One model's micro-batcher: queue requests, dispatch batches as its policy says, split results back.

Requests wait in a FIFO queue with their input tensors. Whenever something changes
(an arrival, a completion, a timer the policy asked for) the batcher asks the policy
how many requests to dispatch; it concatenates their inputs along the batch
dimension with one copy per input, runs the batch on the pool, and hands each
request zero-copy slices of the outputs. At most `interpreters` batches of the model
run at once.

If a batch of several requests fails with a model error, each of its requests is
run again alone (in the same interpreter slot), so that only the request that makes
the model fail gets the error.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable, Mapping

from ..errors import EngineError, InvalidInput, ModelError, Overloaded, RequestTimeout
from ..runtime.datatypes import element_count
from ..tensor import Tensor
from .policy import BatchPolicy

Runner = Callable[[str, Mapping[str, Tensor]], Awaitable[dict[str, Tensor]]]

_QUEUED, _RUNNING, _DONE = 0, 1, 2


class _Request:
    """A queued request; `arrival`, `samples` and `deadline` are what the policy sees."""

    __slots__ = ("arrival", "deadline", "future", "inputs", "samples", "state", "timer")

    def __init__(self, arrival: float, samples: int, deadline: float | None,
                 inputs: Mapping[str, Tensor], future: asyncio.Future[dict[str, Tensor]]) -> None:
        self.arrival = arrival
        self.samples = samples
        self.deadline = deadline
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


class Batcher:
    """The queue and dispatcher of one model.

    run: the coroutine that runs a batch (pool.infer); max_batch_size 0 = the model
    does not batch (every request runs alone); interpreters: most batches in flight;
    max_queue_size: most samples waiting before new requests get Overloaded.
    """

    def __init__(
        self, *, model: str, run: Runner, policy: BatchPolicy, max_batch_size: int, interpreters: int,
        max_queue_size: int,
    ) -> None:
        if interpreters < 1:
            raise ValueError(f"interpreters must be >= 1, got {interpreters}")
        self.model = model
        self.policy = policy
        self.max_batch_size = max_batch_size
        self.interpreters = interpreters
        self.max_queue_size = max_queue_size
        self._run_batch = run
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

    # ---- state ----

    @property
    def queued(self) -> int:
        """Samples waiting."""
        return self._queued_samples

    @property
    def running(self) -> int:
        """Batches in flight."""
        return self._running

    # ---- requests ----

    async def submit(
        self, inputs: Mapping[str, Tensor], samples: int, /, *, deadline: float | None = None
    ) -> dict[str, Tensor]:
        """Queue one request and wait for its outputs (split from its batch's outputs).

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
                raise Overloaded(
                    f"model {self.model!r}: {self._queued_samples} samples are queued, more than it can answer "
                    f"within its latency budget; retry in {wait:.2f} s",
                    retry_after=wait,
                )
        if self._queue and self._queued_samples + samples > self.max_queue_size:
            raise Overloaded(
                f"model {self.model!r}: {self._queued_samples} samples are queued (max_queue_size "
                f"{self.max_queue_size}); retry later",
                retry_after=1.0,
            )
        if deadline is not None and deadline <= now:
            raise RequestTimeout(f"model {self.model!r}: the request's deadline passed before it was queued")
        req = _Request(now, samples, deadline, inputs, loop.create_future())
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

    def _schedule(self) -> None:
        queue = self._queue
        while queue:
            idle = self.interpreters - self._running
            if idle <= 0:
                return  # a completion calls back
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
                return
            self._dispatch(self._take(decision.take))

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
        for r in batch:
            r.state = _RUNNING
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
        try:
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
                for r in batch:
                    r.finish(error=e)
                if not isinstance(e, Exception):
                    raise
                return
            self.policy.observe(total, loop.time() - started)
            del inputs
            try:
                parts = split_outputs(outputs, samples, self.model)
            except ModelError as e:
                for r in batch:
                    r.finish(error=e)
                return
            for r, part in zip(batch, parts):
                r.finish(part)
            self.requests += len(batch)
        finally:
            self._running -= 1
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
