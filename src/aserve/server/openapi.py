"""The OpenAPI 3.1 document of the route table, and a Swagger UI page for it (its files ship in
`static/swagger-ui`).

The document is made from `routes.ROUTES`: every route with an operation id, its path
parameters, the access it needs, and its bodies, which are the codec's own Structs
(`protocol.v2`, `protocol.tfserving` for infer and predict; `protocol.messages`,
`protocol.metadata`, `protocol.tfsignature` for the rest) turned into JSON Schema by
`msgspec.json.schema_components`. The codec's private wire Structs are documented under
public names through doc twins built field by field from them (`_twin`), so a field
added to the codec appears here too.
"""

from __future__ import annotations

import pathlib
import types
import typing
from collections.abc import Sequence
from typing import Annotated, Any

import msgspec

from .. import __version__
from ..protocol import messages as m
from ..protocol.formats import ErrorMessage
from .access import ADMIN, API, Level
from .app import App
from .errors import RouteNotFound
from .http import Request, Response

STATIC = pathlib.Path(__file__).resolve().parent / "static" / "swagger-ui"
JSON, MSGPACK, OCTET = "application/json", "application/msgpack", "application/octet-stream"

# the codec's private wire Structs, by the names the document gives them
PUBLIC_NAMES = {
    "_WireRequest": "InferRequest", "_WireInput": "InferInputTensor", "_InputParameters": "InferInputParameters",
    "_WireOutput": "InferRequestedOutput", "_OutputParameters": "InferRequestedOutputParameters",
    "_WireResponse": "InferResponse", "_WireOutputTensor": "InferOutputTensor", "_WirePredict": "PredictRequest",
}


# ---- doc twins of the codec's private Structs ----

_twins: dict[type, type] = {}


def _twin(cls: type) -> type:
    """A Struct with `cls`'s fields under its public name, `msgspec.Raw` (decoded later)
    documented as any value."""
    found = _twins.get(cls)
    if found is not None:
        return found
    name = PUBLIC_NAMES.get(cls.__name__, cls.__name__)
    fields: list[Any] = []
    for f in msgspec.structs.fields(cls):
        kind = _doc_type(f.type)
        if isinstance(f.default, msgspec.Raw) or f.default is msgspec.UNSET:
            fields.append((f.name, kind, None))
        elif f.default is not msgspec.NODEFAULT:
            fields.append((f.name, kind, f.default))
        elif f.default_factory is not msgspec.NODEFAULT:
            fields.append((f.name, kind, msgspec.field(default_factory=f.default_factory)))
        else:
            fields.append((f.name, kind))
    config = cls.__struct_config__  # type: ignore[attr-defined]
    rename = {f.name: f.encode_name for f in msgspec.structs.fields(cls) if f.encode_name != f.name}
    twin = msgspec.defstruct(name, fields, kw_only=True, rename=rename or None,
                             forbid_unknown_fields=config.forbid_unknown_fields)
    twin.__doc__ = cls.__doc__
    _twins[cls] = twin
    return twin


def _doc_type(kind: Any) -> Any:
    if kind is msgspec.Raw:
        return Any
    if isinstance(kind, type) and issubclass(kind, msgspec.Struct) and kind.__name__.startswith("_"):
        return _twin(kind)
    origin = typing.get_origin(kind)
    if origin is None:
        return kind
    args = typing.get_args(kind)
    if origin is Annotated:
        return Annotated[(_doc_type(args[0]), *kind.__metadata__)]
    if origin in (typing.Union, types.UnionType):
        new = tuple(_doc_type(a) for a in args)
        return typing.Union[new]  # noqa: UP007 - built from a tuple of types
    return origin[tuple(_doc_type(a) for a in args)] if len(args) > 1 else origin[_doc_type(args[0])]


def _public(kind: Any) -> Any:
    if isinstance(kind, type) and issubclass(kind, msgspec.Struct) and kind.__name__.startswith("_"):
        return _twin(kind)
    origin = typing.get_origin(kind)
    if origin is list:
        return list[_public(typing.get_args(kind)[0])]  # type: ignore[misc]
    return kind


# ---- the document ----

def _parameters(path: str) -> list[dict[str, Any]]:
    out = []
    for name in ("model", "version", "label"):
        if "{" + name + "}" in path:
            out.append({"name": name, "in": "path", "required": True,
                        "schema": {"type": "string", "minLength": 1, "pattern": "^[A-Za-z0-9_.-]+$"},
                        "description": {"model": "model name", "version": "version number or label",
                                        "label": "version label"}[name]})
    return out


def _security(level: Level) -> list[dict[str, list[str]]] | None:
    if level == API:
        return [{"apiToken": []}, {"adminToken": []}, {}]
    if level == ADMIN:
        return [{"adminToken": []}, {}]
    return None


