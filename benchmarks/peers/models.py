"""The two models the peers serve, on the V2 codec's tensors.

- `simple`: Triton's quickstart, as examples/simple computes it: OUTPUT0 = INPUT0 + INPUT1,
  OUTPUT1 = INPUT0 - INPUT1, INT32 with 32-bit wrap-around.
- `mlp`: examples/mlp/model.py's network (8 x Linear(16, 16), seeded weights), built by
  that file's own `build()` and run with torch on one thread, as aserve runs it in each
  interpreter (parallelism comes from processes or interpreters, not from torch threads).
"""

from __future__ import annotations

import importlib.util
import pathlib
from array import array
from collections.abc import Sequence
from typing import Any

from .v2 import BadRequest, Tensor

MODELS = ("simple", "mlp")
_INT32 = 1 << 31


def _wrap(v: int) -> int:
    return ((v + _INT32) & 0xFFFFFFFF) - _INT32


def _check(inputs: dict[str, Tensor], name: str, datatype: str, width: int) -> Tensor:
    t = inputs.get(name)
    if t is None:
        raise BadRequest(f"input {name} is missing; got {sorted(inputs)}")
    if t.datatype != datatype or len(t.shape) != 2 or t.shape[1] != width:
        raise BadRequest(f"input {name}: expected {datatype} [-1, {width}], got {t.datatype} {list(t.shape)}")
    return t


def validate(model: str, inputs: dict[str, Tensor]) -> None:
    """Raise BadRequest unless the inputs are what `model` takes."""
    if model == "simple":
        a = _check(inputs, "INPUT0", "INT32", 16)
        b = _check(inputs, "INPUT1", "INT32", 16)
        if a.shape != b.shape:
            raise BadRequest(f"INPUT0 has shape {list(a.shape)}, INPUT1 {list(b.shape)}; they must match")
    elif model == "mlp":
        _check(inputs, "INPUT", "FP32", 16)
    else:
        raise BadRequest(f"unknown model {model!r}")


def add_sub(x: Sequence[int], y: Sequence[int]) -> tuple[list[int], list[int]]:
    """simple's arithmetic on two equally long sequences: (x + y, x - y), INT32 wrap-around."""
    return ([_wrap(p + q) for p, q in zip(x, y, strict=True)], [_wrap(p - q) for p, q in zip(x, y, strict=True)])


def simple(inputs: dict[str, Tensor]) -> dict[str, Tensor]:
    a, b = inputs["INPUT0"], inputs["INPUT1"]
    add, sub = add_sub(a.values(), b.values())
    return {"OUTPUT0": Tensor("INT32", a.shape, array("i", add).tobytes()),
            "OUTPUT1": Tensor("INT32", a.shape, array("i", sub).tobytes())}


class MLP:
    """examples/mlp's network; `__call__` runs a batch of requests as one torch batch."""

    def __init__(self, model_py: str | pathlib.Path) -> None:
        import torch

        torch.set_num_threads(1)
        spec = importlib.util.spec_from_file_location("_benchmarks_mlp", model_py)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot import {model_py}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        self.torch: Any = torch
        self.width: int = module.WIDTH
        self.net = module.build()

    def rows(self, rows: list[list[float]]) -> list[list[float]]:
        """One torch batch of `rows` (each `width` floats), its output rows as lists."""
        torch = self.torch
        with torch.inference_mode():
            y = self.net(torch.tensor(rows, dtype=torch.float32))
        out: list[list[float]] = y.tolist()
        return out

    def __call__(self, requests: list[dict[str, Tensor]]) -> list[dict[str, Tensor]]:
        torch = self.torch
        rows = [torch.frombuffer(bytearray(r["INPUT"].data), dtype=torch.float32).view(-1, self.width)
                for r in requests]
        with torch.inference_mode():
            y = self.net(rows[0] if len(rows) == 1 else torch.cat(rows))
        answers = []
        start = 0
        for r in rows:
            n = r.shape[0]
            data = array("f", y[start:start + n].flatten().tolist()).tobytes()
            answers.append({"OUTPUT": Tensor("FP32", (n, self.width), data)})
            start += n
        return answers
