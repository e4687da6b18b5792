"""The Open Inference Protocol (KServe V2) infer messages, as Triton and MLServer speak them.

Requests and responses are JSON or msgpack; JSON requests may carry tensors after the
JSON header (Triton's binary tensor extension, `Inference-Header-Content-Length`).
Binary tensors are sliced out of the body without a copy; JSON/msgpack lists become
little-endian buffers in C (see `arrays`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Annotated, Any, NamedTuple

import msgspec

from .. import _native
from ..errors import InvalidInput, ModelError
from ..inference import Answer, InferCall, InferRequest, InferResponse, Labels, ModelSchema, RequestedOutput
from ..runtime.datatypes import DATATYPES, decode_bytes, element_count
from ..tensor import Tensor
from . import arrays
from .classification import top_classes
from .formats import (
    DECODE_ERRORS,
    OCTET_STREAM,
    Format,
    decode_error,
    negotiate,
    request_format,
)
from .formats import content_type as _content_type
from .validate import Inputs, check_data

NonNegative = Annotated[int, msgspec.Meta(ge=0)]
Dimension = Annotated[int, msgspec.Meta(ge=0, le=arrays.INT64_MAX)]  # the pool and models count in int64
HEADER_LENGTH = "Inference-Header-Content-Length"


# ---- the request as it arrives ----


class _InputParameters(msgspec.Struct):
    binary_data_size: NonNegative | None = None
    shared_memory_region: str | None = None


class _WireInput(msgspec.Struct):
    name: str
    shape: list[Dimension]
    datatype: str
    parameters: _InputParameters | None = None
    data: msgspec.Raw = msgspec.Raw()  # decoded once the datatype is known


class _OutputParameters(msgspec.Struct):
    binary_data: bool | None = None
    classification: NonNegative = 0
    shared_memory_region: str | None = None


class _WireOutput(msgspec.Struct):
    name: str
    parameters: _OutputParameters | None = None


class _WireRequest(msgspec.Struct):
    inputs: list[_WireInput]
    id: str | None = None
    outputs: list[_WireOutput] | None = None
    parameters: dict[str, Any] | None = None


_Decoder = msgspec.json.Decoder[Any] | msgspec.msgpack.Decoder[Any]
_REQUEST_DECODERS: dict[str, _Decoder] = {
    "json": msgspec.json.Decoder(_WireRequest),
    "msgpack": msgspec.msgpack.Decoder(_WireRequest),
}


# ---- the decoded request ----


class _Slice(NamedTuple):
    """Where a binary request's input lies in the binary data after its JSON header."""

    datatype: str
    shape: tuple[int, ...]
    start: int
    end: int


class _Plan(NamedTuple):
    """What a binary request's JSON header decodes to beyond its inputs, checked: every
    request whose header has the same bytes gets the same (`_native.V2Binary` keeps it
    with the header and where each input lies)."""

    samples: int
    outputs: list[RequestedOutput]
    parameters: dict[str, Any]
    timeout_ms: float | None
    latency_budget_ms: float | None
    binary_outputs: bool


MAX_PLAN_HEADER = 4096  # bytes: longer headers are decoded every time


def decode_infer(
    body: bytes | bytearray | memoryview,
    /,
    *,
    content_type: str | None,
    header_length: int | None,
    schema: ModelSchema,
) -> InferRequest:
    """Decode a V2 infer request body against a model's schema, checking each input once
    as it is decoded (`validate.Inputs`); raises InvalidInput naming the field.

    The request's inputs come out in the schema's order and its sample count is the
    inputs' common batch dimension (1 if the model does not batch). A binary request
    (every tensor after the JSON header) whose header has the bytes of one decoded
    before for this model is not decoded again: its checked plan is reused, and only
    the binary data's length is checked (clients repeat their headers: same names,
    shapes and sizes on every request)."""
    fmt = request_format(content_type)
    if fmt == "json" and header_length is None:
        plan = schema.json_plan
        if plan is False:
            plan = schema.json_plan = _json_plan(schema)
        if plan is not None:
            fast = plan.decode(body)
            if fast is not None:  # inputs, an id and binary_data_output only, valid as they are
                inputs, samples, id_, binary = fast
                return InferRequest(schema=schema, inputs=inputs, samples=samples, id=id_,
                                    parameters={} if binary is None else {"binary_data_output": binary},
                                    binary_outputs=bool(binary))
    reusable = header_length is not None and fmt == "json"
    if reusable:
        plans = schema.plans
        if plans is None:
            plans = schema.plans = _native.V2Binary(Tensor)
        found = plans.find(body, header_length)
        if found is not None:
            inputs, plan = found
            return InferRequest(
                schema=schema, inputs=inputs, samples=plan.samples, outputs=plan.outputs,
                parameters=plan.parameters, timeout_ms=plan.timeout_ms, latency_budget_ms=plan.latency_budget_ms,
                binary_outputs=plan.binary_outputs,
            )
    header, blobs = _split(body, header_length)
    request, slices = _decode(header, blobs, fmt, header_length, schema)
    # a writable header may change under the codec's feet: only a read-only one is remembered
    if reusable and slices is not None and request.id is None and header.readonly and len(header) <= MAX_PLAN_HEADER:
        schema.plans.remember(bytes(header), len(blobs), list(slices), _Plan(
            request.samples, request.outputs, request.parameters, request.timeout_ms, request.latency_budget_ms,
            request.binary_outputs,
        ))
    return request


