"""Polling for a lone job's completion instead of waiting for the eventfd.

At low load a job is alone in flight and its event loop has nothing else to do: it
blocks in epoll until the interpreter writes the eventfd, and waking a blocked thread
on an idle virtual CPU costs tens of microseconds, more than a small model runs. So
while a lone job runs, the loop asks for completions at every turn instead (I/O is
still served between two turns), for at most `poll_s` after the job was queued.

Polling burns the loop's CPU for the whole job to save one wake-up: it pays only for
jobs answered within about what a wake-up costs. The poller remembers how long the
last lone jobs it polled for took and stops polling while their median is longer,
polling for one lone job in `LONE_JOBS` all the same to learn whether that changed.
Under load the loop turns anyway, and polling would only add a callback to every turn,
so a job queued while others are in flight starts no polling.

Used by the host's `Pool` and a front loop's `Link` (server/front.py) alike.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

LONE_JOBS = 8  # lone jobs whose times decide whether the loop polls for the next one
POLL_PAYS_S = 100e-6  # the loop polls for lone jobs answered within this: a few times what its wake-up costs


class LonePoll:
    """`take()` returns the finished jobs (or None when none finished) and `answer(items)`
    answers them; `busy()` says whether a job is still in flight (and the owner open).
    The owner calls `queued(in_flight)` after queueing a job, `finished()` when nothing is
    in flight any more, and `forget()` when the job alone in flight never ran."""

    __slots__ = ("_answer", "_busy", "_count", "_from", "_loop", "_pays", "_polling", "_take", "_times", "_until",
                 "poll_s")

    def __init__(self, poll_s: float, take: Callable[[], Any], answer: Callable[[Any], None],
                 busy: Callable[[], bool]) -> None:
        self.poll_s = poll_s  # 0: never poll
        self._take = take
        self._answer = answer
        self._busy = busy
        self._loop: asyncio.AbstractEventLoop | None = None
        self._polling = False  # a _poll callback is scheduled
        self._until = 0.0
        self._from = 0.0  # when the job now alone in flight was queued (0: none, or not alone)
        self._times: list[float] = []  # seconds the last lone jobs polled for took, queued to answered
        self._pays = True  # whether the loop polls for a lone job's answer
        self._count = 0  # lone jobs queued, all told

    @property
    def pays(self) -> bool:
        """Whether the loop polls for the next lone job (lately they were answered fast)."""
        return self._pays

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def queued(self, in_flight: int) -> None:
        """A job was queued and `in_flight` are now in flight, that one included."""
        lone = in_flight == 1
        if lone:
            self._from = time.perf_counter()
            self._count += 1
        else:
            self._from = 0.0  # not alone: its time says nothing of a lone job's
        if self.poll_s and (self._polling or (lone and (self._pays or self._count % LONE_JOBS == 0))):
            self._until = time.perf_counter() + self.poll_s
            if not self._polling and self._loop is not None:
                self._polling = True
                self._loop.call_soon(self._poll)

    def finished(self) -> None:
        """Nothing is in flight any more: if the loop polled for a lone job (a time taken
        waiting for the eventfd would count the wake-up too), remember how long it took."""
        if self._from and self._polling:
            times = self._times
            times.append(time.perf_counter() - self._from)
            if len(times) > LONE_JOBS:
                del times[0]
            self._pays = len(times) < LONE_JOBS or sorted(times)[LONE_JOBS // 2] <= POLL_PAYS_S
        self._from = 0.0

    def forget(self) -> None:
        """The job alone in flight was never queued after all: its time says nothing."""
        self._from = 0.0

    def _poll(self) -> None:
        if not self._busy():
            self._polling = False
            return
        items = self._take()
        if items is not None:
            self._answer(items)
        if self._busy() and time.perf_counter() < self._until:
            assert self._loop is not None
            self._loop.call_soon(self._poll)
        else:
            self._polling = False
