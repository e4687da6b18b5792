"""The one check of a request's inputs against the model's schema, for every codec.

A codec (V2 JSON, binary or msgpack; TF-Serving rows or columns) decodes each input's
name, datatype and shape, asks `Inputs.check` for its spec, and places its tensor at the
spec's position in `Inputs.tensors`; the
checks are the same whichever format the request came in, and only the field names in
the messages differ (`inputs[1].shape`, `instances[*].X.shape`, `inputs.X.shape`). An
input's (name, datatype, shape) that passed once for a model load is looked up, not
checked again: clients send the same inputs on every request.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

from ..errors import InvalidInput
from ..inference import InputSpec, ModelSchema
from ..runtime.datatypes import DATATYPES, element_count
from ..tensor import Tensor
from .arrays import MAX_RANK, check_empty_shape, count_bytes_elements

Field = Callable[[int, str], str]  # (index in the request, input name) -> the field a message names


def v2_field(index: int, name: str) -> str:
    return f"inputs[{index}]"


class Inputs:
    """One request's inputs, checked as a codec decodes them: each input's name, datatype and
    shape, no input twice, the same batch size in every input (1..max_batch_size when the
    model batches), and, once all are placed in `tensors` (at their spec's position), none
    missing (`done`)."""

    __slots__ = ("_first", "_index", "field", "group", "samples", "schema", "tensors")

    def __init__(self, schema: ModelSchema, *, field: Field = v2_field, group: str = "inputs") -> None:
        self.schema = schema
        self.field = field
        self.group = group  # what the missing-input message names
        self.tensors: list[Tensor | None] = [None] * len(schema.inputs)
        self._index = [-1] * len(schema.inputs)  # where in the request each input came
        self.samples = 0
        self._first = ""

    def check(self, index: int, name: str, datatype: str, shape: tuple[int, ...]) -> InputSpec:
        """The spec of input `name` as the request declares it; InvalidInput names the field."""
        schema = self.schema
        key = (name, datatype, shape)
        spec = schema.checked.get(key)
        if spec is None:
            spec = schema.checked.remember(key, _check(self.field(index, name), name, datatype, shape, schema))
        earlier = self._index[spec.position]
        if earlier >= 0:
            raise InvalidInput(f"{self.field(index, name)}.name: duplicate input {name!r} (also "
                               f"{self.field(earlier, name)})")
        self._index[spec.position] = index
        if schema.max_batch_size > 0 and shape:
            rows = shape[0]
            if not self._first:
                self._first, self.samples = name, rows
            elif rows != self.samples:
                raise InvalidInput(f"{self.field(index, name)}.shape[0]: batch size {rows} of input {name!r} differs "
                                   f"from {self.samples} of input {self._first!r}")
        return spec

    def done(self) -> tuple[list[Tensor], int]:
        """Every input in the schema's order, and the request's sample count (1 for a model
        that does not batch); InvalidInput names the inputs missing."""
        tensors = self.tensors
        if None in tensors:
            specs = self.schema.inputs
            missing = [s.name for s in specs if tensors[s.position] is None]
            raise InvalidInput(f"{self.group}: missing input{'s' if len(missing) > 1 else ''} "
                               f"{', '.join(map(repr, missing))} of model {self.schema.name!r} (expects "
                               f"{names(specs)})")
        return tensors, self.samples or 1  # type: ignore[return-value]


def _check(field: str, name: str, datatype: str, shape: tuple[int, ...], schema: ModelSchema) -> InputSpec:
    spec = schema.by_name.get(name)
    if spec is None:
        raise InvalidInput(f"{field}.name: model {schema.name!r} has no input {name!r}; expected one of "
                           f"{names(schema.inputs)}")
    if datatype != spec.datatype:
        if datatype not in DATATYPES:
            raise InvalidInput(f"{field}.datatype: expected one of {', '.join(DATATYPES)}, got {datatype!r}")
        raise InvalidInput(f"{field}.datatype: input {name!r} of model {schema.name!r} is {spec.datatype}, "
                           f"got {datatype}")
    want = spec.shape
    if len(shape) > MAX_RANK:
        raise InvalidInput(f"{field}.shape: at most {MAX_RANK} dimensions, got {len(shape)}")
    if len(shape) != len(want) or any(w != g and w != -1 for w, g in zip(want, shape)):
        _bad_shape(field, spec, schema, shape)
    if 0 in shape:
        check_empty_shape(shape, spec.itemsize, field=f"{field}.shape")
    max_batch_size = schema.max_batch_size
    if max_batch_size > 0 and shape and not 1 <= shape[0] <= max_batch_size:
        raise InvalidInput(f"{field}.shape[0]: batch size of input {name!r} must be 1..{max_batch_size}, "
                           f"got {shape[0]}")
    return spec


def _bad_shape(field: str, spec: InputSpec, schema: ModelSchema, shape: tuple[int, ...]) -> NoReturn:
    want = spec.shape
    if schema.max_batch_size:
        note = f" (-1: any size; the first is the batch, at most {schema.max_batch_size})"
    else:
        note = " (-1: any size)" if -1 in want else ""
    raise InvalidInput(f"{field}.shape: input {spec.name!r} of model {schema.name!r} expects {list(want)}{note}, "
                       f"got {list(shape)}")


def names(specs: tuple[InputSpec, ...]) -> str:
    return ", ".join(repr(s.name) for s in specs) or "none"


def check_data(field: str, datatype: str, shape: tuple[int, ...], data: Any, *, data_field: str = "") -> None:
    """InvalidInput unless `data` holds a `datatype` tensor of `shape`: its byte size, or
    for BYTES its element count (walking the length prefixes; a broken layout is named
    `data_field` when given)."""
    count = element_count(shape)
    itemsize = DATATYPES[datatype].itemsize
    if itemsize:
        nbytes = memoryview(data).nbytes
        if nbytes != count * itemsize:
            raise InvalidInput(f"{field}: {datatype} {list(shape)} needs {count * itemsize} bytes, got {nbytes}")
        return
    got = count_bytes_elements(data, field=data_field or field)
    if got != count:
        raise InvalidInput(f"{field}: BYTES {list(shape)} needs {count} elements, got {got}")
