"""Bearer tokens (admin: repository and trace settings; api: inference and metadata, on the hot
path and the router) and CORS."""

from __future__ import annotations

import asyncio
import pathlib

import aiohttp
import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from .hardened_models import add_body

ADMIN = {"Authorization": "Bearer admin-secret"}
API = {"Authorization": "Bearer api-secret"}
WRONG = {"Authorization": "Bearer nope"}


async def status(http: aiohttp.ClientSession, method: str, url: str, headers: dict[str, str] | None = None,
                 **kwargs: object) -> tuple[int, dict]:
    async with http.request(method, url, headers=headers, **kwargs) as r:  # type: ignore[arg-type]
        body = await r.json() if r.content_type == "application/json" else {}
        if r.status == 401:
            assert r.headers["WWW-Authenticate"].startswith("Bearer"), r.headers
        return r.status, body


ADMIN_ROUTES = [("POST", "/v2/repository/index"), ("POST", "/v2/repository/models/add/load"),
                ("GET", "/v2/trace/setting"), ("GET", "/v2/models/add/trace/setting")]
API_ROUTES = [("POST", "/v2/models/add/infer"), ("POST", "/v2/models/add/versions/1/infer"),
              ("POST", "/v2/models/ad%64/infer"),  # a percent-escape: the router's path, not the front's
              ("POST", "/v1/models/add:predict"), ("GET", "/v2/models/add"), ("GET", "/v2/models/add/config"),
              ("GET", "/v2/models/stats"), ("GET", "/v2"), ("GET", "/v1/models/add"), ("GET", "/v1/models/add/metadata")]
OPEN_ROUTES = [("GET", "/v2/health/live"), ("GET", "/v2/health/ready"), ("GET", "/v2/models/add/ready"),
               ("GET", "/metrics"), ("GET", "/v2/openapi.json"), ("GET", "/v2/docs")]


def body_for(path: str) -> dict:
    return {"instances": [{"A": [1, 2, 3, 4], "B": [1, 1, 1, 1]}]} if ":predict" in path else add_body()


async def test_admin_and_api_tokens(start_server, repository: pathlib.Path, http: aiohttp.ClientSession) -> None:
    _, url = await start_server(repository, admin_token="admin-secret", api_token="api-secret")
    for method, path in ADMIN_ROUTES:
        code, body = await status(http, method, url + path)
        assert code == 401 and "--admin-token" in body["error"] and "Authorization: Bearer" in body["error"], body
        code, body = await status(http, method, url + path, WRONG)
        assert code == 403 and "not valid" in body["error"] and "--admin-token" in body["error"], body
        assert (await status(http, method, url + path, API))[0] == 403, path  # the api token is not enough
        assert (await status(http, method, url + path, ADMIN))[0] == 200, path
    for method, path in API_ROUTES:
        kwargs = {"json": body_for(path)} if method == "POST" else {}
        code, body = await status(http, method, url + path, **kwargs)
        assert code == 401 and "--api-token" in body["error"], (path, body)
        assert (await status(http, method, url + path, WRONG, **kwargs))[0] == 403, path
        assert (await status(http, method, url + path, {"Authorization": "Basic YTpi"}, **kwargs))[0] == 401, path
        assert (await status(http, method, url + path, API, **kwargs))[0] == 200, path
        assert (await status(http, method, url + path, ADMIN, **kwargs))[0] == 200, path  # admin may do anything
    for method, path in OPEN_ROUTES:
        async with http.request(method, url + path) as r:
            assert r.status == 200, path


async def test_only_an_api_token_guards_the_admin_routes_too(start_server, repository: pathlib.Path,
                                                           http: aiohttp.ClientSession) -> None:
    _, url = await start_server(repository, api_token="api-secret")
    code, body = await status(http, "POST", f"{url}/v2/repository/index")
    assert code == 401 and "--api-token" in body["error"]
    assert (await status(http, "POST", f"{url}/v2/repository/index", API))[0] == 200


async def test_only_an_admin_token_leaves_inference_open(start_server, repository: pathlib.Path,
                                                        http: aiohttp.ClientSession) -> None:
    _, url = await start_server(repository, admin_token="admin-secret")
    assert (await status(http, "POST", f"{url}/v2/models/add/infer", json=add_body()))[0] == 200
    assert (await status(http, "POST", f"{url}/v2/repository/models/add/unload"))[0] == 401
    code, body = await status(http, "GET", f"{url}/v2/models/nope")
    assert code == 404 and body["error"].endswith("lists the models (with the admin token)")


