"""What error responses say: ids for failures, model errors only when exposed, no paths or
tracebacks, no versions in the Server header, 415/400 for bodies the server cannot read."""

from __future__ import annotations

import gzip
import json
import logging
import pathlib
import zlib

import aiohttp
import msgpack
import pytest

from .conftest import MODELS, logged
from .hardened_models import add_body, hardened_repository


@pytest.fixture
def repo(tmp_path: pathlib.Path) -> pathlib.Path:
    return hardened_repository(tmp_path / "repo")


async def test_internal_error_has_an_id_and_its_log_line_too(start_server, repo: pathlib.Path,
                                                             http: aiohttp.ClientSession,
                                                             caplog: pytest.LogCaptureFixture,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    _, url = await start_server(repo)

    def boom(*args: object, **kwargs: object) -> None:
        raise AttributeError("'NoneType' object has no attribute 'secret_internal_detail'")

    monkeypatch.setattr("aserve.server.v2.statistics", boom)  # a bug in a handler's code
    with caplog.at_level(logging.ERROR, logger="aserve.server"):
        async with http.get(f"{url}/v2/models/stats") as r:
            assert r.status == 500
            body = await r.json()
    assert body["error"] == "internal error" and len(body["error_id"]) == 12
    assert "secret_internal_detail" not in str(body) and "AttributeError" not in str(body)
    lines = [rec for rec in caplog.records if body["error_id"] in rec.getMessage()]
    assert lines and lines[0].exc_info is not None and "secret_internal_detail" in caplog.text
    async with http.get(f"{url}/v2/health/live") as r:
        assert r.status == 200


async def test_model_error_exposed_on_loopback_with_relative_paths(start_server, repo: pathlib.Path,
                                                                   http: aiohttp.ClientSession,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    _, url = await start_server(repo, log_level="info")  # 127.0.0.1: exposed by default
    x = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}]}
    caplog.set_level(logging.INFO, logger="aserve.server")
    async with http.post(f"{url}/v2/models/leaky/infer", json=x) as r:
        assert r.status == 500
        body = await r.json()
    assert "cannot read leaky/model.py nor …/secret.key" in body["error"], body
    assert str(repo) not in body["error"] and "/etc/aserve" not in body["error"] and "Traceback" not in body["error"]
    await logged(caplog, where=lambda rec: body["error_id"] in rec.getMessage(), what="the error's log line")
    assert "Traceback" in caplog.text  # the log has it all


async def test_model_error_hidden_when_not_exposed(start_server, repo: pathlib.Path, http: aiohttp.ClientSession,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    _, url = await start_server(repo, expose_model_errors=False, log_level="info")
    x = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}]}
    caplog.set_level(logging.INFO, logger="aserve.server")
    async with http.post(f"{url}/v2/models/leaky/infer", json=x) as r:
        body = await r.json()
    async with http.post(f"{url}/v1/models/leaky:predict", json={"instances": [[1.0]]}) as r:
        tf_body = await r.json()
    error_id = body["error_id"]
    assert body["error"] == f"model 'leaky' version 1 failed (error id {error_id})"
    assert tf_body["error"] == f"model 'leaky' version 1 failed (error id {tf_body['error_id']})"
    [record] = await logged(caplog, where=lambda rec: error_id in rec.getMessage(), what="the error's log line")
    line = record.getMessage()
    assert "secret.key" in line and "leaky" in line
    # the add model's own error (a row starting with -999) is hidden the same way
    async with http.post(f"{url}/v2/models/add/infer", json=add_body(-999)) as r:
        assert r.status == 500 and "-999" not in (await r.json())["error"]


