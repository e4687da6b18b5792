"""A ResNet-18-shaped network at 112x112, with seeded weights (nothing is downloaded).

The second CNN of LBCI's experiment (`benchmarks.batching`): residual blocks of 3x3
convolutions and batch norm, global pooling, one small linear head. Where AlexNet's
time at small batches goes to its large fully connected layers (a cost that barely
grows with the batch), nearly all of this network's goes to convolutions that scale
with it. Five stages: the stem with layer1, layer2, layer3, layer4, the head.
`ResNetAllCores` runs one interpreter on every CPU (the paper's set-up).
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from aserve.runtime import Model, TensorSpec

CLASSES = 1000
SIZE = 112
SEED = 0


class Block(nn.Module):
    """Two 3x3 convolutions with batch norm and a shortcut (projected when the shape changes)."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
            nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
        )
        self.short: nn.Module = nn.Identity() if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.short(x))


def _layer(cin: int, cout: int, stride: int) -> nn.Sequential:
    return nn.Sequential(Block(cin, cout, stride), Block(cout, cout, 1))


def build(seed: int = SEED) -> list[nn.Module]:
    """The network's stages with seeded weights (the same in every interpreter)."""
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        stages: list[nn.Module] = [
            nn.Sequential(
                nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                nn.MaxPool2d(3, 2, padding=1), _layer(64, 64, 1),
            ),
            _layer(64, 128, 2),
            _layer(128, 256, 2),
            _layer(256, 512, 2),
            nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, CLASSES)),
        ]
    finally:
        torch.random.set_rng_state(state)
    for stage in stages:
        stage.eval()
    return stages


class ResNet(Model):
    inputs = (TensorSpec("IMAGE", "FP32", (-1, 3, SIZE, SIZE)),)
    outputs = (TensorSpec("SCORES", "FP32", (-1, CLASSES)),)
    tensor_format = "torch"
    stages = build()  # the class itself tells a batcher its stages

    def load(self) -> None:
        self.net = nn.Sequential(*self.stages).eval()

    def __call__(self, inputs: dict[str, Any]) -> dict[str, Any]:
        with torch.inference_mode():
            return {"SCORES": self.net(inputs["IMAGE"])}


class ResNetAllCores(ResNet):
    """The paper's set-up: serve from one interpreter whose torch threads use every CPU."""

    torch_threads = os.cpu_count() or 1
