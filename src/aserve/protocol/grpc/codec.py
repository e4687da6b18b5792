"""The gRPC infer messages as a codec of the data plane (`aserve.inference.Codec`).

A `ModelInferRequest` is read against the model's schema by the same validator as every
other format (`protocol.validate.Inputs`), with its fields named as the proto names them
(`inputs[1].shape`, `raw_input_contents[0]`). Inputs come either all in
`raw_input_contents` (one entry per input: little-endian elements, BYTES elements each
after a 4-byte length) or each in its `contents` field of its datatype. Request
parameters and output selection mean what they mean over HTTP (`timeout`,
`latency_budget_ms`, `binary_data_output`; an output's `binary_data`, `classification`).

Answers carry every output in `raw_output_contents` (as Triton answers), unless no output
asked for raw data (`binary_data: false` on each, or `binary_data_output: false` on the
request) and every output has a typed field (FP16 and BF16 have none).

A unary call's message comes as its bytes (`Wire`), read by `_native.grpc_split` without
decoding: a request whose bytes but its id and raw contents are those of one decoded before
for the model (clients repeat names, shapes and parameters; only the data changes), with raw
contents of the same sizes, gets that one's checked reading, and its inputs as views of the
message. Any other is decoded in full (and remembered when every input is in raw contents
and none is BYTES). Answers whose outputs all go in raw contents are written in C too.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping
from typing import Any, NamedTuple

from google.protobuf.message import DecodeError

from ... import _native
from ...errors import InvalidInput, ModelError
from ...inference import Answer, InferCall, InferRequest, InferResponse, Labels, ModelSchema, RequestedOutput
from ...runtime.datatypes import decode_bytes, element_count
from ...tensor import Tensor
from .. import arrays
from ..v2 import _OutputParameters as OutputParameters
from ..v2 import _WireOutput as WireOutput
from ..v2 import (
    classified,
    latency_budget_ms,
    output_view,
    requested_outputs,
    timeout_ms,
)
from ..validate import Inputs, check_data
from . import protos

# datatype -> its field of InferTensorContents (FP16 and BF16 have none)
CONTENTS = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}
CONTENTS_FIELDS = tuple(dict.fromkeys(CONTENTS.values()))


def parameter_value(parameter: Any) -> Any:
    """An InferParameter's value (None when none of its choices is set)."""
    which = parameter.WhichOneof("parameter_choice")
    return None if which is None else getattr(parameter, which)


def parameters_of(parameters: Mapping[str, Any]) -> dict[str, Any]:
    """A map<string, InferParameter> as a dict of plain values."""
    return {key: parameter_value(value) for key, value in parameters.items()}


class Wire(NamedTuple):
    """A unary call's ModelInferRequest as it came, and `_native.grpc_split`'s reading of it
    (model name, version, id, key, where each raw_input_contents entry lies), or None."""

    message: bytes
    split: tuple[str, str, str, bytes, list[tuple[int, int]]] | None

    @classmethod
    def of(cls, message: bytes) -> Wire:
        return cls(message, _native.grpc_split(message))

    def parsed(self) -> Any:
        """The message decoded in full; InvalidInput when it is not a ModelInferRequest."""
        try:
            return protos.ModelInferRequest.FromString(self.message)
        except DecodeError as e:
            raise InvalidInput(f"the request is not a valid inference.ModelInferRequest message (protobuf: {e})"
                               ) from None


class _Plan(NamedTuple):
    """A checked reading of a request whose inputs are all raw: every request with the same
    key and raw sizes gets the same (`ModelSchema.grpc_plans`)."""

    sizes: tuple[int, ...]  # each raw_input_contents entry's bytes
    inputs: tuple[tuple[int, str, tuple[int, ...]], ...]  # per entry: its input's place in the schema, datatype, shape
    request: InferRequest  # the rest, its inputs and id left to fill


