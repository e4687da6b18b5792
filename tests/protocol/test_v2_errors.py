"""Every malformed V2 request is an InvalidInput naming the field, expected and received."""

from __future__ import annotations

import json
import random
import re
from typing import Any

import msgspec
import pytest

from aserve.errors import InvalidInput
from aserve.inference import InferResponse
from aserve.protocol import decode_infer, encode_infer
from aserve.tensor import Tensor

from .helpers import model, raw, schema

MODEL = model([("A", "INT32", (-1, 2)), ("B", "FP32", (-1, 3))], [("Y", "INT32", (-1, 2))])


def inp(name: str = "A", shape: Any = (1, 2), datatype: str = "INT32", data: Any = (1, 2), **extra: Any):
    d: dict[str, Any] = {"name": name, "shape": list(shape), "datatype": datatype}
    if data is not None:
        d["data"] = list(data) if isinstance(data, tuple) else data
    d.update(extra)
    return d


B = inp("B", (1, 3), "FP32", (1.0, 2.0, 3.0))


def fails(body: bytes, *, header_length: int | None = None, content_type: str | None = None) -> str:
    with pytest.raises(InvalidInput) as info:
        decode_infer(
            body, content_type=content_type, header_length=header_length, schema=schema(MODEL, 4)
        )
    return str(info.value)


