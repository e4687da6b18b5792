"""Triton's classification extension: an output sent as its top N classes.

A requested output with `parameters.classification: N` (tritonclient's
`InferRequestedOutput(name, class_count=N)`) is answered as a BYTES tensor of
"value:index" strings, or "value:index:label" when the model has labels for that
output, highest value first (ties: lower index first). As Triton does: for a model that
batches, each sample's classes are ranked separately and the shape is
[batch, min(N, classes)]; otherwise the whole tensor is ranked and the shape is
[min(N, elements)]. Values print as C++'s `std::to_string` prints them (`%f` for
floating point, whole numbers as they are).

Labels (`[parameters.classification_labels]` in the model's config.toml: output name ->
a file of one label per line, relative to the version's folder) are read by the server
(`aserve.server.handlers`) and passed in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..errors import InvalidInput
from ..runtime.datatypes import DATATYPES
from ..tensor import Tensor
from . import arrays

FLOATING = frozenset({"FP16", "FP32", "FP64", "BF16"})


def top_classes(tensor: Tensor, count: int, *, batched: bool, labels: Sequence[str] | None = None,
                name: str = "") -> Tensor:
    """The top `count` classes of `tensor` as a BYTES tensor of "value:index[:label]"."""
    datatype = tensor.datatype
    dt = DATATYPES.get(datatype)
    if dt is None or dt.itemsize == 0 or datatype == "BOOL":
        raise InvalidInput(f"outputs: classification of output {name!r} needs a numeric output, it is {datatype}")
    values = arrays.unpack(datatype, tensor.data)
    shape = tensor.shape
    rows = shape[0] if batched and shape else 1
    per_row = len(values) // rows if rows else 0
    k = min(count, per_row)
    text = _float_text if datatype in FLOATING else str
    out: list[str] = []
    for r in range(rows):
        row = values[r * per_row:(r + 1) * per_row]
        order = sorted(range(per_row), key=lambda i: (*_rank(row[i]), i))[:k]
        for i in order:
            entry = f"{text(row[i])}:{i}"
            if labels is not None and i < len(labels) and labels[i]:
                entry += f":{labels[i]}"
            out.append(entry)
    new_shape = (rows, k) if batched and shape else (k,)
    return Tensor("BYTES", new_shape, arrays.pack_bytes(out, field=f"outputs.{name}"))


def _rank(value: float) -> tuple[bool, float]:
    """Sort key: higher values first, NaN last."""
    nan = math.isnan(value)
    return nan, 0.0 if nan else -value


def _float_text(value: float) -> str:
    if math.isnan(value):
        return "nan" if math.copysign(1.0, value) > 0 else "-nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return f"{value:f}"
