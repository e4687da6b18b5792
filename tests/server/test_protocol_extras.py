"""Triton's classification extension through a real server and tritonclient.http; TF-Serving's
metadata, :classify and :regress (501 for models they do not fit, never 405)."""

from __future__ import annotations

import asyncio
import pathlib

import aiohttp
import numpy as np
import pytest
import tritonclient.http as triton

from .hardened_models import LABELS, hardened_repository


@pytest.fixture
async def url(start_server, tmp_path: pathlib.Path) -> str:
    _, base = await start_server(hardened_repository(tmp_path / "repo"))
    return base


async def test_tritonclient_class_count(url: str) -> None:
    x = np.array([[0.1, 0.7, 0.05, 0.15], [0.4, 0.3, 0.2, 0.1]], np.float32)

    def call(binary: bool) -> tuple[np.ndarray, np.ndarray]:
        client = triton.InferenceServerClient(url.removeprefix("http://"))
        try:
            inp = triton.InferInput("X", list(x.shape), "FP32")
            inp.set_data_from_numpy(x, binary_data=binary)
            top = client.infer("clf", [inp], outputs=[triton.InferRequestedOutput("SCORES", binary_data=binary,
                                                                                    class_count=2)])
            plain = client.infer("clf", [inp])
            return top.as_numpy("SCORES"), plain.as_numpy("SCORES")
        finally:
            client.close()

    for binary in (True, False):
        top, plain = await asyncio.to_thread(call, binary)
        rows = [[v if isinstance(v, bytes) else v.encode() for v in r] for r in top]
        assert rows == [[b"0.700000:1:dog", b"0.150000:3:fish"], [b"0.400000:0:cat", b"0.300000:1:dog"]]
        assert plain.tolist() == x.tolist()  # without class_count: the tensor


async def test_tf_metadata(url: str, http: aiohttp.ClientSession) -> None:
    for path in ("/v1/models/clf/metadata", "/v1/models/clf/versions/1/metadata"):
        async with http.get(url + path) as r:
            assert r.status == 200
            meta = await r.json()
        assert meta["model_spec"] == {"name": "clf", "signature_name": "", "version": "1"}
        signatures = meta["metadata"]["signature_def"]["signature_def"]
        serving = signatures["serving_default"]
        assert serving["method_name"] == "tensorflow/serving/predict"
        assert serving["inputs"]["X"] == {"dtype": "DT_FLOAT", "name": "X", "tensor_shape": {
            "dim": [{"size": "-1"}, {"size": "4"}], "unknown_rank": False}}
        assert set(signatures) == {"serving_default", "classify"}
    async with http.get(f"{url}/v1/models/reg/metadata") as r:
        assert set((await r.json())["metadata"]["signature_def"]["signature_def"]) == {"serving_default", "regress"}
    async with http.get(f"{url}/v1/models/nope/metadata") as r:
        assert r.status == 404


async def test_tf_classify_and_regress(url: str, http: aiohttp.ClientSession) -> None:
    body = {"examples": [{"X": [0.1, 0.7, 0.05, 0.15]}, {"X": [0.4, 0.3, 0.2, 0.1]}]}
    async with http.post(f"{url}/v1/models/clf:classify", json=body) as r:
        assert r.status == 200, await r.text()
        result = (await r.json())["result"]
    assert [[label for label, _ in row] for row in result] == [LABELS, LABELS]
    assert result[0][1][1] == pytest.approx(0.7)
    body = {"context": {}, "examples": [{"X": [1.0, 2.0]}, {"X": [0.5, 0.25]}]}
    for path in ("/v1/models/reg:regress", "/v1/models/reg/versions/1:regress"):
        async with http.post(url + path, json=body) as r:
            assert r.status == 200, await r.text()
            assert (await r.json())["result"] == pytest.approx([3.0, 0.75])
    async with http.post(f"{url}/v1/models/reg:regress", json={"examples": [{"Z": [1.0]}]}) as r:
        assert r.status == 400 and "examples[0]" in (await r.json())["error"]


async def test_tf_methods_that_do_not_fit_are_501(url: str, http: aiohttp.ClientSession) -> None:
    cases = {
        "/v1/models/add:classify": ":classify needs a model with one numeric output of class scores",
        "/v1/models/clf:regress": ":regress needs a model with one numeric output with one value per example",
        "/v1/models/add:foo": "TF-Serving method :foo is not supported; POST /v1/models/{model}:predict, :classify",
        "/v1/models/add/versions/1:explain": "method :explain is not supported",
        "/v1/models/add/labels/stable:foo": "method :foo is not supported",
    }
    for path, message in cases.items():
        async with http.post(url + path, json={"examples": [{}]}) as r:
            assert r.status == 501, (path, r.status)
            assert message in (await r.json())["error"], path
    async with http.post(f"{url}/v1/models/add:classify", json={"examples": [{}]}) as r:
        assert "use :predict" in (await r.json())["error"]
