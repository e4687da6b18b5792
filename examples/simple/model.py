"""Triton's quickstart model: element-wise sum and difference of two INT32 tensors.

Pure Python (no numpy, no torch) so that it runs in every engine, PEP 684
subinterpreters included. Results wrap around at 32 bits, as int32 arithmetic does
in Triton and numpy.
"""

from __future__ import annotations

from array import array
from operator import add, sub
from typing import Any

from aserve.runtime import Model, TensorSpec

_MASK = 0xFFFFFFFF


def _wrapped(op: Any, a: memoryview, b: memoryview) -> memoryview:
    # Unsigned 32-bit array of the masked results, handed back as raw bytes: the
    # declared INT32 datatype and [-1, 16] shape say how to read them.
    return memoryview(array("I", [v & _MASK for v in map(op, a, b)])).cast("B")


def _flat(view: memoryview) -> memoryview:
    return view.cast("B").cast("i")


class Simple(Model):
    inputs = (TensorSpec("INPUT0", "INT32", (-1, 16)), TensorSpec("INPUT1", "INT32", (-1, 16)))
    outputs = (TensorSpec("OUTPUT0", "INT32", (-1, 16)), TensorSpec("OUTPUT1", "INT32", (-1, 16)))
    tensor_format = "memoryview"

    def __call__(self, inputs: dict[str, Any]) -> dict[str, Any]:
        a = _flat(inputs["INPUT0"])
        b = _flat(inputs["INPUT1"])
        if len(a) != len(b):
            raise ValueError(f"INPUT0 has {len(a)} elements, INPUT1 has {len(b)}; they must match")
        return {"OUTPUT0": _wrapped(add, a, b), "OUTPUT1": _wrapped(sub, a, b)}
