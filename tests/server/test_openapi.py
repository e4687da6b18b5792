"""The OpenAPI document: valid OpenAPI 3.1, every route in it, served with its docs page, and a
bounded schemathesis run against a live server (no 5xx, no response that breaks the schema)."""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import re
import sys

import aiohttp
from openapi_spec_validator import validate

from aserve.server.openapi import STATIC, document
from aserve.server.routes import ROUTES

from ..conftest import spawns
from .hardened_models import hardened_repository

# routes that are not operations of the API: the docs page's files, and the catch-all for
# TF-Serving verbs other than predict, classify and regress (501)
UNDOCUMENTED = {("GET", "/v2/docs/{file}"), ("POST", "/v1/models/{model}"),
                ("POST", "/v1/models/{model}/versions/{version}"), ("POST", "/v1/models/{model}/labels/{label}")}


def test_document_is_valid_openapi_3_1() -> None:
    doc = document(ROUTES)
    assert doc["openapi"] == "3.1.0"
    validate(doc)


async def test_every_route_is_documented_and_answered(start_server, tmp_path: pathlib.Path,
                                                      http: aiohttp.ClientSession) -> None:
    """The router and the document come from one table: every route but the declared few is
    an operation of the served document, and every route reaches its handler."""
    _, url = await start_server(hardened_repository(tmp_path / "repo"))
    assert {(r.method, r.path) for r in ROUTES if not r.operation} == UNDOCUMENTED
    async with http.get(f"{url}/v2/openapi.json") as r:
        assert r.status == 200 and r.content_type == "application/json"
        served = await r.json()
    documented = {(method.upper(), path) for path, ops in served["paths"].items() for method in ops}
    assert documented == {(r.method, r.path) for r in ROUTES if r.operation}
    assert {"InferRequest", "InferResponse", "ErrorMessage", "PredictRequest"} <= set(served["components"]["schemas"])
    # the codec's fields, under the public names
    assert set(served["components"]["schemas"]["InferInputTensor"]["properties"]) == {
        "name", "shape", "datatype", "parameters", "data"}
    values = {"model": "clf", "version": "1", "label": "stable", "file": "swagger-ui.css"}
    for route in ROUTES:
        path = route.path
        for name, value in values.items():
            # load and unload change the repository: asked of a model that does not exist
            path = path.replace("{" + name + "}", "nope" if route.path.endswith("load") and name == "model" else value)
        if route.method == "POST" and route.path.startswith("/v1/") and not route.operation:
            path += ":explain"  # the catch-all for TF-Serving methods not served: 501
        async with http.request(route.method, url + path, json={} if route.method == "POST" else None) as r:
            body = await r.read()
        assert r.status != 405, (route.method, path)
        assert not (r.status == 404 and json.loads(body)["error"].startswith("Not Found:")), (route.method, path)


async def test_docs_page_and_its_shipped_assets(start_server, tmp_path: pathlib.Path,
                                                http: aiohttp.ClientSession) -> None:
    _, url = await start_server(hardened_repository(tmp_path / "repo"))
    async with http.get(f"{url}/v2/docs") as r:
        assert r.status == 200 and r.content_type == "text/html"
        page = await r.text()
    assert "/v2/openapi.json" in page and "//" not in page.replace("http://", "").replace("https://", "")
    assets = re.findall(r'(?:src|href)="(/v2/docs/[^"]+)"', page)
    assert sorted(assets) == ["/v2/docs/swagger-ui-bundle.js", "/v2/docs/swagger-ui.css"]
    for asset, kind in zip(sorted(assets), ("text/javascript", "text/css")):
        async with http.get(url + asset) as r:
            assert r.status == 200 and r.content_type == kind and len(await r.read()) > 100_000
    assert "Apache License" in (STATIC / "LICENSE").read_text()  # shipped with its license
    async with http.get(f"{url}/v2/docs/..%2F..%2Fopenapi.py") as r:
        assert r.status == 404


@spawns
async def test_schemathesis_finds_no_server_error(start_server, tmp_path: pathlib.Path) -> None:
    _, url = await start_server(hardened_repository(tmp_path / "repo"))
    config = tmp_path / "schemathesis.toml"
    config.write_text('[parameters]\n"path.model" = "clf"\n"path.version" = "1"\n"path.label" = "stable"\n')
    cli = pathlib.Path(sys.executable).with_name("schemathesis")
    proc = await asyncio.create_subprocess_exec(
        str(cli), "--config-file", str(config), "run", f"{url}/v2/openapi.json",
        "--checks", "not_a_server_error,response_schema_conformance,content_type_conformance",
        "--phases", "examples,fuzzing", "--max-examples", "8", "--seed", "20261123", "--workers", "1",
        # :regress answers 501 for a classifier (tested elsewhere); loading and unloading change the models
        "--exclude-path-regex", r":regress$|/load$|/unload$",
        cwd=tmp_path, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "NO_COLOR": "1", "SCHEMATHESIS_TELEMETRY": "false"},
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 300)
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text[-6000:]
    assert re.search(r"\d+ generated, \d+ passed", text), text[-3000:]
