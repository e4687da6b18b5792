"""`--loops N`: connections served by front loops, each in a private interpreter of its own.

A real server on 127.0.0.1 with two fronts: infer answers come from the fronts' own
batchers over the host's pools, every other route is answered through the host, the
counters count each request once, a loop that dies is replaced while the other serves,
and a shutdown answers what every loop accepted.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import pathlib
import sys
import time
from typing import Any

import aiohttp
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from aserve.server import loops as loops_module

from ..conftest import EXAMPLES, free_port, needs_torch, spawns, until, wait_ready
from . import test_head_refusals as refusals
from .conftest import ADD_CONFIG, ADD_MODEL, MODELS, write_repository
from .test_http_front import read_response
from .test_metrics import Scrape, scrape, value
from .wire import send_read


def add_body(rows: list[list[int]], other: list[list[int]]) -> dict[str, object]:
    return {"inputs": [{"name": "A", "datatype": "INT32", "shape": [len(rows), 4], "data": rows},
                       {"name": "B", "datatype": "INT32", "shape": [len(other), 4], "data": other}]}


def expected(rows: list[list[int]], other: list[list[int]]) -> tuple[list[int], list[int]]:
    flat_a = [v for r in rows for v in r]
    flat_b = [v for r in other for v in r]
    return [a + b for a, b in zip(flat_a, flat_b)], [a - b for a, b in zip(flat_a, flat_b)]


async def infer(session: aiohttp.ClientSession, url: str, seed: int) -> None:
    rows = [[seed, seed + 1, seed + 2, seed + 3]]
    other = [[seed * 2, 7, -3, seed]]
    async with session.post(f"{url}/v2/models/add/infer", json=add_body(rows, other)) as r:
        assert r.status == 200, await r.text()
        out = {o["name"]: o["data"] for o in (await r.json())["outputs"]}
    total, diff = expected(rows, other)
    assert out == {"SUM": total, "DIFF": diff}


async def infer_on_connections(url: str, connections: int, each: int, http: aiohttp.ClientSession) -> Scrape:
    """`each` checked infer calls on each of `connections` connections at once, then /metrics
    scraped through `http` while those connections are still open."""
    sessions = [aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) for _ in range(connections)]

    async def client(i: int, session: aiohttp.ClientSession) -> None:
        for k in range(each):
            await infer(session, url, 10 * i + k)

    try:
        await asyncio.gather(*(client(i, s) for i, s in enumerate(sessions)))
        return await scrape(http, url)
    finally:
        for session in sessions:
            await session.close()


async def front_requests(server: object) -> list[int]:
    """HTTP requests each front answered, from its own counters."""
    return [front["http"]["requests"] for front in await server.loops.stats()]  # type: ignore[attr-defined]


def fail_loop(server: Any, index: int) -> None:
    """Make front `index`'s loop fail, as a fault in it would: it is sent a message it cannot
    read (no op), raises, its connections close and it is started again."""
    channel = server.loops.fronts[index].channel
    assert channel is not None
    channel.send({})


@pytest.fixture
def loops() -> int:
    """These tests name their loops (the directory's runs over 0, 1 and 2 are not theirs)."""
    return 2


@pytest.fixture
async def looped(start_server, tmp_path: pathlib.Path):  # type: ignore[no-untyped-def]
    server, url = await start_server(write_repository(tmp_path / "repo"), loops=2)
    assert server.loops.serving == 2
    return server, url


async def test_infer_is_served_by_every_loop_and_counted_once(looped) -> None:  # type: ignore[no-untyped-def]
    server, url = looped
    # eight connections: the host hands each to the front with the fewest
    async with aiohttp.ClientSession() as http:
        balance = await infer_on_connections(url, 8, 5, http)
    # the eight are still open while the scrape's own connection is served: four and four, plus that one
    counts = sorted(value(balance, "aserve_event_loop_connections", loop=str(i)) for i in range(2))
    assert counts == [4, 5], counts
    per_front = await front_requests(server)
    assert sum(per_front) == 41 and all(n >= 15 for n in per_front), per_front  # the 40 and the scrape
    assert server.plane.model("add").batcher.requests == 0  # the host's batcher ran none of them
    async with aiohttp.ClientSession() as http:
        text = await scrape(http, url)
    assert value(text, "aserve_inference_request_success_total", model="add", version="1") == 40
    assert value(text, "aserve_batcher_requests_total", model="add", version="1") == 40
    assert value(text, "aserve_inference_count_total", model="add", version="1") == 40  # samples
    assert value(text, "aserve_event_loops") == 2
    # the scrape itself went through a front: 40 infers and at least the scrape answered
    assert value(text, "aserve_http_requests_total") >= 40
    async with aiohttp.ClientSession() as http, http.get(f"{url}/v2/models/add/stats") as r:
        stats = (await r.json())["model_stats"][0]
    assert stats["inference_stats"]["success"]["count"] == 40
    assert stats["execution_count"] >= 1


@spawns
async def test_fourteen_loops_and_one_interpreter_fill_glibcs_namespaces(tmp_path: pathlib.Path) -> None:
    """The most loops there is room for (a light model on many CPUs wants loops, not
    interpreters), in a process of its own (namespaces are the process's): each loop serves,
    every request joins its model's one queue, and each is counted once."""
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "aserve.cli", "serve", str(write_repository(tmp_path / "repo")), "--engine", "private",
        "--loops", "14", "--interpreters", "1", "--port", str(port), "--grpc-port", "0",
        env=dict(os.environ, ASERVE_LOG_LEVEL="warning"), stderr=asyncio.subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http:
            await wait_ready(http, url, proc)
            await until(lambda: _serving(http, url, 14), what="14 front loops serving")
            text = await infer_on_connections(url, 28, 3, http)
        assert value(text, "aserve_event_loops") == 14
        assert value(text, "aserve_pool_interpreters", engine="private") == 1
        assert value(text, "aserve_inference_request_success_total", model="add", version="1") == 84
        assert value(text, "aserve_batcher_requests_total", model="add", version="1") == 84
        # each connection went to the loop with the fewest: the 28 two to a loop (the scrape's own
        # went to one as well, or to the host if it came before the loops served)
        counts = sorted(value(text, "aserve_event_loop_connections", loop=str(i)) for i in range(14))
        assert counts in ([2] * 14, [2] * 13 + [3]), counts
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 60)


async def _serving(http: aiohttp.ClientSession, url: str, loops: int) -> bool:
    return value(await scrape(http, url), "aserve_event_loops") == loops


