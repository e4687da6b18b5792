"""When to dispatch a batch: the interface between a model's batcher and its policy.

The batcher asks its policy `decide(now, queue, idle=, running=, max_batch_size=)`
whenever something changes (an arrival, a completion, a timer it was asked to set)
and dispatches `take` requests from the head of the queue as one batch, or waits
until `wake_at` (or the next arrival/completion when `wake_at` is None). After each
batch it reports `observe(samples, seconds)`.

A policy may also define `admit(now, queued_samples, samples, budget, waited) -> float | None`:
the batcher calls it before queueing a request that must wait (others are queued, or
every interpreter of the model is busy), with the samples queued ahead of it, its own
samples, its latency budget in seconds (None: the policy's own) and the seconds it
already spent in the server before it reached the batcher (they count against the
budget), and refuses the request with 503 and that Retry-After (seconds) unless it
returns None. The batcher may also ask it ahead of a request, from the request's head
before its body is read, with `count=False`: the same answer, nothing counted (see
`Batcher.refuse_ahead`); the policy then has an `arrive(now, samples)` that counts the
arrival of a request refused there, as `admit` counts every request it is asked about.

A policy with `asks_always` true is asked about every request, not only those that must
wait by what the batcher sees: it sees the model's whole queue and batches (a front's
`PlanAdmission`, batching/native.py) and judges which must wait itself.

`idle` is how many more batches of this model may start now (the model's
interpreters minus `running`, its batches in flight); the batcher never calls
`decide` with an empty queue.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol


class Pending(Protocol):  # what a policy sees of one queued request
    arrival: float  # time.monotonic() when queued (the clock loop.call_at counts in)
    samples: int
    deadline: float | None  # time.monotonic() by which it must finish, if any
    budget: float | None  # this request's latency budget in seconds (None: the policy's own)
    waited: float  # seconds it spent in the server before it was queued (they count against its budget)


class Admit(Protocol):  # a policy's admission control (see the module's docstring)
    def __call__(self, now: float, queued_samples: int, samples: int, budget: float | None, waited: float,
                 /, *, count: bool = True) -> float | None: ...


class Decision(NamedTuple):
    take: int  # how many queued requests (from the head, FIFO) to dispatch now as one batch; 0 = wait
    wake_at: float | None  # if take == 0: when to ask again (None = on next arrival/completion)


class BatchPolicy(Protocol):
    def decide(
        self, now: float, queue: Sequence[Pending], *, idle: int, running: int, max_batch_size: int,
        queued: int | None = None,
    ) -> Decision: ...  # queued: the queue's samples summed, where the caller counts them

    def observe(self, samples: int, seconds: float) -> None: ...  # a batch of `samples` took `seconds`


def fitting(queue: Sequence[Pending], max_batch_size: int, queued: int | None = None) -> tuple[int, int]:
    """How many requests from the head fit in one batch of at most max_batch_size samples (at
    least 1), and their samples. `queued`, where known, is the queue's samples summed: when
    they fit in one batch, all of it does, told without a walk of the queue (asked at each
    arrival, a walk would cost a batch of n requests n²/2 steps).

    With max_batch_size 0 (the model does not batch) every request goes alone."""
    if max_batch_size <= 0:
        return 1, queue[0].samples
    if queued is not None and queued <= max_batch_size:
        return len(queue), queued
    total = 0
    n = 0
    for p in queue:
        if n and total + p.samples > max_batch_size:
            break
        total += p.samples
        n += 1
    return n, total


WAIT = Decision(0, None)


class WindowPolicy:
    """A fixed batching window that never makes a lone request wait.

    The rule, checked in order (the queue is never empty):
      1. no free interpreter slot (idle == 0): wait for a completion;
      2. the model does not batch (max_batch_size 0): dispatch the head request;
      3. the queued samples fill a batch (>= max_batch_size): dispatch a full batch;
      4. nothing of this model is running (running == 0): dispatch now. Batches can
         only fill from requests that arrive while others are in flight; with all of
         the model's interpreters idle, waiting out the window would just add its
         length to a lone request's latency (the single-connection case);
      5. the oldest request has waited max_queue_delay, or its deadline falls before
         its window closes (waiting would time it out): dispatch what is queued;
      6. otherwise wait until the oldest request's window closes (or the next
         arrival/completion): a batch is running, so more requests are likely on the
         way and a free interpreter can afford to gather them.
    """

    __slots__ = ("max_queue_delay",)

    def __init__(self, *, max_queue_delay: float) -> None:
        if max_queue_delay < 0:
            raise ValueError(f"max_queue_delay must be >= 0 seconds, got {max_queue_delay}")
        self.max_queue_delay = max_queue_delay

    def decide(
        self, now: float, queue: Sequence[Pending], *, idle: int, running: int, max_batch_size: int,
        queued: int | None = None,
    ) -> Decision:
        if idle <= 0 or not queue:
            return WAIT
        if max_batch_size <= 0:
            return Decision(1, None)
        n, samples = fitting(queue, max_batch_size, queued)
        if n < len(queue) or running == 0 or samples >= max_batch_size:
            # more than one batch's worth is queued, or exactly one (rule 3), or nothing is
            # running (rule 4)
            return Decision(n, None)
        head = queue[0]
        close = head.arrival + self.max_queue_delay
        if now >= close or (head.deadline is not None and head.deadline <= close):
            return Decision(n, None)
        return Decision(0, close)

    def observe(self, samples: int, seconds: float) -> None:
        """The fixed window learns nothing from batch timings."""
