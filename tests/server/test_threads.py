"""CPU per event loop and per interpreter, from the threads' names: `server/threads.py` on a
/proc of its own making, and the /metrics families of a real server with two front loops;
and how often an interpreter's thread sleeps per request."""

from __future__ import annotations

import os
import pathlib

import aiohttp
import pytest

from aserve.server.threads import ThreadCpu

from .conftest import write_repository
from .test_loops import infer
from .test_metrics import scrape, value

TICKS = os.sysconf("SC_CLK_TCK")


def _thread(proc: pathlib.Path, pid: int, tid: int, name: str, seconds: float) -> None:
    task = proc / str(pid) / "task" / str(tid)
    task.mkdir(parents=True, exist_ok=True)
    ticks = round(seconds * TICKS)
    # utime and stime are fields 14 and 15; a name may hold spaces and parentheses
    (task / "stat").write_text(f"{tid} ({name}) S 1 1 1 0 -1 0 0 0 0 0 {ticks} {ticks} 0 0 20 0 1 0\n")


def test_cpu_is_summed_per_loop_and_interpreter_and_never_falls(tmp_path: pathlib.Path) -> None:
    pid = 100
    _thread(tmp_path, pid, 100, "python (main)", 1.0)  # the main thread is the host's loop, whatever its name
    _thread(tmp_path, pid, 101, "aserve-loop0", 2.0)
    _thread(tmp_path, pid, 102, "aserve-priv1", 3.0)
    _thread(tmp_path, pid, 103, "aserve-priv1", 0.5)  # a thread its model started took its name
    _thread(tmp_path, pid, 104, "aserve-subi0", 0.25)
    _thread(tmp_path, pid, 105, "event_engine", 9.0)  # gRPC's: no loop, no interpreter
    cpu = ThreadCpu(pid, proc=str(tmp_path))
    assert cpu.sample() == {("loop", "host"): 2.0, ("loop", "0"): 4.0, ("interpreter", "private", "1"): 7.0,
                            ("interpreter", "subinterp", "0"): 0.5}
    # the model's thread ends; the interpreter's own thread goes on: what the ended one had spent stays
    for f in (tmp_path / str(pid) / "task" / "103").iterdir():
        f.unlink()
    (tmp_path / str(pid) / "task" / "103").rmdir()
    _thread(tmp_path, pid, 102, "aserve-priv1", 3.5)
    assert cpu.sample()[("interpreter", "private", "1")] == 8.0
    assert cpu.sample()[("interpreter", "private", "1")] == 8.0  # counted once
    assert ThreadCpu(pid, proc=str(tmp_path / "absent")).sample() == {}


async def test_metrics_give_each_loops_and_interpreters_cpu(start_server, tmp_path: pathlib.Path) -> None:  # type: ignore[no-untyped-def]
    server, url = await start_server(write_repository(tmp_path / "repo"), loops=2)
    sessions = [aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) for _ in range(4)]
    try:
        for i, session in enumerate(sessions):  # four connections: two on each front
            for k in range(20):
                await infer(session, url, 100 * i + k)
        async with aiohttp.ClientSession() as http:
            first = await scrape(http, url)
            for k in range(20):
                await infer(sessions[0], url, k)
            second = await scrape(http, url)
    finally:
        for session in sessions:
            await session.close()
    loops = {loop: value(second, "aserve_event_loop_cpu_seconds_total", loop=loop) for loop in ("host", "0", "1")}
    assert all(seconds > 0 for seconds in loops.values()), loops
    interpreters = second.samples("aserve_interpreter_cpu_seconds_total", engine="main")
    assert sorted(s.labels["interpreter"] for s in interpreters) == ["0", "1"]  # the tests' engine: main, 2
    for loop in ("host", "0", "1"):
        assert value(second, "aserve_event_loop_cpu_seconds_total", loop=loop) >= \
            value(first, "aserve_event_loop_cpu_seconds_total", loop=loop)
    assert server.loops.serving == 2


def _sleeps(name: str) -> int:
    """Times the process's threads of that name slept, all told (voluntary context switches)."""
    total = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().strip() != name:
                    continue
            with open(f"/proc/self/task/{tid}/status") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt_switches:"))
        except OSError:  # the thread ended
            continue
    return total


@pytest.mark.serial  # a request that comes later than the interpreter's linger costs it one more sleep
async def test_an_interpreter_sleeps_once_per_request_at_one_connection(start_server, tmp_path: pathlib.Path) -> None:  # type: ignore[no-untyped-def]
    """One request after another: the interpreter wakes for each batch, and not once more for
    the outputs the loop gives back after answering (it frees them when it next wakes). Without
    polling (`spin_us=0`): a polling interpreter also naps toward the next request's expected
    time and may wait for the pool's lock as it stops polling, sleeps of its own that would
    blur the count (about two per request on a fast VM)."""
    server, url = await start_server(write_repository(tmp_path / "repo"), engine="private", interpreters=1,
                                     spin_us=0)
    assert server.plane.model("add").pool.engine == "private"
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as session:
        for k in range(5):
            await infer(session, url, k)
        before = _sleeps("aserve-priv0")
        n = 60
        for k in range(n):
            await infer(session, url, k)
        slept = _sleeps("aserve-priv0") - before
    # one sleep per request, and a few more where a request came later than the linger; a
    # wake-up for each give-back too would make it about two per request
    assert slept < 1.35 * n, f"the interpreter slept {slept} times for {n} requests"