def test_expose_model_errors_default_follows_the_bind_address() -> None:
    from aserve.config import ServerSettings, load_settings

    assert ServerSettings(host="127.0.0.1").model_errors_exposed
    assert ServerSettings(host="::1").model_errors_exposed
    assert not ServerSettings(host="0.0.0.0").model_errors_exposed
    assert ServerSettings(host="0.0.0.0", expose_model_errors=True).model_errors_exposed
    assert not load_settings(environ={"ASERVE_EXPOSE_MODEL_ERRORS": "false"}, overrides={}).model_errors_exposed
    from aserve.cli import build_parser, settings_from_args

    args = build_parser().parse_args(["serve", "--no-expose-model-errors"])
    assert settings_from_args(args).expose_model_errors is False


async def test_server_header_has_no_versions(start_server, repo: pathlib.Path, http: aiohttp.ClientSession) -> None:
    _, url = await start_server(repo)
    async with http.post(f"{url}/v2/models/add/infer", json=add_body()) as r:
        assert r.status == 200 and r.headers["Server"] == "aserve"
    for path in ("/v2/health/ready", "/v2/models/nope", "/nothing", "/metrics", "/v2/docs"):
        async with http.get(url + path) as r:
            assert r.headers["Server"] == "aserve", path


async def test_unknown_model_404_lists_no_models(start_server, repo: pathlib.Path,
                                                 http: aiohttp.ClientSession) -> None:
    _, url = await start_server(repo)
    for method, path in (("GET", "/v2/models/nope"), ("POST", "/v2/models/nope/infer"),
                         ("POST", "/v1/models/nope:predict"), ("GET", "/v2/models/nope/stats")):
        async with http.request(method, url + path, json={"inputs": []}) as r:
            assert r.status == 404
            message = (await r.json())["error"]
        assert message == "unknown model 'nope'; POST /v2/repository/index lists the models", message
        assert not any(name in message for name in ("add", "slow", "upper", "clf", "leaky"))


async def test_content_encoding(start_server, repo: pathlib.Path) -> None:
    _, url = await start_server(repo)
    body = json.dumps(add_body()).encode()
    # a new connection per request: a refused body closes its connection
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:
        for path in ("/v2/models/add/infer", "/v2/repository/index", "/v1/models/add:predict"):
            for encoding in ("br", "zstd", "compress", "gzip, br"):
                async with http.post(url + path, data=body, headers={"Content-Encoding": encoding,
                                                                     "Content-Type": "application/json"}) as r:
                    assert r.status == 415, (path, encoding, await r.text())
                    message = (await r.json())["error"]
                assert message.startswith("Content-Encoding: expected one of gzip, deflate, identity, got"), message
            async with http.post(url + path, data=body, headers={"Content-Encoding": "gzip"}) as r:
                assert r.status == 400
                message = (await r.json())["error"]
            assert message.startswith("Content-Encoding: the body is not valid gzip data"), message
        for encoding, packed in (("gzip", gzip.compress(body)), ("deflate", zlib.compress(body)),
                                 ("identity", body)):
            async with http.post(f"{url}/v2/models/add/infer", data=packed,
                                 headers={"Content-Encoding": encoding}) as r:
                assert r.status == 200, (encoding, await r.text())
                assert (await r.json())["outputs"][0]["data"] == [2, 3, 4, 5]


async def test_content_type(start_server, repo: pathlib.Path) -> None:
    _, url = await start_server(repo)
    body = json.dumps(add_body()).encode()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:
        for kind in ("image/png", "multipart/form-data; boundary=x", "application/xml"):
            async with http.post(f"{url}/v2/models/add/infer", data=body, headers={"Content-Type": kind}) as r:
                assert r.status == 415
                message = (await r.json())["error"]
            assert message.startswith("Content-Type: expected application/json") and "application/msgpack" in message
            assert "application/octet-stream" in message and repr(kind) in message
        async with http.post(f"{url}/v1/models/add:predict", data=b"\x80",
                             headers={"Content-Type": "application/msgpack"}) as r:
            assert r.status == 415 and "msgpack" not in (await r.json())["error"].split(", got")[0]
        for kind in ("application/json", "text/plain", "application/x-www-form-urlencoded", "application/octet-stream",
                     "application/json; charset=utf-8", "application/vnd.kserve+json"):
            async with http.post(f"{url}/v2/models/add/infer", data=body, headers={"Content-Type": kind}) as r:
                assert r.status == 200, (kind, await r.text())
        async with http.post(f"{url}/v2/models/add/infer", data=msgpack.packb(add_body()),
                             headers={"Content-Type": "application/msgpack"}) as r:
            assert r.status == 200


