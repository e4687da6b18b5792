"""Inputs the decoders' fuzz targets (tests/fuzz) found to break them, each now answered
as it should be: a 400 naming the field, or a request the data plane can run."""

from __future__ import annotations

import msgspec
import pytest

from aserve.errors import InvalidInput
from aserve.protocol import decode_infer, decode_predict

from .helpers import model, schema

TEXT = schema(model([("TEXT", "BYTES", (-1,))]), 4)


def test_non_ascii_base64_is_invalid_input() -> None:
    # base64.b64decode raises ValueError, not binascii.Error, for a str with non-ASCII characters.
    body = '{"instances": ["The goalkeeper made a save", {"b64": "\u0238JpbmFyef8="}]}'.encode()
    with pytest.raises(InvalidInput, match=r"^instances\[1\]\.TEXT\.b64: invalid base64: .*ASCII"):
        decode_predict(body, schema=TEXT)


# A model that does not batch, with free dimensions: a shape holding a 0 is an empty tensor
# whatever its other dimensions, so no data bounds them.
FREE = schema(model([("W", "BYTES", (-1, -1)), ("X", "FP32", (-1, -1))]), 0)


def free_body(w_shape: list[int], x_shape: list[int]) -> dict:
    return {"inputs": [{"name": "W", "datatype": "BYTES", "shape": w_shape, "data": []},
                       {"name": "X", "datatype": "FP32", "shape": x_shape, "data": []}]}


@pytest.mark.parametrize("fmt", ["json", "msgpack"])
def test_dimensions_beyond_int64_are_invalid_input(fmt: str) -> None:
    # The pool hands shapes to interpreters as int64: 2**63 and up failed there (500, OverflowError).
    for dim in (2**63, 2**64 - 1):
        body = free_body([0, dim], [0, 1])
        encoded = msgspec.msgpack.encode(body) if fmt == "msgpack" else msgspec.json.encode(body)
        with pytest.raises(InvalidInput, match=rf"^inputs\[0\]\.shape\[1\]: expected `int` <= {2**63 - 1}, got {dim}$"):
            decode_infer(encoded, content_type=f"application/{fmt}", header_length=None, schema=FREE)


def test_empty_tensor_whose_other_dimensions_overflow_is_invalid_input() -> None:
    # [2**62, 0] FP32: no elements, but numpy cannot make it (2**62 * 4 bytes), nor any 0-holding
    # shape whose nonzero dimensions multiply past 2**63 - 1 bytes.
    for shape in ([2**62, 0], [0, 2**61 + 1]):
        body = msgspec.json.encode(free_body([0, 1], shape))
        with pytest.raises(InvalidInput, match=r"^inputs\[1\]\.shape: \[.*\] is too large: its nonzero dimensions"):
            decode_infer(body, content_type=None, header_length=None, schema=FREE)
    # what fits is an empty tensor like any other
    request = decode_infer(msgspec.json.encode(free_body([2**62, 0], [0, 2**61 - 1])), content_type=None,
                           header_length=None, schema=FREE)
    assert [(t.shape, bytes(t.data)) for t in request.inputs] == [((2**62, 0), b""), ((0, 2**61 - 1), b"")]
