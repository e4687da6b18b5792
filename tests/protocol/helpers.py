"""Model descriptions and reference data shared by the codec tests."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from aserve.engine.pool import ModelInfo
from aserve.inference import ModelSchema
from aserve.runtime.model import TensorSpec

NUMPY = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
    "BF16": ml_dtypes.bfloat16,
}

# Six values per datatype, exactly representable, extremes included.
VALUES: dict[str, list[Any]] = {
    "BOOL": [True, False, True, True, False, False],
    "UINT8": [0, 1, 2, 127, 128, 255],
    "UINT16": [0, 1, 300, 32768, 65534, 65535],
    "UINT32": [0, 1, 70000, 2**31, 2**32 - 2, 2**32 - 1],
    "UINT64": [0, 1, 2**40, 2**63, 2**64 - 2, 2**64 - 1],
    "INT8": [-128, -1, 0, 1, 100, 127],
    "INT16": [-32768, -1, 0, 1, 1000, 32767],
    "INT32": [-(2**31), -1, 0, 1, 123456, 2**31 - 1],
    "INT64": [-(2**63), -1, 0, 1, 2**53 + 1, 2**63 - 1],
    "FP16": [-65504.0, -1.5, 0.0, 0.0009765625, 3.140625, 65504.0],
    "FP32": [-3.4028234663852886e38, -1.5, 0.0, 1.100000023841858, 16777216.0, 3.4028234663852886e38],
    "FP64": [-1.7976931348623157e308, -0.1, 0.0, 1e-300, 2.5, 1.7976931348623157e308],
    "BF16": [-3.0, -1.5, 0.0, 0.25, 1.0078125, 256.0],
    "BYTES": ["", "a", "héllo", "x" * 300, "\u2603", "tab\tnl\n"],
}
DATATYPES = list(VALUES)


def array(datatype: str, values: list[Any] | None = None, shape: tuple[int, ...] = (2, 3)) -> np.ndarray:
    """The reference numpy array of a datatype's values."""
    values = VALUES[datatype] if values is None else values
    if datatype == "BYTES":
        return np.array([v.encode() if isinstance(v, str) else v for v in values], dtype=object).reshape(
            shape
        )
    return np.array(values, dtype=NUMPY[datatype]).reshape(shape)


def raw(datatype: str, values: list[Any] | None = None) -> bytes:
    """The V2 bytes of a datatype's values (BYTES: length-prefixed elements)."""
    values = VALUES[datatype] if values is None else values
    if datatype == "BYTES":
        return b"".join(
            len(b).to_bytes(4, "little") + b
            for b in (v.encode() if isinstance(v, str) else v for v in values)
        )
    return np.array(values, dtype=NUMPY[datatype]).tobytes()


def model(
    inputs: list[tuple[str, str, tuple[int, ...]]],
    outputs: list[tuple[str, str, tuple[int, ...]]] | None = None,
    name: str = "m",
) -> ModelInfo:
    outs = inputs if outputs is None else outputs
    return ModelInfo(
        name=name,
        engine="main",
        interpreters=1,
        class_name="M",
        file="model.py",
        tensor_format="memoryview",
        inputs=[TensorSpec(n, d, s) for n, d, s in inputs],
        outputs=[TensorSpec(n, d, s) for n, d, s in outs],
    )


def schema(info: ModelInfo, max_batch_size: int, *, max_latency_budget_ms: float | None = None) -> ModelSchema:
    """What a loaded model's requests are decoded against."""
    return ModelSchema(info.name, "1", inputs=info.inputs, outputs=info.outputs, max_batch_size=max_batch_size,
                       max_latency_budget_ms=max_latency_budget_ms)