JSON_CASES: list[tuple[str, Any, str]] = [
    ("not an object", [], "request body: expected `object`, got `array`"),
    ("no inputs", {}, "request body: object missing required field `inputs`"),
    (
        "input without name",
        {"inputs": [{"shape": [1], "datatype": "INT32"}]},
        "inputs[0]: object missing required field `name`",
    ),
    (
        "unknown datatype",
        {"inputs": [inp(datatype="INT3"), B]},
        (
            "inputs[0].datatype: expected one of BOOL, UINT8, UINT16, UINT32, UINT64, INT8, INT16, INT32, INT64, "
            "FP16, FP32, FP64, BF16, BYTES, got 'INT3'"
        ),
    ),
    (
        "datatype not the model's",
        {"inputs": [inp(datatype="INT64"), B]},
        "inputs[0].datatype: input 'A' of model 'm' is INT32, got INT64",
    ),
    (
        "wrong rank",
        {"inputs": [inp(shape=(2,)), B]},
        (
            "inputs[0].shape: input 'A' of model 'm' expects [-1, 2] (-1: any size; the first is the batch, "
            "at most 4), got [2]"
        ),
    ),
    (
        "wrong dimension",
        {"inputs": [inp(), inp("B", (1, 2), "FP32", (1.0, 2.0))]},
        (
            "inputs[1].shape: input 'B' of model 'm' expects [-1, 3] (-1: any size; the first is the batch, "
            "at most 4), got [1, 2]"
        ),
    ),
    (
        "batch above max_batch_size",
        {"inputs": [inp(shape=(5, 2), data=[1] * 10), inp("B", (5, 3), "FP32", [1.0] * 15)]},
        "inputs[0].shape[0]: batch size of input 'A' must be 1..4, got 5",
    ),
    (
        "empty batch",
        {"inputs": [inp(shape=(0, 2), data=[]), inp("B", (0, 3), "FP32", [])]},
        "inputs[0].shape[0]: batch size of input 'A' must be 1..4, got 0",
    ),
    (
        "batch sizes differ",
        {"inputs": [inp(shape=(2, 2), data=[1] * 4), B]},
        "inputs[1].shape[0]: batch size 1 of input 'B' differs from 2 of input 'A'",
    ),
    (
        "negative dimension",
        {"inputs": [inp(shape=(1, -2)), B]},
        "inputs[0].shape[1]: expected `int` >= 0, got -2",
    ),
    (
        "dimension not a number",
        {"inputs": [inp(shape=(1, "2")), B]},
        "inputs[0].shape[1]: expected `int`, got `str`",
    ),
    (
        "too many elements",
        {"inputs": [inp(data=(1, 2, 3)), B]},
        "inputs[0].data: shape [1, 2] needs 2 elements, got 3",
    ),
    (
        "too few elements",
        {"inputs": [inp(), inp("B", (1, 3), "FP32", (1.0,))]},
        "inputs[1].data: shape [1, 3] needs 3 elements, got 1",
    ),
    (
        "ragged nested data",
        {"inputs": [inp(shape=(2, 2), data=[[1, 2], [3]]), inp("B", (2, 3), "FP32", [1.0] * 6)]},
        "inputs[0].data: nested data does not match shape [2, 2]: dimension 1 has 1, 2 elements, expected 2",
    ),
    (
        "nested data short",
        {"inputs": [inp(shape=(2, 2), data=[[1, 2]]), inp("B", (2, 3), "FP32", [1.0] * 6)]},
        "inputs[0].data: nested data does not match shape [2, 2]: dimension 0 has 1 elements, expected 2",
    ),
    (
        "nested data too deep",
        {"inputs": [inp(data=[[[1, 2]]]), B]},
        "inputs[0].data[0][0]: expected `int`, got `array`",
    ),
    ("missing input", {"inputs": [inp()]}, "inputs: missing input 'B' of model 'm' (expects 'A', 'B')"),
    (
        "unknown input",
        {"inputs": [inp(), B, inp("C")]},
        "inputs[2].name: model 'm' has no input 'C'; expected one of 'A', 'B'",
    ),
    (
        "duplicate input",
        {"inputs": [inp(), B, inp()]},
        "inputs[2].name: duplicate input 'A' (also inputs[0])",
    ),
    (
        "string for an integer",
        {"inputs": [inp(data=(1, "x")), B]},
        "inputs[0].data[1]: expected `int`, got `str`",
    ),
    (
        "float for an integer",
        {"inputs": [inp(data=(1, 1.5)), B]},
        "inputs[0].data[1]: expected `int`, got `float`",
    ),
    (
        "bool for an integer",
        {"inputs": [inp(data=(1, True)), B]},
        "inputs[0].data[1]: expected `int`, got `bool`",
    ),
    (
        "integer out of range",
        {"inputs": [inp(data=(1, 2**31)), B]},
        "inputs[0].data[1]: expected `int` <= 2147483647, got 2147483648",
    ),
    (
        "nested element out of range",
        {"inputs": [inp(data=[[1, -(2**31) - 1]]), B]},
        "inputs[0].data[0][1]: expected `int` >= -2147483648, got -2147483649",
    ),
    (
        "string for a float",
        {"inputs": [inp(), inp("B", (1, 3), "FP32", (1.0, "2", 3.0))]},
        "inputs[1].data[1]: expected `float`, got `str`",
    ),
    (
        "data null",
        {"inputs": [inp(data=None) | {"data": None}, B]},
        "inputs[0].data: expected `array`, got `null`",
    ),
    ("data an object", {"inputs": [inp(data={"a": 1}), B]}, "inputs[0].data: expected `array`, got `object`"),
    (
        "no data",
        {"inputs": [inp(data=None), B]},
        "inputs[0].data: missing (give data or parameters.binary_data_size)",
    ),
    ("id not a string", {"id": 3, "inputs": [inp(), B]}, "id: expected `str | null`, got `int`"),
    (
        "unknown requested output",
        {"inputs": [inp(), B], "outputs": [{"name": "Z"}]},
        "outputs[0].name: model 'm' has no output 'Z'; expected one of 'Y'",
    ),
    (
        "output requested twice",
        {"inputs": [inp(), B], "outputs": [{"name": "Y"}, {"name": "Y"}]},
        "outputs[1].name: output 'Y' requested twice",
    ),
    (
        "classification count negative",
        {"inputs": [inp(), B], "outputs": [{"name": "Y", "parameters": {"classification": -2}}]},
        "outputs[0].parameters.classification: expected `int` >= 0, got -2",
    ),
    (
        "output shared memory",
        {"inputs": [inp(), B], "outputs": [{"name": "Y", "parameters": {"shared_memory_region": "r"}}]},
        "outputs[0].parameters.shared_memory_region: shared memory is not supported",
    ),
    (
        "input shared memory",
        {"inputs": [inp(data=None, parameters={"shared_memory_region": "r"}), B]},
        "inputs[0].parameters.shared_memory_region: shared memory is not supported",
    ),
    (
        "binary_data not a bool",
        {"inputs": [inp(), B], "outputs": [{"name": "Y", "parameters": {"binary_data": 1}}]},
        "outputs[0].parameters.binary_data: expected `bool | null`, got `int`",
    ),
    (
        "binary_data_output not a bool",
        {"inputs": [inp(), B], "parameters": {"binary_data_output": "yes"}},
        "parameters.binary_data_output: expected true or false, got 'yes'",
    ),
    (
        "timeout zero",
        {"inputs": [inp(), B], "parameters": {"timeout": 0}},
        "parameters.timeout: expected microseconds > 0, got 0",
    ),
    (
        "timeout a string",
        {"inputs": [inp(), B], "parameters": {"timeout": "5"}},
        "parameters.timeout: expected microseconds > 0, got '5'",
    ),
    (
        "parameters not an object",
        {"inputs": [inp(), B], "parameters": [1]},
        "parameters: expected `object | null`, got `array`",
    ),
    (
        "binary_data_size negative",
        {"inputs": [inp(data=None, parameters={"binary_data_size": -1}), B]},
        "inputs[0].parameters.binary_data_size: expected `int` >= 0, got -1",
    ),
    (
        "binary_data_size not a number",
        {"inputs": [inp(data=None, parameters={"binary_data_size": "8"}), B]},
        "inputs[0].parameters.binary_data_size: expected `int | null`, got `str`",
    ),
]


