"""Tensor data between wire values (lists of numbers or strings) and little-endian bytes.

Every conversion runs in C (`array`, `struct`, `memoryview.cast`, `itertools.chain`,
msgspec) rather than in a per-element Python loop; only BYTES tensors, whose elements
each carry their own length, are walked element by element. Like the rest of the
server, this assumes a little-endian host (x86-64, aarch64).
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Iterable, Sequence
from functools import cache
from itertools import chain
from typing import Annotated, Any

import msgspec

from ..errors import InvalidInput
from ..runtime.datatypes import DATATYPES, bytes_ends, decode_bytes, element_count, encode_bytes
from .formats import decode_error

# Python element type of each datatype in a JSON/msgpack list, with the value range
# so that msgspec rejects out-of-range integers with the element's position.
_INT_RANGES = {
    "INT8": (-(2**7), 2**7 - 1),
    "INT16": (-(2**15), 2**15 - 1),
    "INT32": (-(2**31), 2**31 - 1),
    "INT64": (-(2**63), 2**63 - 1),
    "UINT8": (0, 2**8 - 1),
    "UINT16": (0, 2**16 - 1),
    "UINT32": (0, 2**32 - 1),
    "UINT64": (0, 2**64 - 1),
}
ELEMENT_TYPES: dict[str, Any] = {
    # msgspec bounds must fit an int64: UINT64's upper bound is checked when packing.
    **{
        name: Annotated[int, msgspec.Meta(ge=lo, le=hi)]
        if hi < 2**63
        else Annotated[int, msgspec.Meta(ge=lo)]
        for name, (lo, hi) in _INT_RANGES.items()
    },
    "BOOL": bool,
    # Finite range of each float type: larger numbers would silently become infinities.
    "FP16": Annotated[float, msgspec.Meta(ge=-65504.0, le=65504.0)],
    "FP32": Annotated[float, msgspec.Meta(ge=-3.4028234663852886e38, le=3.4028234663852886e38)],
    "FP64": float,
    "BF16": Annotated[float, msgspec.Meta(ge=-3.3895313892515355e38, le=3.3895313892515355e38)],
    "BYTES": str,
}
# BYTES elements in msgpack may be bin or str (msgspec takes no `bytes | str` union:
# `pack_bytes` checks each element instead).
MSGPACK_BYTES_ELEMENT: Any = Any


def _typecodes() -> dict[str, str]:
    codes: dict[str, str] = {}
    for dt in DATATYPES.values():
        if dt.format and dt.format in "bBhHiIqQfd":
            if array(dt.format).itemsize != dt.itemsize:  # pragma: no cover - exotic ABIs
                raise ImportError(f"array typecode {dt.format!r} is not {dt.itemsize} bytes here")
            codes[dt.name] = dt.format
    return codes


MAX_RANK = 32  # dimensions a tensor may have (bounds the nested-list types built)
INT64_MAX = 2**63 - 1
TYPECODES = _typecodes()  # datatype -> array/memoryview typecode of the same size


def _element_error(field: str, datatype: str, values: Sequence[Any], exc: Exception) -> InvalidInput:
    """Find the offending element (error path only) and name it."""
    if datatype in ELEMENT_TYPES:
        try:
            msgspec.convert(values, list_type(datatype, 1))
        except msgspec.ValidationError as e:
            return decode_error(e, "json", field=field, document=list(values))
    for i, v in enumerate(values):
        try:
            _pack(datatype, [v])
        except (OverflowError, TypeError, ValueError, struct.error):
            return InvalidInput(f"{field}[{i}]: {v!r:.40} is out of range for {datatype}")
    return InvalidInput(f"{field}: cannot convert to {datatype}: {exc}")


def pack(datatype: str, values: list[Any], *, field: str) -> bytes | array[Any]:
    """Little-endian bytes of a flat list of elements already typed for `datatype`.

    BYTES elements are `str` (UTF-8 encoded) or `bytes`.
    """
    try:
        code = TYPECODES.get(datatype)
        if code is not None:
            return array(code, values)
        if datatype == "BYTES":
            return pack_bytes(values, field=field)
        return _pack(datatype, values)
    except (OverflowError, TypeError, ValueError, struct.error) as exc:
        raise _element_error(field, datatype, values, exc) from None


def _pack(datatype: str, values: list[Any]) -> bytes | array[Any]:
    code = TYPECODES.get(datatype)
    if code is not None:
        return array(code, values)
    if datatype == "BOOL":
        return bytes(values)
    if datatype == "FP16":
        return struct.pack(f"<{len(values)}e", *values)
    if datatype == "BF16":
        # bfloat16 is the upper half of a float32 (truncated, as a plain cast of the bits).
        wide = memoryview(array("f", values)).cast("B").cast("H")
        return wide[1::2].tobytes()
    raise ValueError(f"unknown datatype {datatype!r}")


def pack_bytes(values: Iterable[str | bytes], *, field: str) -> bytes:
    """The V2 BYTES layout of string (UTF-8 encoded) or bytes elements; InvalidInput names
    an element that is neither."""
    items: list[bytes] = []
    for i, v in enumerate(values):
        if isinstance(v, str):
            try:
                v = v.encode()
            except UnicodeEncodeError as exc:
                raise InvalidInput(f"{field}[{i}]: BYTES element is not valid Unicode: {exc.reason}") from None
        elif not isinstance(v, (bytes, bytearray, memoryview)):
            raise InvalidInput(f"{field}[{i}]: BYTES element must be a string, got {type(v).__name__}")
        items.append(bytes(v))
    return encode_bytes(items)


def check_empty_shape(shape: Sequence[int], itemsize: int, *, field: str) -> None:
    """InvalidInput unless the nonzero dimensions of a shape holding a 0 span at most
    2**63 - 1 bytes: an empty tensor, but one numpy (which checks the product of the other
    dimensions) cannot make. Shapes without a 0 are bounded by their data."""
    span = max(itemsize, 1)
    for d in shape:
        if d:
            span *= d
    if span > INT64_MAX:
        raise InvalidInput(
            f"{field}: {list(shape)} is too large: its nonzero dimensions times the element size "
            f"exceed {INT64_MAX} bytes"
        )


def count_bytes_elements(buf: Any, *, field: str) -> int:
    """Number of elements in a V2 BYTES buffer; InvalidInput naming where the layout breaks."""
    try:
        return len(bytes_ends(buf))
    except ValueError as exc:
        raise InvalidInput(f"{field}: {exc}") from None


def unpack(datatype: str, data: Any) -> list[Any]:
    """The elements of a tensor buffer as a flat list (BYTES: a list of `bytes`)."""
    mv = memoryview(data)
    if mv.ndim != 1 or mv.format != "B":
        mv = mv.cast("B")
    code = TYPECODES.get(datatype)
    if code is not None:
        values: list[Any] = mv.cast(code).tolist()  # type: ignore[call-overload]
        return values
    if datatype == "BOOL":
        return mv.cast("?").tolist()
    if datatype == "FP16":
        return list(struct.unpack(f"<{len(mv) // 2}e", mv))
    if datatype == "BF16":
        wide = bytearray(len(mv) * 2)
        memoryview(wide).cast("H")[1::2] = mv.cast("H")
        return memoryview(wide).cast("f").tolist()
    if datatype == "BYTES":
        return decode_bytes(mv)
    raise ValueError(f"unknown datatype {datatype!r}")


def flatten(nested: list[Any], shape: Sequence[int], *, field: str) -> list[Any]:
    """Flatten nested lists of depth len(shape), checking every level against `shape`."""
    if len(nested) != shape[0]:
        raise InvalidInput(
            f"{field}: nested data does not match shape {list(shape)}: "
            f"dimension 0 has {len(nested)} elements, expected {shape[0]}"
        )
    level = nested
    for k in range(1, len(shape)):
        if level:
            kinds = set(map(type, level))
            if kinds != {list}:
                got = ", ".join(sorted(t.__name__ for t in kinds))
                raise InvalidInput(
                    f"{field}: nested data does not match shape {list(shape)}: "
                    f"dimension {k - 1} holds {got} where lists of {shape[k]} were expected"
                )
            sizes = set(map(len, level))
            if sizes != {shape[k]}:
                got = ", ".join(map(str, sorted(sizes)))
                raise InvalidInput(
                    f"{field}: nested data does not match shape {list(shape)}: "
                    f"dimension {k} has {got} elements, expected {shape[k]}"
                )
        level = list(chain.from_iterable(level))
    return level


def nest(flat: list[Any], shape: Sequence[int]) -> Any:
    """Inverse of `flatten`: a flat list reshaped into nested lists (a scalar for rank 0)."""
    if not shape:
        return flat[0]
    out: list[Any] = flat
    for k in range(len(shape) - 1, 0, -1):
        d = shape[k]
        if d == 0:
            out = [[] for _ in range(element_count(tuple(shape[:k])))]
        else:
            out = [out[i : i + d] for i in range(0, len(out), d)]
    return out


def infer_shape(value: Any) -> list[int]:
    """Shape of nested lists, read along the first element of every level."""
    shape: list[int] = []
    while isinstance(value, list):
        shape.append(len(value))
        if not value:
            break
        value = value[0]
    return shape


@cache
def list_type(datatype: str, depth: int, *, msgpack: bool = False) -> Any:
    """The msgspec type of `depth`-times nested lists of `datatype` elements."""
    t: Any = MSGPACK_BYTES_ELEMENT if (msgpack and datatype == "BYTES") else ELEMENT_TYPES[datatype]
    for _ in range(depth):
        t = list[t]
    return t