async def test_ready_details_need_the_api_token(start_server, tmp_path: pathlib.Path,
                                                http: aiohttp.ClientSession) -> None:
    from .conftest import MODELS, write_repository

    repo = write_repository(tmp_path / "repo", {"add": MODELS["add"], "bad": (MODELS["add"][0], "x = 1\n")})
    _, url = await start_server(repo, api_token="api-secret")
    code, body = await status(http, "GET", f"{url}/v2/health/ready")
    assert code == 503 and "models" not in body and "send the api token" in body["reason"]
    code, body = await status(http, "GET", f"{url}/v2/health/ready", API)
    assert code == 503 and body["models"][0]["name"] == "bad"


async def test_tritonclient_with_a_token(start_server, repository: pathlib.Path) -> None:
    _, url = await start_server(repository, api_token="api-secret")
    a = np.arange(4, dtype=np.int32).reshape(1, 4)

    def call(headers: dict[str, str] | None) -> np.ndarray:
        client = triton.InferenceServerClient(url.removeprefix("http://"))
        inputs = [triton.InferInput("A", [1, 4], "INT32"), triton.InferInput("B", [1, 4], "INT32")]
        inputs[0].set_data_from_numpy(a, binary_data=True)
        inputs[1].set_data_from_numpy(a, binary_data=True)
        try:
            # a copy: tritonclient adds its own headers to the dict it is given
            return client.infer("add", inputs, headers=dict(headers) if headers else None).as_numpy("SUM")
        finally:
            client.close()

    assert (await asyncio.to_thread(call, API)).tolist() == [[0, 2, 4, 6]]
    with pytest.raises(InferenceServerException, match="need a bearer token"):
        await asyncio.to_thread(call, None)


def test_token_settings_from_environment_and_flags() -> None:
    from aserve.cli import build_parser, settings_from_args
    from aserve.config import load_settings

    s = load_settings(environ={"ASERVE_ADMIN_TOKEN": "a", "ASERVE_API_TOKEN": "b",
                               "ASERVE_CORS_ORIGINS": "https://a.example, http://localhost:3000"})
    assert (s.admin_token, s.api_token) == ("a", "b") and s.cors_origins == ["https://a.example",
                                                                           "http://localhost:3000"]
    assert "'a'" not in repr(s) and "'b'" not in repr(s)  # tokens stay out of logs
    args = build_parser().parse_args(["serve", "--admin-token", "x", "--cors-origin", "*",
                                      "--cors-origin", "https://b.example"])
    s = settings_from_args(args)
    assert s.admin_token == "x" and s.cors_origins == ["*", "https://b.example"]


async def test_cors(start_server, repository: pathlib.Path, http: aiohttp.ClientSession) -> None:
    origin = "https://app.example"
    _, url = await start_server(repository, cors_origins=[origin], api_token="api-secret")
    preflight = {"Origin": origin, "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization, content-type"}
    for path in ("/v2/models/add/infer", "/v2/repository/index", "/v2/models/add"):
        async with http.options(url + path, headers=preflight) as r:
            assert r.status == 204 and r.headers["Access-Control-Allow-Origin"] == origin
            assert "POST" in r.headers["Access-Control-Allow-Methods"]
            assert "authorization" in r.headers["Access-Control-Allow-Headers"]
    async with http.options(f"{url}/v2/models/add/infer", headers={**preflight, "Origin": "https://evil.example"}) as r:
        assert r.status == 403 and "--cors-origin" in (await r.json())["error"]
    # responses to the allowed origin, on the hot path and the router, errors included
    for method, path, headers in (("POST", "/v2/models/add/infer", API), ("GET", "/v2/models/add", API),
                                  ("POST", "/v2/models/add/infer", {}), ("GET", "/v2/health/live", {})):
        kwargs = {"json": add_body()} if method == "POST" else {}
        async with http.request(method, url + path, headers={**headers, "Origin": origin}, **kwargs) as r:
            assert r.headers["Access-Control-Allow-Origin"] == origin, (path, r.status)
            assert "Inference-Header-Content-Length" in r.headers["Access-Control-Expose-Headers"]
    async with http.get(f"{url}/v2/health/live", headers={"Origin": "https://evil.example"}) as r:
        assert "Access-Control-Allow-Origin" not in r.headers


async def test_no_cors_by_default(start_server, repository: pathlib.Path, http: aiohttp.ClientSession) -> None:
    _, url = await start_server(repository)
    async with http.post(f"{url}/v2/models/add/infer", json=add_body(), headers={"Origin": "https://a.example"}) as r:
        assert r.status == 200 and "Access-Control-Allow-Origin" not in r.headers
    async with http.options(f"{url}/v2/models/add/infer", headers={
            "Origin": "https://a.example", "Access-Control-Request-Method": "POST"}) as r:
        assert r.status == 405
