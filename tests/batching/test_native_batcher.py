"""NativeBatcher, a front's side of a model batched in the pool, over a queue that answers
when told: admission over the shared count, deadlines, withdrawal, counts, and that an
answered request's outputs are not held once its caller is done with them."""

from __future__ import annotations

import asyncio
import gc
import sys
import time
import weakref
from collections.abc import Sequence
from typing import Any

import pytest

from aserve.batching.native import NativeBatcher, NativeDone
from aserve.errors import EngineError, ModelError, Overloaded, RequestTimeout
from aserve.tensor import Tensor

from ..conftest import until


class Outputs(dict[str, Any]):
    """Outputs a weak reference can follow."""


class Queue:
    """The pool's side: keeps each request until the test answers or cancels it."""

    def __init__(self) -> None:
        self.jobs: dict[int, NativeDone] = {}
        self.cancelled: list[int] = []
        self.running: set[int] = set()  # jobs an interpreter took, each alone
        self.shared = 0  # the model's queued samples, as the pool's slots would count them
        self.holding: list[int] | None = None  # jobs given since hold()
        self.released: list[list[int]] = []  # the jobs each release() queued together

    def request(self, model: str, inputs: Sequence[Tensor], samples: int, done: NativeDone, /, *,
                window_ns: int, deadline_ns: int) -> int:
        job = len(self.jobs) + len(self.cancelled) + 1
        self.jobs[job] = done
        self.shared += samples
        if self.holding is not None:
            self.holding.append(job)
        return job

    def hold(self) -> None:
        assert self.holding is None, "hold() twice without release()"
        self.holding = []

    def release(self) -> None:
        assert self.holding is not None, "release() without hold()"
        self.released.append(self.holding)
        self.holding = None

    def cancel_request(self, job: int, /) -> str | None:
        done = self.jobs.pop(job, None)
        if done is None:
            return None
        self.cancelled.append(job)
        if job in self.running:  # alone in an interpreter: its completion comes when Cancelled ends it
            return "running"
        self.shared -= 1
        done(None, RuntimeError("Cancelled"), 0, 0, 0)
        return "queued"

    def answer(self, job: int, led: int = 0) -> Outputs:
        outputs = Outputs(y=Tensor("FP32", (1, 1), bytearray(4)))
        self.shared -= 1
        now = time.monotonic_ns()
        self.jobs.pop(job)(outputs, None, led, now, now + 1000)
        return outputs

    # SharedQueued
    def add(self, n: int, /) -> None:  # what the loop holds before it hands its requests on
        self.shared += n

    def total(self) -> int:
        return self.shared

    def get(self, slot: int, /) -> int:
        return self.shared if slot == 0 else 0


def batcher(queue: Queue, **kw: Any) -> NativeBatcher:
    settings: dict[str, Any] = {"max_batch_size": 8, "max_queue_size": 3, "max_queue_delay": 0.001}
    settings.update(kw)
    return NativeBatcher(model="m", key="m/1", queue=queue, shared=queue, slots=(0, 1, 2), **settings)


X = [Tensor("FP32", (1, 1), bytearray(4))]


async def test_answers_counts_and_released_outputs() -> None:
    queue = Queue()
    b = batcher(queue)
    futures = [b.submit(X, 1, deadline=time.monotonic() + 30) for _ in range(3)]
    with pytest.raises(Overloaded, match="max_queue_size 3"):
        b.submit(X, 1)
    with pytest.raises(Overloaded):
        b.refuse_ahead()
    await until(lambda: len(queue.jobs) == 3, what="the loop to hand its requests on")
    refs = [weakref.ref(queue.answer(job, led=3 if job == 1 else 0)) for job in sorted(queue.jobs)]
    assert all(f.result() is not None for f in futures)
    del futures
    gc.collect()
    assert [r() for r in refs] == [None, None, None]  # nothing of the batcher's holds them
    stats = b.stats()
    assert (stats["batches"], stats["requests"], stats["refused"]) == (1, 3, 2)
    assert b.batch_sizes.keys() == {3}


async def test_the_requests_of_one_iteration_are_handed_on_together() -> None:
    """Each flush holds the pool's queue while it hands its requests on, so an interpreter
    woken by the first finds them all queued; one that fails to be handed on fails alone."""
    queue = Queue()
    b = batcher(queue, max_queue_size=8)
    first = [b.submit(X, 1) for _ in range(3)]
    await until(lambda: len(queue.jobs) == 3, what="the loop to hand its requests on")
    later = [b.submit(X, 1) for _ in range(2)]
    await until(lambda: len(queue.jobs) == 5, what="the loop to hand its requests on")
    assert queue.released == [[1, 2, 3], [4, 5]] and queue.holding is None
    refused = RuntimeError("the model went away")
    requests, calls = queue.request, []

    def second_fails(*args: Any, **kw: Any) -> int:
        calls.append(args)
        if len(calls) == 2:
            raise refused
        return requests(*args, **kw)

    queue.request = second_fails  # type: ignore[method-assign]
    last = [b.submit(X, 1) for _ in range(3)]
    await until(lambda: last[1].done(), what="the request that could not be handed on to fail")
    assert last[1].exception() is refused and queue.released[-1] == [6, 7] and queue.holding is None
    for job in sorted(queue.jobs):
        queue.answer(job)
    assert all(f.result() is not None for f in (*first, *later, last[0], last[2]))


