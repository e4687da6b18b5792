"""Transitions under load: a closed-loop client keeps 32 requests in flight through a reload
to a new version, a label move and its rollback, and the unload of another model. No
request fails, and every answer comes from the version it was routed to (each version
computes something different: Y = X * version)."""

from __future__ import annotations

import asyncio
import itertools
import pathlib
import time
from dataclasses import dataclass

import aiohttp

from ..conftest import until
from .conftest import infer_body, write_config, write_version

CONCURRENCY = 32


@dataclass
class Answer:
    path: str
    sent: float
    received: float
    status: int
    named: str  # the model_version the response names
    computed: int  # the version whose code computed it
    y: list[int]
    x: list[int]


class ClosedLoop:
    """CONCURRENCY workers, each sending its next request when the last one is answered."""

    def __init__(self, http: aiohttp.ClientSession, url: str, paths: list[str]) -> None:
        self.http, self.url, self.paths = http, url, paths
        self.answers: list[Answer] = []
        self.stop = asyncio.Event()
        self.counter = itertools.count(1)
        self.tasks: list[asyncio.Task[None]] = []

    async def worker(self, i: int) -> None:
        while not self.stop.is_set():
            path = self.paths[i % len(self.paths)]
            n = next(self.counter)
            x = [n, n + 1]
            sent = time.monotonic()
            async with self.http.post(self.url + path, json=infer_body(*x)) as r:
                body = await r.json()
            received = time.monotonic()
            if r.status != 200:
                self.answers.append(Answer(path, sent, received, r.status, str(body), -1, [], x))
                continue
            outputs = {o["name"]: o["data"] for o in body["outputs"]}
            computed = set(outputs["VERSION"])
            assert len(computed) == 1
            self.answers.append(Answer(path, sent, received, 200, body["model_version"], computed.pop(),
                                       outputs["Y"], x))

    def start(self) -> None:
        self.tasks = [asyncio.ensure_future(self.worker(i)) for i in range(CONCURRENCY)]

    async def answered(self, n: int) -> None:
        """Wait until `n` more requests are answered."""
        target = len(self.answers) + n
        await until(lambda: len(self.answers) >= target, what=f"{n} more answers")

    async def finish(self) -> list[Answer]:
        self.stop.set()
        await asyncio.gather(*self.tasks)
        return self.answers


def check(answers: list[Answer]) -> None:
    failed = [a for a in answers if a.status != 200]
    assert not failed, f"{len(failed)} of {len(answers)} requests failed, e.g. {failed[0]}"
    for a in answers:
        assert a.named == str(a.computed), a  # the version named is the version that computed
        assert a.y == [v * a.computed for v in a.x], a  # and the answer is that version's


async def test_reload_label_moves_and_unload_under_load(start_server, repo: pathlib.Path,
                                                       http: aiohttp.ClientSession) -> None:
    # batches of at most 4 on 2 interpreters: of 32 requests in flight, most wait in the queue
    write_config(repo, "vm", "[parameters]\ndelay_ms = 5\n[labels]\nstable = 1\n", max_batch_size=4)
    write_version(repo, "vm", 1)
    write_config(repo, "other", "")
    write_version(repo, "other", 1)
    server, url = await start_server(repo)
    plane = server.plane

    # 1. a reload to a new version: version 2 replaces version 1, which answers what it
    # accepted (queued or running) and is unloaded
    load = ClosedLoop(http, url, ["/v2/models/vm/infer"])
    load.start()
    await load.answered(200)
    write_version(repo, "vm", 2)
    began = time.monotonic()
    await plane.rescan()
    switched = time.monotonic()
    retiring = plane.registry.records["vm"].unloading.get(1)
    assert retiring is not None and retiring.batcher is not None
    await load.answered(200)
    answers = await load.finish()
    check(answers)
    assert {a.computed for a in answers if a.received < began} == {1}
    assert {a.computed for a in answers if a.sent > switched} == {2}
    assert len([a for a in answers if a.sent > switched]) >= 200
    assert retiring.batcher.requests > 0 and retiring.state == "UNAVAILABLE"  # drained, then unloaded

    write_config(repo, "vm", "[parameters]\ndelay_ms = 5\n[version_policy]\nlatest = 2\n[labels]\nstable = 1\n"
                             "canary = 2\n", max_batch_size=4)
    await plane.rescan()

    # 2. a label move (canary promoted to stable) and its rollback, while both labels take requests
    load = ClosedLoop(http, url, ["/v2/models/vm/versions/stable/infer", "/v2/models/vm/versions/canary/infer"])
    load.start()
    await load.answered(200)
    moves = []
    for stable in (2, 1):
        began = time.monotonic()
        await plane.load("vm", {"labels": {"stable": stable, "canary": 2}})
        moves.append((began, time.monotonic(), stable))
        await load.answered(200)
    answers = await load.finish()
    check(answers)
    canary = [a for a in answers if "canary" in a.path]
    assert {a.computed for a in canary} == {2}
    stable_answers = [a for a in answers if "stable" in a.path]
    (promote_began, promoted, _), (rollback_began, rolled_back, _) = moves
    assert {a.computed for a in stable_answers if a.received < promote_began} == {1}
    assert {a.computed for a in stable_answers if promoted < a.sent and a.received < rollback_began} == {2}
    assert {a.computed for a in stable_answers if a.sent > rolled_back} == {1}

    # 3. unloading another model disturbs nothing
    load = ClosedLoop(http, url, ["/v2/models/vm/infer", "/v2/models/vm/versions/1/infer"])
    load.start()
    await load.answered(200)
    await plane.unload("other")
    await load.answered(200)
    answers = await load.finish()
    check(answers)
    assert {a.computed for a in answers} == {1, 2}
    assert not plane.registry.get("other").ready
