"""The messages of every endpoint besides infer and predict, as msgspec Structs.

Handlers build these (never ad-hoc dicts), and the OpenAPI document
(`aserve.server.openapi`) is generated from them, so the two cannot drift. Responses
that other modules build as dicts (the statistics) are converted into their Struct,
which forbids unknown fields: a field added there and not here fails the tests.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from ..repository import ModelConfig
from .metadata import ModelMetadata, ServerMetadata, TensorMetadata

Doc = msgspec.Meta


# ---- health ----

class LiveResponse(msgspec.Struct):
    """`GET /v2/health/live`."""

    live: bool


class NotReady(msgspec.Struct, omit_defaults=True):
    """A model version that keeps the server from being ready, and why (paths relative)."""

    name: str
    version: str
    state: str
    reason: str = ""


class ReadyResponse(msgspec.Struct, omit_defaults=True):
    """`GET /v2/health/ready`: 200 when every model version the repository asks for serves;
    503 with why not (the models are named to callers the api token lets see them)."""

    ready: bool
    reason: str | None = None
    models: list[NotReady] | None = None


class ModelReadyResponse(msgspec.Struct):
    """`GET /v2/models/{model}[/versions/{version}]/ready`."""

    name: str
    ready: bool


# ---- the repository extension ----

class IndexRequest(msgspec.Struct, forbid_unknown_fields=True):
    """`POST /v2/repository/index` (the body may be empty): `ready: true` lists the ready versions only."""

    ready: bool = False


class IndexEntry(msgspec.Struct, omit_defaults=True):
    """One model version of the repository, its state and why (paths relative to the repository)."""

    name: str
    version: str
    state: Annotated[str, Doc(description="READY | LOADING | UNLOADING | UNAVAILABLE")]
    reason: str = ""


class LoadParameters(msgspec.Struct, forbid_unknown_fields=True):
    config: Annotated[
        str | dict[str, Any] | None,
        Doc(description="config.toml fields (a JSON object, or a string of one) laid over the model's config.toml "
                        "until its next load"),
    ] = None


class LoadRequest(msgspec.Struct):
    """`POST /v2/repository/models/{model}/load` (the body may be empty)."""

    parameters: LoadParameters | None = None


class UnloadParameters(msgspec.Struct, forbid_unknown_fields=True):
    unload_dependents: bool = False


class UnloadRequest(msgspec.Struct):
    """`POST /v2/repository/models/{model}/unload` (the body may be empty)."""

    parameters: UnloadParameters | None = None


class EmptyResponse(msgspec.Struct):
    """`{}`: the request was done."""


# ---- statistics (Triton's statistics extension) ----

class Duration(msgspec.Struct, forbid_unknown_fields=True):
    count: int
    ns: int


class InferStats(msgspec.Struct, forbid_unknown_fields=True):
    success: Duration
    fail: Duration
    queue: Duration
    compute_input: Duration
    compute_infer: Duration
    compute_output: Duration
    cache_hit: Duration
    cache_miss: Duration


class BatchStats(msgspec.Struct, forbid_unknown_fields=True):
    batch_size: int
    compute_input: Duration
    compute_infer: Duration
    compute_output: Duration


class ModelStatistics(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    version: str
    last_inference: Annotated[int, Doc(description="milliseconds since the epoch")]
    inference_count: int
    execution_count: int
    inference_stats: InferStats
    batch_stats: list[BatchStats]
    memory_usage: list[dict[str, Any]]


class StatisticsResponse(msgspec.Struct):
    """`GET /v2/models[/{model}[/versions/{version}]]/stats`."""

    model_stats: list[ModelStatistics]


# ---- trace settings (Triton's trace extension) ----

class TraceSetting(msgspec.Struct):
    """`GET/POST /v2[/models/{model}]/trace/setting`: the server-wide trace settings."""

    trace_level: Annotated[list[str], Doc(description='["OFF"] or ["TIMESTAMPS"]')]
    trace_rate: Annotated[str, Doc(description="one request in N is sampled")]
    trace_count: str
    log_frequency: str
    trace_file: str
    trace_mode: str


class TraceSettingRequest(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True):
    """What a POST changes: trace_level and trace_rate (the others are accepted and ignored)."""

    trace_level: list[str] | str | None = None
    trace_rate: str | int | None = None
    trace_count: str | int | None = None
    log_frequency: str | int | None = None
    trace_file: str | None = None
    trace_mode: str | None = None


# ---- model metadata ----

class ModelMetadataResponse(ModelMetadata, kw_only=True):
    """`GET /v2/models/{model}[/versions/{version}]`: the model's inputs and outputs, and in
    `parameters` its engine, batching policy, state, folder (relative to the repository)
    and labels."""

    parameters: dict[str, Any] = msgspec.field(default_factory=dict)


class ModelConfigResponse(ModelConfig, kw_only=True, frozen=True):
    """`GET /v2/models/{model}[/versions/{version}]/config`: the version's config.toml (with
    the model's), and its name."""

    name: str = ""


# ---- TensorFlow-Serving ----

class TFStatus(msgspec.Struct):
    error_code: str
    error_message: str


class TFVersionStatus(msgspec.Struct):
    version: str
    state: Annotated[str, Doc(description="AVAILABLE | LOADING | UNLOADING | END")]
    status: TFStatus


class TFStatusResponse(msgspec.Struct):
    """`GET /v1/models/{model}[/versions/{version} | /labels/{label}]`."""

    model_version_status: list[TFVersionStatus]


class TFPredictResponse(msgspec.Struct, omit_defaults=True):
    """`POST /v1/models/{model}:predict`: `predictions` (row format) or `outputs` (columnar)."""

    predictions: Any = msgspec.UNSET
    outputs: Any = msgspec.UNSET


__all__ = [
    "BatchStats", "Duration", "EmptyResponse", "IndexEntry", "IndexRequest", "InferStats", "LiveResponse",
    "LoadParameters", "LoadRequest", "ModelConfigResponse", "ModelMetadata", "ModelMetadataResponse", "ModelReadyResponse",
    "ModelStatistics", "NotReady", "ReadyResponse", "ServerMetadata", "StatisticsResponse", "TFPredictResponse",
    "TFStatus", "TFStatusResponse", "TFVersionStatus", "TensorMetadata", "TraceSetting", "TraceSettingRequest",
    "UnloadParameters", "UnloadRequest",
]
