"""A hung model is cancelled when its requests time out; one stuck in native code is given up."""

from __future__ import annotations

import logging

import pytest

from aserve.engine import Pool

from ..conftest import until
from .conftest import ENGINES, PAUSE, SLEEP, SPIN, call_faulty, call_ok, metrics

LABELS = '{model="faulty",version="1"}'


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("act", [SPIN, SLEEP], ids=["spin", "sleep"])
async def test_hung_batch_is_cancelled_and_the_interpreter_answers_next(engine, act, repository, start_server,
                                                                        http) -> None:
    _, url = await start_server(repository, engine=engine, interpreters=2)
    status, answer = await call_faulty(http, url, act, timeout_us=300_000)
    assert status == 504, answer
    # faulty runs on interpreter 0 only: this answer comes from the interpreter the hang held
    status, answer = await call_faulty(http, url, 0)
    assert status == 200, answer
    seen = await metrics(http, url)
    assert seen[f"aserve_batch_cancelled_total{LABELS}"] == 1
    assert seen[f'aserve_pool_lost{{engine="{engine}"}}'] == 0
    assert seen['aserve_inference_request_failure_total{model="faulty",version="1",reason="timeout"}'] == 1
    assert await call_ok(http, url, 1) == (200, 2)


@pytest.mark.parametrize("act", [SPIN, SLEEP], ids=["spin", "sleep"])
async def test_a_front_loops_hung_batch_is_cancelled(act, repository, start_server, http) -> None:
    """The same with the request served by a front loop (`--loops 1`): its batcher cancels the
    batch through its link, and the interpreter the hang held answers the next request."""
    server, url = await start_server(repository, engine="private", interpreters=2, loops=1)
    assert server.loops.serving == 1
    status, answer = await call_faulty(http, url, act, timeout_us=300_000)
    assert status == 504, answer
    status, answer = await call_faulty(http, url, 0)
    assert status == 200, answer
    assert [front["http"]["requests"] for front in await server.loops.stats()] == [2]  # the front served both
    seen = await metrics(http, url)
    assert seen[f"aserve_batch_cancelled_total{LABELS}"] == 1
    assert seen['aserve_pool_lost{engine="private"}'] == 0
    assert seen['aserve_inference_request_failure_total{model="faulty",version="1",reason="timeout"}'] == 1


@pytest.mark.parametrize("engine", ENGINES)
async def test_native_hang_loses_its_interpreter(engine, repository, start_server, http, monkeypatch,
                                                 caplog) -> None:
    monkeypatch.setattr(Pool, "cancel_grace_s", 0.5)
    caplog.set_level(logging.WARNING, logger="aserve.engine")
    _, url = await start_server(repository, engine=engine, interpreters=2)
    async with http.get(f"{url}/v2/health/ready") as r:
        assert r.status == 200
    status, answer = await call_faulty(http, url, PAUSE, timeout_us=300_000)
    assert status == 504, answer

    async def lost() -> bool:
        return (await metrics(http, url))[f'aserve_pool_lost{{engine="{engine}"}}'] == 1

    await until(lost, what="interpreter 0 to be marked lost")
    seen = await metrics(http, url)
    assert seen[f"aserve_batch_cancelled_total{LABELS}"] == 1
    assert seen[f"aserve_model_ready{LABELS}"] == 0
    assert seen['aserve_model_ready{model="ok",version="1"}'] == 1
    assert any(f"interpreter 0 of the {engine} pool is lost: model faulty version 1" in r.getMessage()
               for r in caplog.records)

    # faulty has no interpreter left: not ready, and neither is the server
    async with http.get(f"{url}/v2/models/faulty") as r:
        parameters = (await r.json())["parameters"]
        assert (parameters["interpreters_lost"], parameters["interpreters_serving"]) == ([0], 0)
    async with http.get(f"{url}/v2/models/faulty/ready") as r:
        assert r.status == 503
    async with http.get(f"{url}/v2/health/ready") as r:
        assert r.status == 503
    status, answer = await call_faulty(http, url, 0)
    assert status == 503 and "has no interpreter left" in answer["error"], answer

    # the other interpreter still serves ok
    for value in range(4):
        assert await call_ok(http, url, value) == (200, value + 1)
    async with http.get(f"{url}/v2/models/ok") as r:
        parameters = (await r.json())["parameters"]
        assert (parameters["interpreters_lost"], parameters["interpreters_serving"]) == ([0], 1)
    async with http.get(f"{url}/v2/models/ok/ready") as r:
        assert r.status == 200


async def test_a_front_loops_native_hang_loses_its_interpreter(repository, start_server, http, monkeypatch,
                                                             caplog) -> None:
    """The same with the request served by a front loop: the front cancels the batch, the host's
    pool gives the interpreter up after the grace, and the fronts stop serving the model, which
    the host answers as not ready."""
    monkeypatch.setattr(Pool, "cancel_grace_s", 0.5)
    caplog.set_level(logging.WARNING, logger="aserve.engine")
    server, url = await start_server(repository, engine="private", interpreters=2, loops=1)
    assert server.loops.serving == 1
    status, answer = await call_faulty(http, url, PAUSE, timeout_us=300_000)
    assert status == 504, answer

    async def lost() -> bool:
        return (await metrics(http, url))['aserve_pool_lost{engine="private"}'] == 1

    await until(lost, what="interpreter 0 to be marked lost")
    (front,) = await server.loops.stats()
    assert front["http"]["requests"] >= 1  # the front served it
    seen = await metrics(http, url)
    assert seen[f"aserve_batch_cancelled_total{LABELS}"] == 1
    assert seen[f"aserve_model_ready{LABELS}"] == 0
    assert any("interpreter 0 of the private pool is lost: model faulty version 1" in r.getMessage()
               for r in caplog.records)

    async def refused() -> bool:  # the fronts learn the model has no interpreter left
        status, _ = await call_faulty(http, url, 0, timeout_us=300_000)
        return status == 503

    await until(refused, what="faulty to be answered 503 (not ready)")
    assert await call_ok(http, url, 1) == (200, 2)  # the pool's other model goes on, on the front

