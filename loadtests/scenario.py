"""The load test's requests: the bundled models, the V2 encodings, the checks of each answer.

Standard library and msgpack only (no Locust), so that `locustfile.py` and the tests
share one implementation: a test can encode a request here, send it with any client,
and check the answer with the same code the load test uses.

A request is a (model, encoding) pair: `MODELS[model].inputs(rows)` gives the input
tensors and a `check(outputs)` that raises `Mismatch` when an answer is not the one
those inputs should get; `REQUESTS[encoding](inputs)` gives the body and headers;
`decode_answer(encoding, content, headers)` reads the outputs of an answer.
"""

from __future__ import annotations

import json
import math
import random
import struct
from collections.abc import Callable, Mapping
from typing import Any

import msgpack

DEFAULT_WEIGHTS = ("simple:json=3,simple:binary=3,simple:msgpack=2,mlp:json=1,mlp:binary=2,mlp:msgpack=1,"
                   "textclass:json=1,textclass:binary=1,textclass:msgpack=1")
ENCODINGS = ("json", "binary", "msgpack")
CLASSES = ("sports", "tech", "food")  # examples/textclass
TEXTS = (
    "The striker scored twice in the second half to win the match",
    "The goalkeeper made a brilliant save in extra time",
    "The new laptop ships with a faster processor and more memory",
    "Engineers released a software update that fixes the network bug",
    "Bake the bread until the crust is golden and crisp",
    "The soup needs more garlic, salt and fresh basil",
    "A quiet afternoon with nothing in particular to report",
)

# A tensor here: (name, datatype, shape, flat values); BYTES values are bytes.
Tensor = tuple[str, str, list[int], list[Any]]
Outputs = dict[str, Tensor]


# ---- tensors as bytes (little-endian; BYTES elements with a 4-byte length prefix) ----

_FORMATS = {"INT32": "i", "FP32": "f"}


def pack(datatype: str, values: list[Any]) -> bytes:
    if datatype == "BYTES":
        return b"".join(len(v).to_bytes(4, "little") + v for v in values)
    return struct.pack(f"<{len(values)}{_FORMATS[datatype]}", *values)


def unpack(datatype: str, raw: bytes) -> list[Any]:
    if datatype == "BYTES":
        out, pos = [], 0
        while pos < len(raw):
            size = int.from_bytes(raw[pos:pos + 4], "little")
            out.append(raw[pos + 4:pos + 4 + size])
            pos += 4 + size
        return out
    return list(struct.unpack(f"<{len(raw) // 4}{_FORMATS[datatype]}", raw))


# ---- the models: inputs to send, and the check of an answer ----


class Mismatch(Exception):
    """The answer is not what this request should get."""


def _output(outputs: Outputs, name: str, datatype: str, shape: list[int]) -> list[Any]:
    if name not in outputs:
        raise Mismatch(f"no output {name} (got {sorted(outputs)})")
    _, got_type, got_shape, values = outputs[name]
    if got_type != datatype or list(got_shape) != shape:
        raise Mismatch(f"{name}: expected {datatype} {shape}, got {got_type} {got_shape}")
    if len(values) != math.prod(shape):
        raise Mismatch(f"{name}: shape {shape} but {len(values)} values")
    return values


def _finite(name: str, values: list[float]) -> None:
    if not all(math.isfinite(v) for v in values):
        raise Mismatch(f"{name}: values not finite")


class Simple:
    """OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 (INT32 [n, 16])."""

    def inputs(self, rows: int) -> tuple[list[Tensor], Callable[[Outputs], None]]:
        a = [random.randint(-1000, 1000) for _ in range(rows * 16)]
        b = [random.randint(-1000, 1000) for _ in range(rows * 16)]

        def check(outputs: Outputs) -> None:
            if _output(outputs, "OUTPUT0", "INT32", [rows, 16]) != [x + y for x, y in zip(a, b)]:
                raise Mismatch("OUTPUT0 is not INPUT0 + INPUT1")
            if _output(outputs, "OUTPUT1", "INT32", [rows, 16]) != [x - y for x, y in zip(a, b)]:
                raise Mismatch("OUTPUT1 is not INPUT0 - INPUT1")

        return [("INPUT0", "INT32", [rows, 16], a), ("INPUT1", "INT32", [rows, 16], b)], check


