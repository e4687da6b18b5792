"""The Open Inference Protocol's routes besides infer (`infer.py`): health, server and model
metadata, model configuration and statistics."""

from __future__ import annotations

from typing import Any

import msgspec

from .. import __version__
from ..dataplane import ModelHandle
from ..dataplane.queries import serving_versions, tensors
from ..dataplane.stats import statistics
from ..errors import AserveError
from ..protocol import messages as m
from ..protocol.metadata import ServerMetadata, TensorMetadata
from .access import API
from .app import App
from .http import Request, Response, message

EXTENSIONS = ["binary_tensor_data", "model_repository", "model_repository(unload_dependents)", "msgpack",
              "statistics", "trace"]


def _handle(app: App, request: Request) -> ModelHandle:
    params = request.params
    return app.plane.model(params["model"], params.get("version"))


async def server_metadata(app: App, request: Request) -> Response:
    return message(request, ServerMetadata(name="aserve", version=__version__, extensions=EXTENSIONS))


async def live(app: App, request: Request) -> Response:
    return message(request, m.LiveResponse(True))


async def ready(app: App, request: Request) -> Response:
    """200 when every model version the repository asks for serves (`App.readiness`); 503 with
    the reason, and which versions are not ready and why to callers that may see the models
    (with an api token, those that send it)."""
    state = app.readiness()
    if state.ready:
        return message(request, m.ReadyResponse(True))
    if not state.waiting:
        return message(request, m.ReadyResponse(False, state.reason), 503)
    try:
        app.access.check(request, API)
    except AserveError:
        return message(request, m.ReadyResponse(False, state.reason + " (send the api token for which and why)"), 503)
    waiting = [m.NotReady(**row) for row in state.waiting]
    for row in waiting:
        row.reason = app.policy.redact(row.reason)
    return message(request, m.ReadyResponse(False, state.reason, waiting), 503)


def _tensor_metadata(specs: Any) -> list[TensorMetadata]:
    return [TensorMetadata(s.name, s.datatype, list(s.shape)) for s in specs]


async def model_metadata(app: App, request: Request) -> Response:
    handle = _handle(app, request)
    inputs, outputs = tensors(handle)
    parameters = app.policy.redactor().value(handle.parameters())
    parameters["labels"] = dict(app.plane.registry.routes[handle.name].labels)
    return message(request, m.ModelMetadataResponse(
        name=handle.name,
        versions=serving_versions(app.plane, handle),
        platform="aserve",
        inputs=_tensor_metadata(inputs),
        outputs=_tensor_metadata(outputs),
        parameters=parameters,
    ))


async def model_ready(app: App, request: Request) -> Response:
    handle = _handle(app, request)
    return message(request, m.ModelReadyResponse(handle.name, handle.ready), 200 if handle.ready else 503)


async def model_config(app: App, request: Request) -> Response:
    handle = _handle(app, request)
    config = app.policy.redactor().value(msgspec.to_builtins(handle.config))
    config["name"] = handle.name
    return message(request, msgspec.convert(config, m.ModelConfigResponse))


async def model_statistics(app: App, request: Request) -> Response:
    """GET /v2/models[/{model}[/versions/{version}]]/stats, in Triton's statistics format."""
    params = request.params
    fronts = await app.loops.stats() if app.loops is not None else None
    stats = statistics(app.plane.registry, params.get("model"), params.get("version"), fronts)
    return message(request, m.StatisticsResponse(msgspec.convert(stats, list[m.ModelStatistics])))
