"""TensorFlow-Serving's REST routes besides predict, classify and regress (`infer.py`): model
status and metadata, and an answer naming the methods served for any other."""

from __future__ import annotations

from typing import Any

import msgspec

from ..dataplane import READY, ModelHandle
from ..errors import NotSupported
from ..protocol import messages as m
from ..protocol import tfsignature
from .app import App
from .errors import MethodNotAllowed
from .http import Request, Response

_TF_STATES = {"READY": "AVAILABLE", "LOADING": "LOADING", "UNLOADING": "UNLOADING"}


def _version(request: Request) -> str | None:
    params = request.params
    return params.get("version") or params.get("label")


def _json(body: Any) -> Response:
    return Response(200, msgspec.json.encode(body), content_type="application/json")


async def metadata(app: App, request: Request) -> Response:
    """GET /v1/models/{model}[/versions/{v} | /labels/{l}]/metadata: the model's signatures."""
    handle = app.plane.model(request.params["model"], _version(request))
    inputs = handle.info.inputs if handle.info else handle.config.input_specs
    outputs = handle.info.outputs if handle.info else handle.config.output_specs
    return _json(tfsignature.metadata(handle.name, handle.version, inputs, outputs,
                                      max_batch_size=handle.config.max_batch_size))


def _version_status(handle: ModelHandle, redact: Any) -> m.TFVersionStatus:
    state = _TF_STATES.get(handle.state, "END")
    status = m.TFStatus("OK", "")
    if handle.state not in (READY, "LOADING", "UNLOADING"):
        status = m.TFStatus("UNAVAILABLE", redact(handle.reason))
    return m.TFVersionStatus(handle.version, state, status)


async def status(app: App, request: Request) -> Response:
    """GET /v1/models/{model}[/versions/{v} | /labels/{l}]: TF-Serving's model status,
    every version of the model unless one is named."""
    plane = app.plane
    name = request.params["model"]
    wanted = _version(request)
    if wanted is not None:
        handles = [plane.model(name, wanted)]
    else:
        plane.model(name)  # 404 for an unknown model
        routes = plane.registry.routes[name]
        found = {**routes.others, **routes.versions}
        handles = [found[v] for v in sorted(found, key=int) if v != "0"] or [plane.model(name)]
    return _json(m.TFStatusResponse([_version_status(h, app.policy.redact) for h in handles]))


async def other_method(app: App, request: Request) -> Response:
    """POST /v1/models/{model}[...][:method] for a method not served: 501 naming those that are
    (405 for a POST without a method, where only GET is served)."""
    last = request.path.rpartition("/")[2]
    if ":" not in last:
        raise MethodNotAllowed(f"Method Not Allowed: POST {request.path}", ["GET"])
    method = last.rpartition(":")[2]
    raise NotSupported(f"TF-Serving method :{method} is not supported; POST /v1/models/{{model}}:predict, "
                       f":classify or :regress")