class MLP:
    """8 x Linear(16, 16): FP32 [n, 16] in and out."""

    def inputs(self, rows: int) -> tuple[list[Tensor], Callable[[Outputs], None]]:
        x = [random.uniform(-1.0, 1.0) for _ in range(rows * 16)]

        def check(outputs: Outputs) -> None:
            _finite("OUTPUT", _output(outputs, "OUTPUT", "FP32", [rows, 16]))

        return [("INPUT", "FP32", [rows, 16], x)], check


class TextClass:
    """BYTES texts [n] -> LABEL BYTES [n] and SCORES FP32 [n, 3] (class probabilities)."""

    def inputs(self, rows: int) -> tuple[list[Tensor], Callable[[Outputs], None]]:
        texts = [random.choice(TEXTS).encode() for _ in range(rows)]

        def check(outputs: Outputs) -> None:
            labels = _output(outputs, "LABEL", "BYTES", [rows])
            scores = _output(outputs, "SCORES", "FP32", [rows, len(CLASSES)])
            for i, label in enumerate(labels):
                name = label.decode(errors="replace")
                if name not in CLASSES:
                    raise Mismatch(f"LABEL {i}: {name!r} is not one of {', '.join(CLASSES)}")
                row = scores[i * len(CLASSES):(i + 1) * len(CLASSES)]
                if abs(sum(row) - 1.0) > 1e-3 or row.index(max(row)) != CLASSES.index(name):
                    raise Mismatch(f"SCORES {i}: {row} do not pick {name!r}")

        return [("TEXT", "BYTES", [rows], texts)], check


class CNN:
    """FP32 images [n, 3, 64, 64] -> SCORES FP32 [n, 10]."""

    def inputs(self, rows: int) -> tuple[list[Tensor], Callable[[Outputs], None]]:
        image = [random.random() for _ in range(rows * 3 * 64 * 64)]

        def check(outputs: Outputs) -> None:
            _finite("SCORES", _output(outputs, "SCORES", "FP32", [rows, 10]))

        return [("IMAGE", "FP32", [rows, 3, 64, 64], image)], check


MODELS: dict[str, Any] = {"simple": Simple(), "mlp": MLP(), "textclass": TextClass(), "cnn": CNN()}


# ---- the encodings: a request body, and the outputs of an answer ----


def _json_request(inputs: list[Tensor]) -> tuple[bytes, dict[str, str]]:
    body = {"inputs": [
        {"name": n, "datatype": t, "shape": s, "data": [v.decode() for v in d] if t == "BYTES" else d}
        for n, t, s, d in inputs
    ]}
    return json.dumps(body).encode(), {"Content-Type": "application/json"}


