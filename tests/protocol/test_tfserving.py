"""TensorFlow-Serving predict: row and columnar formats, both directions."""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np
import pytest

from aserve.errors import InvalidInput, ModelError
from aserve.protocol import decode_predict, encode_predict
from aserve.tensor import Tensor

from .helpers import DATATYPES, VALUES, model, raw, schema

ONE = model([("X", "FP32", (-1, 2))], [("Y", "FP32", (-1, 2))])
TWO = model([("X", "INT32", (-1, 2)), ("S", "BYTES", (-1,))], [("Y", "FP32", (-1, 2))])


def decode(body: Any, m=ONE, max_batch_size: int = 8):
    return decode_predict(json.dumps(body).encode(), schema=schema(m, max_batch_size))


def fails(body: Any, m=ONE, max_batch_size: int = 8) -> str:
    with pytest.raises(InvalidInput) as info:
        decode(body, m, max_batch_size)
    return str(info.value)


def as_bytes(tensor: Tensor) -> bytes:
    return bytes(tensor.view())


@pytest.mark.parametrize("datatype", [d for d in DATATYPES if d != "BYTES"])
def test_rows_and_columns_of_every_numeric_datatype(datatype: str) -> None:
    m = model([("X", datatype, (-1, 3))], [("Y", datatype, (-1, 3))])
    values = VALUES[datatype]
    rows = decode({"instances": [values[:3], values[3:]]}, m)
    columns = decode({"inputs": {"X": [values[:3], values[3:]]}}, m)
    assert not rows.columnar and columns.columnar
    for request in (rows, columns):
        assert request.samples == 2
        assert request.named()["X"].shape == (2, 3) and as_bytes(request.named()["X"]) == raw(datatype)

    y = Tensor(datatype, (2, 3), raw(datatype))
    assert json.loads(encode_predict({"Y": y}, columnar=False)) == {"predictions": [values[:3], values[3:]]}
    assert json.loads(encode_predict({"Y": y}, columnar=True)) == {"outputs": [values[:3], values[3:]]}


def test_rows_of_named_inputs_with_bytes() -> None:
    request = decode(
        {
            "signature_name": "serving_default",
            "instances": [{"X": [1, 2], "S": "caf\u00e9"}, {"X": [3, 4], "S": {"b64": "AP8="}}],
        },
        TWO,
    )
    assert request.samples == 2 and not request.columnar
    assert as_bytes(request.named()["X"]) == raw("INT32", [1, 2, 3, 4])
    assert request.named()["S"].shape == (2,)
    assert as_bytes(request.named()["S"]) == raw("BYTES", ["caf\u00e9".encode(), b"\x00\xff"])


def test_single_input_rows_may_name_it() -> None:
    request = decode({"instances": [{"X": [1, 2]}, {"X": [3, 4]}]})
    assert request.named()["X"].shape == (2, 2)
    assert np.frombuffer(request.named()["X"].data, np.float32).tolist() == [1, 2, 3, 4]


def test_columns_of_a_single_input_may_be_bare() -> None:
    request = decode({"inputs": [[1, 2]]})
    assert request.columnar and request.named()["X"].shape == (1, 2)


def test_model_without_batching_takes_one_instance() -> None:
    m = model([("X", "INT64", (2, -1))], [("Y", "INT64", (2,))])
    request = decode({"instances": [[[1], [2]]]}, m, max_batch_size=0)
    assert request.samples == 1 and request.named()["X"].shape == (2, 1)
    y = Tensor("INT64", (2,), raw("INT64", [5, 6]))
    assert json.loads(encode_predict({"Y": y}, columnar=False, batched=False)) == {"predictions": [[5, 6]]}
    assert fails({"instances": [[[1], [2]], [[3], [4]]]}, m, 0) == (
        "instances: model 'm' does not batch: expected 1 instance, got 2"
    )


def test_scalar_samples() -> None:
    m = model([("X", "FP64", (-1,))], [("Y", "FP64", (-1,))])
    request = decode({"instances": [1.5, 2, -3]}, m)
    assert request.named()["X"].shape == (3,)
    assert np.frombuffer(request.named()["X"].data, np.float64).tolist() == [1.5, 2.0, -3.0]
    y = Tensor("FP64", (3,), raw("FP64", [0.5, 1.0, 2.0]))
    assert json.loads(encode_predict({"Y": y}, columnar=False)) == {"predictions": [0.5, 1.0, 2.0]}


def test_rows_of_several_outputs_are_objects() -> None:
    y = Tensor("FP32", (2, 2), raw("FP32", [0, 1, 2, 3]))
    s = Tensor("BYTES", (2,), raw("BYTES", [b"ok", b"\xff\x00"]))
    b = Tensor("BOOL", (2, 1, 1), raw("BOOL", [True, False]))
    assert json.loads(encode_predict({"Y": y, "S": s, "B": b}, columnar=False)) == {
        "predictions": [
            {"Y": [0.0, 1.0], "S": "ok", "B": [[True]]},
            {"Y": [2.0, 3.0], "S": {"b64": base64.b64encode(b"\xff\x00").decode()}, "B": [[False]]},
        ]
    }
    assert json.loads(encode_predict({"Y": y, "S": s}, columnar=True)) == {
        "outputs": {"Y": [[0.0, 1.0], [2.0, 3.0]], "S": ["ok", {"b64": "/wA="}]}
    }


