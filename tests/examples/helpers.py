"""Loading a bundled example into a pool, and its model.py into the host for reference."""

from __future__ import annotations

import importlib.util
import pathlib
import sys
import tomllib
from types import ModuleType
from typing import Any

from aserve.engine import ModelSpec
from aserve.runtime import TensorSpec

from ..conftest import EXAMPLES

ENGINES = ["private", "main"] + (["subinterp"] if sys.version_info >= (3, 12) else [])


def spec(name: str) -> ModelSpec:
    """The ModelSpec an example's config.toml describes (class, inputs, outputs, parameters)."""
    folder = EXAMPLES / name
    config: dict[str, Any] = tomllib.loads((folder / "config.toml").read_text())

    def tensors(key: str) -> list[TensorSpec]:
        return [TensorSpec(t["name"], t["datatype"], tuple(t["shape"])) for t in config.get(key, [])]

    return ModelSpec(
        name=name,
        path=str(folder),
        class_name=config.get("class"),
        inputs=tensors("inputs"),
        outputs=tensors("outputs"),
        parameters=config.get("parameters", {}),
    )


def host_module(name: str) -> ModuleType:
    """The example's model.py imported into this (host) interpreter, for reference results."""
    path: pathlib.Path = EXAMPLES / name / "model.py"
    module_name = f"_example_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    loader_spec = importlib.util.spec_from_file_location(module_name, path)
    assert loader_spec is not None and loader_spec.loader is not None
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[module_name] = module
    loader_spec.loader.exec_module(module)
    return module
