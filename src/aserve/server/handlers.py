"""Request handlers: Open Inference Protocol (V2) and TensorFlow-Serving REST.

Handlers only move bytes: HTTP in, a codec from `aserve.protocol`, the data plane,
the codec again, HTTP out. Errors are raised as aserve errors and answered by
`errors.from_exception`. The two infer routes are answered by `front.Front` before
aiohttp's router; everything else is routed here.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Sequence
from time import perf_counter
from typing import Any

import msgspec
from aiohttp import payload, web

from .. import __version__, logs
from ..dataplane import READY, DataPlane, ModelHandle, failure_reason
from ..errors import AserveError, InvalidInput, ModelError, NotSupported, PayloadTooLarge
from ..logs import current_trace
from ..protocol import (
    HEADER_LENGTH,
    decode_infer,
    decode_predict,
    encode_infer,
    encode_message,
    encode_predict,
    negotiate,
    tfsignature,
)
from ..protocol import messages as m
from ..protocol.formats import ACCEPTED, CONTENT_TYPES, body_format, check_encoding, request_format
from ..protocol.metadata import ServerMetadata, TensorMetadata
from ..tracing import RequestTrace, recorder
from .access import ACCESS_KEY, ADMIN, API, OPEN, Level
from .errors import POLICY_KEY, body_timeout
from .httpstats import HTTP_STATS_KEY
from .limits import request_started
from .metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from .metrics import render
from .request import HttpRequest

PLANE_KEY: web.AppKey[DataPlane] = web.AppKey("plane", DataPlane)

EXTENSIONS = ["binary_tensor_data", "model_repository", "model_repository(unload_dependents)", "msgpack",
              "statistics", "trace"]
V2_ROUTE = "/v2/models/{model}/infer"
TF_ROUTE = "/v1/models/{model}:predict"
JOIN_LIMIT = 1 << 16  # bodies up to this size are joined into one buffer; larger ones are written chunk by chunk


def _plane(request: web.Request) -> DataPlane:
    return request.app[PLANE_KEY]


def _message(request: web.Request, obj: Any, *, status: int = 200) -> web.Response:
    fmt = negotiate(request.headers.get("Accept"), request.headers.get("Content-Type"))
    response = web.Response(status=status, body=encode_message(obj, fmt))
    response.content_type = CONTENT_TYPES[fmt]
    return response


def _handle(request: web.Request) -> ModelHandle:
    info = request.match_info
    return _plane(request).model(info["model"], info.get("version"))


# ---- health and metadata ----

async def server_metadata(request: web.Request) -> web.Response:
    return _message(request, ServerMetadata(name="aserve", version=__version__, extensions=EXTENSIONS))


async def live(request: web.Request) -> web.Response:
    return _message(request, m.LiveResponse(True))


async def ready(request: web.Request) -> web.Response:
    """200 when every model version the repository asks for serves; 503 naming which do
    not and why (to callers that may see the models: with an api token, those that send it)."""
    plane = _plane(request)
    if plane.ready:
        return _message(request, m.ReadyResponse(True))
    registry = plane.registry
    waiting = [m.NotReady(**row) for row in registry.not_ready()]
    policy = request.app[POLICY_KEY]
    for row in waiting:
        row.reason = policy.redact(row.reason)
    if waiting:
        reason = f"{len(waiting)} model version{'s' if len(waiting) > 1 else ''} not ready"
    else:
        reason = "shutting down" if getattr(registry, "_closed", False) else "the repository holds no model to serve"
    try:
        request.app[ACCESS_KEY].check(request, API)
    except AserveError:
        return _message(request, m.ReadyResponse(False, reason + " (send the api token for which and why)"),
                        status=503)
    return _message(request, m.ReadyResponse(False, reason, waiting or None), status=503)


def _tensor_metadata(specs: Any) -> list[TensorMetadata]:
    return [TensorMetadata(s.name, s.datatype, list(s.shape)) for s in specs]


async def model_metadata(request: web.Request) -> web.Response:
    handle = _handle(request)
    inputs = handle.info.inputs if handle.info else handle.config.input_specs
    outputs = handle.info.outputs if handle.info else handle.config.output_specs
    routes = _plane(request).registry.routes[handle.name]
    parameters = request.app[POLICY_KEY].redactor().value(handle.parameters())
    parameters["labels"] = dict(routes.labels)
    return _message(request, m.ModelMetadataResponse(
        name=handle.name,
        versions=list(routes.versions),  # the versions serving now
        platform="aserve",
        inputs=_tensor_metadata(inputs),
        outputs=_tensor_metadata(outputs),
        parameters=parameters,
    ))


async def model_ready(request: web.Request) -> web.Response:
    handle = _handle(request)
    return _message(request, m.ModelReadyResponse(handle.name, handle.ready), status=200 if handle.ready else 503)


async def model_config(request: web.Request) -> web.Response:
    handle = _handle(request)
    config = request.app[POLICY_KEY].redactor().value(msgspec.to_builtins(handle.config))
    config["name"] = handle.name
    return _message(request, msgspec.convert(config, m.ModelConfigResponse))


async def _json_body(request: web.Request, what: str) -> dict[str, Any]:
    body = await read_body(request, request.app[POLICY_KEY].max_body_bytes, request.app[POLICY_KEY].request_timeout_s,
                           msgpack=False)
    if not body.strip():
        return {}
    try:
        wanted = msgspec.json.decode(body)
    except msgspec.DecodeError as e:
        raise InvalidInput(f"{what}: malformed JSON: {e}") from None
    if not isinstance(wanted, dict):
        raise InvalidInput(f"{what}: expected a JSON object, got {type(wanted).__name__}")
    return wanted


async def repository_index(request: web.Request) -> web.Response:
    """POST /v2/repository/index: every model version with its state (`{"ready": true}`: ready ones only)."""
    wanted = await _json_body(request, "repository index request")
    ready_only = wanted.get("ready", False)
    if not isinstance(ready_only, bool):
        raise InvalidInput(f"ready: expected true or false, got {ready_only!r}")
    policy = request.app[POLICY_KEY]
    rows = [m.IndexEntry(**row) for row in _plane(request).registry.index(ready_only=ready_only)]
    for row in rows:
        row.reason = policy.redact(row.reason)
    return _message(request, rows)


def _parameters(wanted: dict[str, Any], what: str) -> dict[str, Any]:
    parameters = wanted.get("parameters", {})
    if not isinstance(parameters, dict):
        raise InvalidInput(f"{what}: parameters: expected an object, got {type(parameters).__name__}")
    return parameters


async def repository_load(request: web.Request) -> web.Response:
    """POST /v2/repository/models/{model}/load: load or reload a model from its folder;
    `parameters.config` (a JSON string or object of config.toml fields) is laid over
    its config.toml until the next load."""
    name = request.match_info["model"]
    parameters = _parameters(await _json_body(request, "load request"), "load request")
    files = sorted(k for k in parameters if k.startswith("file:"))
    if files:
        raise InvalidInput(f"parameters.{files[0]}: model files in the request are not taken; put them in the "
                           f"repository folder {name}/ and load it")
    unknown = sorted(set(parameters) - {"config"})
    if unknown:
        raise InvalidInput(f"parameters.{unknown[0]}: unknown load parameter; expected config")
    override = parameters.get("config")
    if isinstance(override, str):
        try:
            override = msgspec.json.decode(override) if override.strip() else None
        except msgspec.DecodeError as e:
            raise InvalidInput(f"parameters.config: malformed JSON: {e}") from None
    if override is not None and not isinstance(override, dict):
        raise InvalidInput(f"parameters.config: expected a JSON object of config.toml fields, got {override!r}")
    await _plane(request).load(name, override)
    return _message(request, m.EmptyResponse())


async def repository_unload(request: web.Request) -> web.Response:
    """POST /v2/repository/models/{model}/unload: stop serving every version of a model
    once the requests it accepted are answered; it stays unloaded until loaded again."""
    parameters = _parameters(await _json_body(request, "unload request"), "unload request")
    unknown = sorted(set(parameters) - {"unload_dependents"})
    if unknown:
        raise InvalidInput(f"parameters.{unknown[0]}: unknown unload parameter; expected unload_dependents")
    await _plane(request).unload(request.match_info["model"])
    return _message(request, m.EmptyResponse())


async def model_statistics(request: web.Request) -> web.Response:
    """GET /v2/models[/{model}[/versions/{version}]]/stats, in Triton's statistics format."""
    info = request.match_info
    stats = _plane(request).registry.statistics(info.get("model"), info.get("version"))
    return _message(request, m.StatisticsResponse(msgspec.convert(stats, list[m.ModelStatistics])))


