"""V2 infer messages: every datatype through JSON, binary tensors and msgpack, both ways."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import numpy as np
import pytest

from aserve.errors import InvalidInput
from aserve.inference import InferResponse
from aserve.protocol import HEADER_LENGTH, InferRequest, decode_infer, encode_infer
from aserve.tensor import Tensor

from .helpers import DATATYPES, VALUES, model, raw, schema

MSGPACK = "application/msgpack"


def one_input(datatype: str, shape: tuple[int, ...] = (-1, 3)):
    return model([("X", datatype, shape)], [("Y", datatype, shape)])


def decode(
    body: bytes | bytearray, m, *, content_type=None, header_length=None, max_batch_size=8
) -> InferRequest:
    return decode_infer(
        body, content_type=content_type, header_length=header_length, schema=schema(m, max_batch_size)
    )


def respond(request: InferRequest, outputs: dict[str, Tensor], *, accept=None, content_type=None):
    chunks, headers = encode_infer(
        InferResponse(model_name="m", model_version="3", outputs=outputs, id=request.id),
        request,
        accept=accept,
        content_type=content_type,
    )
    return b"".join(bytes(c) for c in chunks), headers


def split_response(body: bytes, headers: dict[str, str]) -> tuple[dict[str, Any], bytes]:
    n = int(headers[HEADER_LENGTH]) if HEADER_LENGTH in headers else len(body)
    return json.loads(body[:n]), body[n:]


@pytest.mark.parametrize("datatype", DATATYPES)
@pytest.mark.parametrize("nested", [False, True], ids=["flat", "nested"])
def test_json_round_trip(datatype: str, nested: bool) -> None:
    values = VALUES[datatype]
    data = [values[:3], values[3:]] if nested else values
    body = json.dumps(
        {"id": "req-1", "inputs": [{"name": "X", "shape": [2, 3], "datatype": datatype, "data": data}]}
    ).encode()
    request = decode(body, one_input(datatype))
    tensor = request.named()["X"]
    assert (tensor.datatype, tensor.shape, request.samples, request.id) == (datatype, (2, 3), 2, "req-1")
    assert bytes(tensor.view()) == raw(datatype)

    out, headers = respond(request, {"Y": tensor})
    assert headers == {"Content-Type": "application/json"}
    message = json.loads(out)
    assert message["model_name"] == "m" and message["model_version"] == "3" and message["id"] == "req-1"
    [y] = message["outputs"]
    assert (y["name"], y["datatype"], y["shape"]) == ("Y", datatype, [2, 3])
    assert y["data"] == values  # flat, as Triton answers
    assert "parameters" not in y


@pytest.mark.parametrize("datatype", DATATYPES)
def test_binary_round_trip(datatype: str) -> None:
    blob = raw(datatype)
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "X",
                    "shape": [2, 3],
                    "datatype": datatype,
                    "parameters": {"binary_data_size": len(blob)},
                }
            ],
            "outputs": [{"name": "Y", "parameters": {"binary_data": True}}],
        }
    ).encode()
    request = decode(header + blob, one_input(datatype), header_length=len(header))
    assert bytes(request.named()["X"].view()) == blob
    assert [(o.name, o.binary) for o in request.outputs] == [("Y", True)]

    out, headers = respond(request, {"Y": request.named()["X"]})
    assert headers["Content-Type"] == "application/octet-stream"
    message, tail = split_response(out, headers)
    [y] = message["outputs"]
    assert y == {
        "name": "Y",
        "datatype": datatype,
        "shape": [2, 3],
        "parameters": {"binary_data_size": len(blob)},
    }
    assert tail == blob


@pytest.mark.parametrize("datatype", DATATYPES)
@pytest.mark.parametrize("as_bytes", [True, False], ids=["raw", "list"])
def test_msgpack_round_trip(datatype: str, as_bytes: bool) -> None:
    values = VALUES[datatype]
    if as_bytes:
        data: Any = raw(datatype)
    elif datatype == "BYTES":
        data = [v.encode() for v in values[:3]] + values[3:]  # bin and str elements mix
    else:
        data = [values[:3], values[3:]]
    body = msgspec.msgpack.encode(
        {"id": "p", "inputs": [{"name": "X", "shape": [2, 3], "datatype": datatype, "data": data}]}
    )
    request = decode(body, one_input(datatype), content_type=MSGPACK)
    assert bytes(request.named()["X"].view()) == raw(datatype)

    out, headers = respond(request, {"Y": request.named()["X"]}, content_type=MSGPACK)
    assert headers == {"Content-Type": MSGPACK}
    message = msgspec.msgpack.decode(out)
    [y] = message["outputs"]
    assert (message["id"], y["name"], y["shape"]) == ("p", "Y", [2, 3])
    if datatype == "BYTES":
        assert y["data"] == [v.encode() for v in values]
    else:
        assert y["data"] == raw(datatype)  # raw little-endian bytes, answered in kind


def test_accept_overrides_request_format() -> None:
    m = one_input("INT32")
    body = json.dumps(
        {"inputs": [{"name": "X", "shape": [1, 3], "datatype": "INT32", "data": [1, 2, 3]}]}
    ).encode()
    request = decode(body, m)
    out, headers = respond(request, {"Y": request.named()["X"]}, accept="application/msgpack")
    assert headers["Content-Type"] == MSGPACK
    assert msgspec.msgpack.decode(out)["outputs"][0]["data"] == np.array([1, 2, 3], np.int32).tobytes()

    packed = msgspec.msgpack.encode(
        {"inputs": [{"name": "X", "shape": [1, 3], "datatype": "INT32", "data": [1, 2, 3]}]}
    )
    request = decode(packed, m, content_type="application/x-msgpack")
    out, headers = respond(
        request, {"Y": request.named()["X"]}, accept="application/json", content_type=MSGPACK
    )
    assert headers["Content-Type"] == "application/json"
    assert json.loads(out)["outputs"][0]["data"] == [1, 2, 3]


def test_binary_inputs_are_views_into_the_body() -> None:
    m = model([("A", "FP32", (-1, 4)), ("B", "INT64", (-1, 2)), ("S", "BYTES", (-1,))])
    a = np.arange(8, dtype=np.float32)
    b = np.array([7, 8, 9, 10], dtype=np.int64)
    s = raw("BYTES", ["one", "two"])
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "A",
                    "shape": [2, 4],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": a.nbytes},
                },
                {
                    "name": "B",
                    "shape": [2, 2],
                    "datatype": "INT64",
                    "parameters": {"binary_data_size": b.nbytes},
                },
                {"name": "S", "shape": [2], "datatype": "BYTES", "parameters": {"binary_data_size": len(s)}},
            ]
        }
    ).encode()
    body = bytearray(header + a.tobytes() + b.tobytes() + s)
    request = decode(body, m, header_length=len(header))
    whole = np.frombuffer(body, dtype=np.uint8)
    for name in ("A", "B", "S"):
        assert np.shares_memory(np.frombuffer(request.named()[name].data, dtype=np.uint8), whole)
    body[len(header)] ^= 0xFF  # the body changes: the tensor sees it (no copy was made)
    assert np.frombuffer(request.named()["A"].data, dtype=np.float32)[0] != 0.0
    assert np.frombuffer(request.named()["B"].data, dtype=np.int64).tolist() == [7, 8, 9, 10]
    assert bytes(request.named()["S"].data) == s


def test_msgpack_raw_data_is_a_view_into_the_body() -> None:
    m = one_input("FP64")
    body = bytearray(
        msgspec.msgpack.encode(
            {"inputs": [{"name": "X", "shape": [2, 3], "datatype": "FP64", "data": raw("FP64")}]}
        )
    )
    request = decode(body, m, content_type=MSGPACK)
    assert np.shares_memory(
        np.frombuffer(request.named()["X"].data, dtype=np.uint8), np.frombuffer(body, dtype=np.uint8)
    )


def test_binary_outputs_are_the_output_buffers() -> None:
    m = model([("X", "FP32", (-1, 4))], [("Y", "FP32", (-1, 4)), ("Z", "INT8", (-1, 4))])
    body = json.dumps(
        {
            "inputs": [{"name": "X", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    request = decode(body, m)
    y = bytearray(np.arange(4, dtype=np.float32).tobytes())
    z = bytearray(b"\x01\x02\x03\x04")
    chunks, headers = encode_infer(
        InferResponse(model_name="m", model_version="1", outputs={"Y": Tensor("FP32", (1, 4), y), "Z": Tensor("INT8", (1, 4), z)}, id=request.id),
        request,
        accept=None,
        content_type=None,
    )
    header, *blobs = chunks
    assert int(headers[HEADER_LENGTH]) == len(header)
    message = json.loads(bytes(header))
    assert message["model_version"] == "1" and "id" not in message  # Triton always names the version
    assert [o["parameters"] for o in message["outputs"]] == [
        {"binary_data_size": 16},
        {"binary_data_size": 4},
    ]
    assert [
        np.shares_memory(np.frombuffer(c, np.uint8), np.frombuffer(buf, np.uint8))
        for c, buf in zip(blobs, (y, z))
    ] == [True, True]


def test_requested_outputs_select_and_order_the_response() -> None:
    m = model(
        [("X", "INT32", (-1, 2))], [("P", "INT32", (-1, 2)), ("Q", "INT32", (-1, 2)), ("R", "INT8", (-1, 2))]
    )
    body = json.dumps(
        {
            "inputs": [{"name": "X", "shape": [1, 2], "datatype": "INT32", "data": [5, 6]}],
            "outputs": [{"name": "R"}, {"name": "P", "parameters": {"binary_data": True}}],
            "parameters": {"binary_data_output": False},
        }
    ).encode()
    request = decode(body, m)
    x = request.named()["X"]
    out, headers = respond(request, {"P": x, "Q": x, "R": Tensor("INT8", (1, 2), b"\x09\x0a")})
    message, tail = split_response(out, headers)
    assert [o["name"] for o in message["outputs"]] == ["R", "P"]
    assert message["outputs"][0]["data"] == [9, 10]
    assert tail == x.view().tobytes()


def test_binary_data_output_applies_to_unlisted_outputs() -> None:
    m = model([("X", "INT32", (-1, 2))], [("P", "INT32", (-1, 2)), ("Q", "INT32", (-1, 2))])
    body = json.dumps(
        {
            "inputs": [{"name": "X", "shape": [1, 2], "datatype": "INT32", "data": [5, 6]}],
            "outputs": [{"name": "Q"}, {"name": "P", "parameters": {"binary_data": False}}],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    request = decode(body, m)
    assert [(o.name, o.binary) for o in request.outputs] == [("Q", True), ("P", False)]


def test_timeout_parameter_is_in_microseconds() -> None:
    m = one_input("INT8")
    body = json.dumps(
        {
            "inputs": [{"name": "X", "shape": [1, 3], "datatype": "INT8", "data": [1, 2, 3]}],
            "parameters": {"timeout": 2500, "custom": "kept"},
        }
    ).encode()
    request = decode(body, m)
    assert request.timeout_ms == 2.5
    assert request.parameters == {"timeout": 2500, "custom": "kept"}
    assert decode(body.replace(b'"timeout": 2500, ', b""), m).timeout_ms is None


def test_model_without_batching_counts_one_sample() -> None:
    m = model([("X", "FP32", (4, -1))])
    body = json.dumps(
        {"inputs": [{"name": "X", "shape": [4, 1], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
    ).encode()
    request = decode(body, m, max_batch_size=0)
    assert request.samples == 1 and request.named()["X"].shape == (4, 1)


def test_scalar_and_empty_tensors() -> None:
    m = model([("S", "FP64", ()), ("E", "INT32", (-1, 0))])
    body = json.dumps(
        {
            "inputs": [
                {"name": "S", "shape": [], "datatype": "FP64", "data": [2.5]},
                {"name": "E", "shape": [3, 0], "datatype": "INT32", "data": []},
            ]
        }
    ).encode()
    request = decode(body, m, max_batch_size=0)
    assert bytes(request.named()["S"].view()) == np.float64(2.5).tobytes()
    assert request.named()["E"].nbytes == 0 and request.named()["E"].shape == (3, 0)
    out, _ = respond(request, {"S": request.named()["S"], "E": request.named()["E"]})
    assert [o["data"] for o in json.loads(out)["outputs"]] == [[2.5], []]


def test_multidimensional_output_buffers_are_flattened() -> None:
    m = one_input("FP32", (-1, 3))
    body = json.dumps(
        {"inputs": [{"name": "X", "shape": [2, 3], "datatype": "FP32", "data": [0] * 6}]}
    ).encode()
    request = decode(body, m)
    y = np.arange(6, dtype=np.float32).reshape(2, 3)  # a 2-D buffer, format "f"
    out, _ = respond(request, {"Y": Tensor("FP32", (2, 3), y)})
    assert json.loads(out)["outputs"][0]["data"] == [0, 1, 2, 3, 4, 5]


def test_msgpack_nested_bytes_elements() -> None:
    m = model([("S", "BYTES", (-1, 2))])
    body = msgspec.msgpack.encode(
        {
            "inputs": [
                {"name": "S", "shape": [2, 2], "datatype": "BYTES", "data": [[b"a", "b"], [b"", "\u00e9"]]}
            ]
        }
    )
    request = decode(body, m, content_type=MSGPACK)
    assert bytes(request.named()["S"].view()) == raw("BYTES", ["a", "b", "", "\u00e9"])
    ragged = msgspec.msgpack.encode(
        {"inputs": [{"name": "S", "shape": [2, 2], "datatype": "BYTES", "data": [[b"a", "b"], [b""]]}]}
    )
    with pytest.raises(InvalidInput, match=r"^inputs\[0\]\.data: nested data does not match shape \[2, 2\]"):
        decode(ragged, m, content_type=MSGPACK)


def _binary_body(values: list[int], *, rows: int = 1, id: str | None = None) -> tuple[bytes, int]:
    data = np.array(values, dtype=np.int32).tobytes()
    head: dict[str, Any] = {
        "inputs": [{"name": "X", "shape": [rows, 3], "datatype": "INT32", "parameters": {"binary_data_size": len(data)}}]
    }
    if id is not None:
        head["id"] = id
    header = json.dumps(head).encode()
    return header + data, len(header)


def test_a_repeated_binary_header_is_decoded_once() -> None:
    s = schema(one_input("INT32"), 8)
    first, length = _binary_body([1, 2, 3])
    second, _ = _binary_body([4, 5, 6])
    a = decode_infer(first, content_type=None, header_length=length, schema=s)
    assert len(s.plans) == 1  # checked once, remembered
    b = decode_infer(second, content_type=None, header_length=length, schema=s)
    assert len(s.plans) == 1
    assert np.frombuffer(a.inputs[0].data, np.int32).tolist() == [1, 2, 3]
    assert np.frombuffer(b.inputs[0].data, np.int32).tolist() == [4, 5, 6]  # its own data, no copy
    assert (b.samples, b.inputs[0].shape, b.inputs[0].datatype) == (1, (1, 3), "INT32")
    # the same header over data of another length is decoded again and refused as it was
    short = second[: len(second) - 4]
    with pytest.raises(InvalidInput, match=r"12 bytes at offset 0 run past the binary data after the header \(8 bytes\)"):
        decode_infer(short, content_type=None, header_length=length, schema=s)


def test_the_header_plan_is_found_without_hashing_the_body() -> None:
    # a read-only view of an unhashable buffer: looking the plan up by the view itself
    # would hash (or fail to hash) the whole body, tensors and all
    s = schema(one_input("INT32"), 8)
    first, length = _binary_body([1, 2, 3])
    second, _ = _binary_body([7, 8, 9])
    for body in (first, second):
        view = memoryview(bytearray(body)).toreadonly()
        request = decode_infer(view, content_type=None, header_length=length, schema=s)
        assert np.frombuffer(request.inputs[0].data, np.int32).tolist() == list(np.frombuffer(body[length:], np.int32))
    assert len(s.plans) == 1


def test_headers_that_vary_are_not_remembered() -> None:
    s = schema(one_input("INT32"), 8)
    body, length = _binary_body([1, 2, 3], id="req-1")  # ids differ per request
    assert decode_infer(body, content_type=None, header_length=length, schema=s).id == "req-1"
    text = schema(one_input("BYTES", (-1,)), 8)  # BYTES element counts depend on the data
    data = raw("BYTES", ["a", "b"])
    header = json.dumps({"inputs": [
        {"name": "X", "shape": [2], "datatype": "BYTES", "parameters": {"binary_data_size": len(data)}}
    ]}).encode()
    decode_infer(header + data, content_type=None, header_length=len(header), schema=text)
    assert len(s.plans) == 0 and len(text.plans) == 0


def _outcome(body: Any, length: int, s: Any) -> Any:
    try:
        r = decode_infer(body, content_type=None, header_length=length, schema=s)
    except InvalidInput as exc:
        return "error", str(exc)
    return ([(t.datatype, t.shape, bytes(memoryview(t.data).cast("B"))) for t in r.inputs], r.samples, r.id,
            r.outputs, r.parameters, r.timeout_ms, r.latency_budget_ms, r.binary_outputs)


def test_remembered_headers_decode_as_the_codec_decodes_them_and_the_oldest_give_way() -> None:
    # `_native.V2Binary`: a warm schema (headers remembered, found in C) answers every
    # body as a cold one (plans forgotten before each decode) does: more distinct headers
    # than it keeps, writable bodies, data of another length, a changed byte in the header
    rng = np.random.default_rng(11)
    m = model([("A", "INT32", (-1, 2)), ("B", "FP16", (-1,))])
    warm, cold = schema(m, 8), schema(m, 8)
    remembered = 0
    for i in range(400):
        rows = int(rng.integers(1, 9))
        a = rng.integers(-9, 9, size=(rows, 2)).astype(np.int32).tobytes()
        b = rng.standard_normal(rows).astype(np.float16).tobytes()
        inputs = [{"name": "A", "shape": [rows, 2], "datatype": "INT32", "parameters": {"binary_data_size": len(a)}},
                  {"name": "B", "shape": [rows], "datatype": "FP16", "parameters": {"binary_data_size": len(b)}}]
        order = [0, 1] if i % 3 else [1, 0]
        # padding first: many distinct headers (more than are kept), the inputs in their last part
        head: dict[str, Any] = {"padding": "x" * int(rng.integers(0, 70)), "inputs": [inputs[k] for k in order]}
        if i % 5 == 0:
            head["parameters"] = {"binary_data_output": True, "timeout": int(rng.integers(1000, 10**6))}
        if i % 7 == 0:
            head["outputs"] = [{"name": "Y", "parameters": {"binary_data": bool(i % 2)}}]
        header = json.dumps(head).encode()
        data = b"".join([a, b][k] for k in order)
        body = header + data
        # then, after the header is remembered: the same header over a writable body, over data
        # of another length, or a byte changed in its last part
        variants: list[Any] = [bytearray(body), body[:-2], header.replace(b'"A"', b'"C"') + data]
        bodies = [body, variants[i % 3]]
        for body in bodies:
            for _ in range(2):
                cold.plans = None
                assert _outcome(body, len(header), warm) == _outcome(body, len(header), cold)
        remembered = max(remembered, len(warm.plans))
    assert remembered == 64  # it kept as many as it may, replacing the oldest


def test_a_header_is_remembered_only_with_its_inputs_within_the_data() -> None:
    from aserve import _native

    plans = _native.V2Binary(Tensor)
    with pytest.raises(ValueError, match="outside the binary data"):
        plans.remember(b"{}", 8, [("INT32", (1, 2), 4, 12)], None)
    with pytest.raises(TypeError):
        plans.remember(b"{}", 8, [("INT32", [1, 2], 0, 8)], None)
    assert len(plans) == 0
    plans.remember(b"{}", 8, [("INT32", (1, 2), 0, 8)], "record")
    found = plans.find(b"{}" + bytes(range(8)), 2)
    assert found is not None and found[1] == "record"
    assert bytes(found[0][0].data) == bytes(range(8)) and found[0][0].shape == (1, 2)
    assert plans.find(b"{}" + bytes(range(9)), 2) is None  # data of another length
    assert plans.find(b"{}" + bytes(range(8)), 2**70) is None  # a length past any body: the codec's error
    with pytest.raises(InvalidInput, match=r"expected 1\.\.10 \(the body's length\), got 1180591620717411303424"):
        decode_infer(b"{}" + bytes(range(8)), content_type=None, header_length=2**70, schema=schema(one_input("INT32"), 8))
    plans.remember(b"{}  ", 8, [("INT32", (1, 2), 0, 8)], "record")
    assert plans.find(memoryview(b"{}  " + bytes(range(8))).cast("i"), 4) is None  # not a byte view: the codec's
    plans.clear()
    assert len(plans) == 0 and plans.find(b"{}" + bytes(range(8)), 2) is None


@pytest.mark.parametrize("in_c", [False, True], ids=["codec", "in-c"])
def test_inputs_checked_before_are_still_checked_together(in_c: bool) -> None:
    # (name, datatype, shape) of an input is checked once per model load; what involves
    # the other inputs (duplicates, a common batch size) is checked on every request, by the
    # codec, and by the C path (`_native.V2Json`), which leaves every such request to the codec
    s = schema(model([("A", "INT32", (-1, 2)), ("B", "FP32", (-1, 2))]), 8)
    if not in_c:
        s.json_plan = None

    def body(*inputs: tuple[str, str, list[int]]) -> bytes:
        items = [{"name": n, "datatype": d, "shape": shape, "data": [1] * (shape[0] * shape[1])}
                 for n, d, shape in inputs]
        return json.dumps({"inputs": items}).encode()

    def decode_s(b: bytes) -> InferRequest:
        return decode_infer(b, content_type=None, header_length=None, schema=s)

    two = decode_s(body(("A", "INT32", [2, 2]), ("B", "FP32", [2, 2])))
    one = decode_s(body(("B", "FP32", [1, 2]), ("A", "INT32", [1, 2])))
    assert (two.samples, one.samples) == (2, 1)
    assert [t.shape for t in one.inputs] == [(1, 2), (1, 2)]  # in the schema's order
    assert len(s.checked) == (0 if in_c else 4)  # the C path checks the plain requests itself
    with pytest.raises(InvalidInput, match=r"inputs\[1\].shape\[0\]: batch size 1 of input 'B' differs from 2"):
        decode_s(body(("A", "INT32", [2, 2]), ("B", "FP32", [1, 2])))
    with pytest.raises(InvalidInput, match=r"inputs\[1\].name: duplicate input 'A' \(also inputs\[0\]\)"):
        decode_s(body(("A", "INT32", [2, 2]), ("A", "INT32", [2, 2])))
    with pytest.raises(InvalidInput, match=r"inputs: missing input 'B'"):
        decode_s(body(("A", "INT32", [1, 2])))
    with pytest.raises(InvalidInput, match=r"inputs\[0\].datatype: input 'A' of model 'm' is INT32, got FP32"):
        decode_s(body(("A", "FP32", [1, 2]), ("B", "FP32", [1, 2])))
    with pytest.raises(InvalidInput, match=r"inputs\[0\].shape\[0\]: batch size of input 'A' must be 1..8, got 9"):
        decode_s(body(("A", "INT32", [9, 2]), ("B", "FP32", [9, 2])))
    if not in_c:
        assert len(s.checked) == 4  # refused inputs are not remembered
