"""Suite-wide set-up: glibc tunables for private interpreters, example paths."""

from __future__ import annotations

import os
import pathlib

import pytest

# Private interpreters need glibc tunables at process start: the `aserve.testing`
# plugin (pyproject addopts) re-executes pytest with them before capture starts.

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"

try:
    import torch  # noqa: F401

    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False

needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="torch is installed only for the Python 3.11 run")


# A staged pure-Python model: three stages, each x -> 2x + k (k = stage index) on every
# element of FP32 rows of 4, sleeping `delay` seconds (parameters); a row holding
# `fail_on` makes it raise. Activations are lists of rows; __call__ runs the same stages.
STAGED_MODEL = """
import time
from aserve.runtime import Model, TensorSpec

class Staged(Model):
    inputs = (TensorSpec("X", "FP32", (-1, 4)),)
    outputs = (TensorSpec("Y", "FP32", (-1, 4)),)

    def load(self):
        delay = float(self.parameters.get("delay", 0.0))
        fail = float(self.parameters.get("fail_on", -1.0))

        def stage(k):
            def run(rows):
                time.sleep(delay)
                if any(v == fail for row in rows for v in row):
                    raise ValueError(f"stage {k} refuses {fail}")
                return [[2 * v + k for v in row] for row in rows]
            return run

        self.stages = [stage(k) for k in range(3)]

    def stage_input(self, inputs):
        return inputs["X"].tolist()

    def stage_concat(self, parts):
        return [row for part in parts for row in part]

    def __call__(self, inputs):
        x = self.stage_input(inputs)
        for stage in self.stages:
            x = stage(x)
        return self.stage_output(x)
"""


@pytest.fixture
def examples() -> pathlib.Path:
    return EXAMPLES


@pytest.fixture
def model_dir(tmp_path: pathlib.Path):
    """Write a model.py (and optional config.toml) into a fresh folder; returns its path."""

    def make(source: str, config: str | None = None, name: str = "m") -> pathlib.Path:
        d = tmp_path / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "model.py").write_text(source)
        if config is not None:
            (d / "config.toml").write_text(config)
        return d

    return make


os.environ.setdefault("ASERVE_LOG_LEVEL", "warning")
