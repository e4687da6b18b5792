"""Waiting for the server a load test started: ready, or gone (beside the scripts that import it)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import aiohttp


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
