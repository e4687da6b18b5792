"""Holding a pool's threads to the loop's CPU while its jobs come alone (`Pool(colocate=True)`,
engine/placement.py): real interpreters, real threads, their affinity read back from the kernel."""

from __future__ import annotations

import array
import asyncio
import os
import sys
import threading

import pytest

from aserve.engine import ModelSpec, Pool
from aserve.engine.placement import LONE_RUN
from aserve.tensor import Tensor

pytestmark = [
    pytest.mark.serial,  # pins threads of this process for a while: alone (pyproject's markers)
    pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="holding threads to one CPU needs two"),
]

ENGINES = ["private", "main"] + (["subinterp"] if sys.version_info >= (3, 12) else [])

DOUBLE = """
import threading, time
from aserve.runtime import Model, TensorSpec
stop = threading.Event()
class Double(Model):
    inputs = (TensorSpec("x", "INT64", (-1,)),)
    outputs = (TensorSpec("y", "INT64", (-1,)),)
    def __call__(self, inputs):
        x = list(inputs["x"])
        if x and x[0] == -1:  # start a thread, answer its id: it waits until -3 (or 30 s)
            t = threading.Thread(target=stop.wait, args=(30,))
            t.start()
            return {"y": [t.native_id]}
        if x and x[0] == -3:
            stop.set()
        if x and x[0] == -2:  # a batch that runs long
            time.sleep(0.005)
        return {"y": [2 * v for v in x]}
"""


def _x(*values: int) -> dict[str, Tensor]:
    return {"x": Tensor("INT64", (len(values),), array.array("q", values))}


def _y(outputs: dict[str, Tensor]) -> list[int]:
    return list(memoryview(outputs["y"].data).cast("q"))


def _threads(pool: Pool) -> list[int]:
    return [tid for tid in pool._started.thread_ids() if tid] + [threading.get_native_id()]


async def _lone(pool: Pool, n: int, value: int = 1) -> None:
    for _ in range(n):
        assert _y(await pool.infer("double", _x(value))) == [2 * value]


async def _together(pool: Pool) -> None:
    answers = await asyncio.gather(*(pool.infer("double", _x(i)) for i in range(4)))
    assert [_y(a) for a in answers] == [[0], [2], [4], [6]]


async def _until_held(pool: Pool, at_least: int) -> None:
    """Lone jobs one at a time until the pool holds its threads: never before `at_least` of
    them (the run it waits for); a job that ran long on a busy machine starts the run over."""
    placement = pool.placement
    assert placement is not None
    for n in range(1, 8 * at_least + 1):
        await _lone(pool, 1)
        if placement.cpu >= 0:
            assert n >= at_least, (n, at_least)
            return
    raise AssertionError(f"not held after {8 * at_least} lone jobs")


@pytest.mark.parametrize("engine", ENGINES)
async def test_lone_short_jobs_hold_the_threads_to_the_loops_cpu_and_jobs_together_spread_them(
        engine: str, model_dir) -> None:  # type: ignore[no-untyped-def]
    everyone = os.sched_getaffinity(0)
    # one interpreter: the thread its model starts is stopped by a later call in the same one
    async with Pool(engine=engine, interpreters=1, spin_us=0, colocate=True) as pool:
        await pool.load(ModelSpec(name="double", path=str(model_dir(DOUBLE))))
        placement = pool.placement
        assert placement is not None and placement.cpu == -1
        await _until_held(pool, LONE_RUN)
        for tid in _threads(pool):  # the interpreter's thread and the loop's
            assert os.sched_getaffinity(tid) == {placement.cpu}, tid
        spawned = 0
        if engine != "subinterp":  # a thread a model starts while held inherits the one CPU
            cpu = placement.cpu
            [spawned] = _y(await pool.infer("double", _x(-1)))
            # (unless starting it took the job past a millisecond: that spread it at once)
            assert os.sched_getaffinity(spawned) == ({cpu} if placement.cpu >= 0 else everyone)
        await _together(pool)  # jobs in flight together: every CPU again
        assert placement.cpu == -1
        for tid in [*_threads(pool), spawned]:
            if tid:
                assert os.sched_getaffinity(tid) == everyone, tid
        # a hold that ends sooner than the run it waited for: the next waits twice as long
        need = placement.need
        await _until_held(pool, need)
        await _together(pool)
        assert placement.cpu == -1 and placement.need == 2 * need
        await _until_held(pool, 2 * need)
        # a hold that lasts as long as the run it waited for: the wait is short again after it
        for _ in range(64 * LONE_RUN):
            if placement.cpu >= 0 and placement._run >= placement.need:
                break
            if placement.cpu < 0:
                await _until_held(pool, placement.need)
            else:
                await _lone(pool, 1)
        await _together(pool)
        assert placement.cpu == -1 and placement.need == LONE_RUN
        if spawned:
            assert _y(await pool.infer("double", _x(-3))) == [-6]  # the model's thread ends
    # a closed (parked) pool's threads, and the loop's, keep every CPU
    assert placement.cpu == -1
    assert os.sched_getaffinity(0) == everyone


