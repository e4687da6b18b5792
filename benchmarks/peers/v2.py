"""A small Open Inference Protocol (KServe V2) codec for the peer servers: standard library only.

Requests: JSON (`{"inputs": [{"name", "datatype", "shape", "data"}]}`) or the binary
tensor extension (a JSON header whose inputs carry `parameters.binary_data_size`,
followed by the raw little-endian tensors; the header's length comes from the
`Inference-Header-Content-Length` HTTP header). Where that header is not available
(MOSEC hands a worker the body only) the JSON header is self-delimiting and is found
by parsing it. Responses: JSON, or binary outputs when the request asked for them
(`parameters.binary_data_output`).
"""

from __future__ import annotations

import json
from array import array
from typing import Any, NamedTuple

# V2 datatype -> array typecode (native byte order: little-endian on every platform measured here)
TYPECODES = {"INT8": "b", "UINT8": "B", "INT16": "h", "UINT16": "H", "INT32": "i", "UINT32": "I",
             "INT64": "q", "UINT64": "Q", "FP32": "f", "FP64": "d"}

_DECODER = json.JSONDecoder()


class BadRequest(ValueError):
    """A request this codec cannot read; the servers answer it with 400 and the message."""


class Tensor(NamedTuple):
    datatype: str
    shape: tuple[int, ...]
    data: bytes  # the elements, C order, native byte order

    def values(self) -> array[Any]:
        a = array(TYPECODES[self.datatype])
        a.frombytes(self.data)
        return a


class Request(NamedTuple):
    inputs: dict[str, Tensor]
    binary_output: bool  # the client asked for binary outputs


def _count(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _flatten(data: Any) -> list[Any]:
    if data and isinstance(data[0], list):
        return [x for row in data for x in _flatten(row)]
    return list(data)


def split(body: bytes, header_length: int | None) -> tuple[dict[str, Any], memoryview]:
    """The JSON header and the binary part that follows it (empty for a JSON request)."""
    view = memoryview(body)
    try:
        if header_length is not None:
            if not 0 < header_length <= len(body):
                raise BadRequest(f"Inference-Header-Content-Length {header_length} is outside the body "
                                 f"of {len(body)} bytes")
            return json.loads(bytes(view[:header_length])), view[header_length:]
        try:
            return json.loads(body), view[len(body):]
        except (UnicodeDecodeError, json.JSONDecodeError):
            # a binary request without the header-length: the JSON object ends where it ends
            header, end = _DECODER.raw_decode(body.decode("latin-1"))
            if not body[:end].isascii():
                header = json.loads(body[:end])
            return header, view[end:]
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadRequest(f"the request is not a V2 JSON header: {e}") from e


def decode_request(body: bytes, header_length: int | None = None) -> Request:
    header, blob = split(body, header_length)
    if not isinstance(header, dict) or not isinstance(header.get("inputs"), list):
        raise BadRequest("the request has no 'inputs' list")
    inputs: dict[str, Tensor] = {}
    offset = 0
    for item in header["inputs"]:
        try:
            name, datatype, shape = item["name"], item["datatype"], tuple(int(d) for d in item["shape"])
        except (KeyError, TypeError, ValueError) as e:
            raise BadRequest(f"an input lacks name, datatype or shape: {e}") from e
        code = TYPECODES.get(datatype)
        if code is None:
            raise BadRequest(f"input {name}: datatype {datatype!r} is not supported here")
        size = _count(shape) * array(code).itemsize
        params = item.get("parameters") or {}
        if "binary_data_size" in params:
            n = int(params["binary_data_size"])
            if n != size or offset + n > len(blob):
                raise BadRequest(f"input {name}: binary_data_size {n}, shape {list(shape)} needs {size} "
                                 f"bytes, {len(blob) - offset} left in the body")
            data = bytes(blob[offset:offset + n])
            offset += n
        else:
            try:
                data = array(code, _flatten(item["data"])).tobytes()
            except (KeyError, TypeError, OverflowError) as e:
                raise BadRequest(f"input {name}: no readable 'data' of {datatype}: {e}") from e
            if len(data) != size:
                raise BadRequest(f"input {name}: {len(data)} bytes of data, shape {list(shape)} needs {size}")
        inputs[name] = Tensor(datatype, shape, data)
    binary = bool((header.get("parameters") or {}).get("binary_data_output", False))
    return Request(inputs, binary)


def encode_response(model: str, outputs: dict[str, Tensor], *, binary: bool) -> tuple[bytes, int | None]:
    """(body, header length): the header length is None for a JSON response."""
    items = []
    blobs = []
    for name, t in outputs.items():
        item: dict[str, Any] = {"name": name, "datatype": t.datatype, "shape": list(t.shape)}
        if binary:
            item["parameters"] = {"binary_data_size": len(t.data)}
            blobs.append(t.data)
        else:
            item["data"] = t.values().tolist()
        items.append(item)
    head = json.dumps({"model_name": model, "outputs": items}, separators=(",", ":")).encode()
    if not binary:
        return head, None
    return head + b"".join(blobs), len(head)


def decode_response(body: bytes, header_length: int | None) -> dict[str, Tensor]:
    """A V2 response's outputs by name (the benchmark checks answers with it)."""
    header, blob = split(body, header_length)
    outputs: dict[str, Tensor] = {}
    offset = 0
    for item in header.get("outputs", []):
        shape = tuple(int(d) for d in item["shape"])
        code = TYPECODES[item["datatype"]]
        params = item.get("parameters") or {}
        if "binary_data_size" in params:
            n = int(params["binary_data_size"])
            data = bytes(blob[offset:offset + n])
            offset += n
        else:
            data = array(code, _flatten(item["data"])).tobytes()
        outputs[item["name"]] = Tensor(item["datatype"], shape, data)
    return outputs