@pytest.mark.parametrize(("body", "message"), [c[1:] for c in JSON_CASES], ids=[c[0] for c in JSON_CASES])
def test_json_request_errors(body: Any, message: str) -> None:
    assert fails(json.dumps(body).encode()) == message


def test_bytes_elements_must_be_strings() -> None:
    m = model([("S", "BYTES", (-1,))])
    body = json.dumps(
        {"inputs": [{"name": "S", "shape": [2], "datatype": "BYTES", "data": ["a", 5]}]}
    ).encode()
    with pytest.raises(InvalidInput, match=r"^inputs\[0\]\.data\[1\]: expected `str`, got `int`$"):
        decode_infer(body, content_type=None, header_length=None, schema=schema(m, 2))
    packed = msgspec.msgpack.encode(
        {"inputs": [{"name": "S", "shape": [2], "datatype": "BYTES", "data": [b"a", 5]}]}
    )
    with pytest.raises(
        InvalidInput, match=r"^inputs\[0\]\.data\[1\]: BYTES element must be a string, got int$"
    ):
        decode_infer(
            packed, content_type="application/msgpack", header_length=None, schema=schema(m, 2)
        )


def test_uint64_above_range() -> None:
    m = model([("U", "UINT64", (-1,))])
    body = json.dumps(
        {"inputs": [{"name": "U", "shape": [2], "datatype": "UINT64", "data": [1, 2**64]}]}
    ).encode()
    with pytest.raises(
        InvalidInput, match=r"^inputs\[0\]\.data\[1\]: 18446744073709551616 is out of range for UINT64$"
    ):
        decode_infer(body, content_type=None, header_length=None, schema=schema(m, 2))


def test_malformed_bodies() -> None:
    assert fails(b'{"inputs": [') == "request body: malformed JSON: Input data was truncated"
    assert fails(b"\x81\xa6inputs\x91\x83", content_type="application/msgpack") == (
        "request body: malformed msgpack: Input data was truncated"
    )
    assert fails(b"\xff\xfe").startswith("request body: malformed JSON: JSON is malformed: invalid character")
    # msgspec words bad UTF-8 as its own error from 0.23 ("Invalid UTF-8 encoded string"), as
    # Python's UnicodeDecodeError before ("'utf-8' codec can't decode byte 0xff ...")
    bad_text = fails(b'{"id": "\xff", "inputs": []}')
    assert bad_text.startswith("request body: malformed JSON: ") and "utf-8" in bad_text.lower()


# ---- the binary tensor extension ----

A_BYTES = raw("INT32", [1, 2])


def binary_body(*inputs: dict[str, Any], tail: bytes = A_BYTES) -> tuple[bytes, int]:
    header = json.dumps({"inputs": list(inputs)}).encode()
    return header + tail, len(header)


def binary_a(size: int = 8, **extra: Any) -> dict[str, Any]:
    return inp(data=None, parameters={"binary_data_size": size}, **extra)


