"""TensorFlow-Serving REST predict messages (`POST /v1/models/{m}:predict`).

Row format: `{"instances": [...]}`, one sample per instance (the model's shapes
without the batch dimension): a list of objects (input name -> value), or a list of
values when the model has one input. Columnar format: `{"inputs": {...}}` (or a
single value for a one-input model), each tensor with its batch dimension. BYTES
elements are strings, or `{"b64": "..."}` for binary data. `signature_name` is ignored.
"""

from __future__ import annotations

import base64
from typing import Any

import msgspec

from ..errors import InvalidInput, ModelError
from ..inference import Answer, InferCall, InferRequest, InferResponse, Labels, ModelSchema
from ..tensor import Tensor
from . import arrays
from .formats import DECODE_ERRORS, decode_error
from .validate import Inputs

ROW_FIELD = "instances[*].{name}"
COLUMN_FIELD = "inputs.{name}"


class _WirePredict(msgspec.Struct):
    signature_name: str | None = None
    instances: list[Any] | None = None
    inputs: Any = msgspec.UNSET


_DECODER = msgspec.json.Decoder(_WirePredict)
_ENCODER = msgspec.json.Encoder()


def decode_predict(body: bytes | bytearray | memoryview, /, *, schema: ModelSchema) -> InferRequest:
    """Decode and validate a predict body against a model's schema; raises InvalidInput
    naming the field. The request's `columnar` says which format it came in."""
    try:
        wire = _DECODER.decode(body)
    except DECODE_ERRORS as exc:
        raise decode_error(exc, "json") from None
    rows = wire.instances is not None
    columnar = wire.inputs is not msgspec.UNSET
    if rows == columnar:
        raise InvalidInput(
            'request body: expected one of "instances" (row format) or "inputs" (columnar format), '
            f"got {'both' if rows else 'neither'}"
        )
    max_batch_size = schema.max_batch_size
    if wire.instances is not None:
        values, field = _rows(wire.instances, schema, max_batch_size), ROW_FIELD
    else:
        values, field = _columns(wire.inputs, schema), COLUMN_FIELD
    checked = Inputs(schema, field=lambda index, name: field.format(name=name), group="instances" if rows else "inputs")
    specs = schema.by_name
    for index, (name, value) in enumerate(values.items()):
        where = field.format(name=name)
        try:
            tensor = _tensor(value, specs[name].datatype, where)
        except InvalidInput as exc:
            if rows:
                raise _per_instance(exc, where, name, batched=max_batch_size > 0) from None
            raise
        # the tensor's data fits its shape: both come from the same nested lists (`_tensor`)
        spec = checked.check(index, name, tensor.datatype, tensor.shape)
        checked.tensors[spec.position] = tensor
    inputs, samples = checked.done()
    return InferRequest(schema=schema, inputs=inputs, samples=samples, columnar=columnar)


def _per_instance(exc: InvalidInput, where: str, name: str, *, batched: bool) -> InvalidInput:
    """Name the instance an element error is in: `instances[*].X[3][1]` -> `instances[3].X[1]`."""
    text = str(exc)
    if not batched:
        return InvalidInput(text.replace(where, f"instances[0].{name}", 1))
    head = where + "["
    if text.startswith(head):
        index, _, rest = text[len(head) :].partition("]")
        return InvalidInput(f"instances[{index}].{name}{rest}")
    return exc


def _names(model: ModelSchema) -> list[str]:
    return [s.name for s in model.inputs]


def _check_keys(where: str, got: dict[str, Any], names: list[str], model: ModelSchema) -> None:
    missing = [n for n in names if n not in got]
    extra = [n for n in got if n not in names]
    if missing or extra:
        problems = []
        if missing:
            problems.append(f"missing {', '.join(map(repr, missing))}")
        if extra:
            problems.append(f"unknown {', '.join(map(repr, extra))}")
        raise InvalidInput(
            f"{where}: model {model.name!r} expects inputs {', '.join(map(repr, names))}; "
            f"{' and '.join(problems)}"
        )


def _rows(instances: list[Any], model: ModelSchema, max_batch_size: int) -> dict[str, Any]:
    names = _names(model)
    if not instances:
        raise InvalidInput("instances: expected at least one instance, got []")
    if len(names) == 1 and not (isinstance(instances[0], dict) and instances[0].keys() == {names[0]}):
        columns: dict[str, Any] = {names[0]: instances}
    else:
        for i, inst in enumerate(instances):
            if not isinstance(inst, dict):
                raise InvalidInput(
                    f"instances[{i}]: expected an object of input name -> value "
                    f"(model {model.name!r} has {len(names)} inputs), got {type(inst).__name__}"
                )
            _check_keys(f"instances[{i}]", inst, names, model)
        columns = {name: [inst[name] for inst in instances] for name in names}
    if max_batch_size == 0:
        if len(instances) != 1:
            raise InvalidInput(
                f"instances: model {model.name!r} does not batch: expected 1 instance, got {len(instances)}"
            )
        return {name: column[0] for name, column in columns.items()}
    return columns