# ---- inference ----

def header_length(value: str | None) -> int | None:
    """The Inference-Header-Content-Length header, checked."""
    if value is None:
        return None
    try:
        n = int(value)
    except ValueError:
        raise InvalidInput(f"header {HEADER_LENGTH}: expected a byte count, got {value!r}") from None
    if n < 0:
        raise InvalidInput(f"header {HEADER_LENGTH}: expected >= 0, got {n}")
    return n


class Chunks(payload.Payload):
    """A response body written as the buffers it is made of: large binary outputs go out
    from the interpreter's memory, never joined into a new buffer."""

    def __init__(self, chunks: list[Any], size: int, content_type: str) -> None:
        super().__init__([memoryview(c).cast("B") for c in chunks], content_type=content_type)
        self._size = size

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return b"".join(self._value).decode(encoding, errors)

    async def write(self, writer: Any) -> None:
        for chunk in self._value:
            await writer.write(chunk)

    async def write_with_length(self, writer: Any, content_length: int | None) -> None:
        await self.write(writer)


class Answer:
    """A 200 answer to an infer or predict request, before any HTTP front shapes it: its
    body's buffers (bytes and flat byte views, in order) and its headers. aiohttp's front
    makes it a `web.Response` (`respond`); the wire front writes it as it is."""

    __slots__ = ("chunks", "headers")

    def __init__(self, chunks: list[Any], headers: dict[str, str]) -> None:
        self.chunks = chunks
        self.headers = headers