def test_binary_data_needs_the_header_length() -> None:
    body, _ = binary_body(binary_a(), B)
    assert re.fullmatch(
        r"request body: malformed JSON: JSON is malformed: trailing characters \(byte \d+\) \(binary tensors "
        r"after the JSON need the Inference-Header-Content-Length header\)",
        fails(body),
    )
    body, _n = binary_body(binary_a(), B, tail=b"")
    assert fails(body) == (
        "inputs[0].parameters.binary_data_size: binary data needs the Inference-Header-Content-Length header"
    )


def test_binary_sizes_must_add_up_to_the_body() -> None:
    body, n = binary_body(binary_a(), B, tail=A_BYTES + b"zz")
    assert fails(body, header_length=n) == (
        f"Inference-Header-Content-Length: inputs' binary_data_size add up to 8 bytes, but 10 bytes "
        f"follow the {n}-byte header"
    )
    body, n = binary_body(binary_a(), B, tail=A_BYTES[:5])
    assert fails(body, header_length=n) == (
        "inputs[0].parameters.binary_data_size: 8 bytes at offset 0 run past the binary data after the "
        "header (5 bytes)"
    )


def test_header_length_must_fit_the_body() -> None:
    body, n = binary_body(binary_a(), B)
    for bad in (len(body) + 1, 0, -4):
        assert fails(body, header_length=bad) == (
            f"Inference-Header-Content-Length: expected 1..{len(body)} (the body's length), got {bad}"
        )
    assert fails(body, header_length=n - 3).startswith("request body: malformed JSON")


def test_binary_size_must_match_the_shape() -> None:
    body, n = binary_body(binary_a(4), B, tail=A_BYTES[:4])
    assert (
        fails(body, header_length=n)
        == "inputs[0].parameters.binary_data_size: INT32 [1, 2] needs 8 bytes, got 4"
    )


def test_data_and_binary_data_size_exclude_each_other() -> None:
    body, n = binary_body(inp(parameters={"binary_data_size": 8}), B)
    assert fails(body, header_length=n) == "inputs[0]: has both data and parameters.binary_data_size"


def test_binary_bytes_tensors_are_checked() -> None:
    m = model([("S", "BYTES", (-1,))])

    def decode(tail: bytes, shape: list[int]) -> str:
        header = json.dumps(
            {
                "inputs": [
                    {
                        "name": "S",
                        "shape": shape,
                        "datatype": "BYTES",
                        "parameters": {"binary_data_size": len(tail)},
                    }
                ]
            }
        ).encode()
        with pytest.raises(InvalidInput) as info:
            decode_infer(
                header + tail, content_type=None, header_length=len(header), schema=schema(m, 4)
            )
        return str(info.value)

    assert decode(b"\x05\x00\x00\x00abc", [1]) == (
        "inputs[0] binary data: BYTES element 0: length 5 runs past the end of the data (7 bytes)"
    )
    assert decode(raw("BYTES", ["a"]) + b"\x01\x00", [2]) == (
        "inputs[0] binary data: BYTES element 1: 4-byte length prefix truncated at byte 5 of 7"
    )
    assert decode(raw("BYTES", ["a", "b"]), [3]) == (
        "inputs[0].parameters.binary_data_size: BYTES [3] needs 3 elements, got 2"
    )


def test_msgpack_raw_data_must_match_the_shape() -> None:
    packed = msgspec.msgpack.encode(
        {"inputs": [inp(data=b"\x00" * 7), inp("B", (1, 3), "FP32", b"\x00" * 12)]}
    )
    assert (
        fails(packed, content_type="application/msgpack")
        == "inputs[0].data: INT32 [1, 2] needs 8 bytes, got 7"
    )


def test_bytes_output_that_is_not_utf8_needs_binary() -> None:
    m = model([("S", "BYTES", (-1,))])
    body = json.dumps({"inputs": [{"name": "S", "shape": [1], "datatype": "BYTES", "data": ["a"]}]}).encode()
    request = decode_infer(body, content_type=None, header_length=None, schema=schema(m, 2))
    with pytest.raises(
        InvalidInput, match=r"BYTES output 'S' is not UTF-8 text .*parameters.binary_data = true"
    ):
        encode_infer(
        InferResponse(model_name="m", model_version="1", outputs={"S": Tensor("BYTES", (1,), raw("BYTES", [b"\xff"]))}, id=request.id),
        request,
        accept=None,
        content_type=None,
    )


