"""Writes the seed corpora (tests/fuzz/corpus/<target>/) from real requests.

`python -m tests.fuzz.make_corpus` (re)writes them: bodies that tritonclient and the load
test's encoders (loadtests/scenario.py) send to the bundled models, and hand-written
requests in the same formats for the fuzz schemas' other models (a model that does not
batch, BOOL, scalars, nested BYTES, UINT64/FP16/BF16/INT8, requested outputs and
parameters). Deterministic: the same files every time.
"""

from __future__ import annotations

import base64
import json
import pathlib
import random
import shutil
import sys
from typing import Any

import ml_dtypes
import msgspec
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent
CORPUS = ROOT / "corpus"


def _scenario() -> Any:
    sys.path.insert(0, str(ROOT.parent.parent / "loadtests"))
    try:
        import scenario
    finally:
        sys.path.pop(0)
    return scenario


def _triton(inputs: list[tuple[str, np.ndarray, bool]], outputs: list[tuple[str, bool]] | None = None,
            **kwargs: Any) -> tuple[bytes, int | None]:
    """The body (and JSON header size, None without binary tensors) tritonclient.http sends."""
    from tritonclient import http
    from tritonclient.utils import np_to_triton_dtype

    ins = []
    for name, array, binary in inputs:
        i = http.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        i.set_data_from_numpy(array, binary_data=binary)
        ins.append(i)
    outs = [http.InferRequestedOutput(name, binary_data=binary) for name, binary in outputs or []]
    body, json_size = http.InferenceServerClient.generate_request_body(ins, outputs=outs or None, **kwargs)
    return bytes(body), json_size


def v2_requests() -> dict[str, dict[str, Any]]:
    """Hand-written V2 requests (as Python values) for the fuzz schemas' models."""
    return {
        "unbatched": {
            "id": "u1",
            "inputs": [
                {"name": "MASK", "datatype": "BOOL", "shape": [2, 3], "data": [[True, False, True], [False, False, True]]},
                {"name": "SCALE", "datatype": "FP32", "shape": [], "data": [0.5]},
                {"name": "WORDS", "datatype": "BYTES", "shape": [2, 2], "data": [["a", "bc"], ["", "\u00e9t\u00e9"]]},
            ],
            "outputs": [{"name": "OUT", "parameters": {"binary_data": False}}],
        },
        "unbatched_empty": {
            "inputs": [
                {"name": "MASK", "datatype": "BOOL", "shape": [2, 0], "data": [[], []]},
                {"name": "SCALE", "datatype": "FP32", "shape": [], "data": [-0.0]},
                {"name": "WORDS", "datatype": "BYTES", "shape": [0, 3], "data": []},
            ],
        },
        "wide": {
            "inputs": [
                {"name": "U64", "datatype": "UINT64", "shape": [1, 3], "data": [0, 2**63, 2**64 - 1]},
                {"name": "H", "datatype": "FP16", "shape": [1], "data": [65504.0]},
                {"name": "B", "datatype": "BF16", "shape": [1, 2], "data": [[-1.5, 256.0]]},
                {"name": "I8", "datatype": "INT8", "shape": [1], "data": [-128]},
            ],
            "parameters": {"binary_data_output": True, "timeout": 5000, "latency_budget_ms": 2.5},
        },
        "textclass": {
            "inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [2], "data": ["good match", "new laptop"]}],
            "outputs": [{"name": "LABEL"}, {"name": "SCORES", "parameters": {"binary_data": True}}],
            "parameters": {"latency_budget_ms": 20},
        },
    }


def v2_json() -> dict[str, bytes]:
    scenario = _scenario()
    out: dict[str, bytes] = {}
    for model in ("simple", "mlp", "textclass"):
        inputs, _ = scenario.MODELS[model].inputs(2)
        out[f"scenario_{model}"] = scenario.REQUESTS["json"](inputs)[0]
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    out["tritonclient_simple"] = _triton([("INPUT0", a, False), ("INPUT1", np.ones_like(a), False)],
                                         [("OUTPUT0", False), ("OUTPUT1", False)], request_id="7")[0]
    out["tritonclient_mlp_nested"] = json.dumps({"inputs": [{
        "name": "INPUT", "datatype": "FP32", "shape": [2, 16],
        "data": np.linspace(-1, 1, 32, dtype=np.float32).reshape(2, 16).tolist()}]}).encode()
    for name, request in v2_requests().items():
        out[name] = json.dumps(request).encode()
    return out


