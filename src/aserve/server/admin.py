"""The routes that change the server: the repository extension (index, load, unload) and
trace settings (Triton's trace extension, driving OpenTelemetry sampling)."""

from __future__ import annotations

from typing import Any

import msgspec

from ..dataplane.queries import check_unload, load_override
from ..errors import InvalidInput
from ..protocol import messages as m
from ..tracing import Tracer
from .app import App
from .http import Request, Response, message


def _json_body(request: Request, what: str) -> dict[str, Any]:
    body = request.body
    if not bytes(body).strip():
        return {}
    try:
        wanted = msgspec.json.decode(body)
    except msgspec.DecodeError as e:
        raise InvalidInput(f"{what}: malformed JSON: {e}") from None
    if not isinstance(wanted, dict):
        raise InvalidInput(f"{what}: expected a JSON object, got {type(wanted).__name__}")
    return wanted


async def repository_index(app: App, request: Request) -> Response:
    """POST /v2/repository/index: every model version with its state (`{"ready": true}`: ready ones only)."""
    wanted = _json_body(request, "repository index request")
    ready_only = wanted.get("ready", False)
    if not isinstance(ready_only, bool):
        raise InvalidInput(f"ready: expected true or false, got {ready_only!r}")
    rows = [m.IndexEntry(**row) for row in app.plane.registry.index(ready_only=ready_only)]
    for row in rows:
        row.reason = app.policy.redact(row.reason)
    return message(request, rows)


def _parameters(wanted: dict[str, Any], what: str) -> dict[str, Any]:
    parameters = wanted.get("parameters", {})
    if not isinstance(parameters, dict):
        raise InvalidInput(f"{what}: parameters: expected an object, got {type(parameters).__name__}")
    return parameters


async def repository_load(app: App, request: Request) -> Response:
    """POST /v2/repository/models/{model}/load: load or reload a model from its folder;
    `parameters.config` (a JSON string or object of config.toml fields) is laid over
    its config.toml until the next load."""
    name = request.params["model"]
    override = load_override(name, _parameters(_json_body(request, "load request"), "load request"))
    await app.plane.load(name, override)
    return message(request, m.EmptyResponse())


async def repository_unload(app: App, request: Request) -> Response:
    """POST /v2/repository/models/{model}/unload: stop serving every version of a model
    once the requests it accepted are answered; it stays unloaded until loaded again."""
    check_unload(_parameters(_json_body(request, "unload request"), "unload request"))
    await app.plane.unload(request.params["model"])
    return message(request, m.EmptyResponse())


TRACE_SETTINGS = ("trace_level", "trace_rate", "trace_count", "log_frequency", "trace_file", "trace_mode")


async def trace_setting(app: App, request: Request) -> Response:
    """GET/POST /v2[/models/{model}]/trace/setting: trace_level (OFF | TIMESTAMPS) and
    trace_rate (sample one request in N), as Triton names them. Settings are server-wide:
    the per-model route reads and writes the same ones."""
    tracer = app.plane.tracer
    if "model" in request.params:
        app.plane.model(request.params["model"])  # 404 for an unknown model
    if request.method == "POST":
        wanted = _json_body(request, "trace setting request")
        unknown = sorted(set(wanted) - set(TRACE_SETTINGS))
        if unknown:
            raise InvalidInput(f"trace setting request: unknown setting {unknown[0]!r}; expected trace_level, "
                               f"trace_rate (trace_count, log_frequency and trace_file are accepted and ignored)")
        if tracer is None:
            raise InvalidInput("trace setting: tracing is off in this server; start it with "
                               "OTEL_EXPORTER_OTLP_ENDPOINT set or [tracing] enabled = true")
        apply_trace_setting(tracer, wanted)
    return message(request, current_trace_setting(tracer))


def apply_trace_setting(tracer: Tracer, wanted: dict[str, Any]) -> None:
    """Set trace_level and trace_rate as asked (either front's request); InvalidInput names a bad value."""
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
    if tracer.changed is not None:
        tracer.changed()


def current_trace_setting(tracer: Tracer | None) -> m.TraceSetting:
    """The trace settings in force, as Triton names them."""
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