def respond(answer: Answer | web.Response) -> web.Response:
    """`answer` as aiohttp's response: one buffer when small, written chunk by chunk when large."""
    if isinstance(answer, web.Response):
        return answer
    chunks, headers = answer.chunks, dict(answer.headers)
    if len(chunks) == 1:
        return web.Response(body=chunks[0], headers=headers)
    size = sum(map(len, chunks))
    if size <= JOIN_LIMIT:
        return web.Response(body=b"".join(chunks), headers=headers)
    body = Chunks(chunks, size, headers.pop("Content-Type"))
    return web.Response(body=body, headers=headers)


async def read_body(request: HttpRequest, limit: int, timeout_s: float = 0.0, *, msgpack: bool = True) -> bytes:
    """The request body, its Content-Type and Content-Encoding checked (415). One that has
    fully arrived (most do, with their headers) is taken from the buffer as it is; others
    are read as they come, within what is left of `timeout_s` since the request's first
    byte (408; 0: no limit). Longer than `limit`: 413."""
    headers = request.headers
    content_type = headers.get("Content-Type")
    if content_type is not None and content_type not in ACCEPTED[msgpack]:
        body_format(content_type, msgpack=msgpack)  # 415 unless a type the endpoint reads
    encoding = headers.get("Content-Encoding")
    if encoding is not None:
        check_encoding(encoding)
    content = request.content
    if content.is_eof():
        body = content.read_nowait()
        if len(body) > limit:
            raise PayloadTooLarge(f"request body exceeds the server's limit of {limit} bytes (--max-body-bytes)")
        return body
    if timeout_s <= 0:
        return await request.read()  # aiohttp enforces client_max_size (413)
    loop = asyncio.get_running_loop()
    began = request_started(request) or loop.time()
    try:
        async with asyncio.timeout(max(0.0, began + timeout_s - loop.time())):
            return await request.read()
    except TimeoutError:
        raise body_timeout(timeout_s) from None


def _describe_trace(trace: RequestTrace, request: HttpRequest, route: str, model: str, version: str | None,
                    protocol: str | None) -> None:
    """A sampled request's OpenTelemetry HTTP server attributes (the same for every request
    to a model, route and address: made once, kept in the tracer's table)."""
    headers = request.headers
    host = headers.get("Host", "")
    content_type = headers.get("Content-Type") if protocol is None else None
    binary = protocol is None and HEADER_LENGTH in headers
    key = (route, model, version, protocol, content_type, binary, host)
    tracer = trace.tracer
    index = tracer.route(key)
    if index < 0:
        if protocol is None:
            protocol = _protocol(content_type, binary)
        address, _, port = host.rpartition(":") if ":" in host else (host, "", "")
        attributes: dict[str, Any] = {
            "http.request.method": "POST", "http.route": route, "url.scheme": "http",
            "url.path": route.replace("{model}", model if version is None else f"{model}/versions/{version}"),
            "server.address": address or host, "network.protocol.version": "1.1", "aserve.model": model,
            "aserve.version": version or "latest", "aserve.protocol": protocol,
        }
        if port.isdigit():
            attributes["server.port"] = int(port)
        index = tracer.add_route(key, f"POST {route}", attributes)
        if index < 0:  # the table is full (a client sending many Host names): as a span
            trace.common = recorder.shared(attributes)
    trace.route = index
    if logs.trace_ids_logged:
        current_trace.set(trace)  # this request's task: its log records carry the ids


