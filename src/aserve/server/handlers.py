"""Request handlers: Open Inference Protocol (V2) and TensorFlow-Serving REST.

Handlers only translate: HTTP in, codec, registry/batcher, codec, HTTP out. Errors
are raised as aserve errors and answered by the error middleware.
"""

from __future__ import annotations

from typing import Any

import msgspec
from aiohttp import web

from .. import __version__
from ..errors import InvalidInput
from ..protocol import decode_infer, decode_predict, encode_infer, encode_message, encode_predict, negotiate
from ..protocol.formats import CONTENT_TYPES
from .metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from .metrics import Metrics, render
from .models import READY, VERSIONS, ModelHandle, ModelRegistry

REGISTRY_KEY: web.AppKey[ModelRegistry] = web.AppKey("registry", ModelRegistry)
METRICS_KEY: web.AppKey[Metrics] = web.AppKey("metrics", Metrics)

EXTENSIONS = ["binary_tensor_data", "model_repository", "msgpack"]
STREAM_THRESHOLD = 1 << 20  # bodies larger than this are written chunk by chunk, not joined


def _registry(request: web.Request) -> ModelRegistry:
    return request.app[REGISTRY_KEY]


def _message(request: web.Request, obj: Any, *, status: int = 200) -> web.Response:
    fmt = negotiate(request.headers.get("Accept"), request.headers.get("Content-Type"))
    response = web.Response(status=status, body=encode_message(obj, fmt))
    response.content_type = CONTENT_TYPES[fmt]
    return response


def _handle(request: web.Request) -> ModelHandle:
    info = request.match_info
    return _registry(request).get(info["model"], info.get("version"))


# ---- health and metadata ----

async def server_metadata(request: web.Request) -> web.Response:
    return _message(request, {"name": "aserve", "version": __version__, "extensions": EXTENSIONS})


async def live(request: web.Request) -> web.Response:
    return _message(request, {"live": True})


async def ready(request: web.Request) -> web.Response:
    ok = _registry(request).ready
    return _message(request, {"ready": ok}, status=200 if ok else 503)


def _tensor_metadata(specs: Any) -> list[dict[str, Any]]:
    return [{"name": s.name, "datatype": s.datatype, "shape": list(s.shape)} for s in specs]


async def model_metadata(request: web.Request) -> web.Response:
    handle = _handle(request)
    inputs = handle.info.inputs if handle.info else handle.config.input_specs
    outputs = handle.info.outputs if handle.info else handle.config.output_specs
    return _message(request, {
        "name": handle.name,
        "versions": list(VERSIONS),
        "platform": "aserve",
        "inputs": _tensor_metadata(inputs),
        "outputs": _tensor_metadata(outputs),
        "parameters": handle.parameters(),
    })


async def model_ready(request: web.Request) -> web.Response:
    handle = _handle(request)
    return _message(request, {"name": handle.name, "ready": handle.ready}, status=200 if handle.ready else 503)


async def model_config(request: web.Request) -> web.Response:
    handle = _handle(request)
    config = msgspec.to_builtins(handle.config)
    config["name"] = handle.name
    return _message(request, config)


async def repository_index(request: web.Request) -> web.Response:
    body = await request.read()
    only_ready = False
    if body.strip():
        try:
            wanted = msgspec.json.decode(body)
        except msgspec.DecodeError as e:
            raise InvalidInput(f"repository index request: malformed JSON: {e}") from None
        only_ready = isinstance(wanted, dict) and wanted.get("ready") is True
    index = []
    for handle in _registry(request).models.values():
        if only_ready and not handle.ready:
            continue
        row = {"name": handle.name, "version": VERSIONS[-1], "state": handle.state}
        if handle.reason:
            row["reason"] = handle.reason
        index.append(row)
    return _message(request, index)


# ---- inference ----

def _header_length(request: web.Request) -> int | None:
    value = request.headers.get("Inference-Header-Content-Length")
    if value is None:
        return None
    try:
        n = int(value)
    except ValueError:
        raise InvalidInput(
            f"header Inference-Header-Content-Length: expected a byte count, got {value!r}"
        ) from None
    if n < 0:
        raise InvalidInput(f"header Inference-Header-Content-Length: expected >= 0, got {n}")
    return n