def _from_plan(wire: Wire, schema: ModelSchema) -> InferRequest | None:
    split = wire.split
    if split is None:
        return None
    plan = schema.grpc_plans.get(split[3])
    ranges = split[4]
    if plan is None or len(ranges) != len(plan.sizes):
        return None
    view = memoryview(wire.message)
    tensors: list[Any] = [None] * len(plan.inputs)
    for (start, end), size, (position, datatype, shape) in zip(ranges, plan.sizes, plan.inputs, strict=True):
        if end - start != size:
            return None
        tensors[position] = Tensor(datatype, shape, view[start:end])
    r = plan.request
    return InferRequest(schema=schema, inputs=tensors, samples=r.samples, id=split[2] or None, outputs=r.outputs,
                        parameters=r.parameters, timeout_ms=r.timeout_ms, latency_budget_ms=r.latency_budget_ms,
                        binary_outputs=r.binary_outputs)


def decode_wire(wire: Wire, schema: ModelSchema) -> InferRequest:
    """The request in a unary call's message: a remembered reading where one applies, else
    decoded in full (and remembered when it can be)."""
    found = _from_plan(wire, schema)
    if found is not None:
        return found
    message = wire.parsed()
    request = decode_infer(message, schema)
    raw = message.raw_input_contents
    if wire.split is not None and raw and all(t.datatype != "BYTES" for t in request.inputs):
        positions = {spec.name: spec.position for spec in schema.inputs}
        schema.grpc_plans.remember(wire.split[3], _Plan(
            tuple(len(r) for r in raw),
            tuple((positions[item.name], item.datatype, tuple(item.shape)) for item in message.inputs),
            request))
    return request


def decode_infer(message: Any, schema: ModelSchema) -> InferRequest:
    """The request in a ModelInferRequest, checked against `schema`; InvalidInput names the field."""
    checked = Inputs(schema)
    raw = message.raw_input_contents
    inputs = message.inputs
    if raw and len(raw) != len(inputs):
        raise InvalidInput(f"raw_input_contents: expected one entry per input ({len(inputs)}), got {len(raw)}")
    for index, item in enumerate(inputs):
        field = f"inputs[{index}]"
        datatype = item.datatype
        shape = tuple(item.shape)
        if shape and min(shape) < 0:
            raise InvalidInput(f"{field}.shape: expected dimensions >= 0, got {list(shape)}")
        spec = checked.check(index, item.name, datatype, shape)
        if item.parameters:
            region = item.parameters.get("shared_memory_region")
            if region is not None:
                raise InvalidInput(f"{field}.parameters.shared_memory_region: shared memory is not supported")
        if raw:
            if item.HasField("contents"):
                raise InvalidInput(f"{field}.contents: not allowed with raw_input_contents (give every input's "
                                   f"data in one or the other)")
            data: Any = raw[index]
            check_data(f"raw_input_contents[{index}]", datatype, shape, data)
        else:
            data = _typed(item, datatype, shape, field)
        checked.tensors[spec.position] = Tensor(datatype, shape, data)
    tensors, samples = checked.done()
    parameters = parameters_of(message.parameters) if message.parameters else {}
    default_binary = parameters.get("binary_data_output", True)
    if not isinstance(default_binary, bool):
        raise InvalidInput(f"parameters.binary_data_output: expected a bool_param, got {default_binary!r}")
    return InferRequest(
        schema=schema, inputs=tensors, samples=samples, id=message.id or None,
        outputs=requested_outputs(_wire_outputs(message.outputs), schema, default_binary) if message.outputs else [],
        parameters=parameters,
        timeout_ms=timeout_ms(parameters.get("timeout")) if parameters else None,
        latency_budget_ms=latency_budget_ms(parameters.get("latency_budget_ms"), schema.max_latency_budget_ms)
        if parameters else None,
        binary_outputs=default_binary,
    )


