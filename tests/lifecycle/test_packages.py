"""torch.package versions served by a real server: hermetic code, two versions of one module at once."""

from __future__ import annotations

import asyncio
import pathlib

import numpy as np
import pytest
import tritonclient.http as triton

from ..conftest import needs_torch
from ..runtime.test_package import BIAS, X, addk
from .conftest import index

# The archive's model module exists nowhere but in the archives, and both versions name it
# the same: each version must run its own copy.
MODULE = "packaged_only.addk_model"


def infer(url: str, version: str) -> tuple[list[float], str]:
    client = triton.InferenceServerClient(url.removeprefix("http://"))
    try:
        inp = triton.InferInput("X", [1, 4], "FP32")
        inp.set_data_from_numpy(np.array([X], np.float32), binary_data=True)
        result = client.infer("pkg", [inp], model_version=version)
        return result.as_numpy("Y").ravel().tolist(), result.get_response()["model_version"]
    finally:
        client.close()


@needs_torch
@pytest.mark.parametrize("engine", ["private", "main"])
async def test_packaged_versions_are_hermetic(start_server, repo: pathlib.Path, http, engine: str) -> None:
    (repo / "pkg").mkdir()
    (repo / "pkg" / "config.toml").write_text(
        f'max_batch_size = 4\n[package]\nobject = "{MODULE}:AddK"\n[version_policy]\nall = true\n')
    addk(repo / "pkg" / "1", MODULE, 1)
    addk(repo / "pkg" / "2", MODULE, 2)
    # a module of the same name on the import path is not what the archive runs
    decoy = repo.parent / "decoy" / "packaged_only"
    decoy.mkdir(parents=True)
    (decoy / "__init__.py").write_text("")
    (decoy / "addk_model.py").write_text("raise RuntimeError('the decoy was imported')\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(decoy.parent))
        server, url = await start_server(repo, engine=engine)
        rows = await index(http, url)
        assert rows[("pkg", "1")]["state"] == "READY" and rows[("pkg", "2")]["state"] == "READY", rows
        for version, k in (("1", 1), ("2", 2)):
            y, named = await asyncio.to_thread(infer, url, version)
            assert named == version and y == pytest.approx([2 * x + b + k for x, b in zip(X, BIAS)])
        meta = server.plane.registry.get("pkg", "2").parameters()
        assert meta["package"]["object"] == f"{MODULE}:AddK" and meta["engine"] == engine

        # a new archive for version 2 (same module name, new code) reloads it beside version 1
        addk(repo / "pkg" / "2", MODULE, 20)
        await server.plane.rescan()
        y, _ = await asyncio.to_thread(infer, url, "2")
        assert y == pytest.approx([2 * x + b + 20 for x, b in zip(X, BIAS)])
        y, _ = await asyncio.to_thread(infer, url, "1")
        assert y == pytest.approx([2 * x + b + 1 for x, b in zip(X, BIAS)])
