"""Content negotiation, message encoding, metadata and input validation."""

from __future__ import annotations

import json

import msgspec
import pytest

from aserve.engine.pool import ModelInfo
from aserve.errors import InvalidInput
from aserve.protocol import (
    ServerMetadata,
    content_type,
    decode_infer,
    encode_error,
    encode_message,
    model_metadata,
    negotiate,
)
from aserve.protocol.validate import Field, Inputs, check_data, v2_field
from aserve.tensor import Tensor

from .helpers import model, raw, schema


@pytest.mark.parametrize(
    ("accept", "request_type", "expected"),
    [
        (None, None, "json"),
        (None, "application/msgpack", "msgpack"),
        (None, "application/x-msgpack; charset=binary", "msgpack"),
        ("", "application/json", "json"),
        ("*/*", "application/msgpack", "msgpack"),
        ("application/*", None, "json"),
        ("application/msgpack", None, "msgpack"),
        ("application/x-msgpack", "application/json", "msgpack"),
        ("application/json", "application/msgpack", "json"),
        ("text/html, application/json;q=0.9", "application/msgpack", "json"),
        ("application/json;q=0.5, application/msgpack;q=0.8", None, "msgpack"),
        ("application/json;q=0.8, application/msgpack;q=0.8", "application/msgpack", "msgpack"),
        ("application/json;q=0.8, application/msgpack;q=0.8", None, "json"),
        ("application/msgpack;q=0, */*", None, "json"),
        ("APPLICATION/MSGPACK", None, "msgpack"),
        ("application/msgpack;q=abc", None, "json"),
        ("text/plain", "application/msgpack", "msgpack"),
    ],
)
def test_negotiate(accept: str | None, request_type: str | None, expected: str) -> None:
    assert negotiate(accept, request_type) == expected


def test_content_types() -> None:
    assert content_type("json") == "application/json"
    assert content_type("msgpack") == "application/msgpack"
    assert content_type("msgpack", "application/x-msgpack") == "application/x-msgpack"


def test_encode_error_in_both_formats() -> None:
    body, ctype = encode_error("inputs[0].shape: bad", accept=None)
    assert (json.loads(body), ctype) == ({"error": "inputs[0].shape: bad"}, "application/json")
    body, ctype = encode_error("nope", accept="application/msgpack")
    assert (msgspec.msgpack.decode(body), ctype) == ({"error": "nope"}, "application/msgpack")


def test_metadata_messages() -> None:
    m = model([("X", "FP32", (-1, 4))], [("Y", "INT64", (-1,))], name="mlp")
    meta = model_metadata(m, versions=["1"])
    expected = {
        "name": "mlp",
        "versions": ["1"],
        "platform": "python",
        "inputs": [{"name": "X", "datatype": "FP32", "shape": [-1, 4]}],
        "outputs": [{"name": "Y", "datatype": "INT64", "shape": [-1]}],
    }
    assert json.loads(encode_message(meta, "json")) == expected
    assert msgspec.msgpack.decode(encode_message(meta, "msgpack")) == expected
    assert "versions" not in json.loads(encode_message(model_metadata(m), "json"))
    server = ServerMetadata(name="aserve", version="0.1.0", extensions=["binary_tensor_data"])
    assert json.loads(encode_message(server, "json"))["extensions"] == ["binary_tensor_data"]
    assert encode_message({"ready": True}, "json") == b'{"ready":true}'


MODEL = model([("A", "INT32", (-1, 2)), ("S", "BYTES", (-1,))])


def validate_inputs(inputs: dict[str, Tensor], info: ModelInfo, *, max_batch_size: int,
                    field: Field = v2_field) -> int:
    """What every codec does with the inputs it decoded: each checked, its data sized, none missing."""
    checked = Inputs(schema(info, max_batch_size), field=field)
    for index, (name, tensor) in enumerate(inputs.items()):
        spec = checked.check(index, name, tensor.datatype, tensor.shape)
        check_data(field(index, name), tensor.datatype, tensor.shape, tensor.data)
        checked.tensors[spec.position] = tensor
    return checked.done()[1]


def test_validate_inputs_counts_samples() -> None:
    inputs = {
        "A": Tensor("INT32", (3, 2), raw("INT32", [0] * 6)),
        "S": Tensor("BYTES", (3,), raw("BYTES", ["a", "b", "c"])),
    }
    assert validate_inputs(inputs, MODEL, max_batch_size=4) == 3
    unbatched = model([("A", "INT32", (-1, 2))])
    assert validate_inputs({"A": inputs["A"]}, unbatched, max_batch_size=0) == 1


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        (
            {"A": Tensor("INT32", (1, 2), b"\x00" * 7), "S": Tensor("BYTES", (1,), raw("BYTES", ["a"]))},
            "inputs[0]: INT32 [1, 2] needs 8 bytes, got 7",
        ),
        (
            {"A": Tensor("INT32", (1, 2), b"\x00" * 8), "S": Tensor("BYTES", (1,), raw("BYTES", ["a", "b"]))},
            "inputs[1]: BYTES [1] needs 1 elements, got 2",
        ),
        (
            {"A": Tensor("INT32", (1, 2), b"\x00" * 8), "S": Tensor("BYTES", (1,), b"\x09\x00\x00\x00ab")},
            "inputs[1]: BYTES element 0: length 9 runs past the end of the data (6 bytes)",
        ),
        (
            {"S": Tensor("BYTES", (1,), raw("BYTES", ["a"]))},
            "inputs: missing input 'A' of model 'm' (expects 'A', 'S')",
        ),
    ],
    ids=["byte size", "bytes count", "bytes layout", "missing"],
)
def test_validate_inputs_errors(inputs: dict[str, Tensor], message: str) -> None:
    with pytest.raises(InvalidInput) as info:
        validate_inputs(inputs, MODEL, max_batch_size=4)
    assert str(info.value) == message


def test_validate_inputs_names_fields_as_asked() -> None:
    inputs = {"A": Tensor("INT32", (1, 3), b"\x00" * 12), "S": Tensor("BYTES", (1,), raw("BYTES", ["a"]))}
    with pytest.raises(InvalidInput, match=r"^inputs\.A\.shape: input 'A' of model 'm' expects \[-1, 2\]"):
        validate_inputs(inputs, MODEL, max_batch_size=4, field=lambda index, name: f"inputs.{name}")


def test_deeply_nested_v2_data_is_invalid_input() -> None:
    m = model([("A", "INT32", (-1, 2))])
    body = b'{"inputs": [{"name": "A", "shape": [1, 2], "datatype": "INT32", "data": ' + b"[" * 5000
    body += b"]" * 5000 + b"}]}"
    # msgspec stops either at its recursion limit or (newer Pythons) at the first wrong type
    deep = r"^(request body: malformed JSON: maximum recursion depth|inputs\[0\]\.data\[0\]\[0\]: expected `int`)"
    with pytest.raises(InvalidInput, match=deep):
        decode_infer(body, content_type=None, header_length=None, schema=schema(m, 2))
    shape = json.dumps([1] * 40).encode()
    body = b'{"inputs": [{"name": "A", "shape": ' + shape + b', "datatype": "INT32", "data": [1]}]}'
    with pytest.raises(InvalidInput, match=r"^inputs\[0\]\.shape: at most 32 dimensions, got 40$"):
        decode_infer(body, content_type=None, header_length=None, schema=schema(m, 2))
