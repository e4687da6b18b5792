"""Health, metadata, repository index and TF-Serving status, in JSON and msgpack."""

from __future__ import annotations

import aiohttp
import msgpack

from aserve import __version__


async def test_server_metadata_and_health(base_url: str, http: aiohttp.ClientSession) -> None:
    async with http.get(f"{base_url}/v2") as r:
        assert r.status == 200
        body = await r.json()
    assert body["name"] == "aserve" and body["version"] == __version__
    assert "binary_tensor_data" in body["extensions"]
    async with http.get(f"{base_url}/v2/health/live") as r:
        assert r.status == 200 and (await r.json()) == {"live": True}
    async with http.get(f"{base_url}/v2/health/ready") as r:
        assert r.status == 200 and (await r.json()) == {"ready": True}


async def test_model_metadata_ready_and_config(base_url: str, http: aiohttp.ClientSession) -> None:
    for path in ("/v2/models/add", "/v2/models/add/versions/1"):
        async with http.get(base_url + path) as r:
            assert r.status == 200
            meta = await r.json()
        assert meta["name"] == "add" and meta["versions"] == ["1"]
        assert meta["inputs"] == [
            {"name": "A", "datatype": "INT32", "shape": [-1, 4]},
            {"name": "B", "datatype": "INT32", "shape": [-1, 4]},
        ]
        assert [o["name"] for o in meta["outputs"]] == ["SUM", "DIFF"]
        params = meta["parameters"]
        assert params["engine"] == "main" and params["engine_reason"] == "--engine says main: engine 'main' asked for"
        assert params["interpreters"] == 2 and params["max_batch_size"] == 8 and params["class"] == "Add"
        async with http.get(base_url + path + "/ready") as r:
            assert r.status == 200 and (await r.json()) == {"name": "add", "ready": True}
    async with http.get(f"{base_url}/v2/models/slow/config") as r:
        config = await r.json()
    assert config["interpreters"] == 1 and config["batching"]["max_queue_size"] == 2


async def test_msgpack_metadata(base_url: str, http: aiohttp.ClientSession) -> None:
    async with http.get(f"{base_url}/v2/models/upper", headers={"Accept": "application/msgpack"}) as r:
        assert r.status == 200 and r.content_type == "application/msgpack"
        meta = msgpack.unpackb(await r.read())
    assert meta["inputs"] == [{"name": "TEXT", "datatype": "BYTES", "shape": [-1, 2]}]


async def test_repository_index(base_url: str, http: aiohttp.ClientSession) -> None:
    async with http.post(f"{base_url}/v2/repository/index") as r:
        assert r.status == 200
        index = await r.json()
    assert index == [{"name": n, "version": "1", "state": "READY"} for n in ("add", "slow", "upper")]
    async with http.post(f"{base_url}/v2/repository/index", json={"ready": True}) as r:
        assert len(await r.json()) == 3


async def test_tf_serving_status(base_url: str, http: aiohttp.ClientSession) -> None:
    for path in ("/v1/models/add", "/v1/models/add/versions/1"):
        async with http.get(base_url + path) as r:
            assert r.status == 200
            assert (await r.json()) == {"model_version_status": [
                {"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}
            ]}


async def test_not_found(base_url: str, http: aiohttp.ClientSession) -> None:
    cases = {
        "/v2/models/nope": "unknown model 'nope'",
        "/v2/models/add/versions/2": "model 'add' has no version '2'",
        "/v2/models/add/versions/2/ready": "no version '2'",
        "/v1/models/nope": "unknown model 'nope'",
        "/v2/nothing/here": "Not Found: GET /v2/nothing/here",
    }
    for path, message in cases.items():
        async with http.get(base_url + path) as r:
            assert r.status == 404, path
            assert message in (await r.json())["error"]
    async with http.post(f"{base_url}/v2/models/nope/infer", json={"inputs": []}) as r:
        assert r.status == 404 and "unknown model 'nope'" in (await r.json())["error"]
    async with http.get(f"{base_url}/v2/models/add/infer") as r:
        assert r.status == 405 and "POST" in r.headers["Allow"]
    async with http.get(f"{base_url}/v2/health/live") as r:
        assert r.status == 200