# ---- nothing but InvalidInput, whatever the body ----


def test_mangled_bodies_raise_only_invalid_input() -> None:
    rng = random.Random(1234)
    header, n = binary_body(binary_a(), inp("B", (1, 3), "FP32", (1.0, 2.0, 3.0)))
    seeds = [
        (
            json.dumps(
                {"inputs": [inp(), B], "outputs": [{"name": "Y"}], "parameters": {"timeout": 5}}
            ).encode(),
            None,
        ),
        (header, n),
    ]
    outcomes = {"ok": 0, "invalid": 0}
    for _ in range(3000):
        body, header_length = seeds[rng.randrange(2)]
        data = bytearray(body)
        for _ in range(rng.randint(1, 4)):
            op = rng.randrange(3)
            pos = rng.randrange(len(data))
            if op == 0:
                data[pos] = rng.randrange(256)
            elif op == 1:
                del data[pos : pos + rng.randint(1, 8)]
            else:
                data[pos:pos] = rng.choice([b"[", b"]", b"{", b"-1", b"1e999", b'"', b",", b"null", b"\x00"])
        if header_length is not None and rng.random() < 0.3:
            header_length = rng.randint(-2, len(data) + 2)
        try:
            decode_infer(
                bytes(data), content_type=None, header_length=header_length, schema=schema(MODEL, 4)
            )
            outcomes["ok"] += 1
        except InvalidInput:
            outcomes["invalid"] += 1
    assert outcomes["invalid"] > 2000 and outcomes["ok"] > 0


def test_mangled_msgpack_raises_only_invalid_input() -> None:
    """Bytes of a msgpack request changed at random: InvalidInput, or (a change the message
    survives, such as in a value) a request whose tensors match their shapes."""
    rng = random.Random(99)
    body = msgspec.msgpack.encode({"inputs": [inp(data=A_BYTES), B], "id": "x"})
    outcomes = {"ok": 0, "invalid": 0}
    for _ in range(2000):
        data = bytearray(body)
        for _ in range(rng.randint(1, 3)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        try:
            request = decode_infer(
                bytes(data),
                content_type="application/msgpack",
                header_length=None,
                schema=schema(MODEL, 4),
            )
        except InvalidInput:
            outcomes["invalid"] += 1
            continue
        outcomes["ok"] += 1
        assert [t.datatype for t in request.inputs] == ["INT32", "FP32"]
        for t in request.inputs:
            t.check()  # bytes = elements x item size
            assert t.shape[0] == request.samples and 1 <= request.samples <= 4
    assert outcomes["invalid"] > 1500 and outcomes["ok"] > 100, outcomes


@pytest.mark.parametrize(
    ("datatype", "data", "message"),
    [
        ("FP16", b"[1.0, 1e6]", "inputs[0].data[1]: expected `float` <= 65504.0, got 1000000.0"),
        ("FP32", b"[1e39, 1.0]", "inputs[0].data[0]: expected `float` <= 3.4028234663852886e+38, got 1e+39"),
        (
            "BF16",
            b"[1.0, -1e300]",
            "inputs[0].data[1]: expected `float` >= -3.3895313892515355e+38, got -1e+300",
        ),
        ("FP64", b"[1.0, 1e400]", "inputs[0].data[1]: number out of range"),
        ("UINT8", b"[1, -1]", "inputs[0].data[1]: expected `int` >= 0, got -1"),
        ("BOOL", b"[true, 1]", "inputs[0].data[1]: expected `bool`, got `int`"),
    ],
)
def test_numbers_outside_the_datatype(datatype: str, data: bytes, message: str) -> None:
    m = model([("X", datatype, (-1,))])
    body = b'{"inputs": [{"name": "X", "shape": [2], "datatype": "%s", "data": %s}]}' % (
        datatype.encode(),
        data,
    )
    with pytest.raises(InvalidInput) as info:
        decode_infer(body, content_type=None, header_length=None, schema=schema(m, 2))
    assert str(info.value) == message
