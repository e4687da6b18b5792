"""The host's view of a tensor: datatype, shape and a buffer over its bytes."""

from __future__ import annotations

from typing import Any

import msgspec

from .runtime.datatypes import DATATYPES, element_count


class Tensor(msgspec.Struct, gc=False):
    """A V2 tensor on the host: bytes in C order, little-endian, never a Python list.

    `Tensor(datatype, shape, data)`: `shape` is a tuple of ints; `data` is any object
    with the buffer protocol (bytes, bytearray, memoryview, a buffer returned by an
    interpreter). BYTES tensors hold the V2 binary layout: each element as a 4-byte
    little-endian length followed by its bytes. A msgspec Struct: several are made per
    request, and a Struct costs a fraction of a Python `__init__`.
    """

    datatype: str
    shape: tuple[int, ...]
    data: Any

    @property
    def nbytes(self) -> int:
        return memoryview(self.data).nbytes

    def check(self, name: str = "tensor") -> Tensor:
        """Raise ValueError unless the byte size matches datatype and shape."""
        dt = DATATYPES.get(self.datatype)
        if dt is None:
            raise ValueError(f"{name}: unknown datatype {self.datatype!r}")
        if dt.itemsize:
            want = element_count(self.shape) * dt.itemsize
            if self.nbytes != want:
                raise ValueError(
                    f"{name}: {self.datatype} {list(self.shape)} needs {want} bytes, got {self.nbytes}"
                )
        return self

    def view(self) -> memoryview:
        """The tensor's bytes as a flat unsigned-byte memoryview (no copy)."""
        return memoryview(self.data).cast("B")

    def __repr__(self) -> str:
        return f"Tensor({self.datatype!r}, {list(self.shape)}, <{self.nbytes} bytes>)"