async def test_every_route_answers_on_a_front_connection(looped) -> None:  # type: ignore[no-untyped-def]
    server, url = looped
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as http:
        async with http.get(f"{url}/v2/health/ready") as r:
            assert r.status == 200 and (await r.json())["ready"] is True
        async with http.get(f"{url}/v2/models/add") as r:
            meta = await r.json()
            assert [i["name"] for i in meta["inputs"]] == ["A", "B"]
        async with http.post(f"{url}/v2/repository/index") as r:
            assert {m["name"] for m in await r.json()} == set(MODELS)
        async with http.post(f"{url}/v2/models/nope/infer", json=add_body([[1, 2, 3, 4]], [[1, 2, 3, 4]])) as r:
            assert r.status == 404 and "unknown model 'nope'" in (await r.json())["error"]
        bad = add_body([[1, 2, 3]], [[1, 2, 3, 4]])
        async with http.post(f"{url}/v2/models/add/infer", json=bad) as r:
            assert r.status == 400 and "inputs[0].data" in (await r.json())["error"]
        async with http.post(f"{url}/v2/models/upper/infer", json={"inputs": [
                {"name": "TEXT", "datatype": "BYTES", "shape": [1, 2], "data": ["ab", "cde"]}]}) as r:
            out = {o["name"]: o["data"] for o in (await r.json())["outputs"]}
            assert out == {"UPPER": ["AB", "CDE"], "LENGTH": [2, 3]}
        async with http.post(f"{url}/v2/models/add/versions/1/infer", json=add_body([[1, 1, 1, 1]],
                                                                                    [[2, 2, 2, 2]])) as r:
            assert (await r.json())["outputs"][0]["data"] == [3, 3, 3, 3]
        async with http.head(f"{url}/v2/health/live") as r:
            assert r.status == 200 and await r.read() == b""
        async with http.get(f"{url}/v2/trace/setting") as r:
            assert r.status == 200
        assert value(await scrape(http, url), "aserve_event_loops") == 2
    # all on one connection, which a front served: it answered every request itself or through the host
    assert sorted(await front_requests(server)) == [0, 10]


async def test_reload_under_loops_retires_the_old_load_after_the_fronts(looped) -> None:  # type: ignore[no-untyped-def]
    server, url = looped
    old = server.plane.model("add").key
    async with aiohttp.ClientSession() as http:
        running = asyncio.gather(*(infer(http, url, k) for k in range(40)))
        reload = {"parameters": {"config": {"batching": {"max_queue_delay_ms": 3.0}}}}
        async with http.post(f"{url}/v2/repository/models/add/load", json=reload) as r:
            assert r.status == 200, await r.text()
        await running
        assert server.plane.model("add").key != old
        await asyncio.gather(*(infer(http, url, k) for k in range(10)))
        async with http.get(f"{url}/v2/models/add/stats") as r:
            stats = (await r.json())["model_stats"][0]
        assert stats["inference_stats"]["success"]["count"] == 50
        # unloaded: the fronts no longer serve it, and answer as the host does
        async with http.post(f"{url}/v2/repository/models/add/unload") as r:
            assert r.status == 200
        async with http.post(f"{url}/v2/models/add/infer", json=add_body([[1, 2, 3, 4]], [[1, 2, 3, 4]])) as r:
            assert r.status == 503 and "unloaded" in (await r.json())["error"]


async def test_a_loop_that_dies_is_replaced_while_the_other_serves(looped, caplog) -> None:  # type: ignore[no-untyped-def]
    server, url = looped
    loops = server.loops
    sessions = [aiohttp.ClientSession() for _ in range(4)]
    try:
        await asyncio.gather(*(infer(s, url, i) for i, s in enumerate(sessions)))
        doomed = [f.connections for f in loops.fronts]
        assert doomed == [2, 2]
        with caplog.at_level(logging.ERROR, logger="aserve.server"):
            fail_loop(server, 0)
            while loops.restarts < 1:
                await asyncio.sleep(0.01)
            # the other loop serves on while the first waits to be started again; readiness says so
            async with aiohttp.ClientSession() as fresh:
                async with fresh.get(f"{url}/v2/health/ready") as r:
                    answer = await r.json()
                assert r.status == 503 and answer["reason"] == "1 of 2 event loops serve: one is being started again"
                await infer(fresh, url, 99)
            assert await loops.serving_all(30)
        assert any("loop 0 ended" in m and "missing required field `op`" in m for m in caplog.messages), caplog.messages
        # connections of the loop that died were closed; clients reconnect and are served
        for i, s in enumerate(sessions):
            for attempt in range(2):
                try:
                    await infer(s, url, 200 + i)
                    break
                except aiohttp.ClientConnectionError:
                    assert attempt == 0
        async with aiohttp.ClientSession() as http:
            text = await scrape(http, url)
            async with http.get(f"{url}/v2/health/ready") as r:
                assert r.status == 200
        assert value(text, "aserve_event_loop_restarts_total") == 1
        assert value(text, "aserve_event_loops") == 2
    finally:
        for s in sessions:
            await s.close()


async def _readiness(url: str, stub: Any, health: Any) -> tuple[bool, bool, bool]:
    """Readiness as HTTP's /v2/health/ready, gRPC's ServerReady and gRPC's Health each say it."""
    async with aiohttp.ClientSession() as http, http.get(f"{url}/v2/health/ready") as r:
        by_http = r.status == 200
    by_grpc = (await stub.ServerReady(service_pb2.ServerReadyRequest())).ready
    checked = await health.Check(health_pb2.HealthCheckRequest(service=""))
    return by_http, by_grpc, checked.status == health_pb2.HealthCheckResponse.SERVING


