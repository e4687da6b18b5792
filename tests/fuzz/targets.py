"""The decoders' fuzz targets: one function per wire format, taking the fuzzer's bytes.

Each target decodes its input against every schema in `SCHEMAS` and checks the
property every decoder must keep, whatever arrives:

- nothing escapes but the codec's own errors: an `AserveError` with a 4xx status
  (`InvalidInput`, `PayloadTooLarge`) whose message is non-empty, valid Unicode;
- a request that decodes holds what the message said: every element of every input
  (as its datatype rounds it), or its bytes as sent;
- a request that decodes is one the data plane can run: its inputs are the schema's,
  in order, with the declared datatypes and ranks, every fixed dimension as declared,
  every dimension an int64, the byte length equal to the element count times the
  item size (BYTES: as many well-formed elements as the shape holds), the sample
  count the common batch dimension (1..max_batch_size, or 1 when the model does not
  batch), the requested outputs the model's own, and the timeout and latency budget
  in range;
- (binary extension) a request decoded through the checked-header cache decodes the
  same as without it.

A violated property raises `Failure` (or lets the unexpected exception through): the
fuzzer records the input as a crash. No fuzzer is imported here (the standard library,
msgspec, msgpack and aserve), so that the pytest suite runs the targets without one.

`http_front` is the HTTP front's connection (`aserve.server.connection`, llhttp) fed a
stream of pipelined requests, malformed or not, in pieces: nothing escapes it; what it
writes back is a sequence of well-formed HTTP/1.1 answers (100 Continue only as 1xx), one
per request it answered, nothing after an answer that closes the connection; and every
request it hands a handler is the request h11 (an independent HTTP/1.1 parser) reads at
the same place in the stream, with the same method, target and body. A stream the two
parsers split differently is the request-smuggling setup.

`http_segments` (`segments.py`) is the same connection fed one stream cut into reads in
many ways: every cut is answered as the whole stream in one read is.

`grpc_front` and `grpc_segments` (`grpc_front.py`) are the same two for the gRPC front's
connection (HTTP/2 on libnghttp2), checked against h2, an independent HTTP/2 implementation.

`grpc` is the gRPC front's codec (`aserve.protocol.grpc.codec`): a serialized
`ModelInferRequest` as grpc hands it over, its inputs in typed `contents` or in
`raw_input_contents` (whose sizes need not agree with the shapes); the same property, the
values read from the message's fields.

Input formats: `v2_json`, `msgpack` and `tfserving` take a request body as it is;
`v2_binary` takes `<Inference-Header-Content-Length value>\\n<body>` (a first line that
is not an integer means the header is absent); `http_front`, `http_segments` and
`grpc_segments` take the bytes a client sends on one connection (`http_front`'s first byte
also chooses how they are cut into reads); `grpc_front` takes a byte that chooses how they are
cut, then those bytes.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import re
import struct
import types
from collections.abc import Callable
from typing import Any

import msgpack as _msgpack
import msgspec
from google.protobuf.message import DecodeError

from aserve.errors import AserveError, InvalidInput
from aserve.inference import InferRequest, ModelSchema
from aserve.protocol import arrays, decode_infer, decode_predict
from aserve.protocol.grpc import codec as grpc_codec
from aserve.protocol.grpc import protos
from aserve.runtime.datatypes import decode_bytes, element_count
from aserve.runtime.model import TensorSpec
from aserve.server.app import HttpStats
from aserve.server.connection import Connection, HttpServer, Limits, origin_form
from aserve.server.errors import ErrorPolicy
from aserve.server.http import Response

from .grpc_front import grpc_front, grpc_segments
from .segments import Wire, http_segments

INT64_MAX = 2**63 - 1
MAX_DIMS = 16  # native/abi.h AS_MAX_DIMS: dimensions a tensor may have on its way to a model


class Failure(AssertionError):
    """The decoder broke its contract on this input."""


def _schema(name: str, inputs: list[tuple[str, str, tuple[int, ...]]], outputs: list[tuple[str, str, tuple[int, ...]]],
            max_batch_size: int, max_latency_budget_ms: float | None = None) -> ModelSchema:
    return ModelSchema(name, "1", inputs=[TensorSpec(*i) for i in inputs], outputs=[TensorSpec(*o) for o in outputs],
                       max_batch_size=max_batch_size, max_latency_budget_ms=max_latency_budget_ms)


def make_schemas() -> list[ModelSchema]:
    """The models the targets decode against: the bundled examples' contracts (INT32, FP32,
    BYTES, batching), a model that does not batch (BOOL, a scalar, BYTES with two free
    dimensions) and one of the narrow and wide numeric types."""
    return [
        _schema("simple", [("INPUT0", "INT32", (-1, 16)), ("INPUT1", "INT32", (-1, 16))],
                [("OUTPUT0", "INT32", (-1, 16)), ("OUTPUT1", "INT32", (-1, 16))], 8, 1000.0),
        _schema("mlp", [("INPUT", "FP32", (-1, 16))], [("OUTPUT", "FP32", (-1, 16))], 8),
        _schema("textclass", [("TEXT", "BYTES", (-1,))],
                [("LABEL", "BYTES", (-1,)), ("SCORES", "FP32", (-1, 3))], 4, 50.0),
        _schema("unbatched", [("MASK", "BOOL", (2, -1)), ("SCALE", "FP32", ()), ("WORDS", "BYTES", (-1, -1))],
                [("OUT", "FP32", (2, -1))], 0),
        _schema("wide", [("U64", "UINT64", (-1, 3)), ("H", "FP16", (-1,)), ("B", "BF16", (-1, -1)),
                         ("I8", "INT8", (-1,))], [("U64", "UINT64", (-1, 3))], 4),
    ]


SCHEMAS = make_schemas()
# Twins of the schemas whose checked-header cache is emptied before each use: the
# binary target compares what the cache answers with a fresh decode.
COLD = make_schemas()


# ---- the property ----


def check_error(exc: BaseException) -> None:
    """Only the codec's own 4xx errors may escape; anything else goes on up as the crash."""
    if not isinstance(exc, AserveError):
        raise exc
    if not 400 <= exc.status < 500:
        raise Failure(f"{type(exc).__name__} (status {exc.status}) escaped the decoder: {exc}") from exc
    message = str(exc)
    if not message:
        raise Failure(f"{type(exc).__name__} without a message") from exc
    try:
        message.encode()  # the server sends it as JSON or msgpack: it must be UTF-8
    except UnicodeEncodeError as e:
        raise Failure(f"{type(exc).__name__} message is not valid Unicode: {message!r}") from e


