"""A model batched by the adaptive policy, served alike on the host's loop (the Python policy)
and on front loops, where each front reads and answers its requests itself, the pool batches
every loop's requests of the model by the policy in C (`_native.Plan`), the fronts' admission
asks that policy, and what /metrics shows of the policy is the Plan's (its arrival rate, its
refined cost model)."""

from __future__ import annotations

import asyncio
import json
import pathlib
from typing import Any

import aiohttp
import pytest

from .conftest import write_repository
from .test_head_refusals import GATE_MODEL, TENSORS
from .test_metrics import Scrape, scrape, scrape_until, value

pytestmark = pytest.mark.serial  # a gate holds the one interpreter while requests gather

CONFIG = '''
interpreters = 1
max_batch_size = {max_batch_size}
{tensors}
[parameters]
gate = "{gate}"
delay_ms = {delay}
[batching]
policy = "adaptive"
latency_budget_ms = {budget}
timeout_ms = 5000
'''


def repository(root: pathlib.Path, gate: pathlib.Path, *, delay: int, budget: int,
               max_batch_size: int = 8) -> pathlib.Path:
    return write_repository(root, {"gated": (GATE_MODEL, CONFIG.format(
        tensors=TENSORS, gate=gate, delay=delay, budget=budget, max_batch_size=max_batch_size))})


async def infer(url: str, x: float, **parameters: object) -> tuple[int, dict[str, object], dict[str, str]]:
    """One request on a connection of its own (new connections are spread over the fronts)."""
    message: dict[str, object] = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 1], "data": [x]}]}
    if parameters:
        message["parameters"] = parameters
    async with aiohttp.ClientSession() as http, http.post(
            f"{url}/v2/models/gated/infer", data=json.dumps(message),
            headers={"Content-Type": "application/json"}) as r:
        return r.status, await r.json(), dict(r.headers)


def answered_by_loop(m: Scrape) -> dict[str, float]:
    """HTTP infer requests answered by each event loop ("host", "0", "1")."""
    return {s.labels["loop"]: s.value for s in m.samples("aserve_event_loop_infer_requests_total", protocol="http")}


async def test_the_requests_waiting_on_every_front_go_in_one_batch_the_policy_chose(start_server, tmp_path,
                                                                                    loops) -> None:
    """Six requests read by two fronts wait while the one interpreter is held; once it frees,
    the adaptive policy in C takes all six in one batch (batching pays on a model whose cost
    is the same at any size), and every answer comes from the loop that read the request."""
    gate = tmp_path / "gate"
    _, url = await start_server(repository(tmp_path / "repo", gate, delay=20, budget=2000))
    labels = {"model": "gated", "version": "1"}
    async with aiohttp.ClientSession() as http:
        held = asyncio.ensure_future(infer(url, -1.0))
        await scrape_until(http, url, lambda m: value(m, "aserve_batches_in_flight", **labels) == 1,
                           what="the held request to run")
        waiting = [asyncio.ensure_future(infer(url, float(x))) for x in range(1, 7)]
        await scrape_until(http, url, lambda m: value(m, "aserve_queue_requests", **labels) == 6,
                           what="six requests to wait in the pool's queue")
        gate.touch()
        answers = await asyncio.gather(held, *waiting)
        assert [a[0] for a in answers] == [200] * 7
        assert [a[1]["outputs"][0]["data"] for a in answers] == [[-2.0], *[[2.0 * x] for x in range(1, 7)]]
        m = await scrape(http, url)
    assert value(m, "aserve_inference_exec_count_total", **labels) == 2  # the held one, then the six together
    if loops:
        by_loop = answered_by_loop(m)
        assert by_loop.get("host", 0) == 0 and sum(by_loop.values()) == 7, by_loop
    # the Plan's state, not the host's idle policy: it counted the arrivals and refined the curve
    assert value(m, "aserve_arrival_rate_samples_per_second", **labels) > 0
    assert value(m, "aserve_cost_model_observations_total", **labels) >= 2


@pytest.mark.parametrize("max_batch_size", [8, 0])
async def test_a_front_refuses_what_the_policy_predicts_late_and_names_the_budget(start_server, tmp_path,
                                                                                  loops, max_batch_size) -> None:
    """Batches of 50 ms against a 20 ms budget: while one runs, a request that would wait is
    refused on the front by the policy's admission (503, Retry-After), counted once; a request
    whose own budget allows the wait is admitted. A model that does not batch (max_batch_size
    0) is admitted by its Plan on the fronts too."""
    gate = tmp_path / "gate"
    _, url = await start_server(repository(tmp_path / "repo", gate, delay=50, budget=20,
                                           max_batch_size=max_batch_size))
    labels = {"model": "gated", "version": "1"}
    async with aiohttp.ClientSession() as http:
        held = asyncio.ensure_future(infer(url, -1.0))
        await scrape_until(http, url, lambda m: value(m, "aserve_batches_in_flight", **labels) == 1,
                           what="the held request to run")
        status, body, headers = await infer(url, 1.0)
        assert status == 503, body
        assert "latency budget" in str(body["error"]) and float(headers["Retry-After"]) > 0
        patient = asyncio.ensure_future(infer(url, 2.0, latency_budget_ms=4000))
        await scrape_until(http, url, lambda m: value(m, "aserve_queue_requests", **labels) == 1,
                           what="the patient request to wait")
        gate.touch()
        assert (await held)[0] == 200
        status, body, _ = await patient
        assert status == 200 and body["outputs"][0]["data"] == [4.0]
        m = await scrape(http, url)
    assert value(m, "aserve_inference_refused_total", **labels) == 1
    if loops:
        assert answered_by_loop(m).get("host", 0) == 0


@pytest.fixture
async def otlp_port() -> Any:
    """A real OTLP/HTTP receiver on loopback, its port; set up before a server the test starts,
    so that it still receives what the server exports as it closes."""
    from ..peers import Receiver

    async with Receiver().serving() as port:
        yield port


async def test_a_traced_request_is_admitted_by_the_same_policy(otlp_port: int, start_server, tmp_path, loops,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """With every request sampled for tracing, a front batches the model's requests apart (their
    batches carry the span context), yet the same adaptive policy counts their batches and
    admits them: one that would wait past its budget behind a running batch, read by either
    front, is refused, counted in the same arrival rate."""
    gate = tmp_path / "gate"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{otlp_port}")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_on")
    server, url = await start_server(repository(tmp_path / "repo", gate, delay=50, budget=20))
    assert server.plane.tracer is not None
    labels = {"model": "gated", "version": "1"}
    async with aiohttp.ClientSession() as http:
        held = asyncio.ensure_future(infer(url, -1.0))
        await scrape_until(http, url, lambda m: value(m, "aserve_batches_in_flight", **labels) == 1,
                           what="the held request to run")
        for x in (1.0, 2.0):  # new connections, spread over the fronts
            status, body, headers = await infer(url, x)
            assert status == 503 and "latency budget" in str(body["error"]), body
            assert float(headers["Retry-After"]) > 0
        gate.touch()
        assert (await held)[0] == 200
        m = await scrape(http, url)
    assert value(m, "aserve_inference_refused_total", **labels) == 2
    assert value(m, "aserve_arrival_rate_samples_per_second", **labels) > 0
