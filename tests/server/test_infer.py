"""Inference round trips (JSON, binary, msgpack, BYTES, TF-Serving) checked against numpy, and cross-talk."""

from __future__ import annotations

import asyncio
import json
import pathlib

import aiohttp
import msgpack
import numpy as np
import tritonclient.http as triton


def add_inputs(a: np.ndarray, b: np.ndarray) -> list[dict]:
    return [
        {"name": "A", "datatype": "INT32", "shape": list(a.shape), "data": a.ravel().tolist()},
        {"name": "B", "datatype": "INT32", "shape": list(b.shape), "data": b.ravel().tolist()},
    ]


def outputs_by_name(body: dict) -> dict[str, dict]:
    return {o["name"]: o for o in body["outputs"]}


async def test_json_round_trip(base_url: str, http: aiohttp.ClientSession) -> None:
    rng = np.random.default_rng(1)
    a = rng.integers(-(2**31), 2**31 - 1, size=(3, 4), dtype=np.int32)
    b = rng.integers(-(2**31), 2**31 - 1, size=(3, 4), dtype=np.int32)
    body = {"id": "r-1", "inputs": add_inputs(a, b)}
    for path in ("/v2/models/add/infer", "/v2/models/add/versions/1/infer"):
        async with http.post(base_url + path, json=body) as r:
            assert r.status == 200, await r.text()
            out = await r.json()
        assert out["id"] == "r-1" and out["model_name"] == "add"
        got = outputs_by_name(out)
        assert got["SUM"]["shape"] == [3, 4] and got["SUM"]["datatype"] == "INT32"
        np.testing.assert_array_equal(np.array(got["SUM"]["data"], np.int32).reshape(3, 4), a + b)
        np.testing.assert_array_equal(np.array(got["DIFF"]["data"], np.int32).reshape(3, 4), a - b)


def _triton_round_trip(url: str, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, dict]:
    client = triton.InferenceServerClient(url.removeprefix("http://"))
    try:
        assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("add")
        meta = client.get_model_metadata("add")
        inputs = [triton.InferInput("A", list(a.shape), "INT32"), triton.InferInput("B", list(b.shape), "INT32")]
        inputs[0].set_data_from_numpy(a, binary_data=True)
        inputs[1].set_data_from_numpy(b, binary_data=False)
        outputs = [triton.InferRequestedOutput("SUM", binary_data=True),
                   triton.InferRequestedOutput("DIFF", binary_data=False)]
        result = client.infer("add", inputs, outputs=outputs, model_version="1")
        return result.as_numpy("SUM"), result.as_numpy("DIFF"), meta
    finally:
        client.close()


async def test_tritonclient_binary_round_trip(base_url: str) -> None:
    rng = np.random.default_rng(2)
    a = rng.integers(-1000, 1000, size=(5, 4), dtype=np.int32)
    b = rng.integers(-1000, 1000, size=(5, 4), dtype=np.int32)
    total, diff, meta = await asyncio.to_thread(_triton_round_trip, base_url, a, b)
    np.testing.assert_array_equal(total, a + b)
    np.testing.assert_array_equal(diff, a - b)
    assert meta["name"] == "add"


