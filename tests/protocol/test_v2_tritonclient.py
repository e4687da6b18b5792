"""tritonclient.http's own request builder and response parser against the V2 codec."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.http._utils import _get_inference_request

from aserve.inference import InferResponse
from aserve.protocol import HEADER_LENGTH, decode_infer, encode_infer
from aserve.tensor import Tensor

from .helpers import DATATYPES, array, model, raw, schema


def build(inputs, outputs=None, request_id="", timeout=None, parameters=None) -> tuple[bytes, int | None]:
    body, header_length = _get_inference_request(
        inputs=inputs,
        request_id=request_id,
        outputs=outputs,
        sequence_id=0,
        sequence_start=False,
        sequence_end=False,
        priority=0,
        timeout=timeout,
        custom_parameters=parameters,
    )
    return body, header_length


def result(chunks, headers) -> triton.InferResult:
    body = b"".join(bytes(c) for c in chunks)
    length = headers.get(HEADER_LENGTH)
    return triton.InferResult.from_response_body(body, header_length=None if length is None else int(length))


def send_as(datatype: str, binary: bool) -> bool:
    return binary or datatype == "BF16"  # tritonclient sends BF16 only as binary


@pytest.mark.parametrize("datatype", DATATYPES)
@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_tritonclient_round_trip(datatype: str, binary: bool) -> None:
    m = model([("IN", datatype, (-1, 3))], [("OUT", datatype, (-1, 3))])
    x = array(datatype)
    infer_input = triton.InferInput("IN", [2, 3], datatype)
    infer_input.set_data_from_numpy(x, binary_data=send_as(datatype, binary))
    body, header_length = build(
        [infer_input], [triton.InferRequestedOutput("OUT", binary_data=binary)], request_id="abc"
    )
    request = decode_infer(body, content_type=None, header_length=header_length, schema=schema(m, 4))
    tensor = request.named()["IN"]
    assert tensor.shape == (2, 3) and request.samples == 2 and request.id == "abc"
    assert bytes(tensor.view()) == raw(datatype)

    chunks, headers = encode_infer(
        InferResponse(model_name="m", model_version="1", outputs={"OUT": Tensor(datatype, tensor.shape, tensor.data)}, id=request.id),
        request,
        accept=None,
        content_type=None,
    )
    assert (HEADER_LENGTH in headers) == binary
    res = result(chunks, headers)
    got = res.as_numpy("OUT")
    assert got.shape == (2, 3)
    if datatype == "BYTES":
        want = x if binary else np.vectorize(bytes.decode, otypes=[object])(x)
        assert got.tolist() == want.tolist()
    else:
        assert got.dtype == x.dtype
        np.testing.assert_array_equal(got, x)
    assert res.get_response()["id"] == "abc" and res.get_response()["model_version"] == "1"


def test_tritonclient_without_requested_outputs_gets_every_output_binary() -> None:
    m = model(
        [("A", "FP32", (-1, 2)), ("B", "INT16", (-1,))],
        [("C", "FP32", (-1, 2)), ("D", "BYTES", (-1,))],
    )
    a = np.array([[1.5, -2.0], [0.0, 8.25]], dtype=np.float32)
    b = np.array([3, 4], dtype=np.int16)
    in_a, in_b = triton.InferInput("A", [2, 2], "FP32"), triton.InferInput("B", [2], "INT16")
    in_a.set_data_from_numpy(a, binary_data=False)
    in_b.set_data_from_numpy(b, binary_data=True)
    body, header_length = build([in_a, in_b], timeout=1500)
    request = decode_infer(body, content_type=None, header_length=header_length, schema=schema(m, 2))
    assert request.outputs == [] and request.timeout_ms == 1.5
    strings = raw("BYTES", ["ok", "\u00e9"])
    chunks, headers = encode_infer(
        InferResponse(model_name="m", model_version="1", outputs={"C": request.named()["A"], "D": Tensor("BYTES", (2,), strings)}, id=request.id),
        request,
        accept=None,
        content_type=None,
    )
    res = result(chunks, headers)
    np.testing.assert_array_equal(res.as_numpy("C"), a)
    assert res.as_numpy("D").tolist() == [b"ok", "\u00e9".encode()]
    assert all("data" not in o for o in res.get_response()["outputs"])


def test_tritonclient_custom_parameters_reach_the_request() -> None:
    m = model([("A", "INT32", (-1,))])
    in_a = triton.InferInput("A", [1], "INT32")
    in_a.set_data_from_numpy(np.array([7], dtype=np.int32))
    body, header_length = build([in_a], parameters={"temperature": 0.5})
    request = decode_infer(body, content_type=None, header_length=header_length, schema=schema(m, 1))
    assert request.parameters == {"binary_data_output": True, "temperature": 0.5}
