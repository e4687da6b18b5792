"""What the load tests (and the test suite) share about the server they start: a free port for it,
and waiting until it is ready, or gone. The scripts import it from beside them."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable

import aiohttp


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def wait_ready(session: aiohttp.ClientSession, url: str, exited: Callable[[], int | None], *,
                     timeout: float, every: float, output: Callable[[], str] = lambda: "") -> None:
    """Poll `url` until it answers 200; RuntimeError when `exited()` reports the server's exit
    status first, or after `timeout` seconds (with `output()`, the server's log)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        status = exited()
        if status is not None:
            raise RuntimeError(f"aserve serve exited with {status} before it was ready:\n{output()}")
        try:
            async with session.get(url) as r:
                if r.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(every)
    raise RuntimeError(f"{url} did not answer 200 within {timeout} s:\n{output()}")
