"""Every route the server answers, declared once.

One `Route` says what the router matches (method and path template), what the request
needs (the kind of access, the body formats it reads, the check its head gets before
the body is read), which handler answers it, and what the OpenAPI document says of it
(operation, summary, tag, the msgspec types of its bodies, its error statuses). The
router (`router.py`) and the document (`openapi.py`) are both made from `ROUTES`.

Path templates: a segment `{name}` matches any one segment (percent-decoded into
`params[name]`); `{name}:verb` one that ends in `:verb` (TF-Serving's methods).
Earlier routes win where two match.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

from ..dataplane.plane import Pending
from ..inference import Answer, Codec
from ..protocol import CLASSIFY, PREDICT, REGRESS, V2, tfserving, tfsignature, v2
from ..protocol import messages as m
from . import admin, infer, metrics, openapi
from . import tfserving as tf
from . import v2 as v2_routes
from .access import ADMIN, API, OPEN, Level
from .app import App
from .http import Request, Response

JSON, MSGPACK = "application/json", "application/msgpack"

Handler = Callable[[App, Request], Awaitable[Response | Answer] | Pending]
HeadCheck = Callable[[App, Request], None]


class Route(NamedTuple):
    method: str
    path: str
    handler: Handler
    level: Level  # who may call it (access.py)
    operation: str  # the OpenAPI operationId ("": left out of the document)
    summary: str = ""
    tag: str = ""
    request: Any = None  # the body's Struct type (None: reads no body)
    response: Any = None  # the answer's Struct type (or list[...]); None: see `content`
    formats: tuple[str, ...] = (JSON, MSGPACK)  # the media types its bodies come in (others get 415)
    content: str | None = None  # a non-JSON answer (text/plain, text/html, ...)
    statuses: tuple[int, ...] = ()  # error statuses documented besides the default
    head: HeadCheck | None = None  # runs once the head has arrived, before the body is read
    codec: Codec | None = None  # an infer route's codec (infer.py)


# a model's path in each API, by the suffix its routes' operation ids get: the latest version,
# a version named (and, in TF-Serving's, a version label)
V2_MODEL = (("", "/v2/models/{model}"), ("_version", "/v2/models/{model}/versions/{version}"))
V1_MODEL = (("", "/v1/models/{model}"), ("_version", "/v1/models/{model}/versions/{version}"),
            ("_label", "/v1/models/{model}/labels/{label}"))


INFER_STATUSES = (400, 404, 415, 503, 504)


def _routes() -> tuple[Route, ...]:
    routes = [
        Route("GET", "/v2/health/live", v2_routes.live, OPEN, "live", "Is the server running", "health",
              response=m.LiveResponse),
        Route("GET", "/v2/health/ready", v2_routes.ready, OPEN, "ready", "Does every model version the repository "
              "asks for serve (503 names which do not, and why)", "health", response=m.ReadyResponse,
              statuses=(503,)),
        Route("GET", "/v2", v2_routes.server_metadata, API, "server_metadata", "Server name, version and protocol "
              "extensions", "metadata", response=m.ServerMetadata),
        Route("GET", "/metrics", metrics.metrics, OPEN, "metrics", "Prometheus metrics (text format 0.0.4, or "
              "OpenMetrics 1.0 with exemplars when the Accept header asks for it)", "health", content="text/plain"),
        Route("GET", "/v2/models/stats", v2_routes.model_statistics, API, "statistics", "Statistics of every model "
              "version (Triton's statistics extension)", "metadata", response=m.StatisticsResponse),
        Route("POST", "/v2/repository/index", admin.repository_index, ADMIN, "repository_index", "Every model "
              "version, its state and why", "repository", m.IndexRequest, list[m.IndexEntry], formats=(JSON,)),
        Route("POST", "/v2/repository/models/{model}/load", admin.repository_load, ADMIN, "repository_load", "Load or "
              "reload a model from its folder", "repository", m.LoadRequest, m.EmptyResponse, formats=(JSON,),
              statuses=(400,)),
        Route("POST", "/v2/repository/models/{model}/unload", admin.repository_unload, ADMIN, "repository_unload",
              "Stop serving a model once it has answered what it accepted", "repository", m.UnloadRequest,
              m.EmptyResponse, formats=(JSON,)),
        Route("GET", "/v2/trace/setting", admin.trace_setting, ADMIN, "trace_setting", "The trace settings",
              "trace", response=m.TraceSetting),
        Route("POST", "/v2/trace/setting", admin.trace_setting, ADMIN, "trace_setting_update", "Change the trace "
              "settings", "trace", m.TraceSettingRequest, m.TraceSetting, formats=(JSON,)),
        Route("GET", "/v2/models/{model}/trace/setting", admin.trace_setting, ADMIN, "model_trace_setting", "The "
              "trace settings (server-wide)", "trace", response=m.TraceSetting),
        Route("POST", "/v2/models/{model}/trace/setting", admin.trace_setting, ADMIN, "model_trace_setting_update",
              "Change the trace settings (server-wide)", "trace", m.TraceSettingRequest, m.TraceSetting,
              formats=(JSON,)),
        Route("GET", "/v2/openapi.json", openapi.openapi_document, OPEN, "openapi", "This document", "docs",
              content=JSON),
        Route("GET", "/v2/docs", openapi.docs_page, OPEN, "docs", "The API's documentation page (Swagger UI)",
              "docs", content="text/html"),
        Route("GET", "/v2/docs/{file}", openapi.static_files, OPEN, ""),  # the page's script and style
    ]
    for suffix, path in V2_MODEL:
        routes += [
            Route("POST", path + "/infer", infer.infer, API, f"infer{suffix}", "Run the model on a request (JSON, "
                  "msgpack, or JSON with binary tensors after it)", "inference", v2._WireRequest, v2._WireResponse,
                  statuses=INFER_STATUSES, head=infer.prepare, codec=V2),
            Route("GET", path, v2_routes.model_metadata, API, f"model_metadata{suffix}", "The model's inputs, outputs "
                  "and parameters", "metadata", response=m.ModelMetadataResponse, statuses=(404,)),
            Route("GET", path + "/ready", v2_routes.model_ready, OPEN, f"model_ready{suffix}", "Does the model answer "
                  "requests", "health", response=m.ModelReadyResponse, statuses=(404, 503)),
            Route("GET", path + "/config", v2_routes.model_config, API, f"model_config{suffix}", "The model's "
                  "configuration (config.toml)", "metadata", response=m.ModelConfigResponse, statuses=(404,)),
            Route("GET", path + "/stats", v2_routes.model_statistics, API, f"model_statistics{suffix}", "The model's "
                  "statistics", "metadata", response=m.StatisticsResponse, statuses=(404,)),
        ]
    for suffix, path in V1_MODEL:
        routes += [
            Route("POST", path + ":predict", infer.infer, API, f"tf_predict{suffix}", "TF-Serving predict (row or "
                  "columnar format)", "tensorflow-serving", tfserving._WirePredict, m.TFPredictResponse,
                  formats=(JSON,), statuses=INFER_STATUSES, head=infer.prepare, codec=PREDICT),
            Route("POST", path + ":classify", infer.infer, API, f"tf_classify{suffix}", "TF-Serving classify (501 for "
                  "a model without class scores)", "tensorflow-serving", tfsignature.ExamplesRequest,
                  tfsignature.ClassifyResponse, formats=(JSON,), statuses=(400, 404, 501), head=infer.prepare,
                  codec=CLASSIFY),
            Route("POST", path + ":regress", infer.infer, API, f"tf_regress{suffix}", "TF-Serving regress (501 for a "
                  "model without one value per example)", "tensorflow-serving", tfsignature.ExamplesRequest,
                  tfsignature.RegressResponse, formats=(JSON,), statuses=(400, 404, 501), head=infer.prepare,
                  codec=REGRESS),
            Route("GET", path, tf.status, API, f"tf_status{suffix}", "TF-Serving model status", "tensorflow-serving",
                  response=m.TFStatusResponse, formats=(JSON,), statuses=(404,)),
            Route("GET", path + "/metadata", tf.metadata, API, f"tf_metadata{suffix}", "TF-Serving model metadata "
                  "(signatures)", "tensorflow-serving", response=tfsignature.TFMetadataResponse, formats=(JSON,),
                  statuses=(404,)),
            Route("POST", path, tf.other_method, API, ""),  # any other :method: 501 naming those served
        ]
    return tuple(routes)


ROUTES = _routes()
