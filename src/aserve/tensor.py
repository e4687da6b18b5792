"""The host's view of a tensor (datatype, shape and a buffer over its bytes), and batches of them.

A batch's inputs are its requests' tensors concatenated along the first (batch)
dimension, with one copy; its outputs go back to the requests as zero-copy slices.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from ._native import concat_rows, split_rows
from .errors import ModelError
from .runtime.datatypes import DATATYPES, bytes_ends, element_count


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


def same_sample_shapes(head: Sequence[Tensor], other: Sequence[Tensor]) -> bool:
    """Whether two requests' inputs can share a batch: the same per-sample shapes."""
    for t, o in zip(head, other):
        if o.shape[1:] != t.shape[1:]:
            return False
    return True


def concat_inputs(requests: Sequence[Sequence[Tensor]], samples: int) -> list[Tensor]:
    """Each input of `requests` concatenated along the batch dimension: one copy into a fresh bytearray.

    BYTES inputs concatenate the same way: their length-prefixed layout has no header."""
    return [Tensor(first.datatype, (samples, *first.shape[1:]), concat_rows([r[i].data for r in requests]))
            for i, first in enumerate(requests[0])]


def wrong_rows(model: str, name: str, shape: tuple[int, ...], total: int) -> ModelError:
    """The error of an output whose first dimension is not the batch's samples."""
    return ModelError(
        f"model {model!r}: output {name!r} has shape {list(shape)}, but the batch holds {total} "
        f"samples: its first dimension must be {total}"
    )


def split_outputs(outputs: Mapping[str, Tensor], samples: Sequence[int], model: str) -> list[dict[str, Tensor]]:
    """Per-request outputs: zero-copy slices of each output along the batch dimension."""
    total = sum(samples)
    rows = list(samples)
    results: list[dict[str, Tensor]] = [{} for _ in rows]
    for name, t in outputs.items():
        shape = t.shape
        if not shape or shape[0] != total:
            raise wrong_rows(model, name, shape, total)
        view = t.view()
        rest = shape[1:]
        if t.datatype != "BYTES":
            split_rows(results, name, Tensor, t.datatype, rest, view, rows, view.nbytes // total if total else 0)
            continue
        per = element_count(rest)
        try:
            ends = bytes_ends(view)
        except ValueError as exc:
            raise ModelError(f"model {model!r}: BYTES output {name!r}: {exc}") from None
        if len(ends) != total * per:
            raise ModelError(f"model {model!r}: BYTES output {name!r} holds {len(ends)} elements, its shape "
                             f"{list(shape)} says {total * per}")
        start = k = 0
        for i, s in enumerate(rows):
            k += s * per
            end = ends[k - 1] if k else 0
            results[i][name] = Tensor("BYTES", (s, *rest), view[start:end])
            start = end
    return results
