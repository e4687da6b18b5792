"""A model's `config.toml`, parsed into frozen Structs.

Every error is a `ConfigError` whose message names the file and the field, what was
expected and what was found.

A versioned model has one `config.toml` for the model (`<repo>/<name>/config.toml`) and
may have one per version (`<repo>/<name>/<n>/config.toml`). A version's effective config
is the model's with the version's tables laid over it (`merge_tables`): its top-level
fields replace the model's, and its `[batching]`, `[parameters]` and `[package]` tables
replace the model's field by field. `version_policy`, `labels` and `transition` are about
the model as a whole and belong in the model's file only.
"""

from __future__ import annotations

import os
import pathlib
import re
from collections.abc import Iterable
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
    admission_reserve: Annotated[
        float,
        _doc("adaptive: under overload, the share of the latency budget admission keeps back for what it "
             "cannot predict (a slow spell of the machine, the client's side of the connection): it admits a "
             "request predicted to finish within (1 - admission_reserve) x its budget", ge=0, lt=1),
    ] = 0.2
    layer_join: Annotated[
        bool, _doc("adaptive: requests may join a running batch at a stage boundary (models with stages)")
    ] = True
    join_rule: Annotated[
        Literal["benefit", "budget"],
        _doc("benefit: join only if the total latency falls; budget: whenever every budget still holds (LBCI)"),
    ] = "benefit"


class VersionPolicy(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The `[version_policy]` table: which of the versions on disk are served (TF-Serving's
    and Triton's policies). At most one of the three; none = `latest = 1`."""

    latest: Annotated[int, _doc("serve the n highest-numbered versions", ge=1)] | None = None
    specific: Annotated[list[Annotated[int, msgspec.Meta(ge=1)]], _doc("serve these versions")] | None = None
    all: Annotated[bool, _doc("serve every version")] = False

    def describe(self) -> str:
        if self.all:
            return "all"
        if self.specific is not None:
            return f"specific {sorted(self.specific)}"
        return f"latest {self.latest or 1}"

    def select(self, versions: Iterable[int]) -> list[int]:
        """The versions this policy serves out of those present, in ascending order."""
        present = sorted(set(versions))
        if self.all:
            return present
        if self.specific is not None:
            wanted = set(self.specific)
            return [v for v in present if v in wanted]
        return present[-(self.latest or 1):]


class PackageConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The `[package]` table: the version is a torch.package archive."""

    archive: Annotated[str, _doc("the archive, relative to the version folder", min_length=1)] = "model.pt"
    object: Annotated[str | None, _doc('"some.module:Name": a Model subclass among the archive\'s modules')] = None
    pickle: Annotated[str | None, _doc('"package.name/resource.pkl": a pickled torch.nn.Module')] = None


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
    package: PackageConfig | None = None
    version_policy: VersionPolicy = VersionPolicy()
    labels: Annotated[dict[str, int], _doc("label name -> version")] = {}
    transition: Annotated[
        Literal["availability", "resource"],
        _doc("availability: a new version is ready before the old one stops; resource: the old one goes first"),
    ] = "availability"

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
    if path.startswith(".package"):
        return list(PackageConfig.__struct_encode_fields__)
    if path.startswith(".version_policy"):
        return list(VersionPolicy.__struct_encode_fields__)
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


# the fields about the model as a whole: only in the model's own config.toml
MODEL_FIELDS = ("version_policy", "labels", "transition")
# tables a version's config.toml (or a load request's override) replaces field by field
MERGED_TABLES = ("batching", "parameters", "package")


def read_table(text: bytes | str, *, file: str = CONFIG_FILE) -> dict[str, Any]:
    """A config.toml's text as a table (not yet checked against ModelConfig)."""
    try:
        table = msgspec.toml.decode(text)
    except msgspec.DecodeError as e:
        raise ConfigError(f"{file}: invalid TOML: {e}") from None
    assert isinstance(table, dict)
    return table


def merge_tables(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` laid over `base`: its fields replace base's, its MERGED_TABLES field by field."""
    out = dict(base)
    for key, value in over.items():
        if key in MERGED_TABLES and isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out


def to_config(table: dict[str, Any], *, file: str = CONFIG_FILE) -> ModelConfig:
    """Check a table against ModelConfig; ConfigError names `file` and the field."""
    try:
        config = msgspec.convert(table, type=ModelConfig)
    except msgspec.ValidationError as e:
        m = _AT.match(str(e))
        path, msg = (m["path"], m["msg"]) if m else ("", str(e))
        if msg.startswith("Object contains unknown field"):
            msg += f"; expected one of {', '.join(_known_fields(path))}"
        raise ConfigError(f"{file}: {_field_path(path)}: {msg}") from None
    _check_tensors(file, "inputs", config.inputs, config.max_batch_size)
    _check_tensors(file, "outputs", config.outputs, config.max_batch_size)
    _check_model_fields(file, config)
    return config


def _check_model_fields(file: str, config: ModelConfig) -> None:
    policy = config.version_policy
    chosen = [k for k, on in (("latest", policy.latest is not None), ("specific", policy.specific is not None),
                              ("all", policy.all)) if on]
    if len(chosen) > 1:
        raise ConfigError(f"{file}: version_policy: expected one of latest = n, specific = [...] or all = true, "
                          f"got {' and '.join(chosen)}")
    if policy.specific is not None and not policy.specific:
        raise ConfigError(f"{file}: version_policy.specific: expected at least one version, got []")
    for label, version in config.labels.items():
        if not label or label.isdigit() or "/" in label:
            raise ConfigError(f"{file}: labels: a label is a name that is not a number and holds no '/', "
                              f"got {label!r}")
        if version < 1:
            raise ConfigError(f"{file}: labels.{label}: expected a version number >= 1, got {version}")
    package = config.package
    if package is not None and (package.object is None) == (package.pickle is None):
        raise ConfigError(f"{file}: package: expected exactly one of object = \"module:Name\" (a Model subclass "
                          f"in the archive) or pickle = \"package.name/resource.pkl\" (a pickled torch.nn.Module)")
    if package is not None and package.object is not None:
        module, _, name = package.object.partition(":")
        if not module or not name:
            raise ConfigError(f"{file}: package.object: expected \"some.module:Name\", got {package.object!r}")


def check_version_table(table: dict[str, Any], *, file: str) -> None:
    """A version's config.toml (or a load override's version part) may not hold MODEL_FIELDS."""
    misplaced = [k for k in MODEL_FIELDS if k in table]
    if misplaced:
        raise ConfigError(f"{file}: {misplaced[0]}: belongs in the model's config.toml (one folder up), "
                          "not in a version's")


def parse_config(text: bytes | str, *, file: str = CONFIG_FILE) -> ModelConfig:
    """Parse and check a config.toml's text; ConfigError names `file` and the field."""
    return to_config(read_table(text, file=file), file=file)


def load_table(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read one config.toml as a table; a missing file is an empty table (all defaults)."""
    p = pathlib.Path(path)
    try:
        text = p.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise ConfigError(f"{p}: cannot read: {e.strerror}") from None
    return read_table(text, file=str(p))


def load_config(path: str | os.PathLike[str]) -> ModelConfig:
    """Read and parse one config.toml; a missing file is an empty config (all defaults)."""
    return to_config(load_table(path), file=str(path))
