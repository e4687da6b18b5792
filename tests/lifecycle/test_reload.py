"""Hot reload: polling, SIGHUP, changed and failed versions, the two transitions, draining."""

from __future__ import annotations

import asyncio
import logging
import os
import pathlib
import signal
import sys

import aiohttp
import pytest

from tests.conftest import free_port, spawns, until, wait_ready

from .conftest import answer, index, version_of, write_config, write_version


async def test_poll_loads_reloads_and_unloads(start_server, repo: pathlib.Path, http: aiohttp.ClientSession) -> None:
    write_config(repo, "vm", "[version_policy]\nall = true\n")
    write_version(repo, "vm", 1)
    server, url = await start_server(repo, repository_poll_s=0.02)

    async def states() -> dict[tuple[str, str], str]:
        return {k: r["state"] for k, r in (await index(http, url)).items()}

    write_version(repo, "vm", 2)  # a new version
    await until(lambda: "2" in server.plane.registry.routes["vm"].versions, what="version 2 to load")
    status, body = await answer(http, url, "/v2/models/vm/infer", 3)
    assert version_of(body) == ("2", 2) and body["outputs"][0]["data"] == [6]

    key = server.plane.registry.get("vm", "1").key
    write_version(repo, "vm", 1, source=(repo / "vm" / "1" / "model.py").read_text().replace(
        "VERSION = 1", "VERSION = 1\nSCALE = 10").replace("v * VERSION", "v * SCALE"))  # changed code
    await until(lambda: server.plane.registry.get("vm", "1").key != key, what="version 1 to reload")
    status, body = await answer(http, url, "/v2/models/vm/versions/1/infer", 3)
    assert status == 200 and body["outputs"][0]["data"] == [30]

    for f in (repo / "vm" / "2").iterdir():
        f.unlink()
    (repo / "vm" / "2").rmdir()  # a removed version
    await until(lambda: "2" not in server.plane.registry.routes["vm"].versions
                and not server.plane.registry.records["vm"].unloading, what="version 2 to unload")
    assert await states() == {("vm", "1"): "READY"}

    write_config(repo, "new", "")
    write_version(repo, "new", 5)  # a new model
    await until(lambda: "new" in server.plane.registry.routes and server.plane.registry.get("new").ready,
                what="the new model")
    status, body = await answer(http, url, "/v2/models/new/infer", 1)
    assert version_of(body) == ("5", 5)