async def test_no_absolute_paths_anywhere(start_server, tmp_path: pathlib.Path, http: aiohttp.ClientSession,
                                          caplog: pytest.LogCaptureFixture) -> None:
    repo = hardened_repository(tmp_path / "repo", badconfig=(MODELS["add"][0], "max_batch_size = 'eight'\n"),
                               badcode=("raise RuntimeError('cannot import me')\n", ""))
    with caplog.at_level(logging.ERROR, logger="aserve.server"):
        _, url = await start_server(repo)
    # the configuration error was logged at start, one line naming the file, the field and the reason
    lines = [rec.getMessage() for rec in caplog.records if "badconfig" in rec.getMessage()]
    assert any("badconfig/config.toml: max_batch_size: Expected `int`, got `str`" in line and "\n" not in line
               for line in lines), lines
    seen: list[str] = []

    async def text(method: str, path: str, **kwargs: object) -> str:
        async with http.request(method, url + path, **kwargs) as r:  # type: ignore[arg-type]
            seen.append(body := await r.text())
            return body

    index = await text("POST", "/v2/repository/index")
    assert "badcode/model.py: import failed: RuntimeError: cannot import me" in index
    assert "badconfig/config.toml: max_batch_size" in index
    meta = await text("GET", "/v2/models/add")
    assert '"directory":"add"' in meta
    await text("GET", "/v2/models/clf/config")
    ready = await text("GET", "/v2/health/ready")
    assert "badcode/model.py: import failed" in ready and "badconfig/config.toml" in ready
    await text("GET", "/v2/models/badcode")
    await text("GET", "/v1/models/badcode")
    await text("POST", "/v2/models/badcode/infer", json={"inputs": []})
    load = await text("POST", "/v2/repository/models/badcode/load")
    assert "badcode/model.py" in load
    for body in seen:
        assert str(tmp_path) not in body and "Traceback" not in body and '"/' not in body, body


async def test_ready_503_names_why(start_server, tmp_path: pathlib.Path, http: aiohttp.ClientSession) -> None:
    repo = hardened_repository(tmp_path / "repo", badconfig=(MODELS["add"][0], "max_batch_size = 'eight'\n"))
    _, url = await start_server(repo)
    async with http.get(f"{url}/v2/health/ready") as r:
        assert r.status == 503
        body = await r.json()
    assert body["ready"] is False and body["reason"] == "1 model version not ready"
    assert body["models"] == [{"name": "badconfig", "version": "", "state": "UNAVAILABLE", "reason":
                               "badconfig/config.toml: max_batch_size: Expected `int`, got `str`"}]


def test_a_message_without_a_path_is_redacted_without_the_registrys_folders() -> None:
    # a refusal's message has no "/": the policy answers it without walking the registry's
    # folders, and says what the full rewrite would
    from types import SimpleNamespace

    from aserve.redact import Redactor
    from aserve.server.errors import ErrorPolicy

    class Walked(dict):  # type: ignore[type-arg]
        def items(self):  # type: ignore[no-untyped-def]
            raise AssertionError("the registry's folders were walked")

    policy = ErrorPolicy(registry=SimpleNamespace(records=Walked(), repository="/srv/models"))
    full = Redactor("/srv/models")
    for text in ("model 'cnn' cannot answer the request within its latency budget; retry in 0.02 s",
                 "  spaced  ", "boom\nTraceback (most recent call last):\n  File \"x\", line 1", ""):
        assert policy.redact(text) == full.text(text)
    with pytest.raises(AssertionError, match="walked"):
        policy.redact("failed to load /srv/models/cnn/model.py")
