"""A front's model whose requests are batched in the pool, by the window rule in C.

Every front loop queues each request of such a model on the pool's shared queue as it
comes (`Link.request`), so the requests of every loop wait in one queue per
model and join the same batches: a worker takes one when the window rule says its batch
may start (full, nothing of the model running, its window closed, or its deadline near:
`WindowPolicy`'s rule, `_native.window_rule`), gathers the queued requests that fit,
copies their inputs into one block, runs the model once and gives each request its rows
(native/host/pool_coalesce.c). A completion goes to the loop that queued the request.

What stays here, on the request's own loop: admission (`max_queue_size` over every loop,
the model's `_native.Counter`), the deadline (one timer per model, at the earliest
deadline; a request still queued when it passes is cancelled in the pool), withdrawal,
and the counts its statistics read. The batch's leader reports the batch (its rows and
run time), so every batch is counted once, by the loop whose request led it.

`Batcher` stays the reference: the host's loop runs it, with tracing, the adaptive
policy and layer joining, none of which a front serves.
"""

from __future__ import annotations

import asyncio
import heapq
import math
from collections.abc import Callable, Sequence
from functools import partial
from time import monotonic
from typing import Any, Protocol

from .._native import RequestTrace
from ..errors import EngineError, ModelError, Overloaded, RequestTimeout
from ..tensor import Tensor, wrong_rows
from .batcher import count_batch, queue_full
from .policy import WindowPolicy

# (outputs or None, error or None, rows of the batch it led (0: none), run start and end, ns)
NativeDone = Callable[[dict[str, Tensor] | None, BaseException | None, int, int, int], None]


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


class _Request:
    __slots__ = ("arrival", "deadline", "future", "job", "samples")

    def __init__(self, arrival: float, samples: int, deadline: float | None,
                 future: asyncio.Future[dict[str, Tensor]]) -> None:
        self.arrival = arrival
        self.samples = samples
        self.deadline = deadline
        self.future = future
        self.job: Any = None

    def __lt__(self, other: _Request) -> bool:  # heap order past equal deadlines: arrival
        return self.arrival < other.arrival


