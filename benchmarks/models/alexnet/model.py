"""AlexNet in torchvision's layer layout, with seeded weights (nothing is downloaded).

LBCI's paper serves AlexNet; this is the network its experiment runs
(`python -m benchmarks.batching --model benchmarks/models/alexnet`). It is split into
five stages at the paper's layer boundaries, so a batcher may join waiting requests to
a running batch between them. `AlexNet` uses one intra-op thread per interpreter
(aserve's set-up: parallelism from interpreters); `AlexNetAllCores` uses every CPU in
one interpreter (the paper's set-up: one instance whose threads share the machine).
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from aserve.runtime import Model, TensorSpec

CLASSES = 1000
SIZE = 224
SEED = 0


def build(seed: int = SEED) -> list[nn.Module]:
    """The network's stages with seeded weights (the same in every interpreter)."""
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        stages: list[nn.Module] = [
            nn.Sequential(nn.Conv2d(3, 64, 11, stride=4, padding=2), nn.ReLU(), nn.MaxPool2d(3, 2)),
            nn.Sequential(nn.Conv2d(64, 192, 5, padding=2), nn.ReLU(), nn.MaxPool2d(3, 2)),
            nn.Sequential(
                nn.Conv2d(192, 384, 3, padding=1), nn.ReLU(),
                nn.Conv2d(384, 256, 3, padding=1), nn.ReLU(),
                nn.Conv2d(256, 256, 3, padding=1), nn.ReLU(),
                nn.MaxPool2d(3, 2),
            ),
            nn.Sequential(
                nn.AdaptiveAvgPool2d(6), nn.Flatten(),
                nn.Dropout(), nn.Linear(256 * 6 * 6, 4096), nn.ReLU(),
                nn.Dropout(), nn.Linear(4096, 4096), nn.ReLU(),
            ),
            nn.Linear(4096, CLASSES),
        ]
    finally:
        torch.random.set_rng_state(state)
    for stage in stages:
        stage.eval()
    return stages


class AlexNet(Model):
    inputs = (TensorSpec("IMAGE", "FP32", (-1, 3, SIZE, SIZE)),)
    outputs = (TensorSpec("SCORES", "FP32", (-1, CLASSES)),)
    tensor_format = "torch"
    stages = build()  # the class itself tells a batcher its stages

    def load(self) -> None:
        self.net = nn.Sequential(*self.stages).eval()

    def __call__(self, inputs: dict[str, Any]) -> dict[str, Any]:
        with torch.inference_mode():
            return {"SCORES": self.net(inputs["IMAGE"])}


class AlexNetAllCores(AlexNet):
    """The paper's set-up: serve from one interpreter whose torch threads use every CPU."""

    torch_threads = os.cpu_count() or 1