def document(routes: Sequence[Any]) -> dict[str, Any]:
    """The OpenAPI 3.1 document of `routes` (routes.Route; those without an operation id are left out)."""
    routes = [r for r in routes if r.operation]
    bodies: list[Any] = [ErrorMessage]
    for r in routes:
        for t in (r.request, r.response):
            if t is not None:
                bodies.append(_public(t))
    schemas, components = msgspec.json.schema_components(bodies, ref_template="#/components/schemas/{name}")
    ref = dict(zip(bodies, schemas))
    error = ref[ErrorMessage]
    paths: dict[str, dict[str, Any]] = {}
    for r in routes:
        op: dict[str, Any] = {"operationId": r.operation, "summary": r.summary, "tags": [r.tag]}
        params = _parameters(r.path)
        if params:
            op["parameters"] = params
        if r.request is not None:
            schema = ref[_public(r.request)]
            content = {fmt: {"schema": schema} for fmt in r.formats}
            if r.operation.startswith("infer"):
                content[OCTET] = {"schema": {"type": "string", "format": "binary", "description":
                                             "the JSON request, then its binary tensors "
                                             "(Inference-Header-Content-Length: the JSON's length)"}}
            op["requestBody"] = {"required": False, "content": content}
        responses: dict[str, Any] = {}
        if r.response is not None:
            schema = ref[_public(r.response)]
            content = {fmt: {"schema": schema} for fmt in r.formats}
            if r.operation.startswith("infer"):
                content[OCTET] = {"schema": {"type": "string", "format": "binary"}}
            responses["200"] = {"description": "OK", "content": content}
        else:
            text = {"type": "object"} if r.content == JSON else {"type": "string"}
            responses["200"] = {"description": "OK", "content": {r.content or JSON: {"schema": text}}}
        errors = {fmt: {"schema": error} for fmt in (JSON, MSGPACK)}
        for status in r.statuses:
            if status == 503 and r.operation == "ready":
                responses["503"] = {"description": "not ready: which model versions, and why",
                                    "content": {fmt: {"schema": ref[m.ReadyResponse]} for fmt in r.formats}}
            elif status == 503 and r.operation.startswith("model_ready"):
                responses["503"] = {"description": "the model does not answer requests",
                                    "content": {fmt: {"schema": ref[m.ModelReadyResponse]}
                                                for fmt in r.formats}}
            else:
                responses[str(status)] = {"description": _STATUS[status], "content": errors}
        responses["default"] = {"description": "an error: the message names the field, limit or setting and the "
                                               "expected value", "content": errors}
        op["responses"] = responses
        security = _security(r.level)
        if security is not None:
            op["security"] = security
        paths.setdefault(r.path, {})[r.method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "aserve", "version": __version__,
            "description": "Open Inference Protocol (KServe V2, as Triton speaks it) and TensorFlow-Serving REST. "
                           "V2 bodies are JSON, msgpack, or JSON followed by binary tensors. Bearer tokens are "
                           "needed only when the server was started with --api-token (inference and metadata) or "
                           "--admin-token (repository and trace settings); health, /metrics and this document "
                           "are open.",
            "license": {"name": "Apache-2.0", "identifier": "Apache-2.0"},
        },
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {
                "apiToken": {"type": "http", "scheme": "bearer", "description": "--api-token (ASERVE_API_TOKEN)"},
                "adminToken": {"type": "http", "scheme": "bearer",
                               "description": "--admin-token (ASERVE_ADMIN_TOKEN)"},
            },
        },
    }


_STATUS = {400: "invalid request: the message names the field, the expected and the received value",
           404: "no such model or version", 415: "unsupported Content-Type or Content-Encoding",
           501: "the model does not fit this method", 503: "not ready or overloaded (Retry-After)",
           504: "the request's deadline passed"}


# ---- handlers ----

async def openapi_document(app: App, request: Request) -> Response:
    return Response(200, app.openapi, content_type=JSON)


DOCS_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>aserve API</title>
<link rel="stylesheet" href="/v2/docs/swagger-ui.css">
</head>
<body>
<div id="swagger-ui"></div>
<script src="/v2/docs/swagger-ui-bundle.js"></script>
<script>
window.ui = SwaggerUIBundle({url: "/v2/openapi.json", dom_id: "#swagger-ui", deepLinking: true});
</script>
</body>
</html>
"""


async def docs_page(app: App, request: Request) -> Response:
    return Response(200, DOCS_PAGE.encode(), content_type="text/html; charset=utf-8")


_STATIC_TYPES = {".js": "text/javascript", ".css": "text/css", ".txt": "text/plain"}


async def static_files(app: App, request: Request) -> Response:
    """The Swagger UI files shipped in the package (no CDN), by name only."""
    name = request.params["file"]
    files = {p.name: p for p in STATIC.iterdir() if p.is_file()} if STATIC.is_dir() else {}
    path = files.get(name)
    if path is None:
        raise RouteNotFound(f"no file {name!r} under /v2/docs/; there are: {', '.join(sorted(files))}")
    kind = _STATIC_TYPES.get(path.suffix, "text/plain")
    return Response(200, path.read_bytes(), {"Content-Type": kind, "Cache-Control": "public, max-age=86400"})