async def test_http_and_grpc_readiness_agree_through_a_loops_restart(start_server, tmp_path: pathlib.Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A front loop that died makes every readiness answer say not ready until it serves again."""
    monkeypatch.setattr(loops_module, "RESTART_FIRST_S", 3600.0)  # it stays down until the test starts it
    monkeypatch.setattr(loops_module, "RESTART_MAX_S", 3600.0)
    server, url = await start_server(write_repository(tmp_path / "repo"), loops=2, grpc=True)
    loops = server.loops
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        health = health_pb2_grpc.HealthStub(channel)
        assert await _readiness(url, stub, health) == (True, True, True)
        fail_loop(server, 0)
        await until(lambda: loops.restarts == 1, what="the failed loop reported ended")
        assert await _readiness(url, stub, health) == (False, False, False)
        loops._restart(loops.fronts[0])
        assert await loops.serving_all(30)
        assert await _readiness(url, stub, health) == (True, True, True)


async def test_a_front_started_again_serves_grpc_with_nothing_of_its_last_life_logged(
        start_server, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A front loop that died with gRPC calls open is started again in the same interpreter and
    serves gRPC; the calls of its last life end there, with no error in the log (grpc.aio's
    completion queue is the interpreter's, and hands a call's last events to the loop that made it)."""
    monkeypatch.setattr(loops_module, "RESTART_FIRST_S", 3600.0)  # it stays down until the test starts it
    monkeypatch.setattr(loops_module, "RESTART_MAX_S", 3600.0)
    server, _ = await start_server(write_repository(tmp_path / "repo"), loops=1, grpc=True)
    loops = server.loops
    caplog.set_level(logging.INFO)
    target = f"127.0.0.1:{server.grpc_port}"
    async with grpc.aio.insecure_channel(target) as channel:
        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""))
        assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING  # open on the front
        fail_loop(server, 0)
        await until(lambda: loops.restarts == 1, what="the failed loop reported ended")
        try:  # the stream ends with the loop
            while await watch.read() is not grpc.aio.EOF:
                pass
        except grpc.aio.AioRpcError:
            pass
    loops._restart(loops.fronts[0])
    assert await loops.serving_all(30)
    for _ in range(3):  # fresh channels, so that the front's new server answers each
        async with grpc.aio.insecure_channel(target) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            for _ in range(50):
                assert (await stub.ServerLive(service_pb2.ServerLiveRequest())).live
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR and "loop 0 ended" not in r.getMessage()]
    assert errors == [], [(r.getMessage(), r.exc_info) for r in errors]


@pytest.fixture
def gate_config() -> str:
    """`gated`'s model config: one interpreter, max_queue_size 1 (a test may override it)."""
    return refusals.GATE_CONFIG


@pytest.fixture
def front_batching() -> str:
    """`gated`'s --front-batching (a test may run with both)."""
    return "pool"


@pytest.fixture
async def gated(start_server, tmp_path: pathlib.Path, gate_config: str, front_batching: str):  # type: ignore[no-untyped-def]
    """A server with two fronts serving `gate` (configured by `gate_config`; it runs until
    the file `gate` exists), and three connections: to front 0, front 1, front 0 (each
    goes to the front with the fewest). Yields (server, url, gate file, connections)."""
    gate = tmp_path / "gate"
    config = gate_config.format(tensors=refusals.TENSORS, gate=gate)
    repo = write_repository(tmp_path / "repo", {"gate": (refusals.GATE_MODEL, config)})
    server, url = await start_server(repo, loops=2, request_timeout_s=60.0, front_batching=front_batching)
    fronts = server.loops.fronts
    conns = []
    try:
        for expected in ([1, 0], [1, 1], [2, 1]):
            conns.append(await asyncio.open_connection("127.0.0.1", server.port))
            await until(lambda expected=expected: [f.connections for f in fronts] == expected,
                        what=f"connections {expected} on the fronts")
        yield server, url, gate, conns
    finally:
        gate.touch()
        for _, w in conns:
            w.close()


async def test_a_models_queue_bound_holds_across_loops_and_a_dead_loops_place_is_given_back(gated) -> None:  # type: ignore[no-untyped-def]
    """`gate`: a request held running and one queued on the first front fill the model's
    queue for every loop, so the second front refuses; when the first front dies with its
    queued request, the place it held is given back."""
    server, _, gate, conns = gated
    queued = server.plane.registry.get("gate").queued
    pool = server.plane.registry.pools["main"]
    (held_reader, held), (reader, writer), (_, waits) = conns
    held.write(refusals.request("gate", -1.0))  # front 0: runs until the gate opens
    await until(lambda: pool.stats()["busy"] == 1, what="the held request to run")
    waits.write(refusals.request("gate", 2.0))  # front 0: waits
    await until(lambda: queued.total() == 1, what="the model's queue to be full")
    writer.write(refusals.request("gate", 3.0))  # front 1: the queue is full for every loop
    status, headers, body = await read_response(reader)
    assert status == 503 and "max_queue_size 1" in json.loads(body)["error"] and headers["retry-after"]
    fail_loop(server, 0)
    await until(lambda: queued.total() == 0, what="the dead loop's place given back")
    assert await held_reader.read() == b""  # its connections were closed
    # front 1 (read after the hold of a client refused a moment ago): admitted, not refused
    writer.write(refusals.request("gate", 4.0))
    gate.touch()
    status, _, body = await read_response(reader)
    assert status == 200 and refusals.outputs(body) == [8.0]


@pytest.mark.parametrize("front_batching", ["pool", "loop"])
async def test_a_batch_waiting_in_the_pools_queue_counts_as_queued_for_every_loop(gated) -> None:  # type: ignore[no-untyped-def]
    """Front 1 hands its request on (as a request batched in the pool, or as a batch of its
    own batcher, which sees `gate`'s one interpreter free while front 0's batch holds it):
    it waits in the pool's queue. It fills max_queue_size 1 for every loop and
    shows in the queue gauges, not as running. When its front dies (its connections
    closed: nobody waits for it), it leaves the pool's queue at once and its place is
    given back, without running."""
    server, url, gate, conns = gated
    queued = server.plane.registry.get("gate").queued
    pool = server.plane.registry.pools["main"]
    labels = {"model": "gate", "version": "1"}
    (held_reader, held), (waiting_reader, waiting), (reader, writer) = conns
    held.write(refusals.request("gate", -1.0))  # front 0: runs until the gate opens
    await until(lambda: pool.stats()["busy"] == 1, what="the held request to run")
    waiting.write(refusals.request("gate", 2.0))  # front 1: handed to the pool, where it waits
    await until(lambda: pool.stats()["queued"] == 1, what="front 1's batch to wait in the pool's queue")
    assert queued.total() == 1
    async with aiohttp.ClientSession() as http:
        text = await scrape(http, url)
    assert value(text, "aserve_queue_requests", **labels) == 1
    assert value(text, "aserve_queue_samples", **labels) == 1
    assert value(text, "aserve_batches_in_flight", **labels) == 1
    writer.write(refusals.request("gate", 3.0))  # front 0: the queue is full for every loop
    status, headers, body = await read_response(reader)
    assert status == 503 and "max_queue_size 1" in json.loads(body)["error"] and headers["retry-after"]
    fail_loop(server, 1)  # its front ends, and what it queued in the pool with it
    assert await waiting_reader.read() == b""
    await until(lambda: pool.stats()["queued"] == 0 and queued.total() == 0,
                what="the dead front's request out of the pool's queue, its place given back")
    assert pool.stats()["busy"] == 1  # front 0's batch runs on
    gate.touch()
    status, _, body = await read_response(held_reader)
    assert status == 200 and refusals.outputs(body) == [-2.0]
    await until(lambda: pool.stats()["busy"] == 0, what="the pool to empty")
    assert [queued.get(slot) for slot in range(queued.slots)] == [0] * queued.slots
    writer.write(refusals.request("gate", 4.0))
    status, _, body = await read_response(reader)
    assert status == 200 and refusals.outputs(body) == [8.0]
    async with aiohttp.ClientSession() as http:
        text = await scrape(http, url)
    assert value(text, "aserve_queue_requests", **labels) == 0
    assert value(text, "aserve_batches_in_flight", **labels) == 0