def check_request(request: InferRequest, schema: ModelSchema) -> None:
    """A decoded request is one the data plane can run (see the module's docstring)."""
    if request.schema is not schema:
        raise Failure("request decoded against another schema")
    if len(request.inputs) != len(schema.inputs):
        raise Failure(f"{len(request.inputs)} inputs for a model of {len(schema.inputs)}")
    batched = schema.max_batch_size > 0
    samples = request.samples
    if type(samples) is not int or not (1 <= samples <= max(schema.max_batch_size, 1)):
        raise Failure(f"samples {samples!r} outside 1..{max(schema.max_batch_size, 1)}")
    for spec, tensor in zip(schema.inputs, request.inputs):
        where = f"input {spec.name!r}"
        if tensor.datatype != spec.datatype:
            raise Failure(f"{where}: datatype {tensor.datatype!r}, declared {spec.datatype}")
        shape = tensor.shape
        if type(shape) is not tuple or len(shape) != len(spec.shape) or len(shape) > MAX_DIMS:
            raise Failure(f"{where}: shape {shape!r} for declared {spec.shape}")
        for want, got in zip(spec.shape, shape):
            if type(got) is not int or not 0 <= got <= INT64_MAX:
                raise Failure(f"{where}: dimension {got!r} of {list(shape)} is not an int64 >= 0")
            if want != -1 and got != want:
                raise Failure(f"{where}: shape {list(shape)} for declared {list(spec.shape)}")
        # Some dimension is 0 or none is: either way the element count, and the byte size
        # of the nonzero dimensions (what numpy checks), must be an int64.
        nonzero = element_count([d for d in shape if d]) * max(spec.itemsize, 1)
        if nonzero > INT64_MAX:
            raise Failure(f"{where}: shape {list(shape)} spans {nonzero} bytes, more than an int64")
        if batched and shape and shape[0] != samples:
            raise Failure(f"{where}: batch dimension {shape[0]} but {samples} samples")
        try:
            view = memoryview(tensor.data)
        except TypeError as exc:
            raise Failure(f"{where}: data {type(tensor.data).__name__} has no buffer") from exc
        if not view.c_contiguous:
            raise Failure(f"{where}: data is not C-contiguous")
        count = element_count(shape)
        if spec.itemsize:
            if view.nbytes != count * spec.itemsize:
                raise Failure(f"{where}: {view.nbytes} bytes for {spec.datatype} {list(shape)}")
        else:
            try:
                elements = decode_bytes(view)
            except ValueError as exc:
                raise Failure(f"{where}: BYTES data is malformed: {exc}") from exc
            if len(elements) != count:
                raise Failure(f"{where}: {len(elements)} BYTES elements for {list(shape)}")
    if not batched and samples != 1:
        raise Failure(f"model does not batch, but {samples} samples")
    names = [o.name for o in schema.outputs]
    requested = [o.name for o in request.outputs]
    if len(set(requested)) != len(requested) or not set(requested) <= set(names):
        raise Failure(f"outputs {requested} of a model with {names}")
    if any(type(o.binary) is not bool for o in request.outputs):
        raise Failure("an output's binary flag is not a bool")
    timeout = request.timeout_ms
    # a positive timeout in microseconds may round to 0.0 ms (5e-324): it times out at once (504)
    if timeout is not None and not (type(timeout) is float and timeout >= 0):
        raise Failure(f"timeout_ms {timeout!r}")
    budget = request.latency_budget_ms
    if budget is not None:
        limit = schema.max_latency_budget_ms
        if not (0 < budget < math.inf and (limit is None or budget <= limit)):
            raise Failure(f"latency_budget_ms {budget!r} (the model's limit: {limit})")


