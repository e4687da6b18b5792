"""Every error answers its status and message, in JSON or msgpack, and the server goes on serving."""

from __future__ import annotations

import asyncio
import pathlib

import aiohttp
import msgpack
import numpy as np

from ..conftest import until
from .conftest import MODELS, write_repository
from .test_infer import add_inputs


def slow_body(ms: float, **parameters: object) -> dict:
    body: dict = {"inputs": [{"name": "MS", "datatype": "FP32", "shape": [1], "data": [ms]}]}
    if parameters:
        body["parameters"] = parameters
    return body


async def gauge_until(http: aiohttp.ClientSession, url: str, model: str, name: str, want: float,
                      timeout: float = 30.0) -> None:
    """Scrape /metrics until the model's gauge `name` reads `want` (polling observable state)."""
    prefix = f'{name}{{model="{model}",'

    async def reads_want() -> bool:
        async with http.get(f"{url}/metrics") as r:
            lines = [line for line in (await r.text()).splitlines() if line.startswith(prefix)]
        return bool(lines) and float(lines[0].rsplit(" ", 1)[1]) == want

    await until(reads_want, timeout=timeout, what=f"{name} of {model} to be {want}", every=0.002)


async def still_serving(http: aiohttp.ClientSession, url: str) -> None:
    a = np.arange(4, dtype=np.int32).reshape(1, 4)
    async with http.post(f"{url}/v2/models/add/infer", json={"inputs": add_inputs(a, a)}) as r:
        assert r.status == 200
        assert (await r.json())["outputs"][0]["data"] == (2 * a).ravel().tolist()