def _end_trace(trace: RequestTrace, name: str, error: BaseException | None) -> None:
    status = 200
    if error is not None:
        status = error.status if isinstance(error, AserveError) else getattr(error, "status", 500)
        if isinstance(error, asyncio.CancelledError):
            status = 499  # the client went away
    recorder.finish(trace, name, status, error)


def _protocol(content_type: str | None, binary: bool) -> str:
    if request_format(content_type) == "msgpack":
        return "v2-msgpack"
    return "v2-binary" if binary else "v2-json"


async def infer(plane: DataPlane, request: HttpRequest, model: str, version: str | None, *,
                max_body_bytes: int, timeout_s: float = 0.0) -> Answer:
    """POST /v2/models/{model}[/versions/{version}]/infer"""
    handle = plane.model(model, version)
    stats = handle.stats
    start = perf_counter()
    trace = None
    try:
        headers = request.headers
        length = header_length(headers.get(HEADER_LENGTH))
        content_type = headers.get("Content-Type")
        if plane.tracer is not None:
            trace = plane.tracer.start(headers)
            if trace is not None:
                _describe_trace(trace, request, V2_ROUTE, model, version, None)
        body = await read_body(request, max_body_bytes, timeout_s)
        if handle.retired:  # a reload or unload took it out of the routes while the body arrived
            handle = plane.model(model, version)
        schema = handle.require_ready()
        if trace is not None:
            trace.stamp(recorder.DECODE_START)
        req = decode_infer(body, content_type=content_type, header_length=length, schema=schema)
        if trace is not None:
            trace.stamp(recorder.DECODE_END)
        response = await plane.run(handle, req, trace=trace, received=getattr(request, "received", None))
        if trace is not None:
            trace.stamp(recorder.ENCODE_START)
        chunks, out_headers = encode_infer(response, req, accept=headers.get("Accept"), content_type=content_type,
                                           labels=_labels(handle) if req.outputs else None)
        answer = Answer(chunks, out_headers)
        if trace is not None:
            trace.stamp(recorder.ENCODE_END)
    except BaseException as exc:
        stats.failed(failure_reason(exc), perf_counter() - start)
        if isinstance(exc, ModelError):
            exc.model, exc.version = handle.name, handle.version
        if trace is not None:
            _end_trace(trace, f"POST {V2_ROUTE}", exc)
        raise
    stats.succeeded(perf_counter() - start, req.samples)
    if trace is not None and not trace.end(200):
        _end_trace(trace, f"POST {V2_ROUTE}", None)
    return answer


async def predict(plane: DataPlane, request: HttpRequest, model: str, version: str | None, *,
                  max_body_bytes: int, timeout_s: float = 0.0) -> Answer:
    """POST /v1/models/{model}[/versions/{version}]:predict (TF-Serving's predict has no
    per-request parameters: the model's timeout and budget apply)."""
    handle = plane.model(model, version)
    stats = handle.stats
    start = perf_counter()
    trace = None
    try:
        if plane.tracer is not None:
            trace = plane.tracer.start(request.headers)
            if trace is not None:
                _describe_trace(trace, request, TF_ROUTE, model, version, "tfserving")
        body = await read_body(request, max_body_bytes, timeout_s, msgpack=False)
        if handle.retired:  # a reload or unload took it out of the routes while the body arrived
            handle = plane.model(model, version)
        schema = handle.require_ready()
        if trace is not None:
            trace.stamp(recorder.DECODE_START)
        req = decode_predict(body, schema=schema)
        if trace is not None:
            trace.stamp(recorder.DECODE_END)
        response = await plane.run(handle, req, trace=trace, received=getattr(request, "received", None))
        if trace is not None:
            trace.stamp(recorder.ENCODE_START)
        answer = encode_predict(response.outputs, columnar=req.form is True, batched=schema.max_batch_size > 0)
        if trace is not None:
            trace.stamp(recorder.ENCODE_END)
    except BaseException as exc:
        stats.failed(failure_reason(exc), perf_counter() - start)
        if isinstance(exc, ModelError):
            exc.model, exc.version = handle.name, handle.version
        if trace is not None:
            _end_trace(trace, f"POST {TF_ROUTE}", exc)
        raise
    stats.succeeded(perf_counter() - start, req.samples)
    if trace is not None and not trace.end(200):
        _end_trace(trace, f"POST {TF_ROUTE}", None)
    return Answer([answer], {"Content-Type": "application/json"})


