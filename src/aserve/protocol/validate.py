"""Checks a request's tensors against the model's declared inputs."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, NoReturn

from ..errors import InvalidInput
from ..runtime.datatypes import DATATYPES, element_count
from ..tensor import Tensor
from .arrays import count_bytes_elements

if TYPE_CHECKING:
    from ..inference import InputSpec, ModelSchema

# How a message names the tensor at position `index` called `name`.
V2_FIELD = "inputs[{index}]"
_GROUP = re.compile(r"[A-Za-z_]*")


def validate_inputs(
    inputs: Mapping[str, Tensor],
    model: ModelSchema,
    *,
    max_batch_size: int,
    field: str = V2_FIELD,
) -> int:
    """Check names, datatypes, shapes and byte sizes; return the batch's sample count.

    When the model batches (max_batch_size > 0) the declared shapes start with the batch
    dimension: every input must have the same leading size, 1..max_batch_size. Other -1
    dimensions take any size. `field` formats the name of each input in messages, from
    its `index` in the request and its `name`.
    """
    specs = model.inputs
    samples = 1
    first: str | None = None
    for index, (name, tensor) in enumerate(inputs.items()):
        for spec in specs:
            if spec.name == name:
                break
        else:
            raise InvalidInput(
                f"{_where(field, index, name)}.name: model {model.name!r} has no input {name!r}; "
                f"expected one of {_names(specs)}"
            )
        if tensor.datatype != spec.datatype:
            raise InvalidInput(
                f"{_where(field, index, name)}.datatype: input {name!r} of model {model.name!r} is "
                f"{spec.datatype}, got {tensor.datatype}"
            )
        shape, want = tensor.shape, spec.shape
        if len(shape) != len(want):
            _bad_shape(field, index, name, model, want, shape, max_batch_size)
        for w, g in zip(want, shape):
            if w != g and w != -1:
                _bad_shape(field, index, name, model, want, shape, max_batch_size)
        if max_batch_size > 0 and shape:
            batch_size = shape[0]
            if not 1 <= batch_size <= max_batch_size:
                raise InvalidInput(
                    f"{_where(field, index, name)}.shape[0]: batch size of input {name!r} must be "
                    f"1..{max_batch_size}, got {batch_size}"
                )
            if first is None:
                first, samples = name, batch_size
            elif batch_size != samples:
                raise InvalidInput(
                    f"{_where(field, index, name)}.shape[0]: batch size {batch_size} of input {name!r} "
                    f"differs from {samples} of input {first!r}"
                )
        _check_size(field, index, name, tensor)
    if len(inputs) != len(specs):
        missing = [s.name for s in specs if s.name not in inputs]
        raise InvalidInput(
            f"{_group(field)}: missing input{'s' if len(missing) > 1 else ''} "
            f"{', '.join(map(repr, missing))} of model {model.name!r} (expects {_names(specs)})"
        )
    return samples


def _where(field: str, index: int, name: str) -> str:
    return field.format(index=index, name=name)


def _group(field: str) -> str:
    m = _GROUP.match(field)
    return m[0] if m else field


def _names(specs: Sequence[InputSpec]) -> str:
    return ", ".join(repr(s.name) for s in specs) or "none"


def _bad_shape(
    field: str,
    index: int,
    name: str,
    model: ModelSchema,
    want: tuple[int, ...],
    shape: tuple[int, ...],
    max_batch_size: int,
) -> NoReturn:
    if max_batch_size:
        note = f" (-1: any size; the first is the batch, at most {max_batch_size})"
    else:
        note = " (-1: any size)" if -1 in want else ""
    raise InvalidInput(
        f"{_where(field, index, name)}.shape: input {name!r} of model {model.name!r} expects "
        f"{list(want)}{note}, got {list(shape)}"
    )


def _check_size(field: str, index: int, name: str, tensor: Tensor) -> None:
    itemsize = DATATYPES[tensor.datatype].itemsize
    count = element_count(tensor.shape)
    if itemsize:
        nbytes = memoryview(tensor.data).nbytes
        if nbytes != count * itemsize:
            raise InvalidInput(
                f"{_where(field, index, name)}: {tensor.datatype} {list(tensor.shape)} needs "
                f"{count * itemsize} bytes, got {nbytes}"
            )
    else:
        where = _where(field, index, name)
        got = count_bytes_elements(tensor.data, field=where)
        if got != count:
            raise InvalidInput(f"{where}: BYTES {list(tensor.shape)} needs {count} elements, got {got}")
