"""Triton's classification extension in the codec, driven by tritonclient's own request builder
(`InferRequestedOutput(name, class_count=N)`) and response parser."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as triton

from aserve.errors import InvalidInput
from aserve.inference import InferResponse
from aserve.protocol import decode_infer, encode_infer
from aserve.protocol.classification import top_classes
from aserve.runtime.datatypes import decode_bytes
from aserve.tensor import Tensor

from .helpers import model, schema
from .test_v2_tritonclient import build, result

SCORES = {
    "FP32": np.array([[0.1, 0.7, 0.05, 0.15], [0.4, 0.3, 0.2, 0.1]], np.float32),
    "FP64": np.array([[1.5, -2.0, 3.25, 0.0], [0.0, 0.0, 9.0, 1.0]], np.float64),
    "FP16": np.array([[0.5, 0.25, 1.0, 0.125], [2.0, 4.0, 1.0, 0.5]], np.float16),
    "INT32": np.array([[3, 9, -1, 4], [7, 7, 2, 8]], np.int32),
    "UINT8": np.array([[3, 250, 1, 4], [0, 7, 200, 8]], np.uint8),
    "INT64": np.array([[-5, 2**40, 3, 0], [1, 2, 3, 4]], np.int64),
}


def as_bytes(rows: np.ndarray) -> list[list[bytes]]:
    """tritonclient's BYTES: bytes from binary data, str from JSON."""
    return [[v if isinstance(v, bytes) else v.encode() for v in r] for r in rows]


def expected(row: np.ndarray, n: int, labels: list[str] | None = None) -> list[bytes]:
    """What Triton answers: std::to_string of the value (%f for floating point), ':', the index."""
    order = sorted(range(len(row)), key=lambda i: (-float(row[i]), i))[:n]
    out = []
    for i in order:
        value = f"{float(row[i]):f}" if row.dtype.kind == "f" else str(int(row[i]))
        out.append(f"{value}:{i}{':' + labels[i] if labels else ''}".encode())
    return out


@pytest.mark.parametrize("datatype", list(SCORES))
@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_class_count_batched(datatype: str, binary: bool) -> None:
    scores = SCORES[datatype]
    m = model([("X", "FP32", (-1, 1))], [("OUT", datatype, (-1, 4))])
    x = triton.InferInput("X", [2, 1], "FP32")
    x.set_data_from_numpy(np.zeros((2, 1), np.float32))
    body, length = build([x], [triton.InferRequestedOutput("OUT", binary_data=binary, class_count=2)])
    request = decode_infer(body, content_type=None, header_length=length, schema=schema(m, 4))
    assert request.outputs[0].classification == 2
    response = InferResponse(model_name="m", model_version="1",
                             outputs={"OUT": Tensor(datatype, (2, 4), scores.tobytes())})
    got = result(*encode_infer(response, request, accept=None, content_type=None))
    out = got.as_numpy("OUT")
    assert out.shape == (2, 2) and got.get_output("OUT")["datatype"] == "BYTES"
    assert as_bytes(out) == [expected(scores[0], 2), expected(scores[1], 2)]


def test_class_count_not_batched_ranks_the_whole_tensor_and_caps_at_its_size() -> None:
    scores = np.array([0.2, 0.9, 0.4], np.float32)
    m = model([("X", "FP32", (1,))], [("OUT", "FP32", (3,))])
    x = triton.InferInput("X", [1], "FP32")
    x.set_data_from_numpy(np.zeros(1, np.float32))
    body, length = build([x], [triton.InferRequestedOutput("OUT", class_count=10)])
    request = decode_infer(body, content_type=None, header_length=length, schema=schema(m, 0))
    response = InferResponse(model_name="m", model_version="1", outputs={"OUT": Tensor("FP32", (3,), scores.tobytes())})
    out = result(*encode_infer(response, request, accept=None, content_type=None)).as_numpy("OUT")
    assert out.shape == (3,) and list(map(bytes, out)) == [b"0.900000:1", b"0.400000:2", b"0.200000:0"]


def test_labels_and_other_outputs_untouched() -> None:
    scores = SCORES["FP32"]
    m = model([("X", "FP32", (-1, 1))], [("OUT", "FP32", (-1, 4)), ("RAW", "FP32", (-1, 4))])
    x = triton.InferInput("X", [2, 1], "FP32")
    x.set_data_from_numpy(np.zeros((2, 1), np.float32))
    body, length = build([x], [triton.InferRequestedOutput("OUT", class_count=3), triton.InferRequestedOutput("RAW")])
    request = decode_infer(body, content_type=None, header_length=length, schema=schema(m, 4))
    labels = ["cat", "dog", "bird", "fish"]
    tensor = Tensor("FP32", (2, 4), scores.tobytes())
    response = InferResponse(model_name="m", model_version="1", outputs={"OUT": tensor, "RAW": tensor})
    got = result(*encode_infer(response, request, accept=None, content_type=None,
                               labels=lambda name: labels if name == "OUT" else None))
    assert as_bytes(got.as_numpy("OUT")) == [expected(s, 3, labels) for s in scores]
    assert got.as_numpy("RAW").tolist() == scores.tolist()


def test_classification_of_a_bytes_or_bool_output_is_400() -> None:
    for datatype in ("BYTES", "BOOL"):
        m = model([("X", "FP32", (-1, 1))], [("OUT", datatype, (-1, 4))])
        body = (b'{"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 1], "data": [0]}], '
                b'"outputs": [{"name": "OUT", "parameters": {"classification": 1}}]}')
        with pytest.raises(InvalidInput, match=rf"outputs\[0\].parameters.classification: output 'OUT' is {datatype}"):
            decode_infer(body, content_type=None, header_length=None, schema=schema(m, 4))


def test_ties_and_nan() -> None:
    t = Tensor("FP32", (5,), np.array([1.0, np.nan, 1.0, 3.0, -np.inf], np.float32).tobytes())
    out = top_classes(t, 5, batched=False)

    assert decode_bytes(out.data) == [b"3.000000:3", b"1.000000:0", b"1.000000:2", b"-inf:4", b"nan:1"]