async def _infer_routed(request: web.Request) -> web.Response:
    info = request.match_info
    policy = request.app[POLICY_KEY]
    return respond(await infer(_plane(request), request, info["model"], info.get("version"),
                               max_body_bytes=policy.max_body_bytes, timeout_s=policy.request_timeout_s))


async def _predict_routed(request: web.Request) -> web.Response:
    info = request.match_info
    policy = request.app[POLICY_KEY]
    return respond(await predict(_plane(request), request, info["model"], info.get("version") or info.get("label"),
                                 max_body_bytes=policy.max_body_bytes, timeout_s=policy.request_timeout_s))


# ---- classification labels (Triton's classification extension, TF-Serving's classify) ----

LABELS_PARAMETER = "classification_labels"
_labels_cache: dict[tuple[str, str], list[str] | None] = {}


def _labels(handle: ModelHandle) -> Any:
    """`labels(output)`: the labels of a model's output, from the file its config's
    `[parameters.classification_labels]` names for it (relative to the version's folder)."""

    def labels(output: str) -> list[str] | None:
        key = (handle.key, output)
        if key not in _labels_cache:
            if len(_labels_cache) > 1024:
                _labels_cache.clear()
            _labels_cache[key] = _read_labels(handle, output)
        return _labels_cache[key]

    return labels


def _read_labels(handle: ModelHandle, output: str) -> list[str] | None:
    table = handle.config.parameters.get(LABELS_PARAMETER)
    if not isinstance(table, dict) or not isinstance(table.get(output), str):
        return None
    folder = os.path.realpath(handle.source.directory)
    path = os.path.realpath(os.path.join(folder, table[output]))
    if not path.startswith(folder + os.sep):
        raise InvalidInput(f"parameters.{LABELS_PARAMETER}.{output}: the labels file must be inside the model's "
                           f"folder, got {table[output]!r}")
    try:
        with open(path, encoding="utf-8") as f:
            return [line.rstrip("\r\n") for line in f]
    except OSError as e:
        raise NotSupported(f"model {handle.name!r}: cannot read the labels of output {output!r} "
                           f"({table[output]}: {e.strerror})") from None


# ---- TensorFlow-Serving metadata, classify and regress ----

async def tf_metadata(request: web.Request) -> web.Response:
    """GET /v1/models/{model}[/versions/{v} | /labels/{l}]/metadata: the model's signatures."""
    info = request.match_info
    handle = _plane(request).model(info["model"], info.get("version") or info.get("label"))
    inputs = handle.info.inputs if handle.info else handle.config.input_specs
    outputs = handle.info.outputs if handle.info else handle.config.output_specs
    body = tfsignature.metadata(handle.name, handle.version, inputs, outputs,
                                max_batch_size=handle.config.max_batch_size)
    return web.Response(body=msgspec.json.encode(body), content_type="application/json")


_TF_VERB = re.compile(r"^(?P<model>[^:]+):(?P<verb>[A-Za-z_]+)$")