def summary(request: InferRequest) -> tuple[Any, ...]:
    """What a decoded request is, for comparing two decodings."""
    return (
        [(t.datatype, t.shape, bytes(memoryview(t.data))) for t in request.inputs],
        request.samples, request.id, [msgspec.structs.astuple(o) for o in request.outputs],
        repr(request.parameters), request.timeout_ms, request.latency_budget_ms, request.binary_outputs, request.columnar,
    )


def decode(target: str, data: bytes, schema: ModelSchema) -> InferRequest:
    """What the server decodes a target's input to, for one model."""
    if target == "v2_json":
        return decode_infer(data, content_type="application/json", header_length=None, schema=schema)
    if target == "msgpack":
        return decode_infer(data, content_type="application/msgpack", header_length=None, schema=schema)
    if target == "tfserving":
        return decode_predict(data, schema=schema)
    if target == "grpc":
        return grpc_codec.decode_infer(grpc_message(data), schema)
    header_length, body = split_binary(data)
    return decode_infer(body, content_type="application/octet-stream", header_length=header_length, schema=schema)


def _decode_each(target: str, data: bytes) -> None:
    for schema in SCHEMAS:
        try:
            request = decode(target, data, schema)
        except Exception as exc:  # noqa: BLE001 - check_error re-raises what must not escape
            check_error(exc)
        else:
            check_request(request, schema)
            check_values(target, data, request)


# ---- the values: what a decoded tensor holds is what the message said ----


def _flat(value: Any) -> list[Any]:
    """Nested lists flattened in C order (a scalar: a list of one)."""
    if not isinstance(value, (list, tuple)):
        return [value]
    out: list[Any] = []
    for v in value:
        out.extend(_flat(v))
    return out


def _as_element(datatype: str, value: Any) -> Any:
    """A wire value as the tensor holds it: rounded as the datatype rounds, BYTES as bytes."""
    if datatype == "BYTES":
        if isinstance(value, dict):
            return base64.b64decode(value["b64"])
        return value.encode() if isinstance(value, str) else bytes(value)
    if datatype in ("FP32", "BF16"):
        value = struct.unpack("<f", struct.pack("<f", value))[0]
        if datatype == "BF16":  # the upper half of the float32's bits
            bits = struct.unpack("<I", struct.pack("<f", value))[0] & 0xFFFF0000
            value = struct.unpack("<f", struct.pack("<I", bits))[0]
        return value
    if datatype == "FP16":
        return struct.unpack("<e", struct.pack("<e", value))[0]
    if datatype in ("FP64",):
        return float(value)
    return value