async def test_failed_reload_keeps_the_old_version(start_server, repo: pathlib.Path, http: aiohttp.ClientSession,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    write_config(repo, "vm", "")
    write_version(repo, "vm", 1)
    server, url = await start_server(repo)
    caplog.set_level(logging.ERROR, logger="aserve.server")

    # a new version that fails: version 1 goes on serving, the index and the log say why
    write_version(repo, "vm", 2, source="import no_such_module_here\n")
    await server.plane.rescan()
    status, body = await answer(http, url, "/v2/models/vm/infer", 2)
    assert status == 200 and version_of(body) == ("1", 1)
    rows = await index(http, url)
    assert rows[("vm", "1")]["state"] == "READY"
    assert rows[("vm", "2")]["state"] == "UNAVAILABLE"
    cause = rows[("vm", "2")]["reason"]
    assert cause.startswith("vm/2/model.py") and "No module named 'no_such_module_here'" in cause  # relative
    assert f"model vm version 2 failed to load: {repo}/vm/2/model.py" in caplog.text
    assert "version 2 did not load; version 1 keeps serving" in caplog.text
    caplog.clear()
    await server.plane.rescan()  # unchanged: not retried, not logged again
    assert "failed to load" not in caplog.text

    # fixed: version 2 takes over, version 1 is unloaded once its requests are answered
    write_version(repo, "vm", 2)
    await server.plane.rescan()
    status, body = await answer(http, url, "/v2/models/vm/infer", 2)
    assert version_of(body) == ("2", 2)
    await until(lambda: not server.plane.registry.records["vm"].unloading, what="version 1 to unload")
    assert {k: r["state"] for k, r in (await index(http, url)).items()} == {
        ("vm", "1"): "UNAVAILABLE", ("vm", "2"): "READY"}

    # a changed version that fails to load: its previous load keeps serving, the index says so
    write_version(repo, "vm", 2, source="raise RuntimeError('broken on purpose')\n")
    await server.plane.rescan()
    status, body = await answer(http, url, "/v2/models/vm/infer", 2)
    assert status == 200 and version_of(body) == ("2", 2)
    row = (await index(http, url))[("vm", "2")]
    assert row["state"] == "READY" and row["reason"].startswith("reload failed: ")
    assert "broken on purpose" in row["reason"] and "the previous load of version 2 keeps serving" in row["reason"]

    # a config that no longer parses: what serves goes on serving
    (repo / "vm" / "config.toml").write_text("max_batch_size = 'many'\n")
    await server.plane.rescan()
    status, body = await answer(http, url, "/v2/models/vm/infer", 2)
    assert status == 200 and version_of(body) == ("2", 2)
    assert f"{repo}/vm/config.toml: max_batch_size: Expected `int`, got `str`" in caplog.text


FLAT = '''
from array import array
from aserve.runtime import Model, TensorSpec


class Flat(Model):
    inputs = [TensorSpec("X", "INT32", (-1, 1))]
    outputs = [TensorSpec("Y", "INT32", (-1, 1))]

    def __call__(self, inputs):
        x = inputs["X"].cast("B").cast("i")
        if x[0] < 0:
            raise ValueError("negative input")  # MARK
        return {"Y": array("i", [v + OFFSET for v in x])}
'''


async def test_edited_model_reloads_and_tracebacks_match_the_code(
        start_server, repo: pathlib.Path, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture) -> None:
    (repo / "flat").mkdir()
    model = repo / "flat" / "model.py"
    model.write_text("OFFSET = 1\n" + FLAT)
    server, url = await start_server(repo)
    caplog.set_level(logging.INFO, logger="aserve.server")

    def raising_line() -> int:
        return next(i for i, line in enumerate(model.read_text().splitlines(), 1) if "# MARK" in line)

    first_line = raising_line()
    # edited, not yet rescanned: the old code runs, and its traceback shows the old code's line
    model.write_text("OFFSET = 100\n\n\n# three lines more\n" + FLAT)
    async with http.post(url + "/v2/models/flat/infer",
                         json={"inputs": [{"name": "X", "datatype": "INT32", "shape": [1, 1], "data": [1]}]}) as r:
        assert (await r.json())["outputs"][0]["data"] == [2]
    caplog.clear()
    async with http.post(url + "/v2/models/flat/infer",
                         json={"inputs": [{"name": "X", "datatype": "INT32", "shape": [1, 1], "data": [-1]}]}) as r:
        assert r.status == 500 and "negative input" in (await r.json())["error"]
    assert f'model.py", line {first_line}' in caplog.text and 'raise ValueError("negative input")' in caplog.text

    await server.plane.rescan()
    async with http.post(url + "/v2/models/flat/infer",
                         json={"inputs": [{"name": "X", "datatype": "INT32", "shape": [1, 1], "data": [1]}]}) as r:
        assert (await r.json())["outputs"][0]["data"] == [101]
    caplog.clear()
    async with http.post(url + "/v2/models/flat/infer",
                         json={"inputs": [{"name": "X", "datatype": "INT32", "shape": [1, 1], "data": [-1]}]}) as r:
        assert r.status == 500
    assert f'model.py", line {raising_line()}' in caplog.text and raising_line() == first_line + 3


async def test_resource_transition_unloads_first(start_server, repo: pathlib.Path,
                                                 http: aiohttp.ClientSession) -> None:
    gate = repo.parent / "gate"
    write_config(repo, "big", f'transition = "resource"\n[parameters]\nload_gate = "{gate}"\n')
    gate.touch()
    write_version(repo, "big", 1)
    server, url = await start_server(repo)
    gate.unlink()  # the next load waits for the gate
    write_version(repo, "big", 2)
    rescan = asyncio.ensure_future(server.plane.rescan())
    registry = server.plane.registry
    await until(lambda: 2 in registry.records["big"].others and not registry.records["big"].serving
                and not registry.records["big"].unloading, what="version 1 to be unloaded before 2 loads")
    rows = await index(http, url)
    assert rows[("big", "2")]["state"] == "LOADING" and rows[("big", "1")]["state"] == "UNAVAILABLE"
    status, body = await answer(http, url, "/v2/models/big/infer", 1)
    assert status == 503 and body["error"] == "model 'big' is loading"
    gate.touch()
    await rescan
    status, body = await answer(http, url, "/v2/models/big/infer", 1)
    assert status == 200 and version_of(body) == ("2", 2)


async def test_availability_transition_serves_throughout(start_server, repo: pathlib.Path,
                                                         http: aiohttp.ClientSession) -> None:
    gate = repo.parent / "gate"
    # one request per batch, 50 ms each, on 2 interpreters: of 20 requests, 18 wait in the queue
    write_config(repo, "vm", f'[parameters]\nload_gate = "{gate}"\ndelay_ms = 50\n', max_batch_size=1)
    gate.touch()
    write_version(repo, "vm", 1)
    server, url = await start_server(repo)
    gate.unlink()
    write_version(repo, "vm", 2)
    rescan = asyncio.ensure_future(server.plane.rescan())
    registry = server.plane.registry
    await until(lambda: 2 in registry.records["vm"].others, what="version 2 to start loading")
    # version 2 is loading: version 1 answers, and keeps the requests it accepted
    in_flight = [asyncio.ensure_future(answer(http, url, "/v2/models/vm/infer", i)) for i in range(20)]
    await until(lambda: registry.get("vm").batcher.stats()["queued_requests"] == 18, what="the requests to queue")
    gate.touch()
    await rescan
    assert registry.get("vm").version == "2"
    answers = await asyncio.gather(*in_flight)
    assert all(status == 200 and version_of(body) == ("1", 1) for status, body in answers)
    await until(lambda: not registry.records["vm"].unloading, what="version 1 to unload")
    _status, body = await answer(http, url, "/v2/models/vm/infer", 1)
    assert version_of(body) == ("2", 2)


@spawns
async def test_sighup_rescans(repo: pathlib.Path, http: aiohttp.ClientSession) -> None:

    write_config(repo, "vm", "")
    write_version(repo, "vm", 1)
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "aserve.cli", "serve", str(repo), "--engine", "main", "--interpreters", "1",
        "--port", str(port), env=dict(os.environ, ASERVE_LOG_LEVEL="info"), stderr=asyncio.subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_ready(http, url, proc)
        write_version(repo, "vm", 2)
        proc.send_signal(signal.SIGHUP)

        async def version() -> str:
            status, body = await answer(http, url, "/v2/models/vm/infer", 1)
            assert status == 200
            return version_of(body)[0]

        async def reloaded() -> bool:
            assert proc.returncode is None, "SIGHUP ended the server"
            return await version() == "2"

        await until(reloaded, what="SIGHUP to load version 2", every=0.01)
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0
        log = err.decode()
        assert "rescanning the repository" in log and "model vm version 2 ready" in log
        assert "model vm version 1 unloaded" in log
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_request_whose_body_arrives_after_a_reload(start_server, repo: pathlib.Path,
                                                         http: aiohttp.ClientSession) -> None:
    """A request looked up before a reload and read after it goes to the new version."""
    import json

    write_config(repo, "vm", "")
    write_version(repo, "vm", 1)
    server, url = await start_server(repo)
    release = asyncio.Event()

    async def body():
        yield b'{"inputs": [{"name": "X", "datatype": "INT32", '
        await release.wait()
        yield b'"shape": [1, 1], "data": [5]}]}'

    async def send() -> tuple[int, dict]:
        async with http.post(url + "/v2/models/vm/infer", data=body()) as r:
            return r.status, json.loads(await r.read())

    pending = asyncio.ensure_future(send())
    registry = server.plane.registry
    first = registry.get("vm")
    # the request's head has arrived (the model is looked up from it, before the body is read)
    await until(lambda: any(c.queue for c in server.http.connections), what="the request's head to arrive")
    write_version(repo, "vm", 2)
    await server.plane.rescan()
    await until(lambda: first.state == "UNAVAILABLE", what="version 1 to be unloaded")
    release.set()
    status, answer_body = await pending
    assert status == 200 and version_of(answer_body) == ("2", 2)
