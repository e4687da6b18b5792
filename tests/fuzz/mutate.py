"""A structure-aware mutator for the fuzz targets' inputs (atheris' `custom_mutator`).

Byte-level mutations of a JSON or msgpack body mostly make it malformed, which the
decoders reject in their first step. Half the time this mutator instead decodes the
input, changes the message (a value replaced by one at a boundary: -1, 0, 2**31,
2**63, 2**64 - 1, 65520, 1e39, another datatype or input name, a list, an object; a
key or element dropped, duplicated or moved; a list nested or flattened) and encodes
it again, so that the decoders' checks past the syntax get exercised. `v2_binary`
inputs keep their form (`<header length>\\n<JSON header><tensor bytes>`): the header
is mutated as JSON, the tensor bytes as bytes, and the header length mostly follows.
`grpc` inputs (a serialized ModelInferRequest) are parsed and changed field by field;
`grpc_front` and `grpc_segments` inputs (HTTP/2 streams) frame by frame (`grpc_front.py`).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from typing import Any

import msgspec

DATATYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32",
             "FP64", "BF16", "BYTES", "STRING", ""]
NAMES = ["INPUT0", "INPUT1", "INPUT", "TEXT", "MASK", "SCALE", "WORDS", "U64", "H", "B", "I8", "OUTPUT0", "OUTPUT1",
         "OUTPUT", "LABEL", "SCORES", "OUT", "X"]
KEYS = ["inputs", "outputs", "name", "shape", "datatype", "data", "parameters", "binary_data_size", "binary_data",
        "binary_data_output", "classification", "shared_memory_region", "id", "timeout", "latency_budget_ms",
        "instances", "signature_name", "b64"]
INTS = [-1, 0, 1, 2, 3, 4, 5, 8, 9, 16, 17, 255, 256, 65535, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**53 + 1,
        2**62, 2**63 - 1, 2**63, 2**64 - 1, -(2**31), -(2**63)]
INT64S = [v for v in INTS if -(2**63) <= v < 2**63]  # what a protobuf int64 field holds
FLOATS = [0.5, -0.0, 1.5, 65504.0, 65519.0, 65520.0, 3.4028234663852886e38, 3.5e38, 1e39, 1e300, -1e300, 5e-324,
          1e-45]
STRINGS = ["", "a", "\u00e9", "\u2603", "x" * 40, "AAAA", "AA==", "====", "\u00e9\u00e9=="]


def _interesting(rng: random.Random, binary: bool) -> Any:
    kind = rng.randrange(10)
    if kind < 3:
        return rng.choice(INTS)
    if kind == 3:
        return rng.choice(FLOATS + ([float("nan"), float("inf"), -float("inf")] if binary else []))
    if kind == 4:
        return rng.choice(DATATYPES)
    if kind == 5:
        return rng.choice(NAMES)
    if kind == 6:
        return rng.choice(STRINGS + ([b"", b"\x00\x00\x00\x00", b"\x01\x00\x00\x00a", b"\xff" * 8] if binary else []))
    if kind == 7:
        return rng.choice([True, False, None])
    if kind == 8:
        return rng.choice([[], [[]], [0], [1.0, 2.0], [[1, 2], [3]], ["a", ["b"]], [True] * 3])
    return rng.choice([{}, {"b64": "AAEC"}, {"binary_data_size": rng.choice(INTS)}, {"name": rng.choice(NAMES)}])


def _containers(doc: Any) -> list[Any]:
    """Every list and dict in the document, the root included."""
    out: list[Any] = []
    stack = [doc]
    while stack:
        node = stack.pop()
        if isinstance(node, (list, dict)):
            out.append(node)
            stack.extend(node.values() if isinstance(node, dict) else node)
    return out


def _slots(node: Any) -> list[Any]:
    return list(node) if isinstance(node, dict) else list(range(len(node)))


def mutate_document(doc: Any, rng: random.Random, *, binary: bool = False) -> Any:
    """The document (lists, dicts, scalars) changed in 1..4 places."""
    if not isinstance(doc, (list, dict)):
        return _interesting(rng, binary) if rng.random() < 0.5 else [doc]
    for _ in range(rng.randint(1, 4)):
        containers = _containers(doc)
        node = rng.choice(containers)
        slots = _slots(node)
        op = rng.randrange(9)
        if not slots or op == 0:  # add
            value = _interesting(rng, binary) if rng.random() < 0.7 else rng.choice(containers)
            value = _copy(value, binary)
            if isinstance(node, dict):
                node[rng.choice(KEYS + NAMES)] = value
            else:
                node.insert(rng.randint(0, len(node)), value)
            continue
        slot = rng.choice(slots)
        if op in (1, 2, 3):  # replace with a boundary value
            node[slot] = _interesting(rng, binary)
        elif op == 4:  # drop
            del node[slot]
        elif op == 5 and isinstance(node, list):  # duplicate
            node.insert(slot, _copy(node[slot], binary))
        elif op == 6:  # nest or flatten
            value = node[slot]
            node[slot] = value[0] if isinstance(value, list) and value and rng.random() < 0.5 else [value]
        elif op == 7:  # move a subtree somewhere else
            other = rng.choice(containers)
            if other is not node and _slots(other):
                node[slot] = _copy(other[rng.choice(_slots(other))], binary)
        elif isinstance(node[slot], (int, float)) and not isinstance(node[slot], bool):  # nudge a number
            node[slot] = node[slot] + rng.choice([-1, 1]) if isinstance(node[slot], int) else -node[slot]
        elif isinstance(node, dict):  # rename a key
            node[rng.choice(KEYS + NAMES)] = node.pop(slot)
    return doc


def _copy(value: Any, binary: bool) -> Any:
    if binary:
        return msgspec.msgpack.decode(msgspec.msgpack.encode(value))
    return msgspec.json.decode(msgspec.json.encode(value))


def _bytes(data: bytes, rng: random.Random) -> bytes:
    """Tensor bytes: flipped, cut short, lengthened, or a length prefix set to a boundary."""
    buf = bytearray(data)
    op = rng.randrange(4)
    if op == 0 and buf:
        buf[rng.randrange(len(buf))] = rng.randrange(256)
    elif op == 1 and buf:
        del buf[rng.randrange(len(buf)):]
    elif op == 2:
        buf += bytes(rng.choice([1, 2, 4, 8]))
    elif buf:
        pos = rng.randrange(len(buf))
        buf[pos:pos + 4] = rng.choice([0, 1, 2**31, 2**32 - 1, len(buf)]).to_bytes(4, "little")
    return bytes(buf)


def _json(data: bytes, rng: random.Random) -> bytes | None:
    try:
        doc = msgspec.json.decode(data)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        return None
    return json.dumps(mutate_document(doc, rng), separators=(",", ":") if rng.random() < 0.5 else None).encode()


def _msgpack(data: bytes, rng: random.Random) -> bytes | None:
    try:
        doc = msgspec.msgpack.decode(data)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        return None
    try:
        return msgspec.msgpack.encode(mutate_document(doc, rng, binary=True))
    except (TypeError, OverflowError):  # an integer msgpack cannot hold
        return None


def _binary(data: bytes, rng: random.Random) -> bytes | None:
    first, newline, body = data.partition(b"\n")
    try:
        length = int(first)
    except ValueError:
        return None
    if not newline or not 0 < length <= len(body):
        return None
    header, blobs = body[:length], body[length:]
    if rng.random() < 0.7:
        header = _json(header, rng) or header
    if rng.random() < 0.5:
        blobs = _bytes(blobs, rng)
    if rng.random() < 0.9:
        length = len(header)
    else:
        length = rng.choice([0, -1, length, len(header) - 1, len(header) + 1, len(header) + len(blobs) + 1])
    return f"{length}\n".encode() + header + blobs


# the bytes HTTP parsers disagree on: separators, whitespace, controls, non-ASCII, case
_HTTP_BYTES = b" \t\r\n:\x00\x0b\x7f\x80\xff,;=\"\\/?#%+-_.aZ09"


def _head(data: bytes, rng: random.Random) -> bytes:
    """A request head changed line by line: a field repeated (as it is or with its name's
    case swapped), dropped or moved, a field of interesting bytes added, or a separator,
    space or control byte put into the request line or a field."""
    lines = data.split(b"\r\n")
    choice = rng.random()
    i = rng.randrange(len(lines))
    if choice < 0.25 and len(lines) > 1:
        j = rng.randrange(1, len(lines))
        lines.insert(rng.randrange(1, len(lines) + 1), lines[j] if rng.random() < 0.5 else lines[j].swapcase())
    elif choice < 0.4 and len(lines) > 1:
        del lines[rng.randrange(1, len(lines))]
    elif choice < 0.55:
        name = rng.choice([b"Content-Length", b"Transfer-Encoding", b"Connection", b"Host", b"Expect", b"X-A"])
        value = bytes(rng.choice(_HTTP_BYTES) for _ in range(rng.randint(0, 6)))
        lines.insert(rng.randrange(1, len(lines) + 1), name + b":" + value)
    else:
        line = bytearray(lines[i])
        pos = rng.randrange(len(line) + 1)
        line[pos:pos + rng.randint(0, 2)] = bytes(rng.choice(_HTTP_BYTES) for _ in range(rng.randint(1, 3)))
        lines[i] = bytes(line)
    return b"\r\n".join(lines)


def _http_stream(data: bytes, rng: random.Random) -> bytes | None:
    """A stream of pipelined requests changed where parsers disagree: one request's head
    (`_head`), a request repeated or dropped, the stream cut short, or a body's length or
    chunk framing changed."""
    requests = re.findall(rb"(?s).*?\r\n\r\n(?:(?:[0-9a-fA-F]+\r\n.*?\r\n)*0\r\n\r\n)?", data) or [data]
    k = rng.randrange(len(requests))
    choice = rng.random()
    if choice < 0.5:
        head, sep, body = requests[k].partition(b"\r\n\r\n")
        requests[k] = _head(head, rng) + sep + body
    elif choice < 0.65:
        requests.insert(rng.randrange(len(requests) + 1), requests[k])
    elif choice < 0.75 and len(requests) > 1:
        del requests[k]
    elif choice < 0.85:
        return data[:rng.randrange(len(data) + 1)]
    else:
        request = requests[k]
        requests[k] = re.sub(rb"\r\n[0-9a-fA-F]+\r\n", lambda m: b"\r\n%x\r\n" % rng.randint(0, 70), request,
                             count=1) if rng.random() < 0.5 else request + bytes(rng.choice(_HTTP_BYTES)
                                                                                   for _ in range(rng.randint(1, 8)))
    return b"".join(requests)


def _grpc(data: bytes, rng: random.Random) -> bytes | None:
    """A ModelInferRequest changed where the codec checks it: a dimension, a datatype, an
    input's name, raw contents of the wrong size (or one too few or many), typed contents in
    the wrong field or beside raw ones, an input twice, a parameter of another type."""
    from google.protobuf.message import DecodeError

    from aserve.protocol.grpc import protos

    try:
        message = protos.ModelInferRequest.FromString(data)
    except DecodeError:
        return None
    inputs = message.inputs
    raw = message.raw_input_contents
    kind = rng.randrange(9)
    if kind == 0 and inputs:
        item = rng.choice(inputs)
        if item.shape:
            item.shape[rng.randrange(len(item.shape))] = rng.choice(INT64S)
        else:
            item.shape.append(rng.choice(INT64S))
    elif kind == 1 and inputs:
        rng.choice(inputs).datatype = rng.choice(DATATYPES)
    elif kind == 2 and inputs:
        rng.choice(inputs).name = rng.choice(NAMES)
    elif kind == 3 and raw:
        i = rng.randrange(len(raw))
        cut = rng.choice([0, 1, 3, 4, len(raw[i]) // 2, len(raw[i]) + 1])
        raw[i] = raw[i][:cut] if cut <= len(raw[i]) else raw[i] + rng.randbytes(rng.randint(1, 8))
    elif kind == 4:
        if raw and rng.random() < 0.5:
            del raw[rng.randrange(len(raw))]
        else:
            raw.append(rng.choice([b"", b"\x00" * 4, b"\x01\x00\x00\x00a", rng.randbytes(8)]))
    elif kind == 5 and inputs:
        contents = rng.choice(inputs).contents
        field = rng.choice(["bool_contents", "int_contents", "int64_contents", "uint_contents", "uint64_contents",
                            "fp32_contents", "fp64_contents", "bytes_contents"])
        values = {"bool_contents": [True, False], "bytes_contents": [b"", b"\xff", b"ab"],
                  "fp32_contents": [0.5, float("nan"), 3.0e38], "fp64_contents": [1e300, -0.0]}.get(
            field, [0, 1, 127, 128, 255, 256, 65535, 2**31 - 1])
        getattr(contents, field).extend(rng.choice(values) for _ in range(rng.randint(0, 6)))
    elif kind == 6 and inputs:
        inputs.add().CopyFrom(rng.choice(inputs))
        if raw:
            raw.append(raw[-1])
    elif kind == 7:
        parameter = message.parameters[rng.choice(["timeout", "latency_budget_ms", "binary_data_output", "x"])]
        choice = rng.randrange(4)
        if choice == 0:
            parameter.int64_param = rng.choice(INT64S)
        elif choice == 1:
            parameter.bool_param = rng.random() < 0.5
        elif choice == 2:
            parameter.string_param = rng.choice(STRINGS)
        else:
            parameter.double_param = rng.choice(FLOATS + [float("nan"), float("inf")])
    else:
        output = message.outputs.add(name=rng.choice(NAMES))
        key = rng.choice(["classification", "binary_data", "shared_memory_region"])
        if key == "classification":
            output.parameters[key].int64_param = rng.choice(INT64S)
        else:
            output.parameters[key].bool_param = True
    return bytes(message.SerializeToString())


def _h2_front(data: bytes, rng: random.Random) -> bytes | None:
    from .grpc_front import mutate_front

    return mutate_front(data, rng)


def _h2_stream(data: bytes, rng: random.Random) -> bytes | None:
    from .grpc_front import mutate_stream

    return mutate_stream(data, rng)


STRUCTURED: dict[str, Callable[[bytes, random.Random], bytes | None]] = {
    "v2_json": _json, "tfserving": _json, "msgpack": _msgpack, "v2_binary": _binary, "http_front": _http_stream,
    "http_segments": _http_stream,
    "grpc": _grpc, "grpc_front": _h2_front, "grpc_segments": _h2_stream,
}


def mutator(target: str) -> Callable[[bytes, int, int], bytes]:
    """atheris' custom_mutator for `target`: structured half the time, libFuzzer's bytes else."""
    import atheris

    structured = STRUCTURED[target]

    def mutate(data: bytes, max_size: int, seed: int) -> bytes:
        rng = random.Random(seed)
        if rng.random() < 0.5:
            try:
                out = structured(data, rng)
            except RecursionError:
                out = None
            if out is not None and len(out) <= max_size:
                return out
        return atheris.Mutate(data, max_size)

    return mutate