class NativeBatcher:
    """One model on one front loop, batched in the pool; `Batcher`'s interface for the
    data plane (submit, refuse_ahead, withdraw, close, stats and the counters).

    slots: this loop's slots of the model's Counter: the samples and requests its requests
    hold while they wait in the pool's queue, and the batches its requests lead, running."""

    tracer = None  # a front never traces: while tracing is on, the host answers every infer request

    def __init__(self, *, model: str, key: str, queue: NativeQueue, max_batch_size: int, max_queue_size: int,
                 max_queue_delay: float, shared: SharedQueued, slots: tuple[int, int, int],
                 clock: Callable[[], float] = monotonic) -> None:
        self.model = model
        self.key = key
        self.max_batch_size = max_batch_size
        self.max_queue_size = max_queue_size
        self._queue = queue
        self.policy = WindowPolicy(max_queue_delay=max_queue_delay)  # the rule the pool applies, in C
        self._window_ns = round(max_queue_delay * 1e9)
        self._shared = shared
        self._slots = slots
        self._clock = clock
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: set[_Request] = set()  # queued or running: their completion has not come
        # the pending requests' deadlines, a heap; an answered request's entry is dropped when it
        # comes to the top (answers mostly come in deadline order), or at the next expiry
        self._deadlines: list[tuple[float, _Request]] = []
        self._expiry: asyncio.TimerHandle | None = None
        self._expiry_at = math.inf
        self._closed = False
        self._drained: asyncio.Future[None] | None = None
        self._deferred: list[tuple[_Request, Sequence[Tensor], int]] = []  # taken in, not yet handed on
        self._flushing = False
        self.batches = 0  # batches its requests led
        self.requests = 0  # requests answered by a batch
        self.refused = 0
        self.timed_out = 0
        self.cancelled = 0  # requests cancelled running alone in an interpreter once their deadline passed
        self.queue_seconds = 0.0  # summed over requests: from arrival to their batch's start
        self.compute_seconds = 0.0  # summed over requests: their batch's run time
        self.batch_sizes: dict[int, list[float]] = {}  # samples -> [batches led, their seconds summed]
        self.last_dispatch: float | None = None  # clock time the last batch it led started

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

    # ---- requests ----

    def submit(
        self, inputs: Sequence[Tensor], samples: int, /, *, deadline: float | None = None,
        budget: float | None = None, trace: RequestTrace | None = None, waited: float = 0.0,
        context: str | None = None, held: bool = False,
    ) -> asyncio.Future[dict[str, Tensor]]:
        """`Batcher.submit`: queue one request in the pool; the future resolves to its outputs
        (the queue's bound is its only admission: `budget`, `waited` and `held` judge nothing).

        A traced request, or one with a caller's context, is the host's (fronts hand them on):
        neither is taken here."""
        if self._closed:
            raise EngineError(f"model {self.model!r} is shutting down")
        if trace is not None or context is not None:
            raise EngineError(f"model {self.model!r}: a traced request is answered by the host's loop")
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        now = self._clock()
        refused = self._admission(samples)
        if refused is not None:
            self.refused += 1
            raise refused
        if deadline is not None and deadline <= now:
            raise RequestTimeout(f"model {self.model!r}: the request's deadline passed before it was queued")
        future: asyncio.Future[dict[str, Tensor]] = loop.create_future()
        req = _Request(now, samples, deadline, future)
        deadline_ns = 0 if deadline is None else max(1, round(deadline * 1e9))
        self._deferred.append((req, inputs, deadline_ns))
        self._shared.add(samples)  # queued on this loop until the flush hands it to the pool
        if not self._flushing:
            self._flushing = True
            loop.call_soon(self._flush)
        self._pending.add(req)
        if deadline is not None:
            heapq.heappush(self._deadlines, (deadline, req))
            if deadline < self._expiry_at:
                self._arm_expiry(loop, deadline)
        return future

    def _flush(self) -> None:
        """Hand the requests this loop took in since the last flush to the pool, together: once
        per loop iteration, after every connection's bytes were read, so a worker that frees
        finds them all queued and batches them, rather than the first of them alone."""
        self._flushing = False
        deferred, self._deferred = self._deferred, []
        self._shared.add(-sum(req.samples for req, _, _ in deferred))
        queue = self._queue
        queue.hold()  # queued together: an interpreter woken by the first finds the rest queued
        try:
            for req, inputs, deadline_ns in deferred:
                if req.future.done():  # withdrawn or timed out before it was handed on
                    self._pending.discard(req)
                    continue
                try:
                    req.job = queue.request(self.key, inputs, req.samples, partial(self._done, req),
                                            window_ns=self._window_ns, deadline_ns=deadline_ns)
                except Exception as exc:  # noqa: BLE001 - the request's own failure (its model went away)
                    self._pending.discard(req)
                    req.future.set_exception(exc)
        finally:
            queue.release()
        self._check_drained()

    def refuse_ahead(self, *, budget: float | None = None, waited: float = 0.0) -> None:
        """`Batcher.refuse_ahead`: Overloaded when any request would be refused now."""
        if self._closed:
            return
        refused = self._admission(1)
        if refused is not None:
            self.refused += 1
            raise refused

    def refuse_again(self, samples: int, /, *, budget: float | None = None, waited: float = 0.0,
                     held: bool = False) -> Overloaded | None:
        """`Batcher.refuse_again`: the queue bound's refusal `submit` would raise, counted, or None."""
        if self._closed:
            return None
        refused = self._admission(samples)
        if refused is not None:
            self.refused += 1
        return refused

    def _admission(self, samples: int) -> Overloaded | None:
        return queue_full(self.model, self._shared.total(), samples, self.max_queue_size)

    def withdraw(self, future: asyncio.Future[dict[str, Tensor]]) -> None:
        """The caller stopped waiting: a request still queued in the pool leaves it."""
        for req in self._pending:
            if req.future is future:
                if req.job is not None:  # not yet handed on: the flush drops it
                    self._queue.cancel_request(req.job)  # queued: it completes now, failed; running: it runs on
                return

    def _done(self, req: _Request, outputs: dict[str, Tensor] | None, error: BaseException | None,
              led: int, start_ns: int, end_ns: int) -> None:
        """The pool answered one request (from the loop's drain of its link)."""
        self._pending.discard(req)
        heap = self._deadlines
        while heap and heap[0][1] not in self._pending:  # the answered ones on top hold nothing more
            heapq.heappop(heap)
        if led > 0:
            count_batch(self.batch_sizes, led, (end_ns - start_ns) / 1e9)
            self.batches += 1
            self.last_dispatch = start_ns / 1e9
        future = req.future
        if outputs is not None:
            self.queue_seconds += max(0.0, start_ns / 1e9 - req.arrival)
            self.compute_seconds += (end_ns - start_ns) / 1e9
            if not future.done():
                if self.max_batch_size > 0:
                    for name, t in outputs.items():
                        if not t.shape or t.shape[0] != req.samples:
                            future.set_exception(wrong_rows(self.model, name, t.shape, req.samples))
                            break
                if not future.done():
                    future.set_result(outputs)
                    self.requests += 1
        elif not future.done():
            future.set_exception(error if error is not None else ModelError(f"model {self.model!r} failed"))
        self._check_drained()

    # ---- deadlines ----

    def _arm_expiry(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
        self._expiry_at = when
        self._expiry = loop.call_at(when, self._expire)

    def _expire(self) -> None:
        """The earliest deadline came: fail the requests past theirs; one still queued in the
        pool leaves the queue, one running alone is cancelled in its interpreter."""
        self._expiry = None
        self._expiry_at = math.inf
        now = self._clock()
        heap = self._deadlines
        while heap and (heap[0][1] not in self._pending or heap[0][0] <= now):
            _, req = heapq.heappop(heap)
            if req not in self._pending or req.future.done():
                continue
            self.timed_out += 1
            req.future.set_exception(RequestTimeout(
                f"model {self.model!r}: request timed out after {(now - req.arrival) * 1000:.1f} ms"
            ))
            if req.job is not None and self._queue.cancel_request(req.job) == "running":
                self.cancelled += 1  # a queued one just left the queue: no batch was cancelled
        if heap:
            assert self._loop is not None
            self._arm_expiry(self._loop, heap[0][0])

    # ---- lifecycle ----

    def _check_drained(self) -> None:
        drained = self._drained
        if drained is not None and not self._pending and not drained.done():
            drained.set_result(None)

    async def close(self, *, timeout: float | None = None) -> None:
        """Refuse new requests and wait (up to `timeout` s) until every accepted one is answered:
        a request the pool holds is answered by the pool, which never drops one."""
        self._closed = True
        loop = asyncio.get_running_loop()
        self._loop = self._loop or loop
        if self._pending:
            self._drained = loop.create_future()
            try:
                await asyncio.wait_for(asyncio.shield(self._drained), timeout)
            except TimeoutError:
                for req in list(self._pending):
                    if not req.future.done():
                        req.future.set_exception(EngineError(f"model {self.model!r} shut down before the request ran"))
                    if req.job is not None:
                        self._queue.cancel_request(req.job)
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
            self._expiry_at = math.inf
