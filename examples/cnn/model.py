"""A small image classifier: three conv blocks and a linear head, seeded weights.

Compute-bound (tens of MFLOPs per image), the opposite end of the scaling benchmark
from `mlp`. The network is an `nn.Sequential` split into `stages`: running them in
order equals `forward`, and a batcher may join waiting requests at a stage boundary.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from aserve.runtime import Model, TensorSpec

CLASSES = 10
SIZE = 64
SEED = 0


def _block(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(cout, cout, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
    )


def build(seed: int = SEED) -> list[nn.Module]:
    """The stages of the network with seeded weights (deterministic across interpreters)."""
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        stages: list[nn.Module] = [
            _block(3, 32),  # 3x64x64 -> 32x32x32
            _block(32, 64),  # -> 64x16x16
            _block(64, 128),  # -> 128x8x8
            nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, CLASSES)),
        ]
    finally:
        torch.random.set_rng_state(state)
    for stage in stages:
        stage.eval()
    return stages


class CNN(Model):
    inputs = (TensorSpec("IMAGE", "FP32", (-1, 3, SIZE, SIZE)),)
    outputs = (TensorSpec("SCORES", "FP32", (-1, CLASSES)),)
    tensor_format = "torch"
    # Sub-modules whose composition is the whole network, in order (see module doc).
    # Built when the class is defined, so the class itself tells a batcher its stages.
    stages: ClassVar[list[nn.Module]] = build()

    def load(self) -> None:
        self.net = nn.Sequential(*self.stages).eval()

    def __call__(self, inputs: dict[str, Any]) -> dict[str, Any]:
        with torch.inference_mode():
            return {"SCORES": self.net(inputs["IMAGE"])}
