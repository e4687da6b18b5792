"""Fair scheduling across models sharing a pool: a flooded model cannot starve another."""

from __future__ import annotations

import asyncio
import json
import pathlib

import aiohttp
import pytest

from aserve.inference import InferCall
from aserve.protocol import V2

from ..conftest import until
from .conftest import write_repository

# Writes "start NAME FIRST" when a batch starts and "end NAME" when it ends, to the
# shared log file, and sleeps `ms` in between; Y = X.
LOGGED_MODEL = '''
import time
from array import array
from aserve.runtime import Model, TensorSpec

class Logged(Model):
    inputs = [TensorSpec("X", "INT32", (-1, 1))]
    outputs = [TensorSpec("Y", "INT32", (-1, 1))]

    def load(self):
        self.log = self.parameters["log"]
        self.seconds = float(self.parameters["ms"]) / 1000.0

    def __call__(self, inputs):
        x = array("i", inputs["X"].cast("B").cast("i"))
        with open(self.log, "a") as f:
            f.write(f"start {self.name} {x[0]}\\n")
        time.sleep(self.seconds)
        with open(self.log, "a") as f:
            f.write(f"end {self.name}\\n")
        return {"Y": x}
'''


def logged_config(log: pathlib.Path, *, ms: float, interpreters: int | None = None) -> str:
    head = f"interpreters = {interpreters}\n" if interpreters is not None else ""
    return head + f'''
max_batch_size = 4
[[inputs]]
name = "X"
datatype = "INT32"
shape = [-1, 1]
[[outputs]]
name = "Y"
datatype = "INT32"
shape = [-1, 1]
[parameters]
log = "{log}"
ms = {ms}
'''


def read_log(log: pathlib.Path) -> list[list[str]]:
    return [line.split() for line in log.read_text().splitlines()]


async def flood(http: aiohttp.ClientSession, url: str, model: str, stop: asyncio.Event, base: int) -> int:
    """One client sending requests back to back until `stop`; checks each answer; returns how many."""
    n = 0
    while not stop.is_set():
        value = base + n
        body = {"inputs": [{"name": "X", "datatype": "INT32", "shape": [1, 1], "data": [value]}]}
        async with http.post(f"{url}/v2/models/{model}/infer", json=body) as r:
            assert r.status == 200, await r.text()
            out = await r.json()
        assert out["outputs"][0]["data"] == [value]
        n += 1
    return n


@pytest.mark.host_loop  # the host's batchers and scheduler, and a request queued on its loop
async def test_a_flooded_pool_serves_a_quiet_model_at_the_next_free_interpreter(
    start_server, http: aiohttp.ClientSession, tmp_path: pathlib.Path
) -> None:
    """Two models flood one interpreter. Once both have had a batch since the quiet
    model's last one, a request of the quiet model starts at the very next batch start
    (round-robin: its turn comes before theirs). With the pool's FIFO queue alone, the
    other flooding model's batch, already waiting in the pool, would start first."""
    log = tmp_path / "batches.log"
    log.touch()
    models = {name: (LOGGED_MODEL, logged_config(log, ms=ms)) for name, ms in
              (("hot1", 3.0), ("hot2", 3.0), ("quiet", 1.0))}
    server, url = await start_server(write_repository(tmp_path / "repo", models), interpreters=1)
    registry = server.plane.registry
    pool = registry.pools["main"]
    hot = [b for b in (registry.get("hot1").batcher, registry.get("hot2").batcher) if b is not None]
    assert len(hot) == 2
    stop = asyncio.Event()
    clients = [asyncio.ensure_future(flood(http, url, name, stop, 1000 * i))
               for i in range(16) for name in ("hot1", "hot2")]
    try:
        await until(lambda: sum(b.batches for b in hot) >= 20, what="20 batches: both queues full by now")
        for k in range(6):
            # wait until both flooding models had a batch since the quiet one's last, a
            # batch is running (its start logged) and every batch dispatched is in the
            # pool (so that any start logged from here on is of a batch that was already
            # waiting in the pool or is dispatched after the quiet request is queued)
            before = [b.batches for b in hot]
            lines: list[list[str]] = []

            def one_hot_batch_running(lines: list[list[str]] = lines, before: list[int] = before) -> bool:
                lines[:] = read_log(log)
                started = sum(1 for w in lines if w[0] == "start") - sum(1 for w in lines if w[0] == "end")
                native = pool.stats()
                served = all(b.batches > n for b, n in zip(hot, before))
                return served and started == native["busy"] == 1 and sum(b.running for b in hot) == 1 + native["queued"]

            await until(one_hot_batch_running, timeout=10.0, what="a moment with one hot batch running", every=0.0005)
            mark = len(lines)
            value = 7000 + k
            body = json.dumps({"inputs": [{"name": "X", "datatype": "INT32", "shape": [1, 1], "data": [[value]]}]})
            call = InferCall(codec=V2, model="quiet", body=body.encode())
            answer = await server.plane.infer(call)  # queued before the loop goes on
            assert json.loads(b"".join(answer.chunks))["outputs"][0]["data"] == [value]
            starts = [w for w in read_log(log)[mark:] if w[0] == "start"]
            assert starts[0] == ["start", "quiet", str(value)], starts[:4]
    finally:
        stop.set()
        served = await asyncio.gather(*clients)
    assert sum(served) > 0
    hot_starts = [w[1] for w in read_log(log) if w[0] == "start" and w[1] != "quiet"]
    for name in ("hot1", "hot2"):  # the two flooding models share the interpreter too
        assert hot_starts.count(name) >= len(hot_starts) // 3, (name, hot_starts.count(name), len(hot_starts))
    scheduler = registry.schedulers["main"]
    assert scheduler.slots == 1 and scheduler.in_flight == 0


async def test_models_on_a_subset_of_the_interpreters_all_get_served(
    start_server, http: aiohttp.ClientSession, tmp_path: pathlib.Path
) -> None:
    """Two models on the first interpreter only and one on both, all flooded: nothing
    deadlocks, every request is answered, every slot comes back."""
    log = tmp_path / "batches.log"
    models = {
        "narrow1": (LOGGED_MODEL, logged_config(log, ms=1.0, interpreters=1)),
        "narrow2": (LOGGED_MODEL, logged_config(log, ms=1.0, interpreters=1)),
        "wide": (LOGGED_MODEL, logged_config(log, ms=1.0)),
    }
    server, url = await start_server(write_repository(tmp_path / "repo", models), interpreters=2)

    async def client(model: str, base: int) -> None:
        for i in range(15):
            body = {"inputs": [{"name": "X", "datatype": "INT32", "shape": [1, 1], "data": [base + i]}]}
            async with http.post(f"{url}/v2/models/{model}/infer", json=body) as r:
                assert r.status == 200, await r.text()
                assert (await r.json())["outputs"][0]["data"] == [base + i]

    await asyncio.wait_for(
        asyncio.gather(*(client(m, 100 * i) for i in range(6) for m in models)), timeout=60
    )
    starts = [w[1] for w in read_log(log) if w[0] == "start"]
    assert {m: starts.count(m) > 0 for m in models} == dict.fromkeys(models, True)
    scheduler = server.plane.registry.schedulers["main"]
    assert scheduler.slots == 2 and scheduler.in_flight == 0
    for model in models:  # each request batched once, whichever loop queued it
        async with http.get(f"{url}/v2/models/{model}/stats") as r:
            stats = (await r.json())["model_stats"][0]
        assert stats["inference_count"] == 90 and stats["inference_stats"]["success"]["count"] == 90