# one interpreter, batches of up to 4: the requests queued while it runs wait for it together
BATCHING_GATE_CONFIG = '''
interpreters = 1
max_batch_size = 4
{tensors}
[parameters]
gate = "{gate}"
[batching]
max_queue_size = 8
'''


@pytest.mark.parametrize("gate_config", [BATCHING_GATE_CONFIG])
async def test_requests_of_two_loops_wait_in_one_queue_and_run_in_one_batch(gated) -> None:  # type: ignore[no-untyped-def]
    """While `gate`'s one interpreter is held, a request on each front waits in the pool's
    queue, the model's one queue for every loop (counted there as queued, not running);
    when the interpreter is free, the two run as one batch of two, each answered with its
    own rows, and the batch is counted once."""
    server, url, gate, conns = gated
    queued = server.plane.registry.get("gate").queued
    pool = server.plane.registry.pools["main"]
    labels = {"model": "gate", "version": "1"}
    (held_reader, held), (one_reader, one), (zero_reader, zero) = conns
    held.write(refusals.request("gate", -1.0))  # front 0: runs until the gate opens
    await until(lambda: pool.stats()["busy"] == 1, what="the held request to run")
    one.write(refusals.request("gate", 2.0))  # front 1
    zero.write(refusals.request("gate", 3.0))  # front 0
    await until(lambda: pool.stats()["queued"] == 2, what="both requests to wait in the pool's queue")
    assert queued.total() == 2 and queued.running == 1 and queued.pool_rows == 2
    async with aiohttp.ClientSession() as http:
        text = await scrape(http, url)
        assert value(text, "aserve_queue_requests", **labels) == 2
        assert value(text, "aserve_batches_in_flight", **labels) == 1
        gate.touch()
        answers = [await read_response(r) for r in (held_reader, one_reader, zero_reader)]
        assert [(status, refusals.outputs(body)) for status, _, body in answers] == [
            (200, [-2.0]), (200, [4.0]), (200, [6.0])]
        await until(lambda: queued.running == 0, what="the batches to end")
        async with http.get(f"{url}/v2/models/gate/stats") as r:
            stats = (await r.json())["model_stats"][0]
        text = await scrape(http, url)
    sizes = {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}
    assert sizes == {1: 1, 2: 1} and stats["inference_count"] == 3 and stats["execution_count"] == 2
    assert value(text, "aserve_queue_requests", **labels) == 0
    assert value(text, "aserve_batches_in_flight", **labels) == 0
    assert [queued.get(slot) for slot in range(queued.slots)] == [0] * queued.slots and queued.pool_rows == 0


async def test_a_loop_killed_mid_load_fails_only_its_own_connections(looped) -> None:  # type: ignore[no-untyped-def]
    """Four clients keep sending (two connections on each front) while front 0 dies: its
    clients see their connections close and reconnect; front 1's clients see no error at
    all; every answer anyone got is the right one; all are served again after."""
    server, url = looped
    loops = server.loops
    sessions = [aiohttp.ClientSession() for _ in range(4)]
    for n, s in enumerate(sessions, 1):  # fronts 0, 1, 0, 1: each to the one with the fewest
        async with s.get(f"{url}/v2/health/live") as r:
            assert r.status == 200
        await until(lambda n=n: sum(f.connections for f in loops.fronts) == n, what=f"{n} connections")
    assert [f.connections for f in loops.fronts] == [2, 2]
    served, dropped = [0] * 4, [0] * 4
    stop = asyncio.Event()

    async def client(i: int) -> None:
        seed = 1000 * i
        while not stop.is_set():
            seed += 1
            try:
                await infer(sessions[i], url, seed)  # checks the answer
                served[i] += 1
            except aiohttp.ClientConnectionError:
                dropped[i] += 1

    clients = [asyncio.ensure_future(client(i)) for i in range(4)]
    try:
        await until(lambda: min(served) >= 5, what="every client served")
        fail_loop(server, 0)
        await until(lambda: loops.restarts == 1, what="the loop to end")
        assert await loops.serving_all(30)
        after = list(served)
        await until(lambda: all(n >= a + 5 for n, a in zip(served, after)), what="every client served again")
    finally:
        stop.set()
        await asyncio.gather(*clients)
        for s in sessions:
            await s.close()
    assert dropped[1] == dropped[3] == 0  # front 1's clients never noticed
    assert dropped[0] <= 1 and dropped[2] <= 1  # front 0's saw their connection close once at most


async def test_a_failure_answering_a_handed_over_request_is_its_500(looped, monkeypatch, caplog) -> None:  # type: ignore[no-untyped-def]
    """A bug on the host's side of a request a front handed over (here its head checks
    raise) fails that request with a 500 and an error id, as on the host's own
    connections: the client is answered, the front's channel goes on."""
    server, url = looped

    def broken(request: object, length: object) -> None:
        raise RuntimeError("a bug in a head check")

    monkeypatch.setattr(server.http.dispatcher, "head", broken)
    caplog.set_level(logging.ERROR, logger="aserve.server")
    async with aiohttp.ClientSession() as http:
        for path in ("/v2/models/add/stats", "/v2/models/add"):
            async with http.get(f"{url}{path}", timeout=aiohttp.ClientTimeout(total=10)) as r:
                assert r.status == 500
                answer = await r.json()
            assert answer["error"] == "internal error"
            assert answer["error_id"] in caplog.text and "a bug in a head check" in caplog.text  # logged whole
        monkeypatch.undo()
        await infer(http, url, 5)  # the fronts serve on