def _same(a: Any, b: Any) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def _expect(name: str, datatype: str, value: Any, tensor: Any) -> None:
    if isinstance(value, (bytes, bytearray, memoryview)) and not isinstance(value, str):
        if bytes(memoryview(tensor.data)) != bytes(value):  # raw bytes (msgpack bin, binary extension)
            raise Failure(f"input {name!r}: its bytes are not the message's")
        return
    want = [_as_element(datatype, v) for v in _flat(value)]
    got = arrays.unpack(datatype, tensor.data)
    if len(got) != len(want) or not all(_same(g, w) for g, w in zip(got, want)):
        raise Failure(f"input {name!r}: decoded {got[:8]!r}... from {want[:8]!r}...")


def _v2_values(doc: Any, blobs: bytes) -> dict[str, Any]:
    """{input name: its data, or its bytes in the binary data} of a V2 message that decoded."""
    out: dict[str, Any] = {}
    offset = 0
    for item in doc["inputs"]:
        size = ((item.get("parameters") or {}).get("binary_data_size"))
        if size is not None:
            out[item["name"]] = blobs[offset:offset + size]
            offset += size
        else:
            out[item["name"]] = item["data"]
    return out


def _tf_values(doc: Any, schema: ModelSchema) -> dict[str, Any]:
    """{input name: its value, batch dimension included} of a predict message that decoded."""
    names = [s.name for s in schema.inputs]
    batched = schema.max_batch_size > 0
    if "instances" in doc and doc["instances"] is not None:
        rows = doc["instances"]
        if all(isinstance(r, dict) and r.keys() == set(names) for r in rows) and not (
                len(names) == 1 and any(not isinstance(r, dict) for r in rows)):
            columns = {n: [r[n] for r in rows] for n in names}
        else:
            columns = {names[0]: rows}
        return {n: (c if batched else c[0]) for n, c in columns.items()}
    value = doc["inputs"]
    if isinstance(value, dict) and value.keys() == set(names) and not (len(names) == 1 and value.keys() == {"b64"}):
        return dict(value)
    return {names[0]: value}


def _reference(target: str, data: bytes) -> tuple[Any, bytes] | None:
    """The message (and binary data after it) as other parsers than the server's read it,
    keeping what msgspec skips unread (an unknown key need not be valid UTF-8, for one);
    None when none of them reads it (an unknown field nested past the recursion limit, or
    keyed by a msgpack array or map)."""
    try:
        if target == "v2_binary":
            header_length, body = split_binary(data)
            if header_length is None:
                return json.loads(body.decode(errors="surrogateescape")), b""
            return json.loads(body[:header_length].decode(errors="surrogateescape")), body[header_length:]
        if target != "msgpack":
            return json.loads(data.decode(errors="surrogateescape")), b""
        try:
            return msgspec.msgpack.decode(data), b""
        except UnicodeDecodeError:
            return _msgpack.unpackb(data, unicode_errors="surrogateescape", strict_map_key=False, use_list=False), b""
    except (RecursionError, TypeError, ValueError, msgspec.DecodeError, _msgpack.UnpackException):
        return None


def grpc_message(data: bytes) -> Any:
    """The ModelInferRequest in `data`; grpc refuses what does not parse before any codec runs
    (InvalidInput stands for that here)."""
    try:
        return protos.ModelInferRequest.FromString(data)
    except DecodeError as exc:
        raise InvalidInput(f"not a ModelInferRequest: {exc}") from None


def _grpc_values(message: Any, request: InferRequest) -> None:
    """Each decoded tensor holds its raw contents' bytes, or its typed contents' values."""
    tensors = request.named()
    raw = message.raw_input_contents
    for index, item in enumerate(message.inputs):
        tensor = tensors[item.name]
        if raw:
            _expect(item.name, item.datatype, raw[index], tensor)
        else:
            values = list(getattr(item.contents, grpc_codec.CONTENTS[item.datatype]))
            _expect(item.name, item.datatype, [bool(v) if item.datatype == "BOOL" else v for v in values], tensor)


def check_values(target: str, data: bytes, request: InferRequest) -> None:
    """Each decoded tensor holds the values (or bytes) its message gave, in C order."""
    if target == "grpc":
        _grpc_values(grpc_message(data), request)
        return
    reference = _reference(target, data)
    if reference is None:
        return
    doc, blobs = reference
    values = _tf_values(doc, request.schema) if target == "tfserving" else _v2_values(doc, blobs)
    for spec, tensor in zip(request.schema.inputs, request.inputs):
        _expect(spec.name, spec.datatype, values[spec.name], tensor)


