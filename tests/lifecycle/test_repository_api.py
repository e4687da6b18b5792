"""The repository and statistics extensions, driven by tritonclient.http as Triton's users drive them."""

from __future__ import annotations

import pathlib

import aiohttp
import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from .conftest import Triton, answer, index, version_of, write_config, write_version


@pytest.fixture
async def served(start_server, repo: pathlib.Path):
    write_config(repo, "vm", "[version_policy]\nall = true\n")
    for v in (1, 2):
        write_version(repo, "vm", v)
    write_config(repo, "other", "")
    write_version(repo, "other", 1)
    server, url = await start_server(repo)
    client = Triton(url)
    yield server, url, client
    client.close()


async def test_index_load_unload(served, http: aiohttp.ClientSession, repo: pathlib.Path) -> None:
    server, url, client = served
    rows = await client("get_model_repository_index")
    assert sorted((r["name"], r["version"], r["state"]) for r in rows) == [
        ("other", "1", "READY"), ("vm", "1", "READY"), ("vm", "2", "READY")]
    assert await client("is_model_ready", "vm", "1") and await client("is_server_ready")

    await client("unload_model", "other")
    assert not await client("is_model_ready", "other")
    rows = {(r["name"], r["version"]): r for r in await client("get_model_repository_index")}
    assert rows[("other", "1")] == {"name": "other", "version": "1", "state": "UNAVAILABLE",
                                    "reason": "unloaded by request"}
    status, body = await answer(http, url, "/v2/models/other/infer", 1)
    assert status == 503 and body["error"] == "model 'other' is unavailable: unloaded by request"
    assert await client("is_server_ready")  # a model unloaded by request is not a missing one
    ready = await index(http, url, ready=True)
    assert sorted(ready) == [("vm", "1"), ("vm", "2")]
    # an unload holds across rescans, until a load request
    await server.plane.rescan()
    assert not await client("is_model_ready", "other")
    await client("load_model", "other")
    assert await client("is_model_ready", "other")
    status, body = await answer(http, url, "/v2/models/other/infer", 3)
    assert status == 200 and version_of(body) == ("1", 1)

    # a load with a config override: its fields replace config.toml's until the next load
    await client("load_model", "vm", config='{"version_policy": {"specific": [1]}}')
    assert await client("is_model_ready", "vm", "1") and not await client("is_model_ready", "vm", "2")
    await server.plane.rescan()  # the override holds across rescans
    assert not await client("is_model_ready", "vm", "2")
    await client("load_model", "vm")
    assert await client("is_model_ready", "vm", "2")

    # failures are 400s naming the cause
    with pytest.raises(InferenceServerException, match=r"failed to load 'nope': nope: not a folder"):
        await client("load_model", "nope")
    with pytest.raises(InferenceServerException, match="parameters.config: malformed JSON"):
        await client("load_model", "vm", config="{labels")
    with pytest.raises(InferenceServerException, match=r"version_policy: Object contains unknown field `newest`"):
        await client("load_model", "vm", config='{"version_policy": {"newest": 1}}')
    assert await client("is_model_ready", "vm", "2")  # a failed load changed nothing
    with pytest.raises(InferenceServerException, match=r"parameters.file:1/model.py: model files in the request"):
        await client("load_model", "vm", config="{}", files={"file:1/model.py": b"x = 1\n"})
    async with http.post(url + "/v2/repository/models/nope/unload") as r:
        assert r.status == 404 and "unknown model 'nope'" in (await r.json())["error"]
    async with http.post(url + "/v2/repository/index", json={"ready": "yes"}) as r:
        assert r.status == 400 and (await r.json())["error"] == "ready: expected true or false, got 'yes'"


async def test_load_reads_new_models(served, http: aiohttp.ClientSession, repo: pathlib.Path) -> None:
    _, url, client = served
    write_config(repo, "late", "")
    write_version(repo, "late", 4)
    with pytest.raises(InferenceServerException, match="unknown model 'late'"):
        await client("get_model_metadata", "late")
    await client("load_model", "late")
    status, body = await answer(http, url, "/v2/models/late/infer", 2)
    assert status == 200 and version_of(body) == ("4", 4) and body["outputs"][0]["data"] == [8]


async def test_statistics(served, http: aiohttp.ClientSession) -> None:
    _, url, client = served
    for v, n in (("1", 3), ("2", 5)):
        for i in range(n):
            status, _ = await answer(http, url, f"/v2/models/vm/versions/{v}/infer", i, i + 1)
            assert status == 200
    bad = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}]}
    async with http.post(url + "/v2/models/vm/versions/2/infer", json=bad) as r:
        assert r.status == 400

    stats = await client("get_inference_statistics", "vm")
    by_version = {s["version"]: s for s in stats["model_stats"]}
    assert sorted(by_version) == ["1", "2"]
    for v, n in (("1", 3), ("2", 5)):
        s = by_version[v]
        assert s["name"] == "vm" and s["inference_count"] == 2 * n  # samples
        assert 1 <= s["execution_count"] <= n  # batches
        inference = s["inference_stats"]
        assert inference["success"]["count"] == n and inference["success"]["ns"] > 0
        assert inference["queue"]["count"] == n and inference["compute_infer"]["count"] == n
        assert inference["compute_infer"]["ns"] > 0
        assert sum(b["compute_infer"]["count"] for b in s["batch_stats"]) == s["execution_count"]
        assert all(b["batch_size"] % 2 == 0 for b in s["batch_stats"])  # requests of 2 samples each
        assert s["last_inference"] > 1_700_000_000_000  # milliseconds since the epoch
    assert by_version["2"]["inference_stats"]["fail"]["count"] == 1
    one = await client("get_inference_statistics", "vm", "1")
    assert [s["version"] for s in one["model_stats"]] == ["1"]
    everything = await client("get_inference_statistics")
    assert {s["name"] for s in everything["model_stats"]} == {"vm", "other"}
    with pytest.raises(InferenceServerException, match="unknown model 'nope'"):
        await client("get_inference_statistics", "nope")
    assert "statistics" in (await client("get_server_metadata"))["extensions"]
    # tritonclient's numpy-free path agrees with what the server counts
    assert np.sum([s["inference_stats"]["success"]["count"] for s in everything["model_stats"]]) == 8