def _triton_bytes(url: str, text: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    client = triton.InferenceServerClient(url.removeprefix("http://"))
    try:
        inp = triton.InferInput("TEXT", list(text.shape), "BYTES")
        inp.set_data_from_numpy(text, binary_data=True)
        result = client.infer("upper", [inp], outputs=[triton.InferRequestedOutput("UPPER", binary_data=True),
                                                      triton.InferRequestedOutput("LENGTH", binary_data=True)])
        return result.as_numpy("UPPER"), result.as_numpy("LENGTH")
    finally:
        client.close()


async def test_bytes_round_trip(base_url: str) -> None:
    text = np.array([[b"abc", b""], ["h\u00e9llo".encode(), b"x\x00y"]], dtype=np.object_)
    upper, length = await asyncio.to_thread(_triton_bytes, base_url, text)
    assert upper.tolist() == [[b"ABC", b""], [b"H\xc3\xa9LLO", b"X\x00Y"]]  # bytes.upper(): ASCII only
    np.testing.assert_array_equal(length, [[3, 0], [6, 3]])


async def test_msgpack_round_trip(base_url: str, http: aiohttp.ClientSession) -> None:
    a = np.arange(8, dtype=np.int32).reshape(2, 4)
    b = np.full((2, 4), 7, dtype=np.int32)
    body = msgpack.packb({"inputs": [
        {"name": "A", "datatype": "INT32", "shape": [2, 4], "data": a.tobytes()},
        {"name": "B", "datatype": "INT32", "shape": [2, 4], "data": b.tobytes()},
    ]})
    headers = {"Content-Type": "application/msgpack", "Accept": "application/msgpack"}
    async with http.post(f"{base_url}/v2/models/add/infer", data=body, headers=headers) as r:
        assert r.status == 200, await r.read()
        assert r.content_type == "application/msgpack"
        out = msgpack.unpackb(await r.read())
    got = outputs_by_name(out)
    np.testing.assert_array_equal(np.frombuffer(got["SUM"]["data"], np.int32).reshape(2, 4), a + b)
    np.testing.assert_array_equal(np.frombuffer(got["DIFF"]["data"], np.int32).reshape(2, 4), a - b)


async def test_tf_serving_predict(base_url: str, http: aiohttp.ClientSession) -> None:
    a = np.arange(8, dtype=np.int32).reshape(2, 4)
    b = np.arange(8, 16, dtype=np.int32).reshape(2, 4)
    rows = {"instances": [{"A": a[i].tolist(), "B": b[i].tolist()} for i in range(2)]}
    async with http.post(f"{base_url}/v1/models/add:predict", json=rows) as r:
        assert r.status == 200, await r.text()
        predictions = (await r.json())["predictions"]
    np.testing.assert_array_equal(np.array([p["SUM"] for p in predictions]), a + b)
    cols = {"inputs": {"A": a.tolist(), "B": b.tolist()}}
    async with http.post(f"{base_url}/v1/models/add/versions/1:predict", json=cols) as r:
        assert r.status == 200, await r.text()
        outputs = (await r.json())["outputs"]
    np.testing.assert_array_equal(np.array(outputs["DIFF"]), a - b)


async def test_concurrent_requests_get_their_own_answers(base_url: str, http: aiohttp.ClientSession) -> None:
    """200 concurrent requests, distinct inputs, two models, mixed JSON/binary: no cross-talk."""

    async def one_add(i: int) -> None:
        rows = 1 + i % 3
        a = np.arange(rows * 4, dtype=np.int32).reshape(rows, 4) + i * 100
        b = np.full((rows, 4), i, dtype=np.int32)
        if i % 2:
            header = json.dumps({"inputs": [
                {"name": "A", "datatype": "INT32", "shape": [rows, 4], "parameters": {"binary_data_size": a.nbytes}},
                {"name": "B", "datatype": "INT32", "shape": [rows, 4], "parameters": {"binary_data_size": b.nbytes}},
            ], "outputs": [{"name": "SUM", "parameters": {"binary_data": True}}]}).encode()
            async with http.post(f"{base_url}/v2/models/add/infer", data=header + a.tobytes() + b.tobytes(),
                                 headers={"Inference-Header-Content-Length": str(len(header)),
                                          "Content-Type": "application/octet-stream"}) as r:
                assert r.status == 200, await r.text()
                raw = await r.read()
                n = int(r.headers["Inference-Header-Content-Length"])
            meta = json.loads(raw[:n])
            assert [o["name"] for o in meta["outputs"]] == ["SUM"]
            got = np.frombuffer(raw[n:], np.int32).reshape(rows, 4)
        else:
            async with http.post(f"{base_url}/v2/models/add/infer", json={"inputs": add_inputs(a, b)}) as r:
                assert r.status == 200, await r.text()
                got = np.array(outputs_by_name(await r.json())["SUM"]["data"], np.int32).reshape(rows, 4)
        np.testing.assert_array_equal(got, a + b)

    async def one_upper(i: int) -> None:
        words = [f"w{i}-{j}" for j in range(2 * (1 + i % 2))]
        body = {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [len(words) // 2, 2], "data": words}]}
        async with http.post(f"{base_url}/v2/models/upper/infer", json=body) as r:
            assert r.status == 200, await r.text()
            got = outputs_by_name(await r.json())
        assert got["UPPER"]["data"] == [w.upper() for w in words]
        assert got["LENGTH"]["data"] == [len(w) for w in words]

    await asyncio.gather(*(one_add(i) if i % 4 else one_upper(i) for i in range(200)))


async def test_private_engine(start_server, repository: pathlib.Path, http: aiohttp.ClientSession) -> None:
    _, url = await start_server(repository, engine="private")
    async with http.get(f"{url}/v2/models/add") as r:
        assert (await r.json())["parameters"]["engine"] == "private"
    a = np.arange(4, dtype=np.int32).reshape(1, 4)
    results = await asyncio.gather(*(
        http.post(f"{url}/v2/models/add/infer", json={"inputs": add_inputs(a + i, a)}) for i in range(20)
    ))
    for i, r in enumerate(results):
        assert r.status == 200
        got = outputs_by_name(await r.json())
        np.testing.assert_array_equal(np.array(got["SUM"]["data"]).reshape(1, 4), 2 * a + i)
        r.release()
