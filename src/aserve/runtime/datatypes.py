"""The Open Inference Protocol (KServe V2) datatypes, as seen inside an interpreter.

One table maps each V2 datatype to its element size, its `struct`/buffer format
character and the torch and numpy dtype names. Host and interpreter sides both read
it; it imports nothing but the standard library so it loads in any interpreter.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple


class DataType(NamedTuple):
    name: str
    itemsize: int  # bytes per element; 0 for BYTES (variable length)
    format: str  # buffer-protocol format character ("" where Python has none)
    torch: str  # attribute of the torch module ("" where torch has none)
    numpy: str  # numpy dtype string ("" where numpy has none)


DATATYPES: dict[str, DataType] = {
    d.name: d
    for d in (
        DataType("BOOL", 1, "?", "bool", "bool"),
        DataType("UINT8", 1, "B", "uint8", "uint8"),
        DataType("UINT16", 2, "H", "uint16", "uint16"),
        DataType("UINT32", 4, "I", "uint32", "uint32"),
        DataType("UINT64", 8, "Q", "uint64", "uint64"),
        DataType("INT8", 1, "b", "int8", "int8"),
        DataType("INT16", 2, "h", "int16", "int16"),
        DataType("INT32", 4, "i", "int32", "int32"),
        DataType("INT64", 8, "q", "int64", "int64"),
        DataType("FP16", 2, "e", "float16", "float16"),
        DataType("FP32", 4, "f", "float32", "float32"),
        DataType("FP64", 8, "d", "float64", "float64"),
        DataType("BF16", 2, "", "bfloat16", ""),
        DataType("BYTES", 0, "", "", "object"),
    )
}

# Reverse maps used when a model returns a tensor whose datatype is not declared.
BY_TORCH: dict[str, str] = {d.torch: d.name for d in DATATYPES.values() if d.torch}
BY_NUMPY: dict[str, str] = {d.numpy: d.name for d in DATATYPES.values() if d.numpy}
BY_FORMAT: dict[str, str] = {d.format: d.name for d in DATATYPES.values() if d.format}
# Buffer formats that name the same layout with another letter.
BY_FORMAT.update({"l": "INT64", "L": "UINT64", "c": "UINT8"})


def lookup(name: str) -> DataType:
    """The datatype called `name`, or ValueError listing the valid names."""
    try:
        return DATATYPES[name]
    except KeyError:
        raise ValueError(
            f"unknown datatype {name!r}; expected one of {', '.join(DATATYPES)}"
        ) from None


def element_count(shape: tuple[int, ...] | list[int]) -> int:
    """The number of elements of a tensor of `shape` (1 for a scalar)."""
    return math.prod(shape)


# ---- BYTES: the V2 binary layout, each element a 4-byte little-endian length and its bytes ----


def encode_bytes(items: list[bytes]) -> bytes:
    """The V2 binary BYTES layout of `items`."""
    parts = []
    for item in items:
        parts.append(len(item).to_bytes(4, "little"))
        parts.append(item)
    return b"".join(parts)


def bytes_ends(buf: Any) -> list[int]:
    """Where each element of a V2 BYTES buffer ends (byte offsets); ValueError naming the
    element and the byte where the layout breaks."""
    mv = memoryview(buf).cast("B")
    ends: list[int] = []
    pos, end = 0, len(mv)
    while pos < end:
        if pos + 4 > end:
            raise ValueError(f"BYTES element {len(ends)}: 4-byte length prefix truncated at byte {pos} of {end}")
        size = int.from_bytes(mv[pos : pos + 4], "little")
        pos += 4 + size
        if pos > end:
            raise ValueError(f"BYTES element {len(ends)}: length {size} runs past the end of the data ({end} bytes)")
        ends.append(pos)
    return ends


def decode_bytes(buf: Any, count: int | None = None) -> list[bytes]:
    """The elements of a V2 BYTES buffer (ValueError if it is malformed, or does not hold
    `count` elements)."""
    mv = memoryview(buf).cast("B")
    out: list[bytes] = []
    start = 0
    for end in bytes_ends(mv):
        out.append(bytes(mv[start + 4 : end]))
        start = end
    if count is not None and len(out) != count:
        raise ValueError(f"BYTES tensor holds {len(out)} elements, shape says {count}")
    return out