async def test_a_request_past_its_deadline_times_out_and_leaves_the_queue() -> None:
    queue = Queue()
    b = batcher(queue)
    slow = b.submit(X, 1, deadline=time.monotonic() + 0.05)
    later = b.submit(X, 1, deadline=time.monotonic() + 30)
    await until(lambda: len(queue.jobs) == 2, what="the loop to hand its requests on")
    with pytest.raises(RequestTimeout):
        await slow
    # it left the pool's queue: no batch was cancelled
    assert queue.cancelled == [1] and b.stats()["timed_out"] == 1 and b.stats()["cancelled"] == 0
    queue.answer(2)
    assert (await later) is not None
    await asyncio.wait_for(b.close(), 5)


async def test_a_request_running_alone_past_its_deadline_is_a_cancelled_batch() -> None:
    queue = Queue()
    b = batcher(queue)
    slow = b.submit(X, 1, deadline=time.monotonic() + 0.05)
    await until(lambda: len(queue.jobs) == 1, what="the loop to hand its request on")
    queue.running.add(1)
    with pytest.raises(RequestTimeout):
        await slow
    assert queue.cancelled == [1] and b.stats()["timed_out"] == 1 and b.stats()["cancelled"] == 1


async def test_withdrawn_requests_leave_the_queue_and_close_waits_for_the_rest() -> None:
    queue = Queue()
    b = batcher(queue)
    early = b.submit(X, 1)  # withdrawn before the loop hands it on: it never reaches the pool
    early.cancel()
    b.withdraw(early)
    gone = b.submit(X, 1)
    kept = b.submit(X, 1)
    await until(lambda: len(queue.jobs) == 2, what="the loop to hand its requests on")
    gone.cancel()
    b.withdraw(gone)
    assert queue.cancelled == [1] and queue.shared == 1
    closing = asyncio.ensure_future(b.close())
    await asyncio.sleep(0)
    assert not closing.done()  # the kept request is still the pool's
    queue.answer(2)
    await asyncio.wait_for(closing, 5)
    assert queue.shared == 0
    assert kept.result() is not None


async def test_answers_with_the_wrong_rows_or_no_error_fail_their_own_request_only() -> None:
    queue = Queue()
    b = batcher(queue, max_queue_size=8)
    wrong, failed, fine = (b.submit(X, 1) for _ in range(3))
    await until(lambda: len(queue.jobs) == 3, what="the loop to hand its requests on")
    now = time.monotonic_ns()
    queue.shared -= 3
    queue.jobs.pop(1)(Outputs(y=Tensor("FP32", (2, 1), bytearray(8))), None, 1, now, now + 1000)
    queue.jobs.pop(2)(None, None, 0, 0, 0)  # a failure the pool could not name
    queue.jobs.pop(3)(Outputs(y=Tensor("FP32", (1, 1), bytearray(4))), None, 0, now, now + 1000)
    with pytest.raises(ModelError, match=r"'m'.*'y'"):
        wrong.result()
    with pytest.raises(ModelError, match="model 'm' failed"):
        failed.result()
    assert fine.result()["y"].shape == (1, 1)
    stats = b.stats()
    assert (stats["batches"], stats["requests"]) == (1, 1)  # the batch its wrong answer led still ran
    assert b.batch_sizes == {1: [1, pytest.approx(1e-6)]}


async def test_submit_takes_batchers_keywords_and_refuses_what_a_front_does_not_serve() -> None:
    queue = Queue()
    b = batcher(queue)
    with pytest.raises(TypeError, match="unexpected keyword argument 'dealine'"):
        b.submit(X, 1, dealine=1.0)
    with pytest.raises(EngineError, match="goes to its ModelHandle.traced batcher"):
        b.submit(X, 1, context="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
    with pytest.raises(RequestTimeout, match="deadline passed before it was queued"):
        b.submit(X, 1, deadline=time.monotonic() - 1)
    # budget, waited and held judge nothing here: the queue's bound is the only admission
    future = b.submit(X, 1, budget=0.0, waited=5.0, held=True)
    await until(lambda: len(queue.jobs) == 1, what="the loop to hand its request on")
    queue.answer(1)
    assert future.result() is not None
    b.closed = True
    with pytest.raises(EngineError, match="shutting down"):
        b.submit(X, 1)


async def test_a_closed_batcher_and_its_answered_requests_are_collected() -> None:
    queue = Queue()
    b = batcher(queue)
    futures = [b.submit(X, 1, deadline=time.monotonic() + 30) for _ in range(2)]
    await until(lambda: len(queue.jobs) == 2, what="the loop to hand its requests on")
    for job in sorted(queue.jobs):
        queue.answer(job)
    await asyncio.wait_for(b.close(), 5)
    assert all(f.done() for f in futures) and not b.pending
    ref = weakref.ref(b)
    del b, futures
    gc.collect()
    assert ref() is None


async def test_a_queue_that_cannot_hold_still_gets_every_request_and_the_failure_is_reported(
        monkeypatch: pytest.MonkeyPatch) -> None:
    queue = Queue()
    b = batcher(queue, max_queue_size=8)
    reported: list[BaseException | None] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: reported.append(u.exc_value))

    def cannot() -> None:
        raise RuntimeError("no hold today")

    released: list[int] = []
    queue.hold = cannot  # type: ignore[method-assign]
    queue.release = lambda: released.append(len(queue.jobs))  # type: ignore[method-assign]
    futures = [b.submit(X, 1) for _ in range(2)]
    await until(lambda: len(queue.jobs) == 2, what="the loop to hand its requests on")
    assert [str(e) for e in reported] == ["no hold today"] and released == [2]
    for job in sorted(queue.jobs):
        queue.answer(job)
    assert all(f.result() is not None for f in futures)
