"""Layer-level joining through the server: requests arriving while a staged batch runs join it,
on the host's loop (its batcher decides) and on the front loops (the pool decides, in C, for
the requests of every loop in one queue), and each answer comes from the loop that read it."""

from __future__ import annotations

import asyncio
import pathlib
import re

import aiohttp
import pytest

from ..conftest import STAGED_MODEL, until
from .conftest import write_repository
from .test_metrics import scrape

STAGED_CONFIG = """
interpreters = 1
max_batch_size = 8
[parameters]
delay = 0.07
[batching]
policy = "adaptive"
latency_budget_ms = 2000.0
layer_join = {join}
"""


def expected(values: list[float]) -> list[float]:
    out = []
    for x in values:
        for k in range(3):
            x = 2 * x + k
        out.append(x)
    return out


async def infer(http: aiohttp.ClientSession, url: str, values: list[float]) -> list[float]:
    body = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [len(values) // 4, 4], "data": values}]}
    async with http.post(f"{url}/v2/models/staged/infer", json=body) as r:
        assert r.status == 200, await r.text()
        data: list[float] = (await r.json())["outputs"][0]["data"]
        return data


async def metric(http: aiohttp.ClientSession, url: str, name: str) -> float:
    async with http.get(f"{url}/metrics") as r:
        text = await r.text()
    m = re.search(rf'^{name}\{{model="staged",version="1"\}} (\S+)$', text, re.MULTILINE)
    return float(m.group(1)) if m else 0.0


@pytest.mark.parametrize("join", [True, False])
async def test_requests_join_a_running_batch_and_get_their_own_answers(
    start_server, http: aiohttp.ClientSession, tmp_path: pathlib.Path, join: bool, loops: int
) -> None:
    repo = write_repository(tmp_path / "repo", {"staged": (STAGED_MODEL, STAGED_CONFIG.format(join=str(join).lower()))})
    server, url = await start_server(repo, engine="private", interpreters=1)
    async with http.get(f"{url}/v2/models/staged") as r:
        params = (await r.json())["parameters"]
    assert params["stages"] == 3
    assert params["batching"]["layer_join"] is join
    if join:
        assert len(params["batching"]["stage_profile"]["shares"]) == 3

    payloads = [[float(i) + j / 4 for j in range(4)] * (1 + i % 2) for i in range(6)]

    # the first request's batch runs (3 stages of 70 ms) on the only interpreter; the others
    # are sent once the pool runs it, so that they arrive while it runs its stages (they are
    # offered to a batch that runs, not to one still waiting for the interpreter)
    first = asyncio.ensure_future(infer(http, url, payloads[0]))
    pools = list(server.plane.registry.pools.values())
    await until(lambda: first.done() or any(pool.running_jobs() for pool in pools), what="the first batch to run")
    assert not first.done(), "the first batch ended before it was seen running"
    results = await asyncio.gather(first, *(infer(http, url, p) for p in payloads[1:]))
    for values, got in zip(payloads, results):
        assert got == pytest.approx(expected(values))
    joins = await metric(http, url, "aserve_layer_joins_total")
    if join:
        assert joins >= 1
        assert await metric(http, url, "aserve_layer_joined_requests_total") >= joins
    else:
        assert joins == 0
    # who answered: the loop that read each request; on fronts, the pool's Plan joined them
    m = await scrape(http, url)
    by_loop = {s.labels["loop"]: s.value for s in m.samples("aserve_event_loop_infer_requests_total", protocol="http")}
    if loops:
        assert by_loop.get("host", 0) == 0 and sum(by_loop.values()) == len(payloads), by_loop
        (handle,) = server.plane.registry.routes["staged"].versions.values()
        assert handle.batcher.stats().get("joins", 0) == 0  # the host's batcher joined nothing
        assert handle.plan.as_dict(0.0).get("join", {"joins": 0})["joins"] == joins



async def test_a_request_that_fails_the_batch_it_joined_fails_alone(
    start_server, http: aiohttp.ClientSession, tmp_path: pathlib.Path, loops: int
) -> None:
    """A request whose values make the model fail joins a running batch: that batch fails, each
    of its requests runs again alone, and only the culprit's answer is an error."""
    config = STAGED_CONFIG.format(join="true").replace("delay = 0.07\n", "delay = 0.07\nfail_on = 13.0\n")
    repo = write_repository(tmp_path / "repo", {"staged": (STAGED_MODEL, config)})
    server, url = await start_server(repo, engine="private", interpreters=1)
    payloads = [[float(i) + j / 4 for j in range(4)] for i in range(5)]
    payloads[3] = [13.0, 1.0, 2.0, 3.0]

    async def post(values: list[float]) -> tuple[int, object]:
        body = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4], "data": values}]}
        async with http.post(f"{url}/v2/models/staged/infer", json=body) as r:
            return r.status, await r.json()

    first = asyncio.ensure_future(post(payloads[0]))
    pools = list(server.plane.registry.pools.values())
    await until(lambda: first.done() or any(pool.running_jobs() for pool in pools), what="the first batch to run")
    results = await asyncio.gather(first, *(post(p) for p in payloads[1:]))
    for k, (values, (status, body)) in enumerate(zip(payloads, results)):
        if k == 3:
            assert status >= 400 and "refuses 13.0" in str(body), (status, body)
        else:
            assert status == 200, body
            assert body["outputs"][0]["data"] == pytest.approx(expected(values))  # type: ignore[index]
