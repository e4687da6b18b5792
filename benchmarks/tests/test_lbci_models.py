"""The networks of LBCI's experiment (benchmarks/models): seeded, no download, their stages
in order are the network, and each has a class for the paper's set-up on every CPU."""

from __future__ import annotations

import importlib.util
import os
import tomllib

import pytest

from .conftest import ROOT, needs_torch

MODELS = ROOT / "benchmarks" / "models"


def load(name: str):  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(f"lbci_{name}", MODELS / name / "model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@needs_torch
@pytest.mark.parametrize("name, stages", [("alexnet", 5), ("resnet", 5), ("wide", 4)])
def test_stages_in_order_are_the_network(name: str, stages: int) -> None:
    import torch

    module = load(name)
    config = tomllib.loads((MODELS / name / "config.toml").read_text())
    cls = getattr(module, config["class"])
    wide = getattr(module, config["class"] + "AllCores")
    assert issubclass(wide, cls) and wide.torch_threads == (os.cpu_count() or 1) and cls.torch_threads == 1
    assert len(cls.stages) == stages
    model = cls()
    model.load()
    (spec,) = cls.inputs
    assert [spec.name, spec.datatype, list(spec.shape)] == [config["inputs"][0][k] for k in ("name", "datatype", "shape")]
    torch.manual_seed(1)
    x = torch.randn(2, *spec.shape[1:])
    whole = model({spec.name: x})[cls.outputs[0].name]
    with torch.inference_mode():
        y = x
        for stage in cls.stages:
            y = stage(y)
    assert whole.shape == (2, cls.outputs[0].shape[1]) and torch.equal(whole, y)
    again = load(name)  # seeded: the same weights in every interpreter
    assert all(torch.equal(a, b) for a, b in zip(cls.stages[0].state_dict().values(),
                                                 getattr(again, config["class"]).stages[0].state_dict().values()))