async def _write_chunks(request: web.Request, chunks: list[Any], headers: dict[str, str]) -> web.StreamResponse:
    if len(chunks) == 1:
        return web.Response(body=chunks[0], headers=headers)
    total = sum(memoryview(c).nbytes for c in chunks)
    if total <= STREAM_THRESHOLD:
        return web.Response(body=b"".join(chunks), headers=headers)
    response = web.StreamResponse(headers=headers)
    response.content_length = total
    await response.prepare(request)
    for c in chunks:
        await response.write(memoryview(c).cast("B"))
    await response.write_eof()
    return response


async def infer(request: web.Request) -> web.StreamResponse:
    handle = _handle(request)
    with request.app[METRICS_KEY].track(handle.name, handle.version) as tracked:
        header_length = _header_length(request)
        body = await request.read()
        info = handle.require_ready()
        content_type = request.headers.get("Content-Type")
        req = decode_infer(
            body, content_type=content_type, header_length=header_length, model=info,
            max_batch_size=handle.config.max_batch_size, max_latency_budget_ms=handle.timeout_ms,
        )
        tracked.samples = req.samples
        outputs = await handle.infer(
            req.inputs, req.samples, timeout_ms=req.timeout_ms, latency_budget_ms=req.latency_budget_ms
        )
        chunks, headers = encode_infer(
            model_name=handle.name, model_version=request.match_info.get("version"), request=req, outputs=outputs,
            accept=request.headers.get("Accept"), content_type=content_type,
        )
        return await _write_chunks(request, chunks, headers)


# ---- TensorFlow-Serving REST ----

async def tf_predict(request: web.Request) -> web.Response:
    # TF-Serving's predict request has no per-request parameters: the model's timeout and budget apply.
    handle = _handle(request)
    with request.app[METRICS_KEY].track(handle.name, handle.version) as tracked:
        body = await request.read()
        info = handle.require_ready()
        req = decode_predict(body, model=info, max_batch_size=handle.config.max_batch_size)
        tracked.samples = req.samples
        outputs = await handle.infer(req.inputs, req.samples, timeout_ms=None)
        batched = handle.config.max_batch_size > 0
        response = web.Response(body=encode_predict(outputs, columnar=req.columnar, batched=batched))
        response.content_type = "application/json"
        return response


# ---- Prometheus ----

async def metrics(request: web.Request) -> web.Response:
    registry = _registry(request)
    text = render(registry.models.values(), registry.pools, request.app[METRICS_KEY], registry.schedulers)
    return web.Response(body=text.encode(), headers={"Content-Type": METRICS_CONTENT_TYPE})


async def tf_status(request: web.Request) -> web.Response:
    handle = _handle(request)
    state = {"READY": "AVAILABLE", "LOADING": "LOADING"}.get(handle.state, "END")
    status = {"error_code": "OK", "error_message": ""}
    if handle.state != READY:
        status = {"error_code": "UNAVAILABLE" if handle.state != "LOADING" else "OK", "error_message": handle.reason}
    body = {"model_version_status": [{"version": v, "state": state, "status": status} for v in VERSIONS]}
    response = web.Response(body=msgspec.json.encode(body))
    response.content_type = "application/json"
    return response


def add_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/v2", server_metadata)
    r.add_get("/metrics", metrics)
    r.add_get("/v2/health/live", live)
    r.add_get("/v2/health/ready", ready)
    r.add_post("/v2/repository/index", repository_index)
    for base in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        r.add_get(base, model_metadata)
        r.add_get(base + "/ready", model_ready)
        r.add_get(base + "/config", model_config)
        r.add_post(base + "/infer", infer)
    for base in ("/v1/models/{model}", "/v1/models/{model}/versions/{version}"):
        r.add_get(base, tf_status)
        r.add_post(base + ":predict", tf_predict)
