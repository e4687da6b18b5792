"""VirtualLoop: asyncio's callbacks, timers, futures and tasks on a clock that jumps to the next timer."""

from __future__ import annotations

import asyncio

import pytest

from benchmarks.sim.virtualtime import SimulationError, VirtualLoop, run


def test_callbacks_run_in_order_and_timers_by_time_then_as_set() -> None:
    loop = VirtualLoop()
    log: list[tuple[str, float]] = []

    def note(name: str) -> None:
        log.append((name, loop.time()))

    loop.call_at(2.0, note, "t2")
    loop.call_at(1.0, note, "t1a")
    loop.call_later(1.0, note, "t1b")  # the same time as t1a, set after it
    loop.call_soon(note, "soon1")
    loop.call_soon(note, "soon2")
    loop.call_at(3.0, loop.stop)
    loop.run_forever()
    assert log == [("soon1", 0.0), ("soon2", 0.0), ("t1a", 1.0), ("t1b", 1.0), ("t2", 2.0)]
    assert loop.time() == 3.0  # exactly the timer's time, not a sum of steps
    loop.close()


def test_a_cancelled_timer_never_runs_and_time_only_moves_to_live_timers() -> None:
    loop = VirtualLoop(start=10.0)
    ran: list[float] = []
    dead = loop.call_at(11.0, ran.append, 11.0)
    loop.call_at(12.0, lambda: ran.append(loop.time()))
    dead.cancel()
    for i in range(200):  # many cancelled timers are dropped without disturbing the order
        loop.call_at(11.5 + i * 1e-3, ran.append, -1.0).cancel()
    loop.call_at(12.0, loop.stop)
    loop.run_forever()
    assert ran == [12.0]
    loop.close()


def test_tasks_futures_sleep_and_timeouts_in_virtual_seconds() -> None:
    async def main() -> list[object]:
        loop = asyncio.get_running_loop()
        out: list[object] = []
        fut = loop.create_future()
        loop.call_later(5.0, fut.set_result, "late")

        async def sleeper(seconds: float, tag: str) -> str:
            await asyncio.sleep(seconds)
            out.append((tag, loop.time()))
            return tag

        results = await asyncio.gather(sleeper(3.0, "b"), sleeper(1.0, "a"), fut)
        out.append(results)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.sleep(100.0), timeout=2.0)
        out.append(loop.time())
        task = asyncio.ensure_future(asyncio.sleep(50.0))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        out.append(loop.time())
        return out

    assert run(main()) == [("a", 1.0), ("b", 3.0), ["b", "a", "late"], 7.0, 7.0]


def test_an_hour_of_virtual_time_costs_only_its_callbacks() -> None:
    loop = VirtualLoop()

    async def tick() -> int:
        n = 0
        while loop.time() < 3600.0:
            await asyncio.sleep(60.0)
            n += 1
        return n

    assert loop.run_until_complete(tick()) == 60
    assert loop.time() == pytest.approx(3600.0)
    assert loop.callbacks < 200
    loop.close()


def test_a_failing_callback_fails_the_run() -> None:
    loop = VirtualLoop()

    def boom() -> None:
        raise ValueError("broken engine")

    loop.call_at(1.5, boom)
    with pytest.raises(SimulationError, match="t=1.500000") as info:
        loop.run_until_complete(asyncio.sleep(10.0))
    assert isinstance(info.value.__cause__, ValueError)
    loop.close()


def test_waiting_forever_is_an_error_not_a_hang() -> None:
    loop = VirtualLoop()

    async def stuck() -> None:
        await loop.create_future()  # nothing will ever set it

    with pytest.raises(SimulationError, match="wait forever"):
        loop.run_until_complete(stuck())
    loop.close()


def test_the_loop_is_the_running_loop_only_while_it_runs() -> None:
    async def inside() -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    loop = VirtualLoop()
    assert loop.run_until_complete(inside()) is loop
    assert not loop.is_running()
    with pytest.raises(RuntimeError):
        asyncio.get_running_loop()
    loop.close()
    assert loop.is_closed()
    with pytest.raises(RuntimeError, match="closed"):
        loop.call_soon(print)


def test_the_same_program_gives_the_same_trace() -> None:
    def trace() -> list[tuple[float, int]]:
        loop = VirtualLoop()
        out: list[tuple[float, int]] = []

        async def worker(i: int) -> None:
            for k in range(5):
                await asyncio.sleep(0.1 * ((i * 7 + k * 3) % 5))
                out.append((loop.time(), i))

        async def main() -> None:
            await asyncio.gather(*(worker(i) for i in range(6)))

        loop.run_until_complete(main())
        loop.close()
        return out

    assert trace() == trace()