def test_outputs_with_empty_dimensions() -> None:
    y = Tensor("INT8", (2, 0, 3), b"")
    assert json.loads(encode_predict({"Y": y}, columnar=False)) == {"predictions": [[], []]}


def test_rows_need_a_batch_dimension_that_agrees() -> None:
    y = Tensor("FP32", (2, 2), raw("FP32", [0, 1, 2, 3]))
    with pytest.raises(ModelError, match="outputs differ in batch size"):
        encode_predict({"Y": y, "Z": Tensor("FP32", (1,), raw("FP32", [0]))}, columnar=False)
    with pytest.raises(ModelError, match="output 'Z' is a scalar"):
        encode_predict({"Y": y, "Z": Tensor("FP32", (), raw("FP32", [0]))}, columnar=False)


ERRORS: list[tuple[str, Any, Any, str]] = [
    ("not JSON", None, ONE, "request body: malformed JSON: JSON is malformed: invalid character (byte 0)"),
    (
        "both formats",
        {"instances": [], "inputs": {}},
        ONE,
        'request body: expected one of "instances" (row format) or "inputs" (columnar format), got both',
    ),
    (
        "neither format",
        {"signature_name": "x"},
        ONE,
        'request body: expected one of "instances" (row format) or "inputs" (columnar format), got neither',
    ),
    (
        "instances not a list",
        {"instances": {"X": 1}},
        ONE,
        "instances: expected `array | null`, got `object`",
    ),
    ("no instances", {"instances": []}, ONE, "instances: expected at least one instance, got []"),
    (
        "element of the wrong type",
        {"instances": [[1, 2], [3, "x"]]},
        ONE,
        "instances[1].X[1]: expected `float`, got `str`",
    ),
    (
        "integer input given a float",
        {"instances": [{"X": [1, 2.5], "S": "a"}]},
        TWO,
        "instances[0].X[1]: expected `int`, got `float`",
    ),
    (
        "integer out of range",
        {"inputs": {"X": [[1, 2**40]], "S": ["a"]}},
        TWO,
        "inputs.X[0][1]: expected `int` <= 2147483647, got 1099511627776",
    ),
    (
        "instance not an object",
        {"instances": [[1, 2]]},
        TWO,
        "instances[0]: expected an object of input name -> value (model 'm' has 2 inputs), got list",
    ),
    (
        "input missing",
        {"instances": [{"X": [1, 2]}]},
        TWO,
        "instances[0]: model 'm' expects inputs 'X', 'S'; missing 'S'",
    ),
    (
        "input unknown",
        {"instances": [{"X": [1, 2], "S": "a", "T": 1}]},
        TWO,
        "instances[0]: model 'm' expects inputs 'X', 'S'; unknown 'T'",
    ),
    (
        "columns missing an input",
        {"inputs": {"X": [[1, 2]]}},
        TWO,
        "inputs: model 'm' expects inputs 'X', 'S'; missing 'S'",
    ),
    (
        "bare columns for two inputs",
        {"inputs": [[1, 2]]},
        TWO,
        "inputs: model 'm' has 2 inputs: expected an object of input name -> value, got list",
    ),
    (
        "instances of different shapes",
        {"instances": [[1, 2], [3]]},
        ONE,
        "instances[*].X: nested data does not match shape [2, 2]: dimension 1 has 1, 2 elements, expected 2",
    ),
    ("mixed nesting", {"instances": [[1, 2], 3]}, ONE, "instances[1].X: expected `array`, got `int`"),
    (
        "sample of the wrong shape",
        {"instances": [[1, 2, 3]]},
        ONE,
        (
            "instances[*].X.shape: input 'X' of model 'm' expects [-1, 2] (-1: any size; the first is the batch, "
            "at most 8), got [1, 3]"
        ),
    ),
    (
        "too many instances",
        {"instances": [[1, 2]] * 9},
        ONE,
        "instances[*].X.shape[0]: batch size of input 'X' must be 1..8, got 9",
    ),
    (
        "columns of the wrong shape",
        {"inputs": [1, 2]},
        ONE,
        (
            "inputs.X.shape: input 'X' of model 'm' expects [-1, 2] (-1: any size; the first is the batch, "
            "at most 8), got [2]"
        ),
    ),
    (
        "bytes element a number",
        {"instances": [{"X": [1, 2], "S": "a"}, {"X": [1, 2], "S": 5}]},
        TWO,
        'instances[1].S: BYTES element must be a string or {"b64": "..."}, got 5',
    ),
    (
        "bad base64",
        {"instances": [{"X": [1, 2], "S": {"b64": "%%"}}]},
        TWO,
        "instances[0].S.b64: invalid base64: Only base64 data is allowed",
    ),
]


@pytest.mark.parametrize(("body", "m", "message"), [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_predict_errors(body: Any, m, message: str) -> None:
    if body is None:
        with pytest.raises(InvalidInput) as info:
            decode_predict(b"instances", schema=schema(m, 8))
        assert str(info.value) == message
    else:
        assert fails(body, m) == message


def test_too_deep_nesting_is_invalid_input() -> None:
    deep = b'{"instances": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    too_deep = r"request body: malformed JSON: maximum recursion depth|instances\[\*\]\.X: at most 32 dimensions"
    with pytest.raises(InvalidInput, match=too_deep):
        decode_predict(deep, schema=schema(ONE, 8))
    nested: Any = [1.0]
    for _ in range(40):
        nested = [nested]
    assert fails({"inputs": nested}) == "inputs.X: at most 32 dimensions, got 41"
