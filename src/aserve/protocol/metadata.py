"""V2 metadata messages: server metadata and model metadata."""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

if TYPE_CHECKING:
    from ..engine.pool import ModelInfo


class ServerMetadata(msgspec.Struct, kw_only=True):
    """`GET /v2`: the server's name, version and protocol extensions."""

    name: str
    version: str
    extensions: list[str] = []


class TensorMetadata(msgspec.Struct):
    """A model input or output: shapes use -1 for variable dimensions (the batch first)."""

    name: str
    datatype: str
    shape: list[int]


class ModelMetadata(msgspec.Struct, kw_only=True, omit_defaults=True):
    """`GET /v2/models/{m}[/versions/{v}]`."""

    name: str
    versions: list[str] = []
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]


def model_metadata(
    model: ModelInfo, *, versions: list[str] | None = None, platform: str = "python"
) -> ModelMetadata:
    """A loaded model's V2 metadata."""
    return ModelMetadata(
        name=model.name,
        versions=list(versions or []),
        platform=platform,
        inputs=[TensorMetadata(s.name, s.datatype, list(s.shape)) for s in model.inputs],
        outputs=[TensorMetadata(s.name, s.datatype, list(s.shape)) for s in model.outputs],
    )
