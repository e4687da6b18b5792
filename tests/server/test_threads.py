"""CPU per event loop and per interpreter, from the threads' names: `server/threads.py` on a
/proc of its own making, and the /metrics families of a real server with two front loops."""

from __future__ import annotations

import os
import pathlib

import aiohttp

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