async def test_long_lone_jobs_are_never_held_and_one_spreads_a_hold(model_dir) -> None:  # type: ignore[no-untyped-def]
    everyone = os.sched_getaffinity(0)
    async with Pool(engine="private", interpreters=2, spin_us=0, colocate=True) as pool:
        await pool.load(ModelSpec(name="double", path=str(model_dir(DOUBLE))))
        placement = pool.placement
        assert placement is not None
        await _lone(pool, 3 * LONE_RUN, value=-2)  # 5 ms each: more than a short job
        assert placement.held == 0 and placement.cpu == -1
        await _until_held(pool, LONE_RUN)  # short ones again: once they are most of the last few
        await _lone(pool, 1, value=-2)
        assert placement.cpu == -1
        for tid in _threads(pool):
            assert os.sched_getaffinity(tid) == everyone


async def test_nothing_is_held_while_polling_or_without_colocate(model_dir) -> None:  # type: ignore[no-untyped-def]
    # polling (here: always): a thread polling on the loop's CPU would take it from the loop
    async with Pool(engine="private", interpreters=2, spin_us=50_000, spinners=1, spin_always=True,
                    colocate=True) as pool:
        await pool.load(ModelSpec(name="double", path=str(model_dir(DOUBLE))))
        assert pool.placement is not None
        await _lone(pool, 3 * LONE_RUN)
        assert pool.placement.held == 0
    async with Pool(engine="private", interpreters=2, spin_us=0) as pool:
        await pool.load(ModelSpec(name="double", path=str(model_dir(DOUBLE))))
        await _lone(pool, 3 * LONE_RUN)
        assert pool.placement is None
        assert os.sched_getaffinity(0) == os.sched_getaffinity(pool._started.thread_ids()[0])


async def test_a_pool_told_that_more_than_one_client_sends_never_holds(model_dir) -> None:  # type: ignore[no-untyped-def]
    clients = {"one": False}
    async with Pool(engine="private", interpreters=2, spin_us=0, colocate=True,
                    sole=lambda: clients["one"]) as pool:
        await pool.load(ModelSpec(name="double", path=str(model_dir(DOUBLE))))
        placement = pool.placement
        assert placement is not None
        await _lone(pool, 3 * LONE_RUN)
        assert placement.held == 0
        clients["one"] = True
        await _until_held(pool, LONE_RUN)
        clients["one"] = False  # a second client: spread at its first job
        await _lone(pool, 1)
        assert placement.cpu == -1


async def test_a_server_holds_for_one_connection_and_spreads_for_a_second(start_server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import aiohttp

    from ..server.conftest import write_repository
    from ..server.test_loops import add_body

    everyone = os.sched_getaffinity(0)
    # nothing polls (a server measures whether polling pays, and polls while it measures)
    server, url = await start_server(write_repository(tmp_path / "repo"), loops=0, spin_us=0)
    [pool] = server.plane.registry.pools.values()
    placement = pool.placement
    assert placement is not None
    body = add_body([[1, 2, 3, 4]], [[4, 3, 2, 1]])

    async def infer(session: aiohttp.ClientSession) -> None:
        async with session.post(f"{url}/v2/models/add/infer", json=body) as r:
            assert r.status == 200, await r.text()

    async with aiohttp.ClientSession() as one, aiohttp.ClientSession() as two:
        for _ in range(16 * LONE_RUN):  # one connection, one request at a time
            await infer(one)
            if placement.cpu >= 0:
                break
        assert placement.cpu >= 0
        assert os.sched_getaffinity(threading.get_native_id()) == {placement.cpu}  # the loop's thread
        await infer(two)  # another connection: not one client any more
        assert placement.cpu == -1
        assert os.sched_getaffinity(threading.get_native_id()) == everyone
        for _ in range(3 * LONE_RUN):  # the two by turns: never one client
            await infer(one)
            await infer(two)
        assert placement.cpu == -1