async def test_invalid_input_400(base_url: str, http: aiohttp.ClientSession) -> None:
    a = np.zeros((1, 4), np.int32)
    cases = [
        ({"inputs": [{"name": "A", "datatype": "INT32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}, "B"),
        ({"inputs": add_inputs(a, np.zeros((1, 3), np.int32))}, "shape"),
        ({"inputs": add_inputs(np.zeros((9, 4), np.int32), np.zeros((9, 4), np.int32))}, "9"),  # > max_batch_size 8
    ]
    for body, word in cases:
        async with http.post(f"{base_url}/v2/models/add/infer", json=body) as r:
            assert r.status == 400, await r.text()
            assert word in (await r.json())["error"]
    async with http.post(f"{base_url}/v2/models/add/infer", data=b"{not json",
                         headers={"Content-Type": "application/json"}) as r:
        assert r.status == 400 and "malformed JSON" in (await r.json())["error"]
    async with http.post(f"{base_url}/v2/models/add/infer", data=b"{}",
                         headers={"Inference-Header-Content-Length": "many"}) as r:
        assert r.status == 400 and "Inference-Header-Content-Length" in (await r.json())["error"]
    # msgpack clients get msgpack errors
    async with http.post(f"{base_url}/v2/models/add/infer", data=msgpack.packb({"inputs": 3}),
                         headers={"Content-Type": "application/msgpack"}) as r:
        assert r.status == 400 and r.content_type == "application/msgpack"
        assert "inputs" in msgpack.unpackb(await r.read())["error"]
    await still_serving(http, base_url)


async def test_model_error_500(base_url: str, http: aiohttp.ClientSession) -> None:
    a = np.array([[-999, 0, 0, 0]], np.int32)
    async with http.post(f"{base_url}/v2/models/add/infer", json={"inputs": add_inputs(a, a)}) as r:
        assert r.status == 500
        assert "A starts with -999" in (await r.json())["error"]
    await still_serving(http, base_url)


async def test_model_error_in_a_batch_fails_only_its_request(base_url: str, http: aiohttp.ClientSession) -> None:
    async def call(first: int) -> tuple[int, dict]:
        a = np.array([[first, 1, 2, 3]], np.int32)
        async with http.post(f"{base_url}/v2/models/add/infer", json={"inputs": add_inputs(a, a)}) as r:
            return r.status, await r.json()

    results = await asyncio.gather(*(call(-999 if i == 17 else i) for i in range(40)))
    for i, (status, body) in enumerate(results):
        if i == 17:
            assert status == 500 and "-999" in body["error"]
        else:
            assert status == 200 and body["outputs"][0]["data"] == [2 * i, 2, 4, 6]


async def test_body_too_large_413(start_server, repository: pathlib.Path, http: aiohttp.ClientSession) -> None:
    _, url = await start_server(repository, max_body_bytes=1000)
    a = np.zeros((8, 4), np.int32)
    async with http.post(f"{url}/v2/models/add/infer", json={"inputs": add_inputs(a, a)} | {"pad": "x" * 2000}) as r:
        assert r.status == 413
        assert "1000 bytes" in (await r.json())["error"]
    await still_serving(http, url)


async def test_timeout_504_and_overload_503(base_url: str, http: aiohttp.ClientSession) -> None:
    # the request's timeout (microseconds) lowers the model's 5 s: 504 while its model is busy
    async with http.post(f"{base_url}/v2/models/slow/infer", json=slow_body(300, timeout=50_000)) as r:
        assert r.status == 504, await r.text()
        assert "timed out" in (await r.json())["error"]

    async def call(ms: float) -> aiohttp.ClientResponse:
        r = await http.post(f"{base_url}/v2/models/slow/infer", json=slow_body(ms))
        await r.read()
        return r

    # the timed-out request still holds the interpreter; the next one waits for it, then runs
    assert (await call(1)).status == 200

    # one runs, two wait (max_queue_size 2): the next ones are refused with Retry-After. Each
    # step waits for the state /metrics shows; the running request (1 s) outlasts the steps.
    running = asyncio.ensure_future(call(1000))
    await gauge_until(http, base_url, "slow", "aserve_batches_in_flight", 1)
    waiting = [asyncio.ensure_future(call(1)) for _ in range(2)]
    await gauge_until(http, base_url, "slow", "aserve_queue_requests", 2)
    refused = await call(1)
    assert not running.done(), "the running request ended before the queue could be seen full"
    assert refused.status == 503 and refused.headers["Retry-After"] in ("1", "2")  # 1 s, half of them one more
    assert "max_queue_size 2" in (await refused.json())["error"]
    assert (await running).status == 200
    assert [(await w).status for w in waiting] == [200, 200]
    async with http.post(f"{base_url}/v2/models/slow/infer", json=slow_body(1)) as r:
        assert r.status == 200 and (await r.json())["outputs"][0]["data"] == [1.0]


async def test_broken_model_is_unavailable_others_serve(start_server, tmp_path: pathlib.Path,
                                                        http: aiohttp.ClientSession) -> None:
    repo = write_repository(tmp_path / "repo", {
        "add": MODELS["add"],
        "badconfig": (MODELS["add"][0], "max_batch_size = 'eight'\n"),
        "badcode": ("raise RuntimeError('cannot import me')\n", ""),
    })
    _, url = await start_server(repo)
    async with http.get(f"{url}/v2/health/ready") as r:
        assert r.status == 503 and (await r.json())["ready"] is False
    async with http.post(f"{url}/v2/repository/index") as r:
        index = {row["name"]: row for row in await r.json()}
    assert index["add"]["state"] == "READY"
    assert index["badconfig"]["state"] == "UNAVAILABLE"
    assert "badconfig/config.toml: max_batch_size: Expected `int`, got `str`" in index["badconfig"]["reason"]
    assert index["badcode"]["state"] == "UNAVAILABLE" and "cannot import me" in index["badcode"]["reason"]
    async with http.get(f"{url}/v2/models/badcode/ready") as r:
        assert r.status == 503
    async with http.post(f"{url}/v2/models/badcode/infer", json={"inputs": []}) as r:
        assert r.status == 503 and "cannot import me" in (await r.json())["error"]
    await still_serving(http, url)


def test_retry_after_is_whole_seconds_spread_over_two() -> None:
    # clients refused together (a burst) are told to come back over two seconds, not all at once
    from aserve.server.errors import retry_after

    assert {retry_after(0.02) for _ in range(200)} == {"1", "2"}
    assert {retry_after(2.2) for _ in range(200)} == {"3", "4"}


def test_an_overload_refusal_tells_the_connection_how_to_hold_its_client() -> None:
    """The 503 of an Overloaded carries, for the connection that may hold its client, the wait
    the server expects, the budget it was refused for and the rate the model admits."""
    from aserve.errors import Overloaded
    from aserve.server.errors import ErrorPolicy, from_exception
    from aserve.server.http import Request

    request = Request("POST", "/v2/models/m/infer", "1.1", {"content-type": "application/json"})
    response = from_exception(request, Overloaded("busy", retry_after=0.3, budget=0.05, rate=120.0), ErrorPolicy())
    assert (response.status, response.hold, response.budget, response.rate) == (503, 0.3, 0.05, 120.0)
    assert response.headers["Retry-After"] in ("1", "2")
    response = from_exception(request, Overloaded("queue full"), ErrorPolicy())
    assert (response.hold, response.budget, response.rate) == (1.0, None, None)