async def test_shutdown_answers_what_every_loop_accepted(start_server, tmp_path: pathlib.Path) -> None:
    slow = ADD_MODEL.replace("    def __call__(self, inputs):\n",
                             "    def __call__(self, inputs):\n        import time; time.sleep(0.3)\n")
    server, url = await start_server(write_repository(tmp_path / "repo", {"add": (slow, ADD_CONFIG)}), loops=2)
    sessions = [aiohttp.ClientSession() for _ in range(6)]
    try:
        calls = [asyncio.ensure_future(infer(s, url, i)) for i, s in enumerate(sessions)]
        # every request is accepted (queued in a front's batcher) before the shutdown begins
        while sum(s["batcher"]["requests"] + s["batcher"]["queued_requests"] + s["batcher"]["running_batches"]
                  for front in await server.loops.stats() for s in front["models"] if s["name"] == "add") < 6:
            await asyncio.sleep(0.01)
        began = time.monotonic()
        await server.close()
        await asyncio.gather(*calls)  # every one answered 200 with the right values
        assert time.monotonic() - began < 30
    finally:
        for s in sessions:
            await s.close()


@pytest.mark.parametrize("when", ["interpreters starting", "fronts starting"])
async def test_a_shutdown_while_the_fronts_start_does_not_wait_for_them(tmp_path: pathlib.Path, when: str,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    """SIGTERM can come before every front serves (a fast load, a pod stopped at once): the
    close ends the fronts and returns, rather than waiting for fronts that will never serve;
    a front whose interpreter was still starting is not started, one whose loop was starting
    is told to close as soon as it can hear it, and nothing is logged as an error."""
    from aserve.config import ServerSettings
    from aserve.server import Server

    repo = write_repository(tmp_path / "repo", {"add": (ADD_MODEL, ADD_CONFIG)})
    server = Server(ServerSettings(host="127.0.0.1", port=0, engine="main", interpreters=1, loops=2, grpc=False,
                                   log_level="warning", shutdown_timeout_s=5.0), repository=repo)
    await server.start()
    loops = server.loops
    assert loops is not None and loops.serving < 2  # the fronts are still starting
    if when == "fronts starting":
        await until(lambda: all(f.job is not None for f in loops.fronts), what="the fronts' loops started")
    began = time.monotonic()
    await asyncio.wait_for(server.close(), 30)  # LOOPS_START_S (60 s) before the mend
    assert time.monotonic() - began < 15
    assert loops.serving == 0
    assert all(f.job is None or f.job.done() for f in loops.fronts)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


async def test_access_log_has_each_request_once(start_server, tmp_path: pathlib.Path, caplog) -> None:  # type: ignore[no-untyped-def]
    _, url = await start_server(write_repository(tmp_path / "repo"), loops=2, access_log=True,
                                     log_level="info")
    with caplog.at_level(logging.INFO, logger="aserve.access"):
        async with aiohttp.ClientSession() as http:
            await infer(http, url, 1)
            async with http.get(f"{url}/v2/models/add") as r:
                assert r.status == 200
        # the fronts' records reach the host over their channels
        end = time.monotonic() + 10
        lines = []
        while time.monotonic() < end:
            lines = [m for m in caplog.messages if "/v2/models/add" in m]
            if len(lines) >= 2:
                break
            await asyncio.sleep(0.02)
    assert len([m for m in lines if "POST /v2/models/add/infer" in m]) == 1, lines
    assert len([m for m in lines if "GET /v2/models/add " in m]) == 1, lines
    records = [r for r in caplog.records if r.name == "aserve.access" and "infer" in r.getMessage()]
    assert records[0].status == 200 and records[0].remote == "127.0.0.1"  # the fields the JSON format writes


async def test_draining_reaches_every_loop(looped) -> None:  # type: ignore[no-untyped-def]
    server, url = looped
    sessions = [aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) for _ in range(2)]
    try:
        await asyncio.gather(*(infer(s, url, i) for i, s in enumerate(sessions)))
        assert [f.connections for f in server.loops.fronts] == [1, 1]
        server.drain()
        await server.loops.stats()  # a round trip to every front: each has read the drain before it
        for i, session in enumerate(sessions):  # one connection on each loop: answered, then closed
            rows = [[i, 1, 2, 3]]
            async with session.post(f"{url}/v2/models/add/infer", json=add_body(rows, rows)) as r:
                assert r.status == 200 and r.headers["Connection"] == "close"
            async with session.get(f"{url}/v2/health/ready") as r:
                assert r.status == 503 and "draining" in (await r.json())["reason"]
    finally:
        for s in sessions:
            await s.close()


# Y = 2 X and B = the rows of the batch it ran in (FP32 rows of one); a negative X holds its batch
# until the file `gate` exists; X = 99 raises
GATE_MODEL = '''
import os
import time
from array import array
from aserve.runtime import Model, TensorSpec

class Gate(Model):
    inputs = [TensorSpec("X", "FP32", (-1, 1))]
    outputs = [TensorSpec("Y", "FP32", (-1, 1)), TensorSpec("B", "FP32", (-1, 1))]

    def load(self):
        self.gate = self.parameters["gate"]

    def __call__(self, inputs):
        x = inputs["X"].cast("B").cast("f")
        if any(v == 99 for v in x):
            raise ValueError("99 is not served")
        if any(v < 0 for v in x):
            end = time.monotonic() + 60
            while not os.path.exists(self.gate) and time.monotonic() < end:
                time.sleep(0.001)
        return {"Y": array("f", [2 * v for v in x]), "B": array("f", [float(len(x))] * len(x))}
'''

GATE_CONFIG = '''
interpreters = 1
max_batch_size = 8
[[inputs]]
name = "X"
datatype = "FP32"
shape = [-1, 1]
[[outputs]]
name = "Y"
datatype = "FP32"
shape = [-1, 1]
[[outputs]]
name = "B"
datatype = "FP32"
shape = [-1, 1]
[parameters]
gate = "{gate}"
'''


async def gate_call(session: aiohttp.ClientSession, url: str, xs: list[float]) -> tuple[int, dict[str, object]]:
    body = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [len(xs), 1], "data": xs}]}
    async with session.post(f"{url}/v2/models/gate/infer", json=body) as r:
        answer = await r.json()
        if r.status != 200:
            return r.status, answer
        return r.status, {o["name"]: o["data"] for o in answer["outputs"]}


