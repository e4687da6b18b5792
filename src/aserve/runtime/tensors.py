"""Turning shared buffers into the tensors a model wants, and its results back.

Inputs arrive as memoryviews over host memory; they become typed memoryviews,
numpy arrays or torch tensors over the same bytes (no copy). Outputs leave as
(datatype, shape, data) where data is an object with the buffer protocol or a
(address, nbytes, keepalive) triple for torch tensors; the interpreter keeps them
alive until the host releases them.
"""

from __future__ import annotations

import array
import sys
import warnings
from typing import Any

from .datatypes import BY_FORMAT, BY_NUMPY, BY_TORCH, DATATYPES, decode_bytes, element_count, encode_bytes
from .model import TensorSpec

# torch.frombuffer warns on read-only buffers; inputs are borrowed, so that is intended.
warnings.filterwarnings("ignore", message="The given buffer is not writable")

_ARRAY_CODES = {"b", "B", "h", "H", "i", "I", "l", "L", "q", "Q", "f", "d"}


def to_model(datatype: str, shape: tuple[int, ...], view: memoryview, fmt: str) -> Any:
    """One input tensor, in the model's `tensor_format`, over `view`'s memory."""
    dt = DATATYPES[datatype]
    if datatype == "BYTES":
        items = decode_bytes(view, element_count(shape))
        if fmt == "numpy":
            import numpy as np

            arr = np.empty(len(items), dtype=object)
            arr[:] = items
            return arr.reshape(shape)
        return items
    if fmt == "torch":
        import torch

        tdtype = getattr(torch, dt.torch)
        if len(view) == 0:
            return torch.empty(shape, dtype=tdtype)
        return torch.frombuffer(view, dtype=tdtype).reshape(shape)
    if fmt == "numpy":
        import numpy as np

        if not dt.numpy:
            raise TypeError(f"numpy has no {datatype} type; use tensor_format='torch'")
        return np.frombuffer(view, dtype=dt.numpy).reshape(shape)
    # memoryview: typed and shaped where Python's buffer protocol can express it
    if dt.format and 0 not in shape and len(shape) >= 1:
        try:
            return view.cast("B").cast(dt.format, shape)  # type: ignore[call-overload]
        except (TypeError, ValueError):
            pass
    return view


def _torch_output(value: Any) -> tuple[str, tuple[int, ...], Any]:
    t = value.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    datatype = BY_TORCH.get(str(t.dtype).removeprefix("torch."))
    if datatype is None:
        raise TypeError(f"torch dtype {t.dtype} has no V2 datatype")
    nbytes = t.numel() * t.element_size()
    return datatype, tuple(t.shape), (t.data_ptr(), nbytes, t)


def _flatten(value: Any, shape: list[int], depth: int, out: list[Any]) -> None:
    if isinstance(value, (list, tuple)):
        if len(shape) <= depth:
            shape.append(len(value))
        elif shape[depth] != len(value):
            raise ValueError(f"ragged nested list: dimension {depth} has lengths {shape[depth]} and {len(value)}")
        for v in value:
            _flatten(v, shape, depth + 1, out)
    else:
        if depth != len(shape):
            raise ValueError("ragged nested list: scalars at different depths")
        out.append(value)


def _bytes_output(value: Any, spec: TensorSpec | None) -> tuple[str, tuple[int, ...], Any]:
    if type(value).__module__ == "numpy":
        shape = list(value.shape)
        flat: list[Any] = list(value.reshape(-1))
    else:
        shape = []
        flat = []
        _flatten(value, shape, 0, flat)
    items = [v.encode() if isinstance(v, str) else bytes(v) for v in flat]
    return "BYTES", tuple(shape), encode_bytes(items)


def _is_text_list(value: Any) -> bool:
    if not isinstance(value, (list, tuple)):
        return False
    while isinstance(value, (list, tuple)) and value:
        value = value[0]
    return isinstance(value, (str, bytes))


