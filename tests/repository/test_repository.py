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
    assert (b.layer_join, b.join_rule) == (False, "budget")
    assert c.parameters == {"scale": 3, "label": "x"}
    with pytest.raises(AttributeError):
        c.max_batch_size = 1  # type: ignore[misc]


def test_defaults() -> None:
    c = parse_config(b"")
    assert c == ModelConfig()
    assert c.engine is None and c.interpreters is None and c.max_batch_size == 0
    assert c.batching.policy == "window" and c.batching.max_queue_size == 4096 and c.batching.timeout_ms == 30000
    assert c.batching.layer_join is True and c.batching.join_rule == "benefit"


@pytest.mark.parametrize(("text", "message"), [
    (b'max_batch_size = "x"', "m/config.toml: max_batch_size: Expected `int`, got `str`"),
    (b"max_batch_size = -1", "m/config.toml: max_batch_size: Expected `int` >= 0"),
    (b"interpreters = 0", "m/config.toml: interpreters: Expected `int` >= 1"),
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
    (tmp_path / "1").mkdir()  # numeric folders are versions, not models
    (tmp_path / "1" / "model.py").write_text("")
    (tmp_path / "notes").mkdir()  # no model.py
    (tmp_path / "README.md").write_text("")
    entries = scan_repository(tmp_path)
    assert [e.name for e in entries] == ["a", "b", "bad"]
    assert entries[0].config == ModelConfig() and entries[1].config is not None
    assert entries[1].config.max_batch_size == 2
    assert entries[2].config is None
    assert entries[2].error is not None and f"{tmp_path}/bad/config.toml: interpreters" in entries[2].error
    assert entries[0].model_file == str(tmp_path / "a" / "model.py")
    assert load_config(tmp_path / "a" / "config.toml") == ModelConfig()


def test_scan_missing_repository(tmp_path: pathlib.Path) -> None:
    with pytest.raises(RepositoryError, match="is not a folder"):
        scan_repository(tmp_path / "nope")


def test_scan_examples(examples: pathlib.Path) -> None:
    names = [e.name for e in scan_repository(examples)]
    assert {"simple", "mlp", "cnn"} <= set(names)
    assert all(e.error is None for e in scan_repository(examples))


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
