"""Repository scanning and config.toml parsing: every error names the file and the field."""

from __future__ import annotations

import pathlib
import sys

import pytest

from aserve.config import ServerSettings
from aserve.dataplane.engines import resolve_engine
from aserve.repository import (
    ConfigError,
    ModelConfig,
    RepositoryError,
    load_config,
    parse_config,
    scan_repository,
)
from aserve.runtime import TensorSpec

FULL = b'''
class = "Simple"
engine = "main"
interpreters = 2
max_batch_size = 64
[[inputs]]
name = "INPUT0"
datatype = "INT32"
shape = [-1, 16]
[[outputs]]
name = "OUTPUT0"
datatype = "INT32"
shape = [-1, 16]
[batching]
policy = "adaptive"
max_queue_delay_ms = 2.5
max_queue_size = 100
timeout_ms = 1000
latency_budget_ms = 20.0
admission_reserve = 0.3
layer_join = false
join_rule = "budget"
[parameters]
scale = 3
label = "x"
'''


def test_full_config() -> None:
    c = parse_config(FULL, file="m/config.toml")
    assert c.class_name == "Simple" and c.engine == "main" and c.interpreters == 2 and c.max_batch_size == 64
    assert c.input_specs == [TensorSpec("INPUT0", "INT32", (-1, 16))]
    assert c.output_specs == [TensorSpec("OUTPUT0", "INT32", (-1, 16))]
    b = c.batching
    assert (b.policy, b.max_queue_delay_ms, b.max_queue_size, b.timeout_ms, b.latency_budget_ms) == (
        "adaptive", 2.5, 100, 1000.0, 20.0)
    assert (b.layer_join, b.join_rule, b.admission_reserve) == (False, "budget", 0.3)
    assert c.parameters == {"scale": 3, "label": "x"}
    with pytest.raises(AttributeError):
        c.max_batch_size = 1  # type: ignore[misc]


def test_defaults() -> None:
    c = parse_config(b"")
    assert c == ModelConfig()
    assert c.engine is None and c.interpreters is None and c.max_batch_size == 0
    assert c.batching.policy == "window" and c.batching.max_queue_size == 4096 and c.batching.timeout_ms == 30000
    assert c.batching.layer_join is True and c.batching.join_rule == "benefit"
    assert c.batching.admission_reserve == 0.2


@pytest.mark.parametrize(("text", "message"), [
    (b'max_batch_size = "x"', "m/config.toml: max_batch_size: Expected `int`, got `str`"),
    (b"max_batch_size = -1", "m/config.toml: max_batch_size: Expected `int` >= 0"),
    (b"interpreters = 0", "m/config.toml: interpreters: Expected `int` >= 1"),
    (b"[batching]\nadmission_reserve = 1.0", "m/config.toml: batching.admission_reserve: Expected `float` < 1.0"),
    (b'engine = "gpu"', "m/config.toml: engine: Invalid enum value 'gpu'"),
    (b"klass = 1", "m/config.toml: (top level): Object contains unknown field `klass`; expected one of class, engine,"),
    (b'[[inputs]]\nname = "a"\ndatatype = "INT32"\nshape = [-1, "x"]', "m/config.toml: inputs[0].shape[1]: Expected `int`"),
    (b'[[inputs]]\nname = "a"\ndatatype = "INT33"\nshape = [1]', "m/config.toml: inputs[0].datatype: expected one of"),
    (b'[[outputs]]\nname = "a"\ndatatype = "FP32"\nshape = [-2]', "m/config.toml: outputs[0].shape: dimensions must be >= -1"),
    (b'max_batch_size = 4\n[[inputs]]\nname = "a"\ndatatype = "FP32"\nshape = [3]',
     "m/config.toml: inputs[0].shape: with max_batch_size = 4 the first dimension is the batch dimension"),
    (b'[[inputs]]\nname = "a"\ndatatype = "FP32"\nshape = [1]\n[[inputs]]\nname = "a"\ndatatype = "FP32"\nshape = [1]',
     "m/config.toml: inputs[1].name: duplicate tensor name 'a'"),
    (b"[batching]\nmax_queue_sizes = 1", "m/config.toml: batching: Object contains unknown field `max_queue_sizes`; expected one of policy,"),
    (b'[batching]\npolicy = "fifo"', "m/config.toml: batching.policy: Invalid enum value 'fifo'"),
    (b"[batching]\ntimeout_ms = 0", "m/config.toml: batching.timeout_ms: Expected `float` > 0"),
    (b'[batching]\njoin_rule = "always"', "m/config.toml: batching.join_rule: Invalid enum value 'always'"),
    (b'[batching]\nlayer_join = "yes"', "m/config.toml: batching.layer_join: Expected `bool`, got `str`"),
    (b"max_batch_size = ", "m/config.toml: invalid TOML"),
])
def test_errors_name_file_and_field(text: bytes, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text, file="m/config.toml")
    assert str(info.value).startswith(message), str(info.value)


