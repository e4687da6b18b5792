"""The bundled torch `mlp` example behind the server on private interpreters, batched, against torch in the test."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import pathlib
import shutil

import aiohttp
import numpy as np

from tests.conftest import needs_torch


@needs_torch
async def test_mlp_private_batched(start_server, examples: pathlib.Path, tmp_path: pathlib.Path,
                                   http: aiohttp.ClientSession) -> None:
    import torch

    repo = tmp_path / "repo"
    shutil.copytree(examples / "mlp", repo / "mlp", ignore=shutil.ignore_patterns("__pycache__"))
    _, url = await start_server(repo, engine="private")
    spec = importlib.util.spec_from_file_location("mlp_reference", examples / "mlp" / "model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    net = module.build()

    rng = np.random.default_rng(7)
    inputs = [rng.standard_normal((1 + i % 4, 16)).astype(np.float32) for i in range(64)]

    async def call(x: np.ndarray) -> np.ndarray:
        header = json.dumps({
            "inputs": [{"name": "INPUT", "datatype": "FP32", "shape": list(x.shape),
                        "parameters": {"binary_data_size": x.nbytes}}],
            "parameters": {"binary_data_output": True},
        }).encode()
        async with http.post(f"{url}/v2/models/mlp/infer", data=header + x.tobytes(),
                             headers={"Inference-Header-Content-Length": str(len(header))}) as r:
            assert r.status == 200, await r.text()
            raw = await r.read()
            n = int(r.headers["Inference-Header-Content-Length"])
        return np.frombuffer(raw[n:], np.float32).reshape(x.shape)

    results = await asyncio.gather(*(call(x) for x in inputs))
    with torch.inference_mode():
        for x, got in zip(inputs, results):
            np.testing.assert_allclose(got, net(torch.from_numpy(x)).numpy(), rtol=1e-4, atol=1e-5)
    async with http.get(f"{url}/v2/models/mlp") as r:
        params = (await r.json())["parameters"]
    assert params["engine"] == "private" and params["tensor_format"] == "torch"