def _json_plan(schema: ModelSchema) -> Any:
    """The decoder in C of the model's common V2 JSON requests (`_native.V2Json`: inputs, an id
    and parameters of `binary_data_output` alone, each input's data a flat or nested list of
    numbers or booleans), or None where an input's datatype is not one it decodes. It answers
    None for any other body, which `_decode` then reads and judges."""
    try:
        return _native.V2Json(Tensor, schema.max_batch_size, [(s.name, s.datatype, s.shape) for s in schema.inputs])
    except ValueError:
        return None


def _decode(header: memoryview, blobs: memoryview, fmt: Format, header_length: int | None,
            schema: ModelSchema) -> tuple[InferRequest, tuple[_Slice, ...] | None]:
    """The request, and where each input lies in the binary data when every input is there
    (and none is BYTES, whose element counts depend on the data): a plan to reuse."""
    wire = _decode_header(header, fmt, header_length)
    checked = Inputs(schema)
    slices: list[Any] | None = [None] * len(schema.inputs) if header_length is not None and fmt == "json" else None
    offset = 0
    for index, item in enumerate(wire.inputs):
        datatype = item.datatype
        shape = tuple(item.shape)
        spec = checked.check(index, item.name, datatype, shape)
        params = item.parameters
        if params is not None and params.shared_memory_region is not None:
            raise InvalidInput(f"inputs[{index}].parameters.shared_memory_region: shared memory is not supported")
        if params is not None and params.binary_data_size is not None:
            if header_length is None:
                raise InvalidInput(
                    f"inputs[{index}].parameters.binary_data_size: binary data needs the {HEADER_LENGTH} header"
                )
            if item.data:
                raise InvalidInput(f"inputs[{index}]: has both data and parameters.binary_data_size")
            size = params.binary_data_size
            data: Any = _binary_data(datatype, shape, size, blobs, offset, index)
            if slices is not None:
                slices[spec.position] = _Slice(datatype, shape, offset, offset + size) if spec.itemsize else None
            offset += size
        elif item.data:
            data = _decode_data(item.data, datatype, shape, fmt, f"inputs[{index}].data")
            slices = None
        else:
            raise InvalidInput(f"inputs[{index}].data: missing (give data or parameters.binary_data_size)")
        checked.tensors[spec.position] = Tensor(datatype, shape, data)
    if offset != len(blobs):
        raise InvalidInput(
            f"{HEADER_LENGTH}: inputs' binary_data_size add up to {offset} bytes, but "
            f"{len(blobs)} bytes follow the {len(header)}-byte header"
        )
    inputs, samples = checked.done()
    plan = None if slices is None or None in slices else tuple(slices)
    parameters = wire.parameters
    if parameters is None:
        request = InferRequest(schema=schema, inputs=inputs, samples=samples, id=wire.id,
                               outputs=requested_outputs(wire.outputs, schema, False))
        return request, plan
    default_binary = parameters.get("binary_data_output", False)
    if not isinstance(default_binary, bool):
        raise InvalidInput(f"parameters.binary_data_output: expected true or false, got {default_binary!r}")
    request = InferRequest(
        schema=schema,
        inputs=inputs,
        samples=samples,
        id=wire.id,
        outputs=requested_outputs(wire.outputs, schema, default_binary),
        parameters=parameters,
        timeout_ms=timeout_ms(parameters.get("timeout")),
        latency_budget_ms=latency_budget_ms(parameters.get("latency_budget_ms"), schema.max_latency_budget_ms),
        binary_outputs=default_binary,
    )
    return request, plan


