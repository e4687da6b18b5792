"""What the data plane answers the same way over every protocol.

HTTP's handlers (server/v2.py, server/admin.py) and the gRPC servicer (server/grpc/service.py)
turn a request into these calls and their answers (or their errors, each naming the field
and what it expects) into their own messages: a model's tensors and serving versions, and
the parameters of a repository load or unload, read once here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from ..errors import InvalidInput
from ..runtime.model import TensorSpec
from .models import ModelHandle
from .plane import DataPlane


def tensors(handle: ModelHandle) -> tuple[Sequence[TensorSpec], Sequence[TensorSpec]]:
    """A model version's inputs and outputs: what its load reported, else what its config.toml declares."""
    if handle.info is not None:
        return handle.info.inputs, handle.info.outputs
    return handle.config.input_specs, handle.config.output_specs


def serving_versions(plane: DataPlane, handle: ModelHandle) -> list[str]:
    """The versions of `handle`'s model serving now."""
    return list(plane.registry.routes[handle.name].versions)


def load_override(model: str, parameters: Mapping[str, Any]) -> dict[str, Any] | None:
    """The config.toml fields a repository load of `model` lays over its folder's until the
    next load: `parameters["config"]`, a JSON object or a string holding one (bytes as UTF-8);
    None when it names none. InvalidInput for model files (the repository folder holds them)
    and for any other parameter."""
    files = sorted(k for k in parameters if k.startswith("file:"))
    if files:
        raise InvalidInput(f"parameters.{files[0]}: model files in the request are not taken; put them in the "
                           f"repository folder {model}/ and load it")
    unknown = sorted(set(parameters) - {"config"})
    if unknown:
        raise InvalidInput(f"parameters.{unknown[0]}: unknown load parameter; expected config")
    override = parameters.get("config")
    if isinstance(override, bytes):
        override = override.decode("utf-8", "replace")
    if isinstance(override, str):
        try:
            override = msgspec.json.decode(override) if override.strip() else None
        except msgspec.DecodeError as e:
            raise InvalidInput(f"parameters.config: malformed JSON: {e}") from None
    if override is not None and not isinstance(override, dict):
        raise InvalidInput(f"parameters.config: expected a JSON object of config.toml fields, got {override!r}")
    return override


def check_unload(parameters: Mapping[str, Any]) -> None:
    """InvalidInput for a repository unload parameter other than unload_dependents."""
    unknown = sorted(set(parameters) - {"unload_dependents"})
    if unknown:
        raise InvalidInput(f"parameters.{unknown[0]}: unknown unload parameter; expected unload_dependents")