async def tf_examples(request: web.Request) -> web.Response:
    """POST /v1/models/{model}[/versions/{v} | /labels/{l}]:classify | :regress (and any
    other verb: 501 naming the supported ones)."""
    plane = _plane(request)
    parts = dict(request.match_info)
    verb = parts.pop("verb", None)
    if verb is None:  # a route without a verb: the last part of the path may carry one the routes do not name
        last = "label" if "label" in parts else "version" if "version" in parts else "model"
        found = _TF_VERB.match(parts[last])
        if found is None:
            raise web.HTTPMethodNotAllowed("POST", ["GET"])
        parts[last], verb = found["model"], found["verb"]
    if verb not in ("classify", "regress"):
        raise NotSupported(f"TF-Serving method :{verb} is not supported; POST /v1/models/{{model}}:predict, "
                           f":classify or :regress")
    handle = plane.model(parts["model"], parts.get("version") or parts.get("label"))
    policy = request.app[POLICY_KEY]
    with handle.stats.track() as tracked:
        body = await read_body(request, policy.max_body_bytes, policy.request_timeout_s, msgpack=False)
        schema = handle.require_ready()
        tfsignature.check_fits(verb, schema)  # type: ignore[arg-type]
        try:
            req = decode_predict(tfsignature.examples_to_predict(body, schema), schema=schema)
        except InvalidInput as e:
            raise InvalidInput(str(e).replace("instances", "examples")) from None
        tracked.samples = req.samples
        try:
            response = await plane.run(handle, req)
        except ModelError as exc:
            exc.model, exc.version = handle.name, handle.version
            raise
    if verb == "regress":
        answer = tfsignature.encode_regress(response.outputs, req.samples)
    else:
        scores = "scores" if "scores" in response.outputs else next(iter(response.outputs))
        labels: Sequence[str] | None = _labels(handle)(scores)
        answer = tfsignature.encode_classify(response.outputs, req.samples, labels)
    return web.Response(body=answer, content_type="application/json")


# ---- trace settings (Triton's trace extension, driving OpenTelemetry sampling) ----

async def trace_setting(request: web.Request) -> web.Response:
    """GET/POST /v2[/models/{model}]/trace/setting: trace_level (OFF | TIMESTAMPS) and
    trace_rate (sample one request in N), as Triton names them. Settings are server-wide:
    the per-model route reads and writes the same ones."""
    tracer = _plane(request).tracer
    if "model" in request.match_info:
        _handle(request)  # 404 for an unknown model
    if request.method == "POST":
        policy = request.app[POLICY_KEY]
        body = await read_body(request, policy.max_body_bytes, policy.request_timeout_s, msgpack=False)
        try:
            wanted = msgspec.json.decode(body) if body.strip() else {}
        except msgspec.DecodeError as e:
            raise InvalidInput(f"trace setting request: malformed JSON: {e}") from None
        if not isinstance(wanted, dict):
            raise InvalidInput(f"trace setting request: expected an object, got {type(wanted).__name__}")
        unknown = sorted(set(wanted) - {"trace_level", "trace_rate", "trace_count", "log_frequency", "trace_file",
                                        "trace_mode"})
        if unknown:
            raise InvalidInput(f"trace setting request: unknown setting {unknown[0]!r}; expected trace_level, "
                               f"trace_rate (trace_count, log_frequency and trace_file are accepted and ignored)")
        if tracer is None:
            raise InvalidInput("trace setting: tracing is off in this server; start it with "
                               "OTEL_EXPORTER_OTLP_ENDPOINT set or [tracing] enabled = true")
        _apply_trace_setting(tracer, wanted)
    return _message(request, _trace_setting(tracer))


def _apply_trace_setting(tracer: Any, wanted: dict[str, Any]) -> None:
    level = wanted.get("trace_level")
    if level is not None:
        levels = [level] if isinstance(level, str) else level
        if not isinstance(levels, list) or not all(isinstance(x, str) for x in levels) or not levels:
            raise InvalidInput(f"trace_level: expected a list of OFF | TIMESTAMPS | TENSORS, got {level!r}")
        bad = [x for x in levels if x.upper() not in ("OFF", "TIMESTAMPS", "TENSORS")]
        if bad:
            raise InvalidInput(f"trace_level: expected OFF, TIMESTAMPS or TENSORS, got {bad[0]!r}")
        tracer.enabled = [x.upper() for x in levels] != ["OFF"]
    rate = wanted.get("trace_rate")
    if rate is not None:
        try:
            n = int(rate)
        except (TypeError, ValueError):
            n = 0
        if n < 1:
            raise InvalidInput(f"trace_rate: expected a whole number >= 1 (sample one request in N), got {rate!r}")
        if not tracer.sampler.endswith("traceidratio"):
            tracer.sampler = "parentbased_traceidratio" if tracer.sampler.startswith("parentbased") else "traceidratio"
        tracer.set_ratio(1.0 / n)


def _trace_setting(tracer: Any) -> m.TraceSetting:
    if tracer is None or not tracer.enabled:
        level = ["OFF"]
    else:
        level = ["TIMESTAMPS"]
    rate = "1"
    if tracer is not None:
        if tracer.sampler.endswith("always_off"):
            level = ["OFF"]
        elif tracer.sampler.endswith("traceidratio"):
            rate = str(round(1.0 / tracer.ratio)) if tracer.ratio > 0 else "0"
    return m.TraceSetting(trace_level=level, trace_rate=rate, trace_count="-1", log_frequency="0", trace_file="",
                          trace_mode="opentelemetry")