async def test_batches_of_different_loops_run_as_one(start_server, tmp_path: pathlib.Path) -> None:
    gate = tmp_path / "gate"
    repo = write_repository(tmp_path / "repo", {"gate": (GATE_MODEL, GATE_CONFIG.format(gate=gate))})
    server, url = await start_server(repo, loops=3)
    pool = server.plane.model("gate").pool
    sessions = [aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) for _ in range(3)]
    try:
        for s in sessions:  # one connection each, handed to loops 0, 1 and 2 in turn
            assert (await gate_call(s, url, [0.5]))[0] == 200
        assert [f.connections for f in server.loops.fronts] == [1, 1, 1]
        before = pool.stats()["coalesced"]  # a parked pool of an earlier server counted on

        async def phase(first: list[float], second: list[float]) -> list[tuple[int, dict[str, object]]]:
            held = asyncio.ensure_future(gate_call(sessions[2], url, [-1.0]))  # loop 2 holds the interpreter
            await until(lambda: pool.stats()["busy"] == 1, what="the held batch runs")
            calls = [asyncio.ensure_future(gate_call(sessions[0], url, first)),
                     asyncio.ensure_future(gate_call(sessions[1], url, second))]
            await until(lambda: pool.stats()["queued"] == 2, what="a batch of loop 0 and one of loop 1 wait")
            gate.touch()
            answers = await asyncio.gather(*calls)
            assert (await held)[0] == 200
            gate.unlink()
            return answers

        # one batch of three rows: each loop's request gets its own rows of it
        (s0, a0), (s1, a1) = await phase([1.0, 2.0], [3.0])
        assert (s0, a0) == (200, {"Y": [2.0, 4.0], "B": [3.0, 3.0]})
        assert (s1, a1) == (200, {"Y": [6.0], "B": [3.0]})
        assert pool.stats()["coalesced"] - before == 2
        # a request that makes the model fail fails alone: the other runs again by itself
        (s0, a0), (s1, a1) = await phase([99.0], [4.0])
        assert s0 == 500 and "99 is not served" in str(a0["error"])
        assert (s1, a1) == (200, {"Y": [8.0], "B": [1.0]})
        async with aiohttp.ClientSession() as http:
            text = await scrape(http, url)
        assert value(text, "aserve_pool_coalesced_batches_total", engine="main") - before == 4
    finally:
        for s in sessions:
            await s.close()



# BYTES in and out: each text and its upper case twice (a row of two elements of different
# lengths), its length, and the rows of the batch it ran in; "hold" holds the batch until the
# file `gate` exists; "fail" fails it
BYTES_GATE_MODEL = '''
import os
import time
from array import array
from aserve.runtime import Model, TensorSpec

class Words(Model):
    inputs = [TensorSpec("TEXT", "BYTES", (-1,))]
    outputs = [TensorSpec("PAIR", "BYTES", (-1, 2)), TensorSpec("LEN", "FP32", (-1, 1)),
               TensorSpec("ROWS", "FP32", (-1, 1))]

    def load(self):
        self.gate = self.parameters["gate"]

    def __call__(self, inputs):
        texts = [bytes(t).decode() for t in inputs["TEXT"]]
        if "hold" in texts:
            end = time.monotonic() + 60
            while not os.path.exists(self.gate) and time.monotonic() < end:
                time.sleep(0.001)
        if "fail" in texts:
            raise ValueError("'fail' is not served")
        return {"PAIR": [[t, t.upper() * 2] for t in texts], "LEN": array("f", [len(t) for t in texts]),
                "ROWS": array("f", [len(texts)] * len(texts))}
'''

BYTES_GATE_CONFIG = '''
interpreters = 1
max_batch_size = 8
[[inputs]]
name = "TEXT"
datatype = "BYTES"
shape = [-1]
[[outputs]]
name = "PAIR"
datatype = "BYTES"
shape = [-1, 2]
[[outputs]]
name = "LEN"
datatype = "FP32"
shape = [-1, 1]
[[outputs]]
name = "ROWS"
datatype = "FP32"
shape = [-1, 1]
[parameters]
gate = "{gate}"
'''


async def words_call(session: aiohttp.ClientSession, url: str, texts: list[str]) -> tuple[int, dict[str, object]]:
    body = {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [len(texts)], "data": texts}]}
    async with session.post(f"{url}/v2/models/words/infer", json=body) as r:
        answer = await r.json()
        if r.status != 200:
            return r.status, answer
        return r.status, {o["name"]: o["data"] for o in answer["outputs"]}


async def test_requests_with_bytes_tensors_of_different_loops_run_as_one_batch(start_server, tmp_path: pathlib.Path) -> None:  # type: ignore[no-untyped-def]
    """BYTES rows are gathered in the pool like any others: texts of two loops run in one batch
    and each request gets its own rows of a BYTES output whose rows hold elements of different
    lengths; a request that makes the batch fail fails alone."""
    gate = tmp_path / "gate"
    repo = write_repository(tmp_path / "repo", {"words": (BYTES_GATE_MODEL, BYTES_GATE_CONFIG.format(gate=gate))})
    server, url = await start_server(repo, loops=3)
    pool = server.plane.model("words").pool
    sessions = [aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) for _ in range(3)]
    try:
        for s in sessions:  # one connection each, handed to loops 0, 1 and 2 in turn
            assert (await words_call(s, url, ["a"]))[0] == 200
        assert [f.connections for f in server.loops.fronts] == [1, 1, 1]
        before = pool.stats()["coalesced"]

        async def phase(first: list[str], second: list[str]) -> list[tuple[int, dict[str, object]]]:
            held = asyncio.ensure_future(words_call(sessions[2], url, ["hold"]))  # loop 2 holds the interpreter
            await until(lambda: pool.stats()["busy"] == 1, what="the held batch runs")
            calls = [asyncio.ensure_future(words_call(sessions[0], url, first)),
                     asyncio.ensure_future(words_call(sessions[1], url, second))]
            await until(lambda: pool.stats()["queued"] == 2, what="a request of loop 0 and one of loop 1 wait")
            gate.touch()
            answers = await asyncio.gather(*calls)
            assert (await held)[0] == 200
            gate.unlink()
            return answers

        # one batch of three rows, sliced: each request gets its own rows of it
        (s0, a0), (s1, a1) = await phase(["ab", "cde"], ["fghij"])
        assert (s0, a0) == (200, {"PAIR": ["ab", "ABAB", "cde", "CDECDE"], "LEN": [2.0, 3.0], "ROWS": [3.0, 3.0]})
        assert (s1, a1) == (200, {"PAIR": ["fghij", "FGHIJFGHIJ"], "LEN": [5.0], "ROWS": [3.0]})
        assert pool.stats()["coalesced"] - before == 2
        # the batch fails: each request runs again alone, and only the culprit fails
        (s0, a0), (s1, a1) = await phase(["fail"], ["ok"])
        assert s0 == 500 and "'fail' is not served" in str(a0["error"])
        assert (s1, a1) == (200, {"PAIR": ["ok", "OKOK"], "LEN": [2.0], "ROWS": [1.0]})
    finally:
        for s in sessions:
            await s.close()