def _json_outputs(document: Mapping[str, Any], blobs: bytes = b"") -> Outputs:
    outputs: Outputs = {}
    offset = 0
    for o in document["outputs"]:
        size = (o.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            values = unpack(o["datatype"], blobs[offset:offset + size])
            offset += size
        elif o["datatype"] == "BYTES":
            values = [v.encode() for v in o["data"]]
        else:
            values = o["data"]
        outputs[o["name"]] = (o["name"], o["datatype"], o["shape"], values)
    return outputs


def _binary_request(inputs: list[Tensor]) -> tuple[bytes, dict[str, str]]:
    blobs = [pack(t, d) for _, t, _, d in inputs]
    header = json.dumps({
        "inputs": [{"name": n, "datatype": t, "shape": s, "parameters": {"binary_data_size": len(blob)}}
                   for (n, t, s, _), blob in zip(inputs, blobs)],
        "parameters": {"binary_data_output": True},
    }).encode()
    return header + b"".join(blobs), {"Inference-Header-Content-Length": str(len(header)),
                                     "Content-Type": "application/octet-stream"}


def _msgpack_request(inputs: list[Tensor]) -> tuple[bytes, dict[str, str]]:
    body = {"inputs": [{"name": n, "datatype": t, "shape": s, "data": d if t == "BYTES" else pack(t, d)}
                       for n, t, s, d in inputs]}
    return msgpack.packb(body), {"Content-Type": "application/msgpack"}


def _msgpack_outputs(document: Mapping[str, Any]) -> Outputs:
    outputs: Outputs = {}
    for o in document["outputs"]:
        data = o["data"]
        if isinstance(data, bytes):
            values = unpack(o["datatype"], data)
        elif o["datatype"] == "BYTES":
            values = [v if isinstance(v, bytes) else v.encode() for v in data]
        else:
            values = list(data)
        outputs[o["name"]] = (o["name"], o["datatype"], o["shape"], values)
    return outputs


def decode_answer(encoding: str, content: bytes, headers: Mapping[str, str]) -> Outputs:
    if encoding == "msgpack":
        content_type = headers.get("Content-Type") or ""
        if "msgpack" not in content_type:
            raise Mismatch(f"answer is {content_type!r}, not msgpack")
        return _msgpack_outputs(msgpack.unpackb(content))
    length = headers.get("Inference-Header-Content-Length")
    if encoding == "binary" and length is None:
        raise Mismatch("binary outputs asked for, but the answer has no Inference-Header-Content-Length")
    if length is None:
        return _json_outputs(json.loads(content))
    n = int(length)
    return _json_outputs(json.loads(content[:n]), content[n:])


REQUESTS: dict[str, Callable[[list[Tensor]], tuple[bytes, dict[str, str]]]] = {
    "json": _json_request, "binary": _binary_request, "msgpack": _msgpack_request,
}


# ---- the mix ----


def parse_weights(text: str) -> dict[tuple[str, str], int]:
    """{(model, encoding): weight} from "model:encoding=weight,..."; ValueError naming the bad item."""
    weights: dict[tuple[str, str], int] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        pair, eq, number = item.partition("=")
        model, colon, encoding = pair.strip().partition(":")
        if not eq or not colon:
            raise ValueError(f"ASERVE_LOCUST_WEIGHTS: {item!r}: expected model:encoding=weight")
        if model not in MODELS:
            raise ValueError(f"ASERVE_LOCUST_WEIGHTS: {item!r}: model {model!r} is not one of {', '.join(MODELS)}")
        if encoding not in ENCODINGS:
            raise ValueError(
                f"ASERVE_LOCUST_WEIGHTS: {item!r}: encoding {encoding!r} is not one of {', '.join(ENCODINGS)}")
        try:
            weight = int(number)
        except ValueError:
            weight = -1
        if weight < 0:
            raise ValueError(f"ASERVE_LOCUST_WEIGHTS: {item!r}: the weight must be an integer >= 0")
        weights[(model, encoding)] = weight
    if not any(weights.values()):
        raise ValueError(f"ASERVE_LOCUST_WEIGHTS: {text!r} gives no pair a weight above 0")
    return {pair: w for pair, w in weights.items() if w > 0}


def cycle(weights: Mapping[tuple[str, str], int], rng: random.Random | None = None) -> list[tuple[str, str]]:
    """One user's cycle: each pair `weight` times, shuffled; walked round and round, it keeps
    the mix exact over every cycle and sends every weighted pair within sum(weights) requests."""
    pairs = [pair for pair, weight in weights.items() for _ in range(weight)]
    (rng or random).shuffle(pairs)
    return pairs


def parse_max_rows(text: str | None) -> int:
    """ASERVE_LOCUST_MAX_ROWS: samples per request are drawn from 1..this (default 1)."""
    try:
        rows = int(text or 1)
    except ValueError:
        rows = 0
    if rows < 1:
        raise ValueError(f"ASERVE_LOCUST_MAX_ROWS: expected an integer >= 1, got {text!r}")
    return rows