# ---- the targets ----


def v2_json(data: bytes) -> None:
    """A V2 infer request in JSON (no binary tensors)."""
    _decode_each("v2_json", data)


def msgpack(data: bytes) -> None:
    """A V2 infer request in msgpack."""
    _decode_each("msgpack", data)


def tfserving(data: bytes) -> None:
    """A TF-Serving predict request (`instances` or `inputs`)."""
    _decode_each("tfserving", data)


def grpc_infer(data: bytes) -> None:
    """A gRPC ModelInferRequest, serialized: decoded in full, then as the front reads a unary
    call's bytes (`Wire`: twice, the second time from the reading the first may have
    remembered, the plans of earlier inputs with the same key too), which must come to the
    same request, or fail as the full decoder does."""
    _decode_each("grpc", data)
    for schema in SCHEMAS:
        try:
            full: Any = summary(decode("grpc", data, schema))
        except Exception:  # noqa: BLE001 - _decode_each judged it
            full = None
        for _ in range(2):
            try:
                read: Any = summary(grpc_codec.decode_wire(grpc_codec.Wire.of(data), schema))
            except Exception as exc:  # noqa: BLE001 - check_error re-raises what must not escape
                check_error(exc)
                read = None
            if read != full:
                raise Failure(f"{schema.name}: the front's reading of the bytes is {read!r}, the full decoder's "
                              f"{full!r}")


def split_binary(data: bytes) -> tuple[int | None, bytes]:
    """`v2_binary`'s input: the header length (None: not an integer) and the body."""
    first, newline, body = data.partition(b"\n")
    if not newline:
        return None, data
    try:
        return int(first), body
    except ValueError:
        return None, body


def v2_binary(data: bytes) -> None:
    """A V2 infer request with the binary tensor extension (JSON header + tensor bytes).

    Every body is decoded twice against the same schema, the second time through the
    cache of checked headers when the first one stored a plan, and once against a
    schema with an empty cache: all three must agree."""
    header_length, _ = split_binary(data)
    if header_length is not None and header_length < 0:
        return  # the server answers a negative header length itself (handlers.header_length)
    for schema, cold in zip(SCHEMAS, COLD):
        outcomes = []
        for target in (schema, schema, cold):
            if target is cold:
                cold.plans = None  # forgets every header
            try:
                request = decode("v2_binary", data, target)
            except Exception as exc:  # noqa: BLE001 - check_error re-raises what must not escape
                check_error(exc)
                outcomes.append(("error", type(exc).__name__, str(exc)))
            else:
                check_request(request, target)
                check_values("v2_binary", data, request)
                outcomes.append(("ok", summary(request)))
        if not outcomes[0] == outcomes[1] == outcomes[2]:
            raise Failure(f"model {schema.name!r}: decodings differ (first, cached, uncached): {outcomes}")


class _Dispatcher:
    """Every request's head passes; its handler answers 200 and the request is kept."""

    def __init__(self) -> None:
        self.app = types.SimpleNamespace(stats=HttpStats(), policy=ErrorPolicy(), draining=False, cors=None)
        self.served: list[tuple[str, str, bytes]] = []

    def head(self, request: Any, length: int | None) -> None:
        return None

    def again(self, request: Any) -> None:
        return None

    async def respond(self, request: Any) -> Any:
        self.served.append((request.method, request.target, bytes(request.body)))
        return Response(200, b"ok", content_type="text/plain")

    def finish(self, request: Any, response: Any) -> Any:
        return response

    def failed(self, request: Any, exc: BaseException) -> Any:
        raise Failure(f"the stub's handler cannot fail: {exc!r}")


_LOOP: list[asyncio.AbstractEventLoop] = []