async def test_a_request_the_host_refuses_from_its_head_is_answered_before_its_body(looped) -> None:  # type: ignore[no-untyped-def]
    """A front hands an infer request it does not serve to the host; the host's head checks
    run as soon as the head arrives, so its refusal (here: no such model) comes before the
    body is sent, the body is dropped, and the connection serves the next request."""
    server, _ = looped
    before = await front_requests(server)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        big = 1 << 20
        writer.write((f"POST /v2/models/nope/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      f"Content-Length: {big}\r\n\r\n").encode())
        status, headers, body = await read_response(reader)
        assert status == 404 and "connection" not in headers, body
        assert "nope" in json.loads(body)["error"]
        writer.write(b"{" * big)  # not JSON: decoded, it would be a 400
        rows, other = [[1, 2, 3, 4]], [[4, 3, 2, 1]]
        data = json.dumps(add_body(rows, other)).encode()
        writer.write((f"POST /v2/models/add/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      f"Content-Length: {len(data)}\r\n\r\n").encode() + data)
        status, headers, body = await read_response(reader)
        assert status == 200, body
        assert {o["name"]: o["data"] for o in json.loads(body)["outputs"]} == dict(zip(("SUM", "DIFF"),
                                                                                      expected(rows, other)))
    finally:
        writer.close()
    assert sum(await front_requests(server)) == sum(before) + 2  # a front answered both


def _raw(model: str, rows: list[list[int]], other: list[list[int]]) -> bytes:
    data = json.dumps(add_body(rows, other)).encode()
    return (f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n").encode() + data


async def read_sums(reader: asyncio.StreamReader) -> list[int]:
    status, _, body = await read_response(reader)
    assert status == 200, body
    return {o["name"]: o["data"] for o in json.loads(body)["outputs"]}["SUM"]  # type: ignore[no-any-return]


# `add` in two stages, whose waiting requests may join a running batch between them (the
# pool decides joins, in C, for the requests of every loop)
STAGED_ADD_MODEL = '''
from array import array
from aserve.runtime import Model, TensorSpec

class Add(Model):
    inputs = [TensorSpec("A", "INT32", (-1, 4)), TensorSpec("B", "INT32", (-1, 4))]
    outputs = [TensorSpec("SUM", "INT32", (-1, 4)), TensorSpec("DIFF", "INT32", (-1, 4))]

    def load(self):
        self.stages = [lambda rows: [(a + b, a - b) for a, b in rows], lambda rows: rows]

    def stage_input(self, inputs):
        return list(zip(inputs["A"].cast("B").cast("i"), inputs["B"].cast("B").cast("i")))

    def stage_concat(self, parts):
        return [row for part in parts for row in part]

    def stage_output(self, rows):
        return {"SUM": array("i", [s for s, _ in rows]), "DIFF": array("i", [d for _, d in rows])}

    def __call__(self, inputs):
        rows = self.stage_input(inputs)
        for stage in self.stages:
            rows = stage(rows)
        return self.stage_output(rows)
'''


def staged_repository(root: pathlib.Path) -> pathlib.Path:
    """The conftest models plus `fast`: `add` in stages, adaptive, joining under the budget rule."""
    from .test_metrics import ADAPTIVE_CONFIG

    config = ADAPTIVE_CONFIG.replace('policy = "adaptive"\n', 'policy = "adaptive"\njoin_rule = "budget"\n')
    assert 'join_rule = "budget"' in config
    return write_repository(root, {**MODELS, "fast": (STAGED_ADD_MODEL, config)})


async def on_a_front(start_server, root: pathlib.Path):  # type: ignore[no-untyped-def]
    """Two fronts over the conftest models and `fast` (layer joining), and a connection whose first
    request, an `add`, a front answered: (server, url, reader, writer)."""
    server, url = await start_server(staged_repository(root), loops=2)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(_raw("add", [[1, 2, 3, 4]], [[4, 3, 2, 1]]))
    assert await read_sums(reader) == [5, 5, 5, 5]
    assert sum(await front_requests(server)) == 1  # the connection is a front's
    return server, url, reader, writer


async def test_a_model_whose_batches_join_is_answered_by_the_front_that_read_it(start_server, tmp_path: pathlib.Path) -> None:  # type: ignore[no-untyped-def]
    """A model whose requests may join running batches at stage boundaries is served on the
    fronts like any other: its requests, pipelined with another model's in one read, split over
    reads or behind an Expect, are answered in order by the front that read them, and the
    connection stays there."""
    server, url, reader, writer = await on_a_front(start_server, tmp_path / "repo")
    rows, other = [[1, 2, 3, 4]], [[4, 3, 2, 1]]
    try:
        writer.write(_raw("fast", rows, other) + _raw("add", [[10, 20, 30, 40]], other))
        assert await read_sums(reader) == [5, 5, 5, 5]
        assert await read_sums(reader) == [14, 23, 32, 41]
        for k in range(3):
            writer.write(_raw("fast" if k % 2 else "add", [[k, k, k, k]], other))
            assert await read_sums(reader) == [k + 4, k + 3, k + 2, k + 1]
        data = _raw("fast", [[2, 2, 2, 2]], other)
        at = data.index(b"Content-Type") + 5
        await send_read(writer, [data[:at], data[at:]], server.port)
        assert await read_sums(reader) == [6, 5, 4, 3]
        body = json.dumps(add_body(rows, other)).encode()
        writer.write((f"POST /v2/models/fast/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      f"Content-Length: {len(body)}\r\nExpect: 100-continue\r\n\r\n").encode())
        assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30) == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(body)
        assert await read_sums(reader) == [5, 5, 5, 5]
        assert (server.loops.connections, server.app.stats.connections) == (1, 0)  # still the front's
    finally:
        writer.close()
    assert sum(await front_requests(server)) == 8
    async with aiohttp.ClientSession() as http:
        text = await scrape(http, url)
    assert value(text, "aserve_inference_request_success_total", model="fast", version="1") == 4
    assert value(text, "aserve_inference_request_success_total", model="add", version="1") == 4


def _answer_while_held(fd: int, target: str, timeout: float = 10.0) -> tuple[int, bytes]:
    """GET `target` on the connection `fd` and read its answer without yielding to this
    thread's event loop (the host's, in these tests): only a front can answer it."""
    import select

    os.write(fd, f"GET {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    data = b""
    end = time.monotonic() + timeout
    while True:
        head, sep, body = data.partition(b"\r\n\r\n")
        if sep:
            lines = head.split(b"\r\n")
            fields = dict(line.split(b": ", 1) for line in lines[1:])
            if len(body) >= int(fields[b"Content-Length"]):
                return int(lines[0].split()[1]), body
        left = end - time.monotonic()
        assert left > 0, f"no answer to {target} within {timeout} s while the host's loop is held"
        if select.select([fd], [], [], left)[0]:
            chunk = os.read(fd, 65536)
            assert chunk, f"the connection closed before {target} was answered"
            data += chunk


async def test_a_front_answers_health_readiness_configuration_and_the_api_document_itself(start_server, tmp_path: pathlib.Path) -> None:  # type: ignore[no-untyped-def]
    """While the host's loop is held, a front's connection still gets liveness, readiness (the
    readiness the host published), a served model's readiness and configuration, the server's
    metadata, the OpenAPI document and its page, over HTTP and gRPC; a model it does not serve
    is the host's."""
    server, url = await start_server(staged_repository(tmp_path / "repo"), loops=2, grpc=True)
    await until(lambda: server.loops.serving == 2, what="both fronts serve")
    _, writer = await asyncio.open_connection("127.0.0.1", server.port)
    fd = writer.transport.get_extra_info("socket").fileno()
    channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")  # blocking: the host's loop stays held
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    health = health_pb2_grpc.HealthStub(channel)
    try:
        status, body = _answer_while_held(fd, "/v2/health/live")
        assert status == 200 and json.loads(body) == {"live": True}
        status, body = _answer_while_held(fd, "/v2/health/ready")
        assert status == 200 and json.loads(body) == {"ready": True}
        status, body = _answer_while_held(fd, "/v2/models/fast/ready")
        assert status == 200 and json.loads(body)["ready"] is True
        status, body = _answer_while_held(fd, "/v2/models/fast/config")
        assert status == 200 and json.loads(body)["name"] == "fast", body
        status, body = _answer_while_held(fd, "/v2")
        assert status == 200 and json.loads(body)["name"] == "aserve"
        status, body = _answer_while_held(fd, "/v2/openapi.json")
        assert status == 200 and "/v2/health/live" in json.loads(body)["paths"]
        status, body = _answer_while_held(fd, "/v2/docs")
        assert status == 200 and b"swagger-ui" in body
        assert stub.ServerReady(service_pb2.ServerReadyRequest(), timeout=10).ready
        assert stub.ServerLive(service_pb2.ServerLiveRequest(), timeout=10).live
        assert stub.ModelReady(service_pb2.ModelReadyRequest(name="add"), timeout=10).ready
        config = stub.ModelConfig(service_pb2.ModelConfigRequest(name="fast"), timeout=10).config
        assert config.name == "fast" and [i.name for i in config.input] == ["A", "B"]
        checked = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
        assert checked.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        writer.close()
        channel.close()
    async with aiohttp.ClientSession() as http, http.get(f"{url}/v2/models/nosuch/ready") as r:
        assert r.status == 404 and "nosuch" in await r.text()  # the host's answer, through the front
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as aio:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await service_pb2_grpc.GRPCInferenceServiceStub(aio).ModelReady(service_pb2.ModelReadyRequest(name="nosuch"))
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="holding threads to one CPU needs two")
async def test_only_a_server_without_front_loops_holds_its_threads_to_the_loops_cpu(start_server, tmp_path: pathlib.Path) -> None:  # type: ignore[no-untyped-def]
    # front loops queue jobs in the host's pools that the host's loop does not see, so it
    # cannot tell a lone one: their pools never hold (engine/placement.py)
    alone, _ = await start_server(write_repository(tmp_path / "alone"), loops=0)
    assert alone.plane.registry.pools and all(
        pool.placement is not None for pool in alone.plane.registry.pools.values())
    off, _ = await start_server(write_repository(tmp_path / "off"), loops=0, colocate=False)
    assert off.plane.registry.pools and all(pool.placement is None for pool in off.plane.registry.pools.values())
    fronted, _ = await start_server(write_repository(tmp_path / "fronted"), loops=2)
    assert fronted.plane.registry.pools and all(
        pool.placement is None for pool in fronted.plane.registry.pools.values())


def _bundled_inputs(module: Any, model: str) -> list[Any]:
    """One request's inputs for a bundled model (tritonclient's `module`: http or grpc)."""
    import numpy as np

    def tensor(name: str, array: Any, datatype: str) -> Any:
        t = module.InferInput(name, list(array.shape), datatype)
        t.set_data_from_numpy(array)
        return t

    if model == "simple":
        row = np.arange(16, dtype=np.int32).reshape(1, 16)
        return [tensor("INPUT0", row, "INT32"), tensor("INPUT1", row, "INT32")]
    if model == "mlp":
        return [tensor("INPUT", np.linspace(0, 1, 16, dtype=np.float32).reshape(1, 16), "FP32")]
    if model == "textclass":
        return [tensor("TEXT", np.array([b"a fine day for a walk"], dtype=np.object_), "BYTES")]
    if model == "traced":
        return [tensor("X", np.ones((1, 4), dtype=np.float32), "FP32")]
    assert model == "cnn"
    return [tensor("IMAGE", np.zeros((1, 3, 64, 64), dtype=np.float32), "FP32")]


@needs_torch
async def test_each_bundled_models_requests_are_answered_by_the_loop_that_read_them(start_server) -> None:
    """The bundled examples on two front loops, over HTTP and gRPC: each request is answered by
    the front that read it (the per-loop counter of /metrics says which), none by the host's
    loop: `cnn` too, whose adaptive policy runs in C and whose join (benefit rule) cannot pay on
    its curve."""
    import tritonclient.grpc.aio as grpcclient
    import tritonclient.http.aio as httpclient

    server, url = await start_server(EXAMPLES, loops=2, grpc=True, engine="auto", interpreters=1)
    models = ("simple", "mlp", "textclass", "traced", "cnn")
    http_client = httpclient.InferenceServerClient(url.removeprefix("http://"))
    grpc_client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    try:
        for model in models:
            for _ in range(3):
                await http_client.infer(model, _bundled_inputs(httpclient, model))
                await grpc_client.infer(model, _bundled_inputs(grpcclient, model))
        async with aiohttp.ClientSession() as http:
            text = await scrape(http, url)
    finally:
        await http_client.close()
        await grpc_client.close()
    answered = {(s.labels["loop"], s.labels["protocol"]): s.value
                for s in text.samples("aserve_event_loop_infer_requests_total")}
    for protocol in ("http", "grpc"):
        by_fronts = answered.get(("0", protocol), 0) + answered.get(("1", protocol), 0)
        assert by_fronts == 3 * len(models) and answered.get(("host", protocol), 0) == 0, answered
    for model in models:
        assert value(text, "aserve_inference_request_success_total", model=model, version="1") == 6
