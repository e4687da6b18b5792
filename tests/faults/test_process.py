"""What cannot be contained in the process: a stuck interpreter at shutdown, a segfault.

These tests spawn `aserve serve` from the test's loop, which must be asyncio's: uvloop's
child side of a spawn crashes a process that holds PEP 684 subinterpreters
(MagicStack/uvloop#650), and earlier tests leave some parked in this one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pathlib
import signal
import sys
from collections.abc import AsyncIterator

import aiohttp
import pytest

from ..conftest import free_port, spawns, until, wait_ready
from .conftest import ENGINES, PAUSE, SEGFAULT, call_faulty, call_ok, metrics


class Spawned:
    """A spawned `aserve serve` and what it wrote on stderr so far."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.stderr = ""
        self._reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        assert self.proc.stderr is not None
        while line := await self.proc.stderr.readline():
            self.stderr += line.decode(errors="replace")

    async def wrote(self, text: str, timeout: float = 60.0) -> None:
        """Wait until stderr holds `text` (the process may have exited)."""

        def said() -> bool:
            if text not in self.stderr and self._reader.done():
                raise AssertionError(f"stderr never said {text!r}; it said:\n{self.stderr}")
            return text in self.stderr

        try:
            await until(said, timeout=timeout, what=f"stderr to say {text!r}", every=0.02)
        except AssertionError as e:
            raise AssertionError(f"{e}; it said:\n{self.stderr}") from None

    async def ready(self, http: aiohttp.ClientSession, url: str) -> None:
        await wait_ready(http, url, self.proc, log=lambda: self.stderr)


@contextlib.asynccontextmanager
async def serve(repository: pathlib.Path, port: int, *args: str) -> AsyncIterator[Spawned]:
    env = dict(os.environ, ASERVE_LOG_LEVEL="info")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "aserve.cli", "serve", str(repository), "--interpreters", "2", "--port", str(port),
        *args, env=env, stderr=asyncio.subprocess.PIPE,
    )
    spawned = Spawned(proc)
    try:
        yield spawned
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
        await spawned._reader


@spawns
@pytest.mark.parametrize("engine", ENGINES)
async def test_sigterm_exits_within_the_shutdown_timeout_with_a_stuck_interpreter(engine, repository) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    async with serve(repository, port, "--engine", engine, "--shutdown-timeout", "2") as server, \
            aiohttp.ClientSession() as http:
        await server.ready(http, url)
        stuck = asyncio.ensure_future(call_faulty(http, url, PAUSE))  # its timeout (30 s) outlasts the shutdown

        async def running() -> bool:
            return (await metrics(http, url)).get('aserve_batches_in_flight{model="faulty",version="1"}') == 1

        await until(running, what="the batch to start", every=0.01)
        loop = asyncio.get_running_loop()
        began = loop.time()
        server.proc.send_signal(signal.SIGTERM)
        status = await asyncio.wait_for(server.proc.wait(), 60)
        took = loop.time() - began
        with contextlib.suppress(aiohttp.ClientError):
            await stuck
        await server._reader
        assert status == 1, server.stderr
        assert took < 2 + 10, f"exited {took:.1f} s after SIGTERM"
        assert ("exiting now (status 1): shutdown did not finish within --shutdown-timeout 2 s; still running: "
                f"interpreter 0 of the {engine} pool: model faulty version 1") in server.stderr, server.stderr


@spawns
@pytest.mark.parametrize("engine", ENGINES)
async def test_segfault_is_reported_and_the_supervisor_restarts_the_server(engine, repository) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    async with serve(repository, port, "--engine", engine, "--supervise") as supervisor, \
            aiohttp.ClientSession() as http:
        await supervisor.ready(http, url)
        await supervisor.wrote(") is ready:")  # the supervisor saw it ready: this start counts as a success
        assert await call_ok(http, url, 1) == (200, 2)
        with pytest.raises(aiohttp.ClientError):  # the server dies with the request
            await call_faulty(http, url, SEGFAULT)
        await supervisor.wrote("restarting it in")
        report = supervisor.stderr
        assert ("aserve: fatal signal SIGSEGV (segmentation fault) in interpreter 0 (engine "
                f'{engine}), running a batch of model "faulty" version 1 (pool key faulty/1)') in report, report
        assert "Stack (most recent call first):" in report
        stack = report.split("Stack (most recent call first):", 1)[1]
        assert f'File "{repository / "faulty" / "model.py"}", line 28 in __call__' in stack, report
        assert "was killed by SIGSEGV (11); it had been ready for" in report

        await supervisor.ready(http, url)  # a new server
        assert await call_ok(http, url, 5) == (200, 6)
        assert (await call_faulty(http, url, 0))[0] == 200

        supervisor.proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(supervisor.proc.wait(), 120) == 0
        await supervisor._reader
        assert "passing SIGTERM on to the server" in supervisor.stderr
        assert "exited with status 0 after SIGTERM; stopping" in supervisor.stderr, supervisor.stderr