# ---- TensorFlow-Serving model status, Prometheus ----

async def metrics(request: web.Request) -> web.Response:
    plane = _plane(request)
    registry = plane.registry
    text = render(registry.handles(), registry.pools, plane.metrics, registry.schedulers,
                  http=request.app.get(HTTP_STATS_KEY), tracing=plane.tracer.stats() if plane.tracer else None)
    return web.Response(body=text.encode(), headers={"Content-Type": METRICS_CONTENT_TYPE})


_TF_STATES = {"READY": "AVAILABLE", "LOADING": "LOADING", "UNLOADING": "UNLOADING"}


def _tf_version_status(handle: ModelHandle, redact: Any) -> m.TFVersionStatus:
    state = _TF_STATES.get(handle.state, "END")
    status = m.TFStatus("OK", "")
    if handle.state not in (READY, "LOADING", "UNLOADING"):
        status = m.TFStatus("UNAVAILABLE", redact(handle.reason))
    return m.TFVersionStatus(handle.version, state, status)


async def tf_status(request: web.Request) -> web.Response:
    """GET /v1/models/{model}[/versions/{v} | /labels/{l}]: TF-Serving's model status,
    every version of the model unless one is named."""
    info = request.match_info
    plane = _plane(request)
    wanted = info.get("version") or info.get("label")
    if wanted is not None:
        handles = [plane.model(info["model"], wanted)]
    else:
        plane.model(info["model"])  # 404 for an unknown model
        routes = plane.registry.routes[info["model"]]
        found = {**routes.others, **routes.versions}
        handles = [found[v] for v in sorted(found, key=int) if v != "0"] or [plane.model(info["model"])]
    policy = request.app[POLICY_KEY]
    body = m.TFStatusResponse([_tf_version_status(h, policy.redact) for h in handles])
    response = web.Response(body=msgspec.json.encode(body))
    response.content_type = "application/json"
    return response


def add_routes(app: web.Application) -> dict[object, Level]:
    """Every route, and the kind of access each handler needs (aserve.server.access). The
    infer routes are here too, for requests the front hands over (paths with
    percent-escapes, which only the router decodes)."""
    from .openapi import docs_page, openapi_document, static_files

    r = app.router
    levels: dict[object, Level] = {}

    def add(method: str, path: str, handler: Any, level: Level) -> None:
        r.add_route(method, path, handler)
        levels[handler] = level

    add("GET", "/v2/models/stats", model_statistics, API)  # before /v2/models/{model}
    for base in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        add("POST", base + "/infer", _infer_routed, API)
        add("GET", base, model_metadata, API)
        add("GET", base + "/ready", model_ready, OPEN)
        add("GET", base + "/config", model_config, API)
        add("GET", base + "/stats", model_statistics, API)
    for base in ("/v1/models/{model}", "/v1/models/{model}/versions/{version}", "/v1/models/{model}/labels/{label}"):
        add("POST", base + ":predict", _predict_routed, API)
        add("POST", base + ":{verb:classify|regress}", tf_examples, API)
        add("GET", base + "/metadata", tf_metadata, API)
        add("GET", base, tf_status, API)
        add("POST", base, tf_examples, API)  # any other verb: 501 naming the supported ones
    add("POST", "/v2/repository/models/{model}/load", repository_load, ADMIN)
    add("POST", "/v2/repository/models/{model}/unload", repository_unload, ADMIN)
    add("GET", "/v2", server_metadata, API)
    add("GET", "/metrics", metrics, OPEN)
    add("GET", "/v2/health/live", live, OPEN)
    add("GET", "/v2/health/ready", ready, OPEN)
    add("POST", "/v2/repository/index", repository_index, ADMIN)
    for path in ("/v2/trace/setting", "/v2/models/{model}/trace/setting"):
        add("GET", path, trace_setting, ADMIN)
        add("POST", path, trace_setting, ADMIN)
    add("GET", "/v2/openapi.json", openapi_document, OPEN)
    add("GET", "/v2/docs", docs_page, OPEN)
    add("GET", "/v2/docs/{file}", static_files, OPEN)
    return levels
