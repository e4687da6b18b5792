"""A model's outputs as the interpreter hands them to the host (`runtime.tensors.from_model`)."""

from __future__ import annotations

import array

import pytest

from aserve.runtime.datatypes import decode_bytes
from aserve.runtime.model import TensorSpec
from aserve.runtime.tensors import from_model

FLAT = TensorSpec("Y", "INT32", (-1, 4))


def ints(*values: int) -> memoryview:
    return memoryview(array.array("i", values))


def test_a_flat_buffer_takes_the_declared_shape_filled_from_its_length_every_time() -> None:
    for rows in (1, 2, 3, 2, 1):  # the same (declared, count) again: the same answer
        name, datatype, shape, data = from_model("Y", ints(*range(4 * rows)), FLAT)
        assert (name, datatype, shape) == ("Y", "INT32", (rows, 4))
        assert bytes(data) == array.array("i", range(4 * rows)).tobytes()
    # a length the declaration cannot take stays flat
    assert from_model("Y", ints(1, 2, 3), FLAT)[2] == (3,)


def test_a_shaped_buffer_keeps_its_shape_and_raw_bytes_take_the_declared_datatype() -> None:
    shaped = memoryview(array.array("i", range(8)).tobytes()).cast("i", (2, 4))
    assert from_model("Y", shaped, FLAT)[1:3] == ("INT32", (2, 4))
    raw = memoryview(array.array("i", range(8)).tobytes())  # format "B"
    assert from_model("Y", raw, FLAT)[1:3] == ("INT32", (2, 4))
    assert from_model("Y", array.array("i", range(4)), FLAT)[1:3] == ("INT32", (1, 4))  # not a memoryview


def test_a_strided_view_is_copied_to_contiguous_bytes() -> None:
    strided = ints(*range(16))[::2]
    _, _, shape, data = from_model("Y", strided, FLAT)
    assert shape == (2, 4) and list(memoryview(data).cast("B").cast("i")) == list(range(0, 16, 2))


def test_a_memoryview_declared_bytes_is_read_as_text_and_a_wrong_datatype_is_named() -> None:
    texts = TensorSpec("T", "BYTES", (-1,))
    _, datatype, shape, data = from_model("T", memoryview(b"ab"), texts)
    assert datatype == "BYTES" and decode_bytes(data) == [b"ab"] and shape == ()  # one element
    with pytest.raises(TypeError, match="model returned FP64, declared INT32"):
        from_model("Y", memoryview(array.array("d", [1.0] * 4)), FLAT)
