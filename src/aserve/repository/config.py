"""A model's `config.toml`, parsed into frozen Structs.

Every error is a `ConfigError` whose message names the file and the field, what was
expected and what was found.
"""

from __future__ import annotations

import os
import pathlib
import re
from typing import Annotated, Any, Literal

import msgspec

from ..errors import AserveError
from ..runtime.datatypes import DATATYPES
from ..runtime.model import TensorSpec

CONFIG_FILE = "config.toml"
ENGINES = ("auto", "private", "subinterp", "main")
POLICIES = ("window", "adaptive")


class ConfigError(AserveError):
    """A model config is invalid: the message names the file and the field."""

    status = 500


def _doc(text: str, **kw: Any) -> Any:
    return msgspec.Meta(description=text, **kw)


class TensorConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One `[[inputs]]` / `[[outputs]]` entry."""

    name: Annotated[str, _doc("tensor name", min_length=1)]
    datatype: Annotated[str, _doc("V2 datatype, e.g. INT32, FP32, BYTES")]
    shape: Annotated[list[int], _doc("dimensions; -1 = variable (leading -1 = batch when batching)")]

    def spec(self) -> TensorSpec:
        return TensorSpec(self.name, self.datatype, tuple(self.shape))


class BatchingConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The `[batching]` table."""

    policy: Annotated[Literal["window", "adaptive"], _doc("window | adaptive")] = "window"
    max_queue_delay_ms: Annotated[
        float, _doc("window: longest a request waits for a batch to fill", ge=0)
    ] = 1.0
    max_queue_size: Annotated[int, _doc("samples waiting before new requests get 503", ge=1)] = 4096
    timeout_ms: Annotated[float, _doc("default per-request timeout (504); requests may ask for less", gt=0)] = 30000.0
    latency_budget_ms: Annotated[float, _doc("adaptive: target end-to-end latency", gt=0)] = 50.0
    layer_join: Annotated[
        bool, _doc("adaptive: requests may join a running batch at a stage boundary (models with stages)")
    ] = True
    join_rule: Annotated[
        Literal["benefit", "budget"],
        _doc("benefit: join only if the total latency falls; budget: whenever every budget still holds (LBCI)"),
    ] = "benefit"


class ModelConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True,
                  rename={"class_name": "class"}):
    """A model's `config.toml`."""

    class_name: Annotated[str | None, _doc("Model subclass in model.py (default: the only one)")] = None
    engine: Annotated[
        Literal["auto", "private", "subinterp", "main"] | None, _doc("engine; None = the server's --engine")
    ] = None
    interpreters: Annotated[int, _doc("interpreters serving the model; None = all", ge=1)] | None = None
    max_batch_size: Annotated[int, _doc("largest batch in samples; 0 = the model does not batch", ge=0)] = 0
    inputs: list[TensorConfig] = []
    outputs: list[TensorConfig] = []
    batching: BatchingConfig = BatchingConfig()
    parameters: dict[str, Any] = {}

    @property
    def input_specs(self) -> list[TensorSpec]:
        return [t.spec() for t in self.inputs]

    @property
    def output_specs(self) -> list[TensorSpec]:
        return [t.spec() for t in self.outputs]


_AT = re.compile(r"^(?P<msg>.*?) - at `\$(?P<path>[^`]*)`$")


def _field_path(path: str) -> str:
    # msgspec writes `$.inputs[0].shape`; readers want `inputs[0].shape`
    return path.lstrip(".") or "(top level)"


def _known_fields(path: str) -> list[str]:
    """The field names of the table at a msgspec error path ("", ".batching", ".inputs[0]")."""
    if path.startswith((".inputs", ".outputs")):
        return list(TensorConfig.__struct_encode_fields__)
    if path.startswith(".batching"):
        return list(BatchingConfig.__struct_encode_fields__)
    return list(ModelConfig.__struct_encode_fields__)


def _check_tensors(file: str, kind: str, tensors: list[TensorConfig], max_batch_size: int) -> None:
    seen: set[str] = set()
    for i, t in enumerate(tensors):
        where = f"{file}: {kind}[{i}]"
        if t.name in seen:
            raise ConfigError(f"{where}.name: duplicate tensor name {t.name!r}")
        seen.add(t.name)
        if t.datatype not in DATATYPES:
            raise ConfigError(
                f"{where}.datatype: expected one of {', '.join(DATATYPES)}, got {t.datatype!r}"
            )
        if any(d < -1 for d in t.shape):
            raise ConfigError(f"{where}.shape: dimensions must be >= -1, got {t.shape}")
        if max_batch_size > 0 and (not t.shape or t.shape[0] != -1):
            raise ConfigError(
                f"{where}.shape: with max_batch_size = {max_batch_size} the first dimension is the batch "
                f"dimension and must be -1, got {t.shape}"
            )


def parse_config(text: bytes | str, *, file: str = CONFIG_FILE) -> ModelConfig:
    """Parse and check a config.toml's text; ConfigError names `file` and the field."""
    try:
        config = msgspec.toml.decode(text, type=ModelConfig)
    except msgspec.ValidationError as e:
        m = _AT.match(str(e))
        path, msg = (m["path"], m["msg"]) if m else ("", str(e))
        if msg.startswith("Object contains unknown field"):
            msg += f"; expected one of {', '.join(_known_fields(path))}"
        raise ConfigError(f"{file}: {_field_path(path)}: {msg}") from None
    except msgspec.DecodeError as e:
        raise ConfigError(f"{file}: invalid TOML: {e}") from None
    _check_tensors(file, "inputs", config.inputs, config.max_batch_size)
    _check_tensors(file, "outputs", config.outputs, config.max_batch_size)
    return config


def load_config(path: str | os.PathLike[str]) -> ModelConfig:
    """Read and parse one config.toml; a missing file is an empty config (all defaults)."""
    p = pathlib.Path(path)
    try:
        text = p.read_bytes()
    except FileNotFoundError:
        return ModelConfig()
    except OSError as e:
        raise ConfigError(f"{p}: cannot read: {e.strerror}") from None
    return parse_config(text, file=str(p))
