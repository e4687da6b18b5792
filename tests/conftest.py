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
