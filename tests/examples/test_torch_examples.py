"""`mlp` and `cnn`: served results equal a plain torch forward in the host."""

from __future__ import annotations

import asyncio

import pytest

from aserve.engine import Pool
from aserve.tensor import Tensor

from ..conftest import HAVE_TORCH, needs_torch
from .helpers import host_module, spec

pytestmark = needs_torch

ENGINES = ["private", "main"]  # torch does not load in PEP 684 subinterpreters

if HAVE_TORCH:
    import torch


def _host_forward(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        out: torch.Tensor = module(x)
        return out


def _tensor(out: Tensor) -> torch.Tensor:
    return torch.frombuffer(bytearray(out.data), dtype=torch.float32).reshape(out.shape)


@pytest.mark.parametrize("engine", ENGINES)
async def test_mlp_matches_host_forward(engine: str) -> None:
    net = host_module("mlp").build(0)
    assert sum(isinstance(m, torch.nn.Linear) and m.in_features == m.out_features == 16 for m in net) == 8
    gen = torch.Generator().manual_seed(1)
    inputs = [torch.randn(batch, 16, generator=gen) for batch in (1, 1, 5, 64, 2, 1)]
    async with Pool(engine=engine, interpreters=2) as pool:
        info = await pool.load(spec("mlp"))
        assert info.tensor_format == "torch"
        outs = await asyncio.gather(
            *(pool.infer("mlp", {"INPUT": Tensor("FP32", tuple(x.shape), x.numpy())}) for x in inputs)
        )
        for x, out in zip(inputs, outs):
            assert (out["OUTPUT"].datatype, out["OUTPUT"].shape) == ("FP32", (x.shape[0], 16))
            torch.testing.assert_close(_tensor(out["OUTPUT"]), _host_forward(net, x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("engine", ENGINES)
async def test_cnn_matches_host_forward(engine: str) -> None:
    stages = host_module("cnn").build()
    net = torch.nn.Sequential(*stages)
    gen = torch.Generator().manual_seed(2)
    inputs = [torch.randn(batch, 3, 64, 64, generator=gen) for batch in (1, 3, 1)]
    async with Pool(engine=engine, interpreters=2) as pool:
        await pool.load(spec("cnn"))
        outs = await asyncio.gather(
            *(pool.infer("cnn", {"IMAGE": Tensor("FP32", tuple(x.shape), x.numpy())}) for x in inputs)
        )
    for x, out in zip(inputs, outs):
        assert (out["SCORES"].datatype, out["SCORES"].shape) == ("FP32", (x.shape[0], 10))
        torch.testing.assert_close(_tensor(out["SCORES"]), _host_forward(net, x), rtol=1e-4, atol=1e-5)


def test_cnn_stages_compose_to_forward() -> None:
    module = host_module("cnn")
    model = module.CNN()
    model.parameters = {}
    model.load()
    assert 3 <= len(module.CNN.stages) <= 4
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(3))
    y = x
    for stage in module.CNN.stages:
        y = _host_forward(stage, y)
    with torch.inference_mode():
        whole = model({"IMAGE": x})["SCORES"]
    assert whole.shape == (2, 10)
    torch.testing.assert_close(y, whole, rtol=0, atol=0)
    # the weights are seeded: another build gives the same network
    again = torch.nn.Sequential(*module.build())
    torch.testing.assert_close(_host_forward(again, x), whole, rtol=0, atol=0)
