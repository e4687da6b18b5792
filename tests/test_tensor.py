"""Batches of tensors: one-copy concatenation, exact zero-copy split, outputs of the wrong size."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from aserve.errors import ModelError
from aserve.runtime.datatypes import decode_bytes, encode_bytes
from aserve.tensor import Tensor, concat_inputs, split_outputs


def test_concat_and_split_fixed_size() -> None:
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    b = np.arange(100, 103, dtype=np.int32).reshape(1, 3)
    [x] = concat_inputs([[Tensor("INT32", (2, 3), a.tobytes())], [Tensor("INT32", (1, 3), b.tobytes())]], 3)
    assert x.shape == (3, 3)
    assert isinstance(x.data, bytearray)
    np.testing.assert_array_equal(np.frombuffer(x.data, np.int32).reshape(3, 3), np.vstack([a, b]))
    out = {"X": x}
    parts = split_outputs(out, [2, 1], "m")
    np.testing.assert_array_equal(np.frombuffer(parts[0]["X"].data, np.int32).reshape(2, 3), a)
    np.testing.assert_array_equal(np.frombuffer(parts[1]["X"].data, np.int32).reshape(1, 3), b)
    assert parts[1]["X"].shape == (1, 3)
    # zero-copy: the parts are views over the batch buffer
    assert parts[1]["X"].data.obj is out["X"].data


def test_concat_and_split_bytes() -> None:
    r1 = [b"a", b"", b"hello", b"xy"]  # 2 samples x 2
    r2 = [b"\x00\x01\x02", b"z"]  # 1 sample x 2
    t1 = Tensor("BYTES", (2, 2), encode_bytes(r1))
    t2 = Tensor("BYTES", (1, 2), encode_bytes(r2))
    [joined] = concat_inputs([[t1], [t2]], 3)
    out = {"S": joined}
    assert decode_bytes(out["S"].view(), 6) == r1 + r2
    parts = split_outputs(out, [2, 1], "m")
    assert decode_bytes(parts[0]["S"].view(), 4) == r1
    assert decode_bytes(parts[1]["S"].view(), 2) == r2


def test_split_rejects_wrong_batch_dimension() -> None:
    with pytest.raises(ModelError, match="first dimension must be 3"):
        split_outputs({"Y": Tensor("FP32", (2, 1), struct.pack("<2f", 1, 2))}, [2, 1], "m")


def test_split_rejects_a_bytes_output_its_shape_does_not_describe() -> None:
    whole = encode_bytes([b"a", b"bc", b"d"])
    with pytest.raises(ModelError, match=r"BYTES output 'S' holds 3 elements, its shape \[2, 2\] says 4"):
        split_outputs({"S": Tensor("BYTES", (2, 2), whole)}, [1, 1], "m")
    with pytest.raises(ModelError, match=r"BYTES output 'S': BYTES element 1: length 9 runs past the end"):
        split_outputs({"S": Tensor("BYTES", (2, 1), whole[:5] + b"\x09\x00\x00\x00x")}, [1, 1], "m")


def test_many_requests_of_varied_rows_join_and_split_back_exactly() -> None:
    """What a batch of many requests holds: every input's rows in request order, from any
    C-contiguous buffer (bytes, numpy arrays, shaped memoryviews), and back per request."""
    rng = np.random.default_rng(7)
    rows = [1, 3, 0, 2, 1, 5, 1]
    arrays = [rng.integers(-1000, 1000, size=(r, 2, 3)).astype(np.int64) for r in rows]
    holders = [lambda a: a.tobytes(), lambda a: a, memoryview, lambda a: bytearray(a.tobytes())]
    requests = [[Tensor("INT64", a.shape, holders[i % len(holders)](a)), Tensor("FP32", (r, 1), np.ones((r, 1), np.float32))]
                for i, (r, a) in enumerate(zip(rows, arrays))]
    joined = concat_inputs(requests, sum(rows))
    assert [t.shape for t in joined] == [(13, 2, 3), (13, 1)]
    np.testing.assert_array_equal(np.frombuffer(joined[0].data, np.int64).reshape(13, 2, 3), np.concatenate(arrays))
    parts = split_outputs({"Y": joined[0], "Z": joined[1]}, rows, "m")
    for part, r, a in zip(parts, rows, arrays):
        assert part["Y"].shape == (r, 2, 3) and part["Z"].shape == (r, 1)
        np.testing.assert_array_equal(np.frombuffer(part["Y"].data, np.int64).reshape(r, 2, 3), a)
        assert part["Y"].data.obj is joined[0].data  # a view of the batch's buffer, not a copy
    with pytest.raises((BufferError, ValueError)):  # a strided input cannot be copied as bytes in order
        concat_inputs([[Tensor("INT64", (2,), np.arange(4)[::2])]], 2)
