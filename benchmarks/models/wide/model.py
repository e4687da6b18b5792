"""A wide fully connected network with seeded weights: four 4096x4096 layers, one per stage.

The third network of LBCI's experiment (`benchmarks.batching`), the shape where the
paper's layer join pays: a batch of one reads all 256 MB of weights, as a batch of
sixteen does, so a batch's time is mostly a per-batch cost that barely grows with its
samples. A request that joins a running batch repeats a few cheap stages alone and
then rides along, instead of waiting for an interpreter and reading the weights again.
`WideAllCores` runs one interpreter on every CPU (the paper's set-up).
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from aserve.runtime import Model, TensorSpec

WIDTH = 4096
STAGES = 4
SEED = 0


def build(seed: int = SEED) -> list[nn.Module]:
    """The network's stages with seeded weights (the same in every interpreter)."""
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        stages: list[nn.Module] = [nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU()) for _ in range(STAGES)]
    finally:
        torch.random.set_rng_state(state)
    for stage in stages:
        stage.eval()
    return stages


class Wide(Model):
    inputs = (TensorSpec("X", "FP32", (-1, WIDTH)),)
    outputs = (TensorSpec("Y", "FP32", (-1, WIDTH)),)
    tensor_format = "torch"
    stages = build()  # the class itself tells a batcher its stages

    def load(self) -> None:
        self.net = nn.Sequential(*self.stages).eval()

    def __call__(self, inputs: dict[str, Any]) -> dict[str, Any]:
        with torch.inference_mode():
            return {"Y": self.net(inputs["X"])}


class WideAllCores(Wide):
    """The paper's set-up: serve from one interpreter whose torch threads use every CPU."""

    torch_threads = os.cpu_count() or 1
