"""Versions, version policies and labels, through a real server and tritonclient."""

from __future__ import annotations

import asyncio
import logging
import pathlib

import aiohttp
import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from aserve.dataplane import LoadFailed

from .conftest import Triton, answer, index, version_of, write_config, write_version


def triton_infer(url: str, model: str, version: str, x: list[int]) -> tuple[np.ndarray, np.ndarray, str]:
    client = triton.InferenceServerClient(url.removeprefix("http://"))
    try:
        inp = triton.InferInput("X", [len(x), 1], "INT32")
        inp.set_data_from_numpy(np.array(x, np.int32).reshape(-1, 1), binary_data=True)
        result = client.infer(model, [inp], model_version=version)
        return result.as_numpy("Y"), result.as_numpy("VERSION"), result.get_response()["model_version"]
    finally:
        client.close()


def triton_metadata(url: str, model: str, version: str = "") -> dict:
    client = triton.InferenceServerClient(url.removeprefix("http://"))
    try:
        return client.get_model_metadata(model, model_version=version)
    finally:
        client.close()


async def test_versions_and_policy(start_server, repo: pathlib.Path, http: aiohttp.ClientSession) -> None:
    write_config(repo, "vm", "")
    for v in (1, 2, 3):
        write_version(repo, "vm", v)
    (repo / "flat").mkdir()
    (repo / "flat" / "model.py").write_text(
        (repo / "vm" / "1" / "model.py").read_text().replace("VERSION = 1", "VERSION = 7"))
    server, url = await start_server(repo)

    # latest 1 (the default): version 3 answers requests without a version
    y, served_by, named = await asyncio.to_thread(triton_infer, url, "vm", "", [1, 2])
    assert y.ravel().tolist() == [3, 6] and served_by.ravel().tolist() == [3, 3] and named == "3"
    meta = await asyncio.to_thread(triton_metadata, url, "vm")
    assert meta["versions"] == ["3"] and meta["parameters"]["version"] == "3"
    # a version on disk but outside the policy, and one that does not exist: 404 naming what exists
    status, body = await answer(http, url, "/v2/models/vm/versions/1/infer", 1)
    assert status == 404 and body["error"] == ("model 'vm' version 1 is not served: its version policy is latest 1; "
                                               "versions: 3")
    status, body = await answer(http, url, "/v2/models/vm/versions/9/infer", 1)
    assert status == 404 and body["error"] == "model 'vm' has no version '9'; versions: 3"
    with pytest.raises(InferenceServerException, match="version 1 is not served"):
        await asyncio.to_thread(triton_infer, url, "vm", "1", [1])
    # the flat layout is version 1
    _, served_by, named = await asyncio.to_thread(triton_infer, url, "flat", "1", [1])
    assert served_by.ravel().tolist() == [7] and named == "1"

    rows = await index(http, url)
    assert {k: r["state"] for k, r in rows.items()} == {
        ("flat", "1"): "READY", ("vm", "1"): "UNAVAILABLE", ("vm", "2"): "UNAVAILABLE", ("vm", "3"): "READY"}
    assert rows[("vm", "1")]["reason"] == "not served by the version policy (latest 1)"

    for policy, served in (("latest = 2", ["2", "3"]), ("specific = [1, 3]", ["1", "3"]), ("all = true", ["1", "2", "3"]),
                           ("specific = [2]", ["2"])):
        write_config(repo, "vm", f"[version_policy]\n{policy}\n")
        await server.plane.rescan()
        ready = await index(http, url, ready=True)
        assert sorted(v for (m, v) in ready if m == "vm") == served, policy
        for v in served:
            status, body = await answer(http, url, f"/v2/models/vm/versions/{v}/infer", 5)
            assert status == 200 and version_of(body) == (v, int(v)) and body["outputs"][0]["data"] == [5 * int(v)]
        status, body = await answer(http, url, "/v2/models/vm/infer", 5)
        assert version_of(body) == (served[-1], int(served[-1]))  # no version: the latest served
        meta = await asyncio.to_thread(triton_metadata, url, "vm")
        assert meta["versions"] == served
        per_version = await asyncio.to_thread(triton_metadata, url, "vm", served[0])
        assert per_version["parameters"]["version"] == served[0]


async def test_labels(start_server, repo: pathlib.Path, http: aiohttp.ClientSession,
                      caplog: pytest.LogCaptureFixture) -> None:
    write_config(repo, "vm", "[version_policy]\nall = true\n[labels]\nstable = 1\ncanary = 2\n")
    for v in (1, 2):
        write_version(repo, "vm", v)
    server, url = await start_server(repo)

    async def via(label: str) -> tuple[str, int]:
        status, body = await answer(http, url, f"/v2/models/vm/versions/{label}/infer", 1)
        assert status == 200, body
        return version_of(body)

    assert await via("stable") == ("1", 1) and await via("canary") == ("2", 2)
    # TF-Serving's label routes
    async with http.post(url + "/v1/models/vm/labels/canary:predict", json={"instances": [{"X": [4]}]}) as r:
        assert r.status == 200 and (await r.json())["predictions"] == [{"Y": [8], "VERSION": [2]}]
    async with http.get(url + "/v1/models/vm/labels/stable") as r:
        assert (await r.json())["model_version_status"][0]["version"] == "1"
    status, body = await answer(http, url, "/v2/models/vm/versions/beta/infer", 1)
    assert status == 404 and body["error"] == ("model 'vm' has no version 'beta'; versions: 1, 2; "
                                               "labels: canary (version 2), stable (version 1)")
    meta = await asyncio.to_thread(triton_metadata, url, "vm")
    assert meta["parameters"]["labels"] == {"stable": "1", "canary": "2"}

    # promote the canary with a load request's config override; no version reloads
    keys = {h.key for h in server.plane.registry.handles()}
    client = Triton(url)
    try:
        await client("load_model", "vm", config='{"labels": {"stable": 2, "canary": 2}}')
        assert await via("stable") == ("2", 2)
        assert {h.key for h in server.plane.registry.handles()} == keys
        # roll back
        await client("load_model", "vm", config='{"labels": {"stable": 1, "canary": 2}}')
        assert await via("stable") == ("1", 1) and await via("canary") == ("2", 2)
    finally:
        client.close()

    # a label moved to a version that does not serve stays where it was (and the log says why)
    write_config(repo, "vm", "[version_policy]\nall = true\n[labels]\nstable = 3\ncanary = 2\n")
    write_version(repo, "vm", 3, source="def broken(:\n")
    with caplog.at_level(logging.ERROR, logger="aserve.server"), \
            pytest.raises(LoadFailed, match=r"failed to load 'vm': version 3: .*SyntaxError"):
        await server.plane.load("vm")  # a load request reads the files afresh (and drops the override)
    assert await via("stable") == ("1", 1)
    assert "label 'stable' stays on version 1: version 3 does not serve" in caplog.text
    rows = await index(http, url)
    assert rows[("vm", "3")]["state"] == "UNAVAILABLE" and "SyntaxError" in rows[("vm", "3")]["reason"]
    assert rows[("vm", "3")]["reason"].startswith("vm/3/model.py")  # relative to the repository
