"""A small multi-layer perceptron: 8 x Linear(16, 16) with ReLU between layers.

The torch::deploy paper's scaling benchmark model: so little arithmetic per request
that the Python around it dominates, which is what interpreters-per-core speed up.
Weights come from a fixed seed, so every interpreter (and any test) builds the same
network.
"""

from __future__ import annotations

from typing import Any

import torch

from aserve.runtime import Model, TensorSpec

WIDTH = 16
LAYERS = 8
SEED = 0


def build(seed: int = SEED) -> torch.nn.Sequential:
    """The network with its seeded weights (deterministic across interpreters)."""
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        layers: list[torch.nn.Module] = []
        for i in range(LAYERS):
            layers.append(torch.nn.Linear(WIDTH, WIDTH))
            if i < LAYERS - 1:
                layers.append(torch.nn.ReLU())
        net = torch.nn.Sequential(*layers)
    finally:
        torch.random.set_rng_state(generator_state)
    return net.eval()


class MLP(Model):
    inputs = (TensorSpec("INPUT", "FP32", (-1, WIDTH)),)
    outputs = (TensorSpec("OUTPUT", "FP32", (-1, WIDTH)),)
    tensor_format = "torch"

    def load(self) -> None:
        self.net = build(int(self.parameters.get("seed", SEED)))

    def __call__(self, inputs: dict[str, Any]) -> dict[str, Any]:
        with torch.inference_mode():
            return {"OUTPUT": self.net(inputs["INPUT"])}
