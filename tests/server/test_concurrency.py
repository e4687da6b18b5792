"""Many concurrent clients on window-policy models: every answer is 200 and correct.

The server runs on the loop the test runs on (uvloop, as `aserve serve` does, and
asyncio). Windows of a few milliseconds and of less than one put timers at deadlines
under a millisecond away, where uvloop's handles cannot tell their time.
"""

from __future__ import annotations

import asyncio
import pathlib
import sys

import aiohttp
import numpy as np
import pytest

from .conftest import ADD_CONFIG, ADD_MODEL, write_repository

ENGINES = ["main", "private"] + (["subinterp"] if sys.version_info >= (3, 12) else [])


# ADD_MODEL with a batch that takes about a millisecond, so that batches overlap arrivals:
# while one runs and an interpreter is free, the window policy arms its timer.
TIMED_ADD_MODEL = ADD_MODEL.replace("from array import array", "import time\nfrom array import array").replace(
    "        a = inputs", "        time.sleep(0.001)\n        a = inputs", 1)


def add_config(delay_ms: float, max_batch_size: int = 8) -> str:
    return ADD_CONFIG.replace("max_queue_delay_ms = 2.0", f"max_queue_delay_ms = {delay_ms}").replace(
        "max_batch_size = 8", f"max_batch_size = {max_batch_size}"
    )


def binary_body(a: np.ndarray, b: np.ndarray) -> tuple[bytes, dict[str, str]]:
    import json

    rows = a.shape[0]
    header = json.dumps({
        "inputs": [
            {"name": "A", "datatype": "INT32", "shape": [rows, 4], "parameters": {"binary_data_size": a.nbytes}},
            {"name": "B", "datatype": "INT32", "shape": [rows, 4], "parameters": {"binary_data_size": b.nbytes}},
        ],
        "parameters": {"binary_data_output": True},
    }).encode()
    return header + a.tobytes() + b.tobytes(), {
        "Inference-Header-Content-Length": str(len(header)), "Content-Type": "application/octet-stream",
    }


@pytest.mark.parametrize("engine", ENGINES)
async def test_every_concurrent_request_is_answered_correctly(
    start_server, tmp_path: pathlib.Path, engine: str
) -> None:
    models = {
        "window2ms": (TIMED_ADD_MODEL, add_config(2.0)),
        "window300us": (TIMED_ADD_MODEL, add_config(0.3, max_batch_size=16)),
    }
    _, url = await start_server(write_repository(tmp_path / "repo", models), engine=engine, interpreters=2)
    per_client, clients = 40, 48
    failures: list[str] = []

    async def client(http: aiohttp.ClientSession, model: str, c: int) -> int:
        ok = 0
        for i in range(per_client):
            rows = 1 + (c + i) % 3
            a = np.arange(rows * 4, dtype=np.int32).reshape(rows, 4) + 1000 * c + 10 * i
            b = np.full((rows, 4), c - i, dtype=np.int32)
            if i % 2:
                body, headers = binary_body(a, b)
                async with http.post(f"{url}/v2/models/{model}/infer", data=body, headers=headers) as r:
                    raw = await r.read()
                    if r.status != 200:
                        failures.append(f"{r.status} {raw[:200]!r}")
                        continue
                    length = int(r.headers["Inference-Header-Content-Length"])
                    blob = raw[length:]
                    got_sum = np.frombuffer(blob[: a.nbytes], np.int32).reshape(rows, 4)
                    got_diff = np.frombuffer(blob[a.nbytes:], np.int32).reshape(rows, 4)
            else:
                body_json = {"inputs": [
                    {"name": "A", "datatype": "INT32", "shape": [rows, 4], "data": a.ravel().tolist()},
                    {"name": "B", "datatype": "INT32", "shape": [rows, 4], "data": b.ravel().tolist()},
                ]}
                async with http.post(f"{url}/v2/models/{model}/infer", json=body_json) as r:
                    if r.status != 200:
                        failures.append(f"{r.status} {await r.text()}")
                        continue
                    outputs = {o["name"]: o for o in (await r.json())["outputs"]}
                    got_sum = np.array(outputs["SUM"]["data"], np.int32).reshape(rows, 4)
                    got_diff = np.array(outputs["DIFF"]["data"], np.int32).reshape(rows, 4)
            if not (np.array_equal(got_sum, a + b) and np.array_equal(got_diff, a - b)):
                failures.append(f"wrong answer for client {c} request {i}")
                continue
            ok += 1
        return ok

    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector) as http:
        answered = await asyncio.gather(*(client(http, m, c) for c in range(clients // 2)
                                          for m in models))
    assert failures == []
    assert sum(answered) == clients * per_client