def _h11_requests(data: bytes) -> list[tuple[str, str, bytes]]:
    """The requests h11 reads from a stream, up to the first it refuses or that stays incomplete."""
    import h11

    conn = h11.Connection(h11.SERVER)
    conn.receive_data(data)
    conn.receive_data(b"")
    out: list[tuple[str, str, bytes]] = []
    current: list[Any] = []
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError:
            return out
        if event is h11.NEED_DATA or event is h11.PAUSED or isinstance(event, h11.ConnectionClosed):
            if event is h11.PAUSED and conn.our_state is h11.SEND_RESPONSE:
                conn.send(h11.Response(status_code=200, headers=[("Content-Length", "0")]))
                conn.send(h11.EndOfMessage())
                try:
                    conn.start_next_cycle()
                except h11.LocalProtocolError:
                    return out
                continue
            return out
        if isinstance(event, h11.Request):
            current = [event.method.decode("latin-1"), origin_form(event.target.decode("latin-1")), b""]
        elif isinstance(event, h11.Data):
            current[2] += event.data
        elif isinstance(event, h11.EndOfMessage):
            out.append((current[0], current[1], current[2]))


async def _feed(data: bytes) -> tuple[_Dispatcher, Wire, Any]:
    dispatcher = _Dispatcher()
    server = HttpServer(dispatcher, Limits(max_connections=0, max_header_bytes=512,  # type: ignore[arg-type]
                                           max_body_bytes=1 << 14, request_timeout_s=5.0, keepalive_timeout_s=5.0))
    conn = Connection(server)
    transport = Wire(conn, [])
    conn.connection_made(transport)
    step = 1 + (data[0] % 64 if data else 0) * 7  # how the stream is cut into reads
    for i in range(0, len(data), step):
        if transport.closed:
            break
        conn.data_received(data[i:i + step])
        for _ in range(3):
            await asyncio.sleep(0)
    if not transport.closed:
        conn.eof_received()
    for _ in range(20):
        if not conn.busy:
            break
        await asyncio.sleep(0)
    transport.close()
    return dispatcher, transport, conn


CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


def _answers(writes: list[bytes]) -> list[tuple[int, bool]]:
    """(status, closes) of each answer the connection wrote, 100 Continue left out; Failure
    unless each is one well-formed HTTP/1.1 answer whose body is as long as its
    Content-Length says (or absent: the answer to a HEAD request)."""
    import httptools

    class Heads:
        def __init__(self) -> None:
            self.parser = httptools.HttpResponseParser(self)
            self.found: list[tuple[int, bool]] = []

        def on_headers_complete(self) -> None:
            self.found.append((self.parser.get_status_code(), not self.parser.should_keep_alive()))

    answers: list[tuple[int, bool]] = []
    for data in writes:
        if data == CONTINUE:
            continue
        heads = Heads()
        found = heads.found
        head, sep, body = data.partition(b"\r\n\r\n")
        try:
            heads.parser.feed_data(head + sep)
        except httptools.HttpParserError as exc:
            raise Failure(f"the connection wrote a malformed answer ({exc}): {data[:300]!r}") from None
        length = re.search(rb"\r\nContent-Length: (\d+)\r\n", head + b"\r\n")
        if len(found) != 1 or length is None or len(body) not in (0, int(length[1])):
            raise Failure(f"not one whole answer: {data[:300]!r}")
        answers += found
    return answers


def http_front(data: bytes) -> None:
    """The HTTP front's connection on a stream of requests (see the module's docstring)."""
    if not _LOOP:
        _LOOP.append(asyncio.new_event_loop())
    loop = _LOOP[0]
    dispatcher, transport, _ = loop.run_until_complete(_feed(data))
    answers = _answers(transport.writes)
    answered = dispatcher.app.stats.requests
    if len(answers) != answered:
        raise Failure(f"{answered} answers counted, {len(answers)} written: {transport.writes[:3]!r}")
    for k, (status, closes) in enumerate(answers):
        if not 200 <= status < 600:
            raise Failure(f"answer {k} has status {status}")
        if closes and k != len(answers) - 1:
            raise Failure(f"answer {k} closed the connection, yet {len(answers) - k - 1} more followed")
    theirs = _h11_requests(data)
    ours = dispatcher.served
    n = min(len(ours), len(theirs))
    if ours[:n] != theirs[:n]:
        raise Failure(f"llhttp and h11 read the stream differently: {ours[:n]!r} against {theirs[:n]!r}")


TARGETS: dict[str, Callable[[bytes], None]] = {
    "http_front": http_front,
    "http_segments": http_segments,
    "grpc_front": grpc_front,
    "grpc_segments": grpc_segments,
    "v2_json": v2_json,
    "v2_binary": v2_binary,
    "msgpack": msgpack,
    "tfserving": tfserving,
    "grpc": grpc_infer,
}