def test_scan(tmp_path: pathlib.Path) -> None:
    for name, config in [("b", "max_batch_size = 2\n"), ("a", None), ("bad", "interpreters = 'x'\n")]:
        d = tmp_path / name
        d.mkdir()
        (d / "model.py").write_text("")
        if config is not None:
            (d / "config.toml").write_text(config)
    (tmp_path / "notes").mkdir()  # no model.py
    (tmp_path / "README.md").write_text("")
    (tmp_path / ".git").mkdir()  # hidden: not even reported
    found = scan_repository(tmp_path)
    assert list(found.models) == ["a", "b", "bad"]
    a, b, bad = (found.models[n] for n in ("a", "b", "bad"))
    assert a.config == ModelConfig() and list(a.versions) == [1] and a.versions[1].config == ModelConfig()
    assert b.versions[1].config is not None and b.versions[1].config.max_batch_size == 2
    assert bad.config is None and bad.error is not None and f"{tmp_path}/bad/config.toml: interpreters" in bad.error
    assert a.versions[1].model_file == str(tmp_path / "a" / "model.py")
    assert {(pathlib.Path(s.path).name, s.reason.split(" (")[0]) for s in found.skipped} == {
        ("notes", "no model.py, model.pt or numbered version folders"), ("README.md", "not a folder")}
    assert load_config(tmp_path / "a" / "config.toml") == ModelConfig()


def _version(root: pathlib.Path, name: str, v: int | None, config: str | None = None, *,
             file: str = "model.py") -> pathlib.Path:
    d = root / name if v is None else root / name / str(v)
    d.mkdir(parents=True, exist_ok=True)
    (d / file).write_text(f"# version {v}\n")
    if config is not None:
        (d / "config.toml").write_text(config)
    return d


def test_scan_versions(tmp_path: pathlib.Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.toml").write_text(
        "max_batch_size = 8\n[batching]\ntimeout_ms = 100\nmax_queue_size = 7\n"
        "[version_policy]\nlatest = 2\n[labels]\nstable = 1\ncanary = 3\n")
    _version(tmp_path, "m", 1)
    _version(tmp_path, "m", 2, "[batching]\ntimeout_ms = 200\n")  # replaces one field of [batching]
    _version(tmp_path, "m", 3)
    (tmp_path / "m" / "4").mkdir()  # nothing to serve in it
    (tmp_path / "m" / "07").mkdir()  # not a version number
    (tmp_path / "m" / "model.py").write_text("")  # beside version folders: not served
    found = scan_repository(tmp_path)
    m = found.models["m"]
    assert sorted(m.versions) == [1, 2, 3] and m.served() == [2, 3]
    assert m.config is not None and m.config.labels == {"stable": 1, "canary": 3}
    v2 = m.versions[2].config
    assert v2 is not None and (v2.max_batch_size, v2.batching.timeout_ms, v2.batching.max_queue_size) == (8, 200, 7)
    assert m.versions[1].config is not None and m.versions[1].config.batching.timeout_ms == 100
    reasons = {pathlib.Path(s.path).name: s.reason for s in found.skipped}
    assert reasons == {
        "4": "version 4 has no model.py or model.pt",
        "07": "a version is a positive whole number without leading zeros",
        "model.py": "the model has version folders: only their files are served",
    }
    # a version's config may not speak for the model; its mistakes name its own file
    (tmp_path / "m" / "3" / "config.toml").write_text("[labels]\nx = 1\n")
    error = scan_repository(tmp_path).models["m"].versions[3].error
    assert error is not None and error.startswith(f"{tmp_path}/m/3/config.toml: labels: belongs in the model's")
    (tmp_path / "m" / "3" / "config.toml").write_text("max_batch_size = 'x'\n")
    error = scan_repository(tmp_path).models["m"].versions[3].error
    assert error == f"{tmp_path}/m/3/config.toml: max_batch_size: Expected `int`, got `str`"