def _columns(value: Any, model: ModelSchema) -> dict[str, Any]:
    names = _names(model)
    if isinstance(value, dict) and not (len(names) == 1 and value.keys() == {"b64"}):
        _check_keys("inputs", value, names, model)
        return {name: value[name] for name in names}
    if len(names) != 1:
        raise InvalidInput(
            f"inputs: model {model.name!r} has {len(names)} inputs: expected an object of input "
            f"name -> value, got {type(value).__name__}"
        )
    return {names[0]: value}


def _tensor(value: Any, datatype: str, field: str) -> Tensor:
    shape = arrays.infer_shape(value)
    if len(shape) > arrays.MAX_RANK:
        raise InvalidInput(f"{field}: at most {arrays.MAX_RANK} dimensions, got {len(shape)}")
    if datatype == "BYTES":
        flat = arrays.flatten(value, shape, field=field) if shape else [value]
        data: Any = arrays.pack_bytes(_bytes_elements(flat, field), field=field)
    else:
        # Type the nested value first, so that errors name the element's nested position.
        try:
            typed = msgspec.convert(value, arrays.list_type(datatype, len(shape)))
        except msgspec.ValidationError as exc:
            raise decode_error(exc, "json", field=field, document=value) from None
        if len(shape) > 1:
            flat = arrays.flatten(typed, shape, field=field)
        else:
            flat = typed if shape else [typed]
        data = arrays.pack(datatype, flat, field=field)
    return Tensor(datatype, tuple(shape), data)


def _bytes_elements(flat: list[Any], field: str) -> list[str | bytes]:
    out: list[str | bytes] = []
    for i, v in enumerate(flat):
        if isinstance(v, str):
            out.append(v)
        elif isinstance(v, dict) and v.keys() == {"b64"} and isinstance(v["b64"], str):
            try:
                out.append(base64.b64decode(v["b64"], validate=True))
            except ValueError as exc:  # binascii.Error, or a non-ASCII string
                raise InvalidInput(f"{field}[{i}].b64: invalid base64: {exc}") from None
        else:
            raise InvalidInput(
                f'{field}[{i}]: BYTES element must be a string or {{"b64": "..."}}, got {v!r:.60}'
            )
    return out


def encode_predict(outputs: dict[str, Tensor], /, *, columnar: bool, batched: bool = True) -> bytes:
    """`{"predictions": [...]}` (rows) or `{"outputs": ...}` (columnar) as JSON bytes.

    Rows split each output along its batch dimension: a list of values when there is
    one output, else a list of objects. `batched=False` (a model that does not batch)
    answers its outputs as a single row.
    """
    values = {name: arrays.nest(_json_values(t), t.shape) for name, t in outputs.items()}
    only = next(iter(values.values())) if len(values) == 1 else None
    if columnar:
        return _ENCODER.encode({"outputs": only if len(values) == 1 else values})
    if not batched:
        return _ENCODER.encode({"predictions": [only if len(values) == 1 else values]})
    sizes = {name: (t.shape[0] if t.shape else None) for name, t in outputs.items()}
    for name, size in sizes.items():
        if size is None:
            raise ModelError(f"output {name!r} is a scalar: it has no batch dimension to split into rows")
    if len(set(sizes.values())) > 1:
        raise ModelError(f"outputs differ in batch size: {sizes}")
    if len(values) == 1:
        return _ENCODER.encode({"predictions": only})
    n = next(iter(sizes.values())) or 0
    rows = [{name: v[i] for name, v in values.items()} for i in range(n)]
    return _ENCODER.encode({"predictions": rows})


def _json_values(tensor: Tensor) -> list[Any]:
    values = arrays.unpack(tensor.datatype, tensor.data)
    if tensor.datatype != "BYTES":
        return values
    out: list[Any] = []
    for v in values:
        try:
            out.append(v.decode())
        except UnicodeDecodeError:
            out.append({"b64": base64.b64encode(v).decode()})
    return out


class PredictCodec:
    """TF-Serving's predict: rows or columns in, answered in the same format."""

    budgets = False  # no parameters: the model's budget

    def decode(self, call: InferCall, schema: ModelSchema, /) -> InferRequest:
        return decode_predict(call.body, schema=schema)

    def encode(self, call: InferCall, request: InferRequest, response: InferResponse, labels: Labels, /) -> Answer:
        body = encode_predict(response.outputs, columnar=request.columnar, batched=request.schema.max_batch_size > 0)
        return Answer([body], {"Content-Type": "application/json"})

    def protocol(self, call: InferCall, /) -> str:
        return "tfserving"


PREDICT = PredictCodec()
