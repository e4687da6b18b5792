"""The gRPC codec's reading of repeated ModelInferRequests (`Wire`, `_native.grpc_split`): a
request decoded from a remembered reading is the one the full decoder makes of the same
bytes; anything that reading did not check (other sizes, other fields, another id) is
decoded in full; answers written in C are the messages protobuf reads back."""

from __future__ import annotations

import numpy as np
import pytest

from aserve import _native
from aserve.errors import InvalidInput
from aserve.inference import InferRequest, InferResponse, ModelSchema, RequestedOutput
from aserve.protocol.grpc import protos
from aserve.protocol.grpc.codec import Wire, decode_infer, decode_wire, encode_infer
from aserve.repository.config import TensorSpec
from aserve.tensor import Tensor


def schema() -> ModelSchema:
    return ModelSchema("m", "1", inputs=[TensorSpec("A", "FP32", (-1, 4)), TensorSpec("B", "INT64", (-1, 2))],
                       outputs=[TensorSpec("Y", "FP32", (-1, 4))], max_batch_size=8)


def message(rows: int = 2, *, seed: int = 0, id_: str = "", order: str = "AB", budget: int | None = None) -> bytes:
    rng = np.random.default_rng(seed)
    data = {"A": rng.random((rows, 4), dtype=np.float32), "B": rng.integers(0, 9, (rows, 2), dtype=np.int64)}
    request = protos.ModelInferRequest(model_name="m", id=id_)
    for name in order:
        request.inputs.add(name=name, datatype="FP32" if name == "A" else "INT64", shape=list(data[name].shape))
        request.raw_input_contents.append(data[name].tobytes())
    if budget is not None:
        request.parameters["latency_budget_ms"].int64_param = budget
    return request.SerializeToString()


def same(a: InferRequest, b: InferRequest) -> None:
    assert [(t.datatype, tuple(t.shape), bytes(t.data)) for t in a.inputs] == \
        [(t.datatype, tuple(t.shape), bytes(t.data)) for t in b.inputs]
    assert (a.samples, a.id, a.outputs, a.parameters, a.timeout_ms, a.latency_budget_ms, a.binary_outputs) == \
        (b.samples, b.id, b.outputs, b.parameters, b.timeout_ms, b.latency_budget_ms, b.binary_outputs)


@pytest.mark.parametrize("order", ["AB", "BA"])
def test_a_repeated_request_is_read_as_the_full_decoder_reads_it(order: str) -> None:
    s = schema()
    first = message(order=order, budget=50)
    same(decode_wire(Wire.of(first), s), decode_infer(protos.ModelInferRequest.FromString(first), s))
    assert len(s.grpc_plans) == 1
    for seed, id_ in ((1, "r1"), (2, ""), (3, "r3")):
        again = message(seed=seed, id_=id_, order=order, budget=50)
        got = decode_wire(Wire.of(again), s)
        same(got, decode_infer(protos.ModelInferRequest.FromString(again), s))
        assert got.id == (id_ or None)
    assert len(s.grpc_plans) == 1  # every one after the first from the remembered reading


def test_what_the_reading_did_not_check_is_decoded_in_full() -> None:
    s = schema()
    decode_wire(Wire.of(message()), s)
    # more rows: the same key but other raw sizes
    same(decode_wire(Wire.of(message(rows=3)), s), decode_infer(protos.ModelInferRequest.FromString(message(rows=3)), s))
    # a raw entry of a size the shape does not hold: the full decoder's error
    bad = protos.ModelInferRequest.FromString(message())
    bad.raw_input_contents[1] = bad.raw_input_contents[1][:-8]
    with pytest.raises(InvalidInput, match=r"raw_input_contents\[1\]"):
        decode_wire(Wire.of(bad.SerializeToString()), s)
    # other parameters: another key
    assert decode_wire(Wire.of(message(budget=7)), s).latency_budget_ms == 7


@pytest.mark.parametrize("data", [b"\x0a\xff\xff\xff", b"\x0a\x02m", b"\x3a\x05ab", b"\x0b", b"",
                                  b"\x0a\x02\xff\xfe", b"\x0a\x01m\x1a\x01\xff"])  # not UTF-8: a name, an id
def test_a_message_grpc_split_cannot_read_is_the_full_decoders(data: bytes) -> None:
    assert _native.grpc_split(data) is None
    with pytest.raises(InvalidInput):
        decode_wire(Wire.of(data), schema())


def test_answers_written_in_c_are_the_messages_protobuf_reads() -> None:
    s = schema()
    request = decode_wire(Wire.of(message(id_="x")), s)
    y = np.arange(8, dtype=np.float32).reshape(2, 4)
    response = InferResponse(model_name="m", model_version="1", id="x", outputs={"Y": Tensor("FP32", (2, 4), y)})
    written = encode_infer(request, response, None)
    assert isinstance(written, bytes)
    answer = protos.ModelInferResponse.FromString(written)
    assert (answer.model_name, answer.model_version, answer.id) == ("m", "1", "x")
    assert [(o.name, o.datatype, list(o.shape)) for o in answer.outputs] == [("Y", "FP32", [2, 4])]
    assert np.frombuffer(answer.raw_output_contents[0], np.float32).tolist() == y.ravel().tolist()
    # typed contents asked for: the message as protobuf builds it
    typed = InferRequest(schema=s, inputs=request.inputs, samples=2, outputs=[RequestedOutput("Y", False)])
    built = encode_infer(typed, response, None)
    assert not isinstance(built, bytes) and list(built.outputs[0].contents.fp32_contents) == y.ravel().tolist()
