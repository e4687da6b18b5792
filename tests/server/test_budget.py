"""Latency budgets: the model metadata shows the adaptive policy's budget and cost model;
a request may carry its own `parameters.latency_budget_ms`, within (0, the model's timeout]."""

from __future__ import annotations

import pathlib
import time
from collections.abc import Sequence

import aiohttp
import msgpack
import numpy as np
import pytest

from aserve.batching import WindowPolicy
from aserve.batching.policy import Decision, Pending

from .test_infer import add_inputs
from .test_metrics import adaptive_repository

pytestmark = pytest.mark.serial  # timed against the CPU it gets: run alone (pyproject's markers)


@pytest.fixture
async def server_url(start_server, tmp_path: pathlib.Path):
    return await start_server(adaptive_repository(tmp_path / "repo"))


def body(rows: int = 1, **parameters: object) -> dict:
    a = np.arange(rows * 4, dtype=np.int32).reshape(rows, 4)
    out: dict = {"inputs": add_inputs(a, a)}
    if parameters:
        out["parameters"] = parameters
    return out


async def test_metadata_shows_budget_and_cost_model(server_url, http: aiohttp.ClientSession) -> None:
    _, url = server_url
    async with http.get(f"{url}/v2/models/fast") as r:
        assert r.status == 200
        params = (await r.json())["parameters"]
    batching = params["batching"]
    assert batching["policy"] == "adaptive" and params["batching_policy"] == "adaptive"
    assert batching["latency_budget_ms"] == pytest.approx(20.0)
    assert batching["timeout_ms"] == 2000.0
    assert batching["admission_reserve"] == pytest.approx(0.2)  # admits what ends within 16 of the 20 ms
    assert batching["arrival_rate_samples_per_s"] >= 0
    cost = batching["cost_model"]
    assert cost["form"] == "affine" and cost["max_batch_size"] == 8
    assert [p[0] for p in cost["points"]] == [1, 2, 4, 8]
    assert all(p[1] > 0 for p in cost["points"])
    assert 0 < cost["batch1_seconds"] < 1
    assert 1 <= cost["throughput_optimal_batch"] <= 8
    assert set(cost["params"]) == {"a", "c"}
    # msgpack clients get the same
    async with http.get(f"{url}/v2/models/fast", headers={"Accept": "application/msgpack"}) as r:
        packed = msgpack.unpackb(await r.read())["parameters"]["batching"]
    assert packed["cost_model"]["points"][0][0] == 1
    # a window-policy model: its settings, no budget or cost model
    async with http.get(f"{url}/v2/models/add") as r:
        window = (await r.json())["parameters"]["batching"]
    assert window == {"policy": "window", "max_queue_delay_ms": 2.0, "max_queue_size": 4096, "timeout_ms": 30000.0}


@pytest.mark.parametrize("bad", [0, -5, "fast", True, [10], 2000.5, 1e9])
async def test_bad_budget_is_400_naming_the_field(server_url, http: aiohttp.ClientSession, bad: object) -> None:
    _, url = server_url
    async with http.post(f"{url}/v2/models/fast/infer", json=body(latency_budget_ms=bad)) as r:
        assert r.status == 400, await r.text()
        error = (await r.json())["error"]
    assert "parameters.latency_budget_ms" in error and "(0, 2000]" in error and repr(bad) in error


async def test_bad_budget_over_msgpack_and_window_model(server_url, http: aiohttp.ClientSession) -> None:
    _, url = server_url
    async with http.post(f"{url}/v2/models/fast/infer", data=msgpack.packb(body(latency_budget_ms=-1)),
                         headers={"Content-Type": "application/msgpack"}) as r:
        assert r.status == 400
        assert "parameters.latency_budget_ms" in msgpack.unpackb(await r.read())["error"]
    # the window model's timeout is 30 s: the range follows each model's own timeout
    async with http.post(f"{url}/v2/models/add/infer", json=body(latency_budget_ms=30_001)) as r:
        assert r.status == 400 and "(0, 30000]" in (await r.json())["error"]


async def test_good_budgets_are_served(server_url, http: aiohttp.ClientSession) -> None:
    _, url = server_url
    for budget in (0.5, 5, 20, 150.0, 2000):  # tighter and looser than the model's 20 ms, up to its timeout
        async with http.post(f"{url}/v2/models/fast/infer", json=body(2, latency_budget_ms=budget)) as r:
            assert r.status == 200, await r.text()
            expected = (2 * np.arange(8, dtype=np.int32)).tolist()
            assert (await r.json())["outputs"][0]["data"] == expected


class _Seeing(WindowPolicy):
    """The window policy, also noting what it is shown of every request: (budget, queued
    at, seconds it waited in the server before)."""

    def __init__(self) -> None:
        super().__init__(max_queue_delay=0.001)
        self.seen: list[tuple[float | None, float, float]] = []

    def decide(self, now: float, queue: Sequence[Pending], *, idle: int, running: int,
               max_batch_size: int, queued: int | None = None) -> Decision:
        self.seen.extend((p.budget, p.arrival, p.waited) for p in queue)
        return super().decide(now, queue, idle=idle, running=running, max_batch_size=max_batch_size, queued=queued)


@pytest.mark.host_loop  # shown what the host's batcher sees
async def test_budget_reaches_the_batcher_in_seconds(server_url, http: aiohttp.ClientSession) -> None:
    server, url = server_url
    batcher = server.plane.registry.get("add").batcher
    seeing = _Seeing()
    batcher.policy = seeing
    async with http.post(f"{url}/v2/models/add/infer", json=body(latency_budget_ms=7.5)) as r:
        assert r.status == 200
    async with http.post(f"{url}/v2/models/add/infer", json=body()) as r:
        assert r.status == 200
    assert [budget for budget, _, _ in seeing.seen] == [pytest.approx(0.0075), None]


@pytest.mark.host_loop  # shown what the host's batcher sees
async def test_the_budget_counts_from_the_first_bytes_read(server_url, http: aiohttp.ClientSession) -> None:
    # the time a request spends in the server before it reaches the batcher (read, decoded,
    # behind other requests on the event loop) is passed on, so its budget counts it
    server, url = server_url
    batcher = server.plane.registry.get("add").batcher
    seeing = _Seeing()
    batcher.policy = seeing
    sent = time.monotonic()
    async with http.post(f"{url}/v2/models/add/infer", json=body(latency_budget_ms=7.5)) as r:
        assert r.status == 200
    [(_, queued, waited)] = seeing.seen
    assert waited > 0.0
    assert sent <= queued - waited <= queued <= time.monotonic()