def _split(body: bytes | bytearray | memoryview, header_length: int | None) -> tuple[memoryview, memoryview]:
    """The message header and the binary tensor data after it (views of the body)."""
    view = memoryview(body)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    if header_length is None:
        return view, view[:0]
    if not 0 < header_length <= len(view):
        raise InvalidInput(
            f"{HEADER_LENGTH}: expected 1..{len(view)} (the body's length), got {header_length}"
        )
    return view[:header_length], view[header_length:]


def _decode_header(header: memoryview, fmt: Format, header_length: int | None) -> _WireRequest:
    try:
        wire: _WireRequest = _REQUEST_DECODERS[fmt].decode(header)
    except msgspec.ValidationError as exc:
        raise decode_error(exc, fmt, document=header) from None
    except DECODE_ERRORS as exc:
        error = decode_error(exc, fmt)
        if header_length is None and "trailing characters" in str(exc):
            error = InvalidInput(f"{error} (binary tensors after the JSON need the {HEADER_LENGTH} header)")
        raise error from None
    return wire


def _binary_data(datatype: str, shape: tuple[int, ...], size: int, blobs: memoryview, offset: int,
                 index: int) -> memoryview:
    """The input's bytes in the binary data after the header: a view, no copy."""
    if offset + size > len(blobs):
        raise InvalidInput(
            f"inputs[{index}].parameters.binary_data_size: {size} bytes at offset {offset} run past the "
            f"binary data after the header ({len(blobs)} bytes)"
        )
    data = blobs[offset : offset + size]
    check_data(f"inputs[{index}].parameters.binary_data_size", datatype, shape, data,
               data_field=f"inputs[{index}] binary data")
    return data


def _decode_data(raw: msgspec.Raw, datatype: str, shape: tuple[int, ...], fmt: Format, field: str) -> Any:
    """Tensor bytes from a `data` value: flat or nested list, or (msgpack) raw bytes."""
    try:
        value = _data_decoders[fmt, datatype, 1].decode(raw)  # the datatype was checked: its decoder exists
    except msgspec.ValidationError as exc:
        if len(shape) < 2 or "got `array`" not in str(exc):
            raise decode_error(exc, fmt, field=field, document=raw) from None
        value = _decode_nested(raw, datatype, shape, fmt, field)
    except DECODE_ERRORS as exc:
        raise decode_error(exc, fmt, field=field) from None
    if fmt == "msgpack":
        if isinstance(value, memoryview):
            return _raw_data(value, datatype, shape, field)
        if datatype == "BYTES" and len(shape) > 1 and value and isinstance(value[0], list):
            value = arrays.flatten(value, shape, field=field)
    count = element_count(shape)
    if len(value) != count:
        raise InvalidInput(f"{field}: shape {list(shape)} needs {count} elements, got {len(value)}")
    return arrays.pack(datatype, value, field=field)


def _decode_nested(raw: msgspec.Raw, datatype: str, shape: tuple[int, ...], fmt: Format, field: str
                   ) -> list[Any]:
    try:
        nested = _decoder(fmt, datatype, len(shape)).decode(raw)
    except DECODE_ERRORS as exc:
        raise decode_error(exc, fmt, field=field, document=raw) from None
    return arrays.flatten(nested, shape, field=field)


def _raw_data(value: memoryview, datatype: str, shape: tuple[int, ...], field: str) -> memoryview:
    """msgpack `data` given as bytes: the tensor's little-endian bytes (a view, no copy)."""
    check_data(field, datatype, shape, value)
    return value


# (format, datatype, nesting depth) -> decoder of a `data` value; flat ones built up front.
_data_decoders: dict[tuple[str, str, int], _Decoder] = {}


def _decoder(fmt: Format, datatype: str, depth: int) -> _Decoder:
    key = (fmt, datatype, depth)
    dec = _data_decoders.get(key)
    if dec is None:
        if fmt == "msgpack":
            # Raw bytes (bin) are also accepted, as a zero-copy view into the body.
            dec = msgspec.msgpack.Decoder(memoryview | arrays.list_type(datatype, depth, msgpack=True))
        else:
            dec = msgspec.json.Decoder(arrays.list_type(datatype, depth))
        _data_decoders[key] = dec
    return dec


for _fmt in ("json", "msgpack"):
    for _dt in DATATYPES:
        _decoder(_fmt, _dt, 1)