def v2_binary() -> dict[str, bytes]:
    """`<Inference-Header-Content-Length>\\n<body>`, as targets.v2_binary reads them."""
    scenario = _scenario()
    bodies: dict[str, tuple[bytes, int | None]] = {}
    for model in ("simple", "mlp", "textclass"):
        inputs, _ = scenario.MODELS[model].inputs(2)
        body, headers = scenario.REQUESTS["binary"](inputs)
        bodies[f"scenario_{model}"] = body, int(headers["Inference-Header-Content-Length"])
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    bodies["tritonclient_simple"] = _triton([("INPUT0", a, True), ("INPUT1", np.ones_like(a), True)],
                                            [("OUTPUT0", True), ("OUTPUT1", False)])
    bodies["tritonclient_simple_mixed"] = _triton([("INPUT0", a, True), ("INPUT1", np.ones_like(a), False)])
    texts = np.array([b"The striker scored", b"", b"\xff\xfe binary"], dtype=object)
    bodies["tritonclient_textclass"] = _triton([("TEXT", texts, True)], [("LABEL", True)],
                                               parameters={"latency_budget_ms": 10})
    bodies["tritonclient_unbatched"] = _triton([
        ("MASK", np.array([[True, False], [False, True]]), True),
        ("SCALE", np.array(2.0, dtype=np.float32), True),
        ("WORDS", np.array([[b"x", b"yz"]], dtype=object), True),
    ])
    bodies["tritonclient_wide"] = _triton([
        ("U64", np.array([[1, 2**63, 2**64 - 1]], dtype=np.uint64), True),
        ("H", np.array([0.5], dtype=np.float16), True),
        ("B", np.array([[1.0, -2.5]], dtype=ml_dtypes.bfloat16), True),
        ("I8", np.array([-1], dtype=np.int8), True),
    ], timeout=1000)
    return {name: f"{size}\n".encode() + body if size is not None else b"x\n" + body
            for name, (body, size) in bodies.items()}