def test_fingerprints(tmp_path: pathlib.Path) -> None:
    import os

    root = tmp_path
    (root / "m").mkdir()
    (root / "m" / "config.toml").write_text("[labels]\nstable = 1\n")
    d1 = _version(root, "m", 1)
    _version(root, "m", 2)

    def prints() -> dict[int, str]:
        return {v: s.fingerprint for v, s in scan_repository(root).models["m"].versions.items()}

    first = prints()
    assert first == prints() and first[1] != first[2]
    (root / "m" / "config.toml").write_text("[labels]\nstable = 2\n[version_policy]\nall = true\n")
    assert prints() == first  # labels and policy are not a version's behaviour: nothing reloads
    (d1 / "helper.py").write_text("x = 1\n")
    second = prints()
    assert second[1] != first[1] and second[2] == first[2]
    st = os.stat(d1 / "model.py")
    os.utime(d1 / "model.py", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert prints()[1] != second[1]
    (d1 / "__pycache__").mkdir()
    (d1 / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"")
    third = prints()
    (d1 / "__pycache__" / "helper.cpython-311.pyc").write_bytes(b"")
    assert prints() == third  # byte-code caches are not the model
    (root / "m" / "config.toml").write_text("[labels]\nstable = 2\n[batching]\ntimeout_ms = 5\n")
    assert all(prints()[v] != third[v] for v in (1, 2))  # a config change reloads every version


@pytest.mark.parametrize(("policy", "served"), [
    ("", [3]), ("latest = 2", [2, 3]), ("specific = [1, 3, 9]", [1, 3]), ("all = true", [1, 2, 3]),
])
def test_version_policy(tmp_path: pathlib.Path, policy: str, served: list[int]) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.toml").write_text(f"[version_policy]\n{policy}\n")
    for v in (1, 2, 3):
        _version(tmp_path, "m", v)
    assert scan_repository(tmp_path).models["m"].served() == served


@pytest.mark.parametrize(("text", "message"), [
    (b"[version_policy]\nlatest = 0", "m/config.toml: version_policy.latest: Expected `int` >= 1"),
    (b"[version_policy]\nlatest = 1\nall = true", ("version_policy: expected one of latest = n, specific = [...] "
                                                  "or all = true, got latest and all")),
    (b"[version_policy]\nspecific = []", "version_policy.specific: expected at least one version, got []"),
    (b"[version_policy]\nnewest = 1", ("version_policy: Object contains unknown field `newest`; expected one of "
                                      "latest, specific, all")),
    (b"[labels]\n2 = 1", "labels: a label is a name that is not a number"),
    (b"[labels]\nstable = 0", "labels.stable: expected a version number >= 1, got 0"),
    (b'transition = "fast"', "transition: Invalid enum value 'fast'"),
    (b"[package]\narchive = 'm.pt'", "package: expected exactly one of object"),
    (b"[package]\nobject = 'nocolon'", "package.object: expected \"some.module:Name\", got 'nocolon'"),
])
def test_lifecycle_config_errors(text: bytes, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_config(text, file="m/config.toml")
    assert message in str(e.value)


def test_scan_packages(tmp_path: pathlib.Path) -> None:
    # an archive needs its declaration; with it, the version is a package
    _version(tmp_path, "pkg", 1, file="model.pt")
    _version(tmp_path, "pkg", 2, "[package]\nobject = 'mymodels.net:Net'\n", file="model.pt")
    m = scan_repository(tmp_path).models["pkg"]
    assert m.versions[1].error is not None and "needs a [package] table" in m.versions[1].error
    v2 = m.versions[2]
    assert v2.error is None and v2.packaged and v2.model_file == str(tmp_path / "pkg" / "2" / "model.pt")
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "config.toml").write_text("[package]\narchive = 'net.pt'\npickle = 'net/model.pkl'\n")
    flat = scan_repository(tmp_path).models["flat"].versions[1]
    assert flat.error == f"{tmp_path}/flat/net.pt: the archive the [package] table names is not there"


def test_scan_missing_repository(tmp_path: pathlib.Path) -> None:
    with pytest.raises(RepositoryError, match="is not a folder"):
        scan_repository(tmp_path / "nope")


def test_scan_examples(examples: pathlib.Path) -> None:
    found = scan_repository(examples)
    assert {"simple", "mlp", "cnn"} <= set(found.models)
    assert all(v.error is None for m in found.models.values() for v in m.versions.values())
    assert all(m.error is None for m in found.models.values())


async def test_resolve_engine(tmp_path: pathlib.Path) -> None:
    plain = tmp_path / "p.py"
    plain.write_text("from array import array\n")
    auto = ServerSettings()
    assert await resolve_engine(ModelConfig(engine="main"), auto, model_file=str(plain)) == (
        "main", "config.toml says main: engine 'main' asked for")
    assert await resolve_engine(ModelConfig(), ServerSettings(engine="main"), model_file=str(plain)) == (
        "main", "--engine says main: engine 'main' asked for")
    engine, reason = await resolve_engine(ModelConfig(engine="auto"), ServerSettings(engine="main"),
                                          model_file=str(plain))
    assert reason.startswith("config.toml says auto: ")
    assert engine == ("subinterp" if sys.version_info >= (3, 12) else "private")