def timeout_ms(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise InvalidInput(f"parameters.timeout: expected microseconds > 0, got {value!r}")
    return value / 1000.0


def latency_budget_ms(value: Any, limit: float | None) -> float | None:
    if value is None:
        return None
    accepted = "milliseconds > 0" if limit is None else f"milliseconds in (0, {limit:g}] (the model's timeout_ms)"
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (number and 0 < value < math.inf and (limit is None or value <= limit)):
        raise InvalidInput(f"parameters.latency_budget_ms: expected {accepted}, got {value!r}")
    return float(value)


def requested_outputs(
    wire: list[_WireOutput] | None, schema: ModelSchema, default_binary: bool
) -> list[RequestedOutput]:
    if not wire:
        return []
    known = [s.name for s in schema.outputs]
    out: list[RequestedOutput] = []
    seen: set[str] = set()
    for index, item in enumerate(wire):
        field = f"outputs[{index}]"
        if item.name not in known:
            raise InvalidInput(
                f"{field}.name: model {schema.name!r} has no output {item.name!r}; "
                f"expected one of {', '.join(map(repr, known))}"
            )
        if item.name in seen:
            raise InvalidInput(f"{field}.name: output {item.name!r} requested twice")
        seen.add(item.name)
        binary = default_binary
        params = item.parameters
        if params is not None:
            if params.classification and _datatype(schema, item.name) in ("BYTES", "BOOL"):
                raise InvalidInput(f"{field}.parameters.classification: output {item.name!r} is "
                                   f"{_datatype(schema, item.name)}: classification needs a numeric output")
            if params.shared_memory_region is not None:
                raise InvalidInput(f"{field}.parameters.shared_memory_region: shared memory is not supported")
            if params.binary_data is not None:
                binary = params.binary_data
        out.append(RequestedOutput(item.name, binary, params.classification if params is not None else 0))
    return out


def _datatype(schema: ModelSchema, name: str) -> str:
    return next(s.datatype for s in schema.outputs if s.name == name)


# ---- the response ----


class _WireOutputTensor(msgspec.Struct, omit_defaults=True):
    name: str
    datatype: str
    shape: tuple[int, ...]
    data: Any = None
    parameters: dict[str, int] | None = None


class _WireResponse(msgspec.Struct, omit_defaults=True):
    model_name: str
    model_version: str | None = None
    id: str | None = None
    outputs: list[_WireOutputTensor] = []


_json_encoder = msgspec.json.Encoder()
_msgpack_encoder = msgspec.msgpack.Encoder()


def encode_infer(
    response: InferResponse,
    request: InferRequest,
    /,
    *,
    accept: str | None,
    content_type: str | None,
    labels: Callable[[str], Sequence[str] | None] | None = None,
) -> tuple[list[bytes | memoryview], dict[str, str]]:
    """The response body (as chunks to write in order) and its headers.

    JSON: outputs requested as binary go after the JSON header, each as the tensor's
    own buffer (no copy), with `Inference-Header-Content-Length` and an
    application/octet-stream Content-Type (as Triton answers); the rest carry flat
    `data` lists. msgpack: every output's `data` is its raw little-endian bytes, BYTES
    as a list of byte strings. An output requested with `classification: N` is sent as
    its top N classes (`classification.top_classes`; `labels(output name)`: its labels).
    """
    fmt = negotiate(accept, content_type)
    outputs = response.outputs
    model_name = response.model_name
    if fmt == "json":
        # written in C as below (None: written below): every output binary, or integer and
        # boolean outputs each as a flat list
        asked = request.outputs
        if _binary_only(asked) if asked else request.binary_outputs:
            names = [r.name for r in asked] if asked else None
            chunks = _native.v2_binary_encode(model_name, response.model_version, response.id, outputs, names)
            if chunks is not None:
                return chunks, {"Content-Type": OCTET_STREAM, HEADER_LENGTH: str(len(chunks[0]))}
        elif request.schema.integral_outputs and not request.outputs:
            body = _native.v2_json_encode(model_name, response.model_version, response.id, outputs)
            if body is not None:
                return [body], {"Content-Type": "application/json"}
    if request.outputs:
        selected = [(r.name, r.binary) for r in request.outputs]
        if any(r.classification for r in request.outputs):
            outputs = classified(outputs, request, labels)
    else:
        default_binary = request.binary_outputs
        selected = [(name, default_binary) for name in outputs]
    wire: list[_WireOutputTensor] = []
    blobs: list[bytes | memoryview] = []
    for name, binary in selected:
        tensor = outputs.get(name)
        if tensor is None:
            raise ModelError(
                f"model {model_name!r} returned no output {name!r} (it returned {list(outputs)})"
            )
        view = output_view(model_name, name, tensor)
        if fmt == "msgpack":
            data: Any = decode_bytes(view) if tensor.datatype == "BYTES" else view
            wire.append(_WireOutputTensor(name, tensor.datatype, tensor.shape, data))
        elif binary:
            blobs.append(view)
            wire.append(
                _WireOutputTensor(
                    name, tensor.datatype, tensor.shape, parameters={"binary_data_size": len(view)}
                )
            )
        else:
            wire.append(
                _WireOutputTensor(name, tensor.datatype, tensor.shape, _json_data(name, tensor, view))
            )
    message = _WireResponse(model_name, response.model_version, response.id, wire)
    if fmt == "msgpack":
        return [_msgpack_encoder.encode(message)], {"Content-Type": _content_type("msgpack", content_type)}
    header = _json_encoder.encode(message)
    if not blobs:
        return [header], {"Content-Type": "application/json"}
    return [header, *blobs], {"Content-Type": OCTET_STREAM, HEADER_LENGTH: str(len(header))}


def _binary_only(outputs: list[RequestedOutput]) -> bool:
    """Whether every output asked for goes as binary data, none as its top classes."""
    return all(r.binary and not r.classification for r in outputs)


def classified(outputs: dict[str, Tensor], request: InferRequest,
                labels: Callable[[str], Sequence[str] | None] | None) -> dict[str, Tensor]:
    out = dict(outputs)
    batched = request.schema.max_batch_size > 0
    for r in request.outputs:
        tensor = outputs.get(r.name)
        if r.classification and tensor is not None:
            out[r.name] = top_classes(tensor, r.classification, batched=batched, name=r.name,
                                      labels=labels(r.name) if labels is not None else None)
    return out


def output_view(model_name: str, name: str, tensor: Tensor) -> memoryview:
    view: memoryview = tensor.data
    if type(view) is not memoryview:
        view = memoryview(view)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    dt = DATATYPES.get(tensor.datatype)
    if dt is None:
        raise ModelError(f"model {model_name!r} output {name!r}: unknown datatype {tensor.datatype!r}")
    if dt.itemsize and len(view) != element_count(tensor.shape) * dt.itemsize:
        raise ModelError(
            f"model {model_name!r} output {name!r}: {tensor.datatype} {list(tensor.shape)} needs "
            f"{element_count(tensor.shape) * dt.itemsize} bytes, got {len(view)}"
        )
    return view


def _json_data(name: str, tensor: Tensor, view: memoryview) -> list[Any]:
    code = arrays.TYPECODES.get(tensor.datatype)
    if code is not None:  # view is flat unsigned bytes (_output_view)
        values: list[Any] = view.cast(code).tolist()  # type: ignore[call-overload]
        return values
    values = arrays.unpack(tensor.datatype, view)
    if tensor.datatype != "BYTES":
        return values
    try:
        return [v.decode() for v in values]
    except UnicodeDecodeError as exc:
        raise InvalidInput(
            f"outputs: BYTES output {name!r} is not UTF-8 text ({exc.reason} at byte {exc.start}); "
            f"request it with parameters.binary_data = true"
        ) from None


# ---- the codec the data plane runs (aserve.inference.Codec) ----


def header_length(value: str | None) -> int | None:
    """The Inference-Header-Content-Length header's byte count (None when absent)."""
    if value is None:
        return None
    try:
        n = int(value)
    except ValueError:
        raise InvalidInput(f"header {HEADER_LENGTH}: expected a byte count, got {value!r}") from None
    if n < 0:
        raise InvalidInput(f"header {HEADER_LENGTH}: expected >= 0, got {n}")
    return n


class V2Codec:
    """V2 infer requests and answers: JSON, JSON with binary tensors after it, or msgpack."""

    budgets = True  # parameters.latency_budget_ms

    def decode(self, call: InferCall, schema: ModelSchema, /) -> InferRequest:
        return decode_infer(call.body, content_type=call.content_type, header_length=call.header_length,
                            schema=schema)

    def encode(self, call: InferCall, request: InferRequest, response: InferResponse, labels: Labels, /) -> Answer:
        chunks, headers = encode_infer(response, request, accept=call.accept, content_type=call.content_type,
                                       labels=labels if request.outputs else None)
        return Answer(chunks, headers)

    def protocol(self, call: InferCall, /) -> str:
        if request_format(call.content_type) == "msgpack":
            return "v2-msgpack"
        return "v2-binary" if call.header_length is not None else "v2-json"


V2 = V2Codec()