def msgpack() -> dict[str, bytes]:
    scenario = _scenario()
    out: dict[str, bytes] = {}
    for model in ("simple", "mlp", "textclass"):
        inputs, _ = scenario.MODELS[model].inputs(2)
        out[f"scenario_{model}"] = scenario.REQUESTS["msgpack"](inputs)[0]
    for name, request in v2_requests().items():
        out[f"{name}_lists"] = msgspec.msgpack.encode(request)
    out["simple_lists"] = msgspec.msgpack.encode({"inputs": [
        {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": list(range(16))},
        {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [[1] * 16]},
    ], "parameters": {"timeout": 250.5}})
    out["unbatched_raw"] = msgspec.msgpack.encode({"inputs": [
        {"name": "MASK", "datatype": "BOOL", "shape": [2, 1], "data": b"\x01\x00"},
        {"name": "SCALE", "datatype": "FP32", "shape": [], "data": np.float32(3.0).tobytes()},
        {"name": "WORDS", "datatype": "BYTES", "shape": [1, 2], "data": [b"\x00\x01", "text"]},
    ]})
    return out


def tfserving() -> dict[str, bytes]:
    b64 = base64.b64encode(b"\x00binary\xff").decode()
    requests: dict[str, Any] = {
        "mlp_instances": {"instances": [[0.1 * i for i in range(16)], [1.0] * 16]},
        "mlp_columnar": {"signature_name": "serving_default", "inputs": [[0.5] * 16]},
        "simple_instances": {"instances": [{"INPUT0": list(range(16)), "INPUT1": [1] * 16}]},
        "simple_columnar": {"inputs": {"INPUT0": [list(range(16))] * 2, "INPUT1": [[2] * 16] * 2}},
        "textclass_instances": {"instances": ["The goalkeeper made a save", {"b64": b64}]},
        "textclass_columnar": {"inputs": [{"b64": b64}, "soup"]},
        "textclass_object": {"instances": [{"TEXT": "bread"}]},
        "unbatched_instance": {"instances": [{"MASK": [[True], [False]], "SCALE": 1.5, "WORDS": [["a"], [{"b64": b64}]]}]},
        "unbatched_columnar": {"inputs": {"MASK": [[True, True], [False, False]], "SCALE": -2.0, "WORDS": [[]]}},
        "wide_columnar": {"inputs": {"U64": [[0, 1, 18446744073709551615]], "H": [-0.25], "B": [[1.0, 2.0]],
                                     "I8": [127]}},
        "wide_instances": {"instances": [{"U64": [1, 2, 3], "H": 1.0, "B": [0.5], "I8": -3}] * 2},
    }
    return {name: json.dumps(value).encode() for name, value in requests.items()}


def http_front() -> dict[str, bytes]:
    """What clients send on one connection to the infer routes (tritonclient, aiohttp, curl, wrk):
    single requests, pipelined ones, chunked and compressed bodies, Expect, Connection: close."""
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 2], "data": [1, 2]}]})

    def request(lines: list[str], data: bytes = b"") -> bytes:
        return "\r\n".join(lines).encode() + b"\r\n\r\n" + data

    aiohttp_json = request(["POST /v2/models/simple/infer HTTP/1.1", "Host: 127.0.0.1:8000", "Accept: */*",
                            "Accept-Encoding: gzip, deflate", "User-Agent: Python/3.11 aiohttp/3.14.5",
                            f"Content-Length: {len(body)}", "Content-Type: application/json"], body.encode())
    triton = request(["POST /v2/models/mlp/versions/1/infer HTTP/1.1", "Host: localhost:8000",
                      "Content-Type: application/octet-stream", "Inference-Header-Content-Length: 4",
                      "Content-Length: 12", "Connection: keep-alive"], b"{}  \x00\x00\x80?\x00\x00\x00@")
    curl = request(["POST /v1/models/cnn:predict HTTP/1.1", "Host: localhost:8000", "User-Agent: curl/8.5.0",
                    "Accept: */*", "Content-Type: application/json", "Content-Length: 20"], b'{"instances": [[1]]}')
    close = request(["POST /v2/models/textclass/infer HTTP/1.1", "Host: a",
                     "traceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
                     "Authorization: Bearer t0ken", "Content-Length: 0", "Connection: close"])
    chunked = request(["POST /v2/models/simple/infer HTTP/1.1", "Host: a", "Transfer-Encoding: chunked"],
                      b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
    expect = request(["POST /v2/models/simple/infer HTTP/1.1", "Host: a", "Expect: 100-continue",
                      "Content-Length: 2"], b"{}")
    live = request(["GET /v2/health/live HTTP/1.1", "Host: a"])
    return {"aiohttp_json": aiohttp_json, "triton_binary": triton, "curl_predict": curl, "traced_close": close,
            "chunked": chunked, "expect": expect, "pipelined": aiohttp_json + live + triton + chunked + curl,
            "http10": request(["GET /v2/health/ready HTTP/1.0"]), "pipelined_close": live + close + live}


def http_segments() -> dict[str, bytes]:
    """Streams whose meaning must not change with how they are cut into reads: a request alone,
    pipelined between others and with a body behind an Expect; a head sent again and again,
    then behind a partial method;
    refusals from the head with a body to drop; a chunked body with trailers; HTTP/1.0."""
    def post(path: str, body: bytes, *extra: str) -> bytes:
        lines = [f"POST {path} HTTP/1.1", "Host: a", *extra, f"Content-Length: {len(body)}"]
        return "\r\n".join(lines).encode() + b"\r\n\r\n" + body

    body = b'{"inputs": []}'
    ready = b"GET /v2/health/ready HTTP/1.1\r\nHost: a\r\n\r\n"
    host = post("/v2/models/host/infer", body)
    return {
        **http_front(),
        "host": host,
        "host_behind": post("/v2/models/simple/infer", body) + host + post("/v2/models/simple/infer", b"{}"),
        "host_expect": post("/v2/models/host/infer", body, "Expect: 100-continue") + ready,
        "known_head": ready * 3 + b"G" + ready + b"ET /v2/models/nosuch/ready HTTP/1.1\r\nHost: a\r\n\r\n",
        "refusals": post("/v2/models/refuse/infer", b"x" * 40) + post("/deny", b"y") + ready,
        "expect_refused": post("/v2/models/refuse/infer", b"xxxxx", "Expect: 100-continue") + ready,
        "trailers": b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
                    b"4\r\nab\r\n\r\n0\r\nA: 1\r\nB: 2\r\n\r\n" + ready,
        "absolute": b"GET http://a:8000/v2/health/live HTTP/1.1\r\nHost: a\r\n\r\n" + ready,
        "short": b"GET / HTTP/1.1\r\nHost: a\r\n\r\n",
    }


def grpc() -> dict[str, bytes]:
    """Serialized ModelInferRequests as tritonclient.grpc builds them (raw contents), and with
    typed contents as other KServe clients send them."""
    from tritonclient.grpc import service_pb2
    from tritonclient.utils import serialize_byte_tensor

    def message(inputs: list[tuple[str, str, np.ndarray]], typed: bool = False, **fields: Any) -> bytes:
        request = service_pb2.ModelInferRequest(**fields)
        for name, datatype, array in inputs:
            tensor = request.inputs.add(name=name, datatype=datatype, shape=list(array.shape))
            if typed:
                field = {"INT32": "int_contents", "FP32": "fp32_contents", "BOOL": "bool_contents",
                         "BYTES": "bytes_contents", "UINT64": "uint64_contents", "INT8": "int_contents"}[datatype]
                getattr(tensor.contents, field).extend(array.ravel().tolist())
            elif datatype == "BYTES":
                request.raw_input_contents.append(serialize_byte_tensor(array).item())  # as tritonclient.grpc sends it
            else:
                request.raw_input_contents.append(array.tobytes())
        return request.SerializeToString()

    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    simple = [("INPUT0", "INT32", a), ("INPUT1", "INT32", np.ones_like(a))]
    mlp = [("INPUT", "FP32", np.linspace(-1, 1, 32, dtype=np.float32).reshape(2, 16))]
    text = [("TEXT", "BYTES", np.array([b"The striker scored", b"", b"\xff\xfe binary"], dtype=object))]
    unbatched = [("MASK", "BOOL", np.array([[True, False], [False, True]])),
                 ("SCALE", "FP32", np.array(2.0, dtype=np.float32)),
                 ("WORDS", "BYTES", np.array([[b"x", b"yz"]], dtype=object))]
    wide = [("U64", "UINT64", np.array([[1, 2**63, 2**64 - 1]], dtype=np.uint64)),
            ("H", "FP16", np.array([0.5], dtype=np.float16)),
            ("B", "BF16", np.array([[1.0, -2.5]], dtype=ml_dtypes.bfloat16)),
            ("I8", "INT8", np.array([-1], dtype=np.int8))]
    out = {
        "simple_raw": message(simple, model_name="simple", id="7"),
        "simple_typed": message(simple, typed=True, model_name="simple"),
        "mlp_raw": message(mlp, model_name="mlp"),
        "mlp_typed": message(mlp, typed=True, model_name="mlp"),
        "textclass_raw": message(text, model_name="textclass"),
        "textclass_typed": message(text, typed=True, model_name="textclass"),
        "unbatched_raw": message(unbatched, model_name="unbatched"),
        "unbatched_typed": message(unbatched, typed=True, model_name="unbatched"),
        "wide_raw": message(wide, model_name="wide"),
    }
    request = service_pb2.ModelInferRequest.FromString(out["textclass_raw"])
    request.parameters["latency_budget_ms"].int64_param = 10
    request.parameters["timeout"].int64_param = 5000
    request.outputs.add(name="LABEL").parameters["binary_data"].bool_param = False
    request.outputs.add(name="SCORES").parameters["classification"].int64_param = 2
    out["textclass_parameters"] = request.SerializeToString()
    return out


def grpc_segments() -> dict[str, bytes]:
    """Client streams whose meaning must not change with how they are cut into reads, as gRPC's
    clients send them: unary and streaming calls alone and interleaved, messages cut across DATA
    frames, header blocks across CONTINUATION frames, padding, an abort, an unknown method, a
    message too large, a call without its message, metadata, PINGs, a window that holds the
    answer until the client opens it, a GOAWAY to end."""
    from .grpc_front import ABORT, STREAM, UNARY, Client, unary

    def stream(client: Client, at: int, *messages: bytes) -> Client:
        return client.call(at, STREAM).send(at, *messages[:1]).send(at, *messages[1:], end=True)

    return {
        "short": Client(settings=()).call(1, UNARY, bare=True).send(1, b"hi", end=True).bytes(),
        "unary": unary(1, b"\x08\x01\x12\x05hello").bytes(),
        "stream": stream(Client(), 1, b"one", b"two", b"three").bytes(),
        "chunks": Client().call(1, STREAM).send(1, b"a" * 20, b"", b"b" * 7, chunk=3).end(1).bytes(),
        "interleaved": Client().call(1, STREAM).call(3, UNARY).send(1, b"s1").send(3, b"u", end=True)
        .call(5, UNARY, end=False).send(1, b"s2", end=True).send(5, b"v", end=True).bytes(),
        "continuation_padding": Client().call(1, UNARY, split=9).send(1, b"padded", end=True, pad=7).bytes(),
        "abort": unary(1, ABORT + b"!").call(3, STREAM).send(3, b"x", ABORT, b"y", end=True).bytes(),
        "unknown": Client().call(1, "/echo.Echo/Nope").send(1, b"?", end=True).call(3, UNARY)
        .send(3, b"after", end=True).bytes(),
        "too_large": Client().call(1, UNARY).send(1, b"L" * 1100, end=True, chunk=500).call(3, UNARY)
        .send(3, b"small", end=True).bytes(),
        "no_message": Client().call(1, UNARY, end=True).bytes(),
        "metadata": unary(1, b"m", metadata=(("grpc-timeout", "120S"), ("x-request-id", "7"),
                                             ("trace-bin", "AAH/"))).bytes(),
        "pings": Client().ping().call(1, UNARY).ping(b"\x00" * 8).send(1, b"p", end=True).bytes(),
        "window": Client(settings=((4, 0),)).call(1, UNARY).send(1, b"held back", end=True)
        .window(1, 7).window(1, 100).bytes(),
        "settings_ack_goaway": unary(1, b"g").control(4, 1).control(7, 0, 0, bytes(8)).bytes(),
    }


def grpc_front() -> dict[str, bytes]:
    """A selector byte (how the rest is cut into reads: tests/fuzz/grpc_front.py `reads`), then what
    a client sends on one connection: every steady stream, and streams whose answers depend on
    timing or that break the protocol: a reset mid-call, too many PINGs, more streams than
    allowed, metadata too large, a compressed message, two messages to a unary method, GET, a
    wrong content-type, a deadline that passes, a GOAWAY then a call, a frame on stream 0, a
    wrong preface."""
    from .grpc_front import STREAM, UNARY, Client, unary

    streams = grpc_segments()
    many = Client()
    for at in range(1, 20, 2):
        many.call(at, STREAM).send(at, b"%d" % at)
    seeds = {name: bytes([selector]) + data for (name, data), selector in zip(streams.items(), [0, 1, 2, 3, 6, 9, 13]
                                                                              * 2)}
    cases = {
        "reset_mid_call": Client().call(1, STREAM).send(1, b"first").reset(1).call(3, UNARY)
        .send(3, b"next", end=True),
        "too_many_pings": Client().call(1, STREAM).send(1, b"open").ping().ping().ping().ping().send(1, b"late"),
        "refused_streams": many,
        "large_metadata": unary(1, b"x", metadata=(("x-big", "y" * 600),)).call(3, UNARY).send(3, b"ok", end=True),
        "compressed": Client().call(1, UNARY, metadata=(("grpc-encoding", "gzip"),))
        .send(1, b"\x1f\x8b", end=True, compressed=True),
        "two_messages": Client().call(1, UNARY).send(1, b"one", b"two", end=True),
        "get": Client().call(1, UNARY, method="GET").send(1, b"x", end=True),
        "content_type": Client().call(1, UNARY, metadata=(("content-type", "text/plain"),)).send(1, b"x", end=True),
        "deadline": Client().call(1, STREAM, metadata=(("grpc-timeout", "1n"),)).send(1, b"late"),
        "goaway_then_call": unary(1, b"a").control(7, 0, 0, bytes(8)).call(3, UNARY).send(3, b"b", end=True),
        "stream_zero": unary(1, b"a").control(0, 0, 0, b"\x00\x00\x00\x00\x00"),
    }
    for k, (name, client) in enumerate(cases.items()):
        seeds[name] = bytes([(0, 1, 7, 11)[k % 4]]) + client.bytes()
    seeds["preface"] = b"\x00PRI * HTTP/1.1\r\n\r\n" + unary(1, b"a").bytes()[24:]
    return seeds


def main() -> None:
    random.seed(12)
    for target, make in (("v2_json", v2_json), ("v2_binary", v2_binary), ("msgpack", msgpack),
                         ("tfserving", tfserving), ("grpc", grpc), ("http_front", http_front),
                         ("http_segments", http_segments), ("grpc_front", grpc_front),
                         ("grpc_segments", grpc_segments)):
        folder = CORPUS / target
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        for name, data in make().items():
            (folder / name).write_bytes(data)
        print(f"{folder.relative_to(ROOT.parent.parent)}: {len(list(folder.iterdir()))} files")


if __name__ == "__main__":
    main()
