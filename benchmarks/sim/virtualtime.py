"""An asyncio event loop whose clock is virtual: it jumps to the next timer instead of waiting.

`VirtualLoop` runs callbacks (`call_soon`), timers (`call_at`, `call_later`),
futures and tasks exactly as asyncio's own loop does, but `time()` returns virtual
seconds that only move when nothing is ready to run: then the clock jumps to the
earliest timer. A simulated second costs only the callbacks it holds, and a run is
deterministic: callbacks run first in, first out; timers by time, then in the order
they were set; nothing depends on the machine's speed or on another thread.

It has no I/O (no sockets, pipes, subprocesses, signals or executors): it drives
code that schedules work with timers and futures, such as the real `Batcher` with a
simulated engine (`benchmarks.sim.simulation`). An exception that escapes a
callback stops the loop and is raised from `run_until_complete`, so a broken
simulation fails loudly instead of logging and going on; so does waiting on
something when no timer is left that could ever wake it.
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import logging
import math
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import Any, TypeVar, TypeVarTuple, Unpack, cast

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


class SimulationError(RuntimeError):
    """A callback failed on the virtual loop, or the loop would wait forever."""


class VirtualLoop(asyncio.AbstractEventLoop):
    """A single-threaded asyncio loop on a virtual clock that starts at `start` seconds."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)
        self._ready: deque[asyncio.Handle] = deque()
        self._timers: list[tuple[float, int, asyncio.TimerHandle]] = []
        self._seq = 0  # ties between timers of one time go in the order they were set
        self._cancelled_timers = 0
        self._running = False
        self._stopping = False
        self._closed = False
        self._debug = False
        self._handler: Callable[[asyncio.AbstractEventLoop, dict[str, Any]], object] | None = None
        self._failure: dict[str, Any] | None = None
        self.callbacks = 0  # callbacks run so far (a measure of the simulation's work)

    # ---- the clock ----

    def time(self) -> float:
        """Virtual seconds."""
        return self._now

    # ---- scheduling ----

    def call_soon(self, callback: Callable[[Unpack[Ts]], object], *args: *Ts,
                  context: contextvars.Context | None = None) -> asyncio.Handle:
        self._check_closed()
        handle = asyncio.Handle(callback, args, self, context)
        self._ready.append(handle)
        return handle

    def call_soon_threadsafe(self, callback: Callable[[Unpack[Ts]], object], *args: *Ts,
                             context: contextvars.Context | None = None) -> asyncio.Handle:
        # one thread only: the same as call_soon
        return self.call_soon(callback, *args, context=context)

    def call_at(self, when: float, callback: Callable[[Unpack[Ts]], object], *args: *Ts,
                context: contextvars.Context | None = None) -> asyncio.TimerHandle:
        self._check_closed()
        when = float(when)
        if math.isnan(when):  # it would never fire and would break the heap's order
            raise ValueError("call_at: the time is NaN")
        handle = asyncio.TimerHandle(when, callback, args, self, context)
        heapq.heappush(self._timers, (when, self._seq, handle))
        self._seq += 1
        return handle

    def call_later(self, delay: float, callback: Callable[[Unpack[Ts]], object], *args: *Ts,
                   context: contextvars.Context | None = None) -> asyncio.TimerHandle:
        return self.call_at(self._now + delay, callback, *args, context=context)

    def _timer_handle_cancelled(self, handle: asyncio.TimerHandle) -> None:
        # asyncio.TimerHandle.cancel calls this; drop cancelled timers once they are many
        self._cancelled_timers += 1
        if self._cancelled_timers > 64 and self._cancelled_timers * 2 > len(self._timers):
            self._timers = [t for t in self._timers if not t[2].cancelled()]
            heapq.heapify(self._timers)
            self._cancelled_timers = 0

    # ---- futures and tasks ----

    def create_future(self) -> asyncio.Future[Any]:
        return asyncio.Future(loop=self)

    def create_task(self, coro: Coroutine[Any, Any, T] | Generator[Any, None, T], *, name: str | None = None,
                    context: contextvars.Context | None = None) -> asyncio.Task[T]:
        self._check_closed()
        if context is None:
            return asyncio.Task(coro, loop=self, name=name)
        return asyncio.Task(coro, loop=self, name=name, context=context)

    # ---- running ----

    def run_until_complete(self, future: Generator[Any, None, T] | Awaitable[T]) -> T:
        """Run until `future` is done and return its result (or raise its exception)."""
        self._check_closed()
        fut = asyncio.ensure_future(cast(Awaitable[T], future), loop=self)
        fut.add_done_callback(self._stop_on)
        try:
            self.run_forever()
        except BaseException:
            self._cancel_tasks()
            raise
        finally:
            fut.remove_done_callback(self._stop_on)
        if not fut.done():
            raise SimulationError("the loop stopped before the future was done")
        return fut.result()

    def _cancel_tasks(self) -> None:
        """After a failure: cancel this loop's pending tasks and let them unwind (as far
        as they can without waiting forever), so none is destroyed while pending."""
        tasks = [t for t in asyncio.all_tasks(self) if not t.done()]
        if not tasks:
            return
        self._ready.clear()  # the rest of the failed iteration
        for task in tasks:
            task.cancel()
        self._failure = None
        self._stopping = False
        asyncio._set_running_loop(self)
        self._running = True
        try:
            for _ in range(1000):
                if all(t.done() for t in tasks):
                    break
                self._run_once()
        except SimulationError:
            pass
        finally:
            self._running = False
            self._stopping = False
            asyncio._set_running_loop(None)
        for task in tasks:
            if task.done() and not task.cancelled():
                task.exception()  # retrieved: the failure was raised already

    def _stop_on(self, _fut: asyncio.Future[Any]) -> None:
        self.stop()

    def run_forever(self) -> None:
        """Run callbacks, jumping the clock to the next timer whenever none is ready, until stop()."""
        self._check_closed()
        if self._running:
            raise RuntimeError("this event loop is already running")
        if asyncio._get_running_loop() is not None:
            raise RuntimeError("cannot run a virtual loop while another loop is running in this thread")
        self._running = True
        asyncio._set_running_loop(self)
        try:
            while True:
                self._run_once()
                if self._stopping:
                    break
        finally:
            self._stopping = False
            self._running = False
            asyncio._set_running_loop(None)

    def _run_once(self) -> None:
        ready = self._ready
        timers = self._timers
        if not ready and not self._stopping:
            while timers and timers[0][2].cancelled():
                heapq.heappop(timers)
                self._cancelled_timers = max(0, self._cancelled_timers - 1)
            if not timers:
                raise SimulationError(
                    f"at t={self._now:.6f} s nothing is ready and no timer is set: the loop would wait forever"
                )
            self._now = max(self._now, timers[0][0])
        now = self._now
        while timers and timers[0][0] <= now:
            _, _, timer = heapq.heappop(timers)
            if timer.cancelled():
                self._cancelled_timers = max(0, self._cancelled_timers - 1)
            else:
                ready.append(timer)
        for _ in range(len(ready)):
            handle = ready.popleft()
            if handle.cancelled():
                continue
            self.callbacks += 1
            handle._run()
            if self._failure is not None:
                failure, self._failure = self._failure, None
                exc = failure.get("exception")
                raise SimulationError(f"at t={self._now:.6f} s: {failure.get('message')}") from exc

    def stop(self) -> None:
        self._stopping = True

    def is_running(self) -> bool:
        return self._running

    def is_closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        if self._running:
            raise RuntimeError("cannot close a running event loop")
        self._closed = True
        self._ready.clear()
        self._timers.clear()

    def _check_closed(self) -> None:
        if self._closed:
            raise RuntimeError("the virtual loop is closed")

    async def shutdown_asyncgens(self) -> None:
        """No async generators are tracked."""

    async def shutdown_default_executor(self, timeout: float | None = None) -> None:
        """There is no executor."""

    # ---- errors and debugging ----

    def get_debug(self) -> bool:
        return self._debug

    def set_debug(self, enabled: bool) -> None:
        self._debug = enabled

    def set_exception_handler(
        self, handler: Callable[[asyncio.AbstractEventLoop, dict[str, Any]], object] | None
    ) -> None:
        self._handler = handler

    def get_exception_handler(self) -> Callable[[asyncio.AbstractEventLoop, dict[str, Any]], object] | None:
        return self._handler

    def default_exception_handler(self, context: dict[str, Any]) -> None:
        """While running: remember the first failure, which the loop raises after the
        callback. Otherwise (a future collected after the run) log it as asyncio does."""
        if self._running:
            if self._failure is None:
                self._failure = context
            return
        logging.getLogger("asyncio").error("%s", context.get("message"), exc_info=context.get("exception"))

    def call_exception_handler(self, context: dict[str, Any]) -> None:
        if self._handler is not None:
            self._handler(self, context)
        else:
            self.default_exception_handler(context)


def run(main: Awaitable[T], *, start: float = 0.0) -> T:
    """Run `main` on a fresh VirtualLoop starting at `start` virtual seconds; close the loop after."""
    loop = VirtualLoop(start)  # type: ignore[abstract]  # no I/O: the abstract I/O methods stay absent
    try:
        return loop.run_until_complete(main)
    finally:
        loop.close()