def from_model(name: str, value: Any, spec: TensorSpec | None) -> tuple[str, str, tuple[int, ...], Any]:
    """One output, as (name, datatype, shape, buffer-or-(address, nbytes, keepalive))."""
    if type(value) is memoryview and (spec is None or spec.datatype != "BYTES"):
        datatype, shape, data = _buffer_output(name, value, value, spec)  # the common case first
    elif (spec is not None and spec.datatype == "BYTES") or (spec is None and _is_text_list(value)):
        datatype, shape, data = _bytes_output(value, spec)
    elif type(value).__module__ == "torch" and "torch" in sys.modules:
        datatype, shape, data = _torch_output(value)
    elif type(value).__module__ == "numpy":
        import numpy as np

        arr = np.ascontiguousarray(value)
        datatype = BY_NUMPY.get(str(arr.dtype), "")
        if not datatype:
            raise TypeError(f"output {name!r}: numpy dtype {arr.dtype} has no V2 datatype")
        shape, data = tuple(arr.shape), arr
    elif isinstance(value, (list, tuple)):
        want = spec.datatype if spec is not None else ""
        shape_l: list[int] = []
        flat: list[Any] = []
        _flatten(value, shape_l, 0, flat)
        if not want:
            want = "FP64" if any(isinstance(v, float) for v in flat) else "INT64"
        dt = DATATYPES[want]
        if dt.format in _ARRAY_CODES:
            data = array.array(dt.format, flat)
        elif dt.format == "?":
            data = bytes(bool(v) for v in flat)
        else:
            raise TypeError(f"output {name!r}: a list cannot become {want}; return a tensor")
        datatype, shape = want, tuple(shape_l)
    else:
        try:
            view = memoryview(value)
        except TypeError:
            raise TypeError(
                f"output {name!r}: {type(value).__name__} is not a tensor, array, buffer or list"
            ) from None
        datatype, shape, data = _buffer_output(name, value, view, spec)
    if spec is not None and datatype != spec.datatype:
        raise TypeError(f"output {name!r}: model returned {datatype}, declared {spec.datatype}")
    return name, datatype, shape, data


def _buffer_output(name: str, value: Any, view: memoryview, spec: TensorSpec | None
                   ) -> tuple[str, tuple[int, ...], Any]:
    """An output with the buffer protocol (`view` over it): its datatype from the buffer's
    format (raw bytes: the declared one), its shape from the buffer's, or the declared shape
    filled from its element count when the buffer is flat."""
    datatype = BY_FORMAT.get(view.format.lstrip("@=<"), "")
    if spec is not None and (view.format in ("B", "c") or not datatype):
        datatype = spec.datatype  # raw bytes: the declaration says what they are
    if not datatype:
        raise TypeError(f"output {name!r}: buffer format {view.format!r} has no V2 datatype")
    data = value
    if not view.c_contiguous:
        data = view = memoryview(view.tobytes()).cast(view.format, view.shape or ())  # type: ignore[call-overload]
    shape = tuple(view.shape or ())
    if spec is not None and view.ndim <= 1 and DATATYPES[datatype].itemsize:
        shape = _fit_declared(spec.shape, view.nbytes // DATATYPES[datatype].itemsize)
    return datatype, shape, data


_FITTED: dict[tuple[tuple[int, ...], int], tuple[int, ...]] = {}  # (declared, count) -> shape: models repeat them
_FITTED_MAX = 1024


def _fit_declared(declared: tuple[int, ...], count: int) -> tuple[int, ...]:
    """The declared shape with its one variable dimension filled from the element count."""
    key = (declared, count)
    shape = _FITTED.get(key)
    if shape is None:
        shape = _fit(declared, count)
        if len(_FITTED) < _FITTED_MAX:
            _FITTED[key] = shape
    return shape


def _fit(declared: tuple[int, ...], count: int) -> tuple[int, ...]:
    fixed = element_count([d for d in declared if d != -1])
    if declared.count(-1) == 1 and fixed and count % fixed == 0:
        return tuple(count // fixed if d == -1 else d for d in declared)
    if -1 not in declared and element_count(declared) == count:
        return declared
    return (count,)
