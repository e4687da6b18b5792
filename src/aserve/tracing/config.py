"""When tracing is on, and how it samples: the `[tracing]` table and the standard OTEL_* variables.

Off unless asked for. The OpenTelemetry variables turn it on the way any
instrumented service does: `OTEL_EXPORTER_OTLP_ENDPOINT` (or
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) set, or `OTEL_TRACES_EXPORTER=otlp`;
`OTEL_TRACES_EXPORTER=none` and `OTEL_SDK_DISABLED=true` turn it off, the latter over
everything else. The `[tracing]` table of the server config (`enabled`, `endpoint`,
`service_name`, `sampler`, `sampler_arg`) says the same where a file is handier;
`OTEL_SDK_DISABLED` still wins. The exporter itself reads the rest of the OTEL_*
variables (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_EXPORTER_OTLP_*`,
`OTEL_BSP_*`) as the OpenTelemetry SDK does.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Annotated, Any

import msgspec

SAMPLERS = ("always_on", "always_off", "traceidratio", "parentbased_always_on", "parentbased_always_off",
            "parentbased_traceidratio")


class TracingSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The `[tracing]` table of the server config; unset fields defer to OTEL_* variables."""

    enabled: Annotated[bool | None, msgspec.Meta(description="trace requests (None: the OTEL_* variables say)")] = None
    endpoint: Annotated[str | None, msgspec.Meta(description="OTLP/HTTP endpoint, e.g. http://jaeger:4318")] = None
    service_name: Annotated[str | None, msgspec.Meta(description="service.name (default aserve)")] = None
    sampler: Annotated[str | None, msgspec.Meta(description="one of " + ", ".join(SAMPLERS))] = None
    sampler_arg: Annotated[
        float, msgspec.Meta(ge=0.0, le=1.0, description="traceidratio samplers: the share sampled")
    ] | None = None

    def __post_init__(self) -> None:
        if self.sampler is not None and self.sampler not in SAMPLERS:
            raise ValueError(f"tracing.sampler: expected one of {', '.join(SAMPLERS)}, got {self.sampler!r}")


class Resolved(msgspec.Struct, frozen=True, kw_only=True):
    """What tracing does in this process: the sampler, and the environment the exporter runs with."""

    sampler: str
    ratio: float
    exporter_env: dict[str, str]


def resolve(settings: TracingSettings, environ: Mapping[str, str] | None = None) -> Resolved | None:
    """The tracing this process runs, or None when it is off."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    exporters = {x.strip().lower() for x in env.get("OTEL_TRACES_EXPORTER", "").split(",") if x.strip()}
    if settings.enabled is not None:
        on = settings.enabled
    elif "none" in exporters:
        on = False
    else:
        on = bool(settings.endpoint or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
                  or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or "otlp" in exporters)
    if not on:
        return None
    sampler = (settings.sampler or env.get("OTEL_TRACES_SAMPLER") or "parentbased_always_on").strip().lower()
    if sampler not in SAMPLERS:
        raise ValueError(f"OTEL_TRACES_SAMPLER: expected one of {', '.join(SAMPLERS)}, got {sampler!r}")
    ratio = 1.0
    if sampler.endswith("traceidratio"):
        raw: Any = settings.sampler_arg if settings.sampler_arg is not None else env.get("OTEL_TRACES_SAMPLER_ARG", "1.0")
        try:
            ratio = float(raw)
        except ValueError:
            raise ValueError(f"OTEL_TRACES_SAMPLER_ARG: expected a number in [0, 1], got {raw!r}") from None
        if not 0.0 <= ratio <= 1.0:
            raise ValueError(f"OTEL_TRACES_SAMPLER_ARG: expected a number in [0, 1], got {ratio}")
    exporter_env = {k: v for k, v in env.items() if k.startswith("OTEL_")}
    if settings.endpoint:
        exporter_env["OTEL_EXPORTER_OTLP_ENDPOINT"] = settings.endpoint
    exporter_env.setdefault("OTEL_SERVICE_NAME", settings.service_name or "aserve")
    if settings.service_name:
        exporter_env["OTEL_SERVICE_NAME"] = settings.service_name
    return Resolved(sampler=sampler, ratio=ratio, exporter_env=exporter_env)