def _typed(item: Any, datatype: str, shape: tuple[int, ...], field: str) -> Any:
    """An input's data from its typed `contents`: the one field of its datatype, the shape's element count."""
    name = CONTENTS.get(datatype)
    contents = item.contents
    if name is None:
        raise InvalidInput(f"{field}.contents: {datatype} has no typed contents field; send it in raw_input_contents")
    for other in CONTENTS_FIELDS:
        if other != name and len(getattr(contents, other)):
            raise InvalidInput(f"{field}.contents.{other}: input {item.name!r} is {datatype}: its elements go in "
                               f"contents.{name}")
    values = getattr(contents, name)
    count = element_count(shape)
    if len(values) != count:
        if not item.HasField("contents"):
            raise InvalidInput(f"{field}.contents: missing (give contents.{name}, or every input in "
                               f"raw_input_contents)")
        raise InvalidInput(f"{field}.contents.{name}: shape {list(shape)} needs {count} elements, got {len(values)}")
    code = arrays.TYPECODES.get(datatype)
    if code is not None and datatype in ("INT32", "INT64", "UINT32", "UINT64", "FP32", "FP64"):
        return array(code, values)  # the field's own width: every value fits
    return arrays.pack(datatype, list(values), field=f"{field}.contents.{name}")


def _wire_outputs(outputs: Any) -> list[WireOutput]:
    """The requested outputs as the V2 codec's checks read them."""
    wire = []
    for index, item in enumerate(outputs):
        params = parameters_of(item.parameters) if item.parameters else {}
        classification = params.get("classification", 0)
        if isinstance(classification, bool) or not isinstance(classification, int) or classification < 0:
            raise InvalidInput(f"outputs[{index}].parameters.classification: expected an int64_param >= 0, got "
                               f"{classification!r}")
        binary = params.get("binary_data")
        if binary is not None and not isinstance(binary, bool):
            raise InvalidInput(f"outputs[{index}].parameters.binary_data: expected a bool_param, got {binary!r}")
        region = params.get("shared_memory_region")
        wire.append(WireOutput(item.name, OutputParameters(binary, classification,
                                                            None if region is None else str(region))))
    return wire


def encode_infer(request: InferRequest, response: InferResponse, labels: Labels | None) -> Any:
    """The ModelInferResponse of `response` (outputs as `request` selected them): its bytes
    when every output is in raw contents, else the message."""
    outputs = response.outputs
    model_name = response.model_name
    if request.outputs:
        selected: list[RequestedOutput] = request.outputs
        if any(r.classification for r in selected):
            outputs = classified(outputs, request, labels)
    else:
        selected = [RequestedOutput(name, request.binary_outputs) for name in outputs]
    views = []
    for r in selected:
        tensor = outputs.get(r.name)
        if tensor is None:
            raise ModelError(f"model {model_name!r} returned no output {r.name!r} (it returned {list(outputs)})")
        views.append((r.name, tensor, output_view(model_name, r.name, tensor)))
    raw = any(r.binary for r in selected) or any(t.datatype not in CONTENTS for _, t, _ in views)
    if raw:  # the message written in C
        return _native.grpc_response(model_name, response.model_version, response.id or "",
                                     [(name, t.datatype, tuple(t.shape), view) for name, t, view in views])
    message = protos.ModelInferResponse(model_name=model_name, model_version=response.model_version,
                                        id=response.id or "")
    for name, tensor, view in views:
        out = message.outputs.add(name=name, datatype=tensor.datatype, shape=tensor.shape)
        _fill(out.contents, tensor.datatype, view)
    return message


def _fill(contents: Any, datatype: str, view: memoryview) -> None:
    """An output's elements into its typed contents field."""
    field = getattr(contents, CONTENTS[datatype])
    if datatype == "BYTES":
        field.extend(decode_bytes(view))
    elif datatype == "BOOL":
        field.extend(view.cast("?").tolist())
    else:
        field.extend(view.cast(arrays.TYPECODES[datatype]).tolist())  # type: ignore[call-overload]


class GrpcCodec:
    """ModelInferRequest in (a `Wire`, or the message decoded), ModelInferResponse out: the
    Answer's one chunk is the message, or its bytes."""

    budgets = True  # parameters["latency_budget_ms"]

    def decode(self, call: InferCall, schema: ModelSchema, /) -> InferRequest:
        body = call.body
        return decode_wire(body, schema) if isinstance(body, Wire) else decode_infer(body, schema)

    def encode(self, call: InferCall, request: InferRequest, response: InferResponse, labels: Labels, /) -> Answer:
        return Answer([encode_infer(request, response, labels if request.outputs else None)], {})

    def protocol(self, call: InferCall, /) -> str:
        return "grpc"


GRPC = GrpcCodec()
