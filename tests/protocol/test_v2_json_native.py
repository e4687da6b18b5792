"""The V2 JSON codec's path in C (`_native.V2Json`, `_native.v2_json_encode`,
`_native.v2_binary_encode`) against the Python codec it stands in for: where the C path
answers, it answers exactly what the Python codec answers (the same tensors, the same
bytes); where it does not, the Python codec is left to decide. The common requests of every
numeric datatype are decoded in C, the answers of integer and boolean outputs written in C
(float outputs are msgspec's), and binary answers of every datatype written in C."""

from __future__ import annotations

import json
import math
import random
import struct
from typing import Any

import pytest

from aserve import _native
from aserve.errors import AserveError
from aserve.inference import InferRequest, InferResponse, ModelSchema
from aserve.protocol import decode_infer, encode_infer
from aserve.protocol import v2 as v2mod
from aserve.runtime.model import TensorSpec
from aserve.tensor import Tensor

NUMERIC = ("BOOL", "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64", "FP32", "FP64")
INT_RANGES = {
    "INT8": (-(2**7), 2**7 - 1), "INT16": (-(2**15), 2**15 - 1), "INT32": (-(2**31), 2**31 - 1),
    "INT64": (-(2**63), 2**63 - 1), "UINT8": (0, 2**8 - 1), "UINT16": (0, 2**16 - 1),
    "UINT32": (0, 2**32 - 1), "UINT64": (0, 2**64 - 1),
}
PACK = {"BOOL": "?", "INT8": "b", "INT16": "h", "INT32": "i", "INT64": "q", "UINT8": "B", "UINT16": "H",
        "UINT32": "I", "UINT64": "Q", "FP32": "f", "FP64": "d"}
FLT_MAX = 3.4028234663852886e38


def make_schema(inputs: list[tuple[str, str, tuple[int, ...]]], max_batch_size: int,
                output: str = "FP32") -> ModelSchema:
    return ModelSchema("m", "1", inputs=[TensorSpec(n, d, s) for n, d, s in inputs],
                       outputs=[TensorSpec("Y", output, (-1,))], max_batch_size=max_batch_size)


def python_decode(body: bytes, schema: ModelSchema) -> InferRequest | AserveError:
    """The Python codec's answer (its error, where it refuses)."""
    plan, schema.json_plan = schema.json_plan, None
    try:
        return decode_infer(body, content_type="application/json", header_length=None, schema=schema)
    except AserveError as exc:
        return exc
    finally:
        schema.json_plan = plan


def same_request(fast: Any, reference: InferRequest | AserveError) -> None:
    assert isinstance(reference, InferRequest), f"the C path accepted what the codec refuses: {reference}"
    tensors, samples, id_, binary = fast
    assert samples == reference.samples and id_ == reference.id
    assert (binary or False) == reference.binary_outputs and reference.outputs == []
    assert ({} if binary is None else {"binary_data_output": binary}) == reference.parameters
    assert reference.timeout_ms is None and reference.latency_budget_ms is None
    assert [(t.datatype, t.shape, bytes(t.data)) for t in tensors] == \
        [(t.datatype, t.shape, bytes(memoryview(t.data).cast("B"))) for t in reference.inputs]


def value_text(datatype: str, rng: random.Random) -> str:
    """One element as a client may write it, now and then just out of the datatype's range."""
    if datatype == "BOOL":
        return rng.choice(["true", "false"])
    if datatype in INT_RANGES:
        lo, hi = INT_RANGES[datatype]
        v = rng.choice([lo, hi, 0, 1, -1, rng.randint(lo, hi), rng.randint(lo, hi)])
        if rng.random() < 0.02:
            v = rng.choice([lo - 1, hi + 1])
        return rng.choice([str(v), str(v), "-0" if v == 0 else str(v)])
    kind = rng.randrange(9)
    if kind == 0:
        return str(rng.randint(-(10**30), 10**30))
    if kind == 1:
        return rng.choice(["-0", "-0.0", "0", "1e-45", "1.4e-45", "1e-5", "2.5E-05", "1e16", "1e38", "3.5e38",
                           "1e308", "1e309", "-1e-320", "9007199254740993", "0.1", "-123.456e-7"])
    if kind == 2:
        return repr(rng.uniform(-FLT_MAX, FLT_MAX))
    return repr(rng.uniform(-1, 1) * 10 ** rng.randint(-40, 40))


def nested_text(values: list[str], shape: list[int], sep: str) -> str:
    """`values` as nested lists, one per dimension of `shape` (as numpy's tolist() gives them)."""
    if len(shape) <= 1:
        return sep.join(values)
    step = len(values) // shape[0] if shape[0] else 0
    return sep.join("[" + nested_text(values[i * step:(i + 1) * step], shape[1:], sep) + "]" for i in range(shape[0]))


def body_text(inputs: list[tuple[str, str, tuple[int, ...]]], rng: random.Random, *,
              order: bool = True, noise: bool = False, nested: bool = False) -> tuple[str, list[int]]:
    # order: the fields in the order clients write them; else shuffled. nested: the data of
    # inputs of two or more dimensions nested one list per dimension
    """A plain request for the schema's inputs (batch of rows where the first dimension is -1)."""
    rows = rng.randint(1, 4)
    parts = []
    for name, datatype, shape in rng.sample(inputs, len(inputs)):
        real = [rows if (i == 0 and d == -1) else (rng.randint(1, 3) if d == -1 else d) for i, d in enumerate(shape)]
        count = math.prod(real)
        values = [value_text(datatype, rng) for _ in range(count)]
        if nested and len(real) > 1:
            data = nested_text(values, real, rng.choice([", ", ","]))
        else:
            data = ", ".join(values)
        if noise:
            data = ",".join(value_text(datatype, rng) for _ in range(count + rng.choice([-1, 0, 1])))
        fields = [f'"name": "{name}"', f'"datatype": "{datatype}"', f'"shape": {json.dumps(real)}',
                  f'"data": [{data}]']
        if rng.random() < 0.2:  # what MLServer's codecs add, which the codec ignores
            fields.append('"parameters": ' + rng.choice(['{"content_type": "np"}', "{}",
                                                         '{"a": 1.5e3, "b": true, "c": null, "d": false}']))
        if not order:
            rng.shuffle(fields)
        parts.append("{" + rng.choice([", ", ",", " ,\n "]).join(fields) + "}")
    members = ['"inputs": [' + ", ".join(parts) + "]"]
    if rng.random() < 0.3:  # an id, as clients that number their requests send it, before or after
        members.insert(rng.randrange(2), '"id": ' + rng.choice(['"req-7"', '""', "null", '"ünï"']))
    if rng.random() < 0.2:  # what tritonclient sends with JSON inputs and no outputs named
        members.insert(rng.randrange(len(members) + 1),
                       '"parameters": ' + rng.choice(['{"binary_data_output": true}', '{"binary_data_output":false}']))
    return "{" + ", ".join(members) + "}", []


def schemas(rng: random.Random) -> list[tuple[list[tuple[str, str, tuple[int, ...]]], int]]:
    out = []
    for datatype in NUMERIC:
        out.append(([("X", datatype, (-1, 3))], 8))
        out.append(([("X", datatype, (2, -1)), ("ÿname", rng.choice(NUMERIC), (-1,))], 0))
    for _ in range(10):
        n = rng.randint(1, 3)
        out.append(([(f"in{i}", rng.choice(NUMERIC), (-1, *rng.choice([(), (2,), (-1,), (2, 2)])))
                     for i in range(n)], rng.choice([0, 4, 8])))
    return out


def test_plain_requests_of_every_numeric_datatype_decode_in_c_as_the_codec_decodes_them() -> None:
    rng = random.Random(7)
    answered = refused = 0
    for inputs, mbs in schemas(rng):
        schema = make_schema(inputs, mbs)
        plan = v2mod._json_plan(schema)
        assert plan is not None
        for _ in range(60):
            ordered = rng.random() < 0.8  # name, datatype and shape before data, as clients write them
            body = body_text(inputs, rng, order=ordered, nested=rng.random() < 0.4)[0].encode()
            fast = plan.decode(body)
            reference = python_decode(body, schema)
            if fast is not None:
                same_request(fast, reference)
                answered += 1
            elif isinstance(reference, AserveError):
                refused += 1  # a value out of range: the codec names it
            else:
                assert not ordered, f"a plain request the codec accepts was not decoded in C: {body!r}"
    assert answered > refused > 0  # both exercised


def test_a_requests_id_is_read_in_c_wherever_it_comes() -> None:
    schema = make_schema([("X", "INT32", (-1, 3))], 8)
    plan = v2mod._json_plan(schema)
    assert plan is not None
    data = '{"name": "X", "datatype": "INT32", "shape": [1, 3], "data": [1, 2, 3]}'
    for text, id_ in ((f'{{"id": "42", "inputs": [{data}]}}', "42"), (f'{{"inputs": [{data}], "id": "é"}}', "é"),
                      (f'{{"id": null, "inputs": [{data}]}}', None)):
        fast = plan.decode(text.encode())
        assert fast is not None and fast[2] == id_
        same_request(fast, python_decode(text.encode(), schema))
        request = decode_infer(text.encode(), content_type="application/json", header_length=None, schema=schema)
        assert request.id == id_


@pytest.mark.parametrize("binary", [True, False])
def test_binary_data_output_alone_is_read_in_c_and_answered_so(binary: bool) -> None:
    schema = make_schema([("X", "INT32", (-1, 3))], 8, output="INT32")
    text = ('{"inputs": [{"name": "X", "datatype": "INT32", "shape": [1, 3], "data": [1, 2, 3]}], '
            f'"parameters": {{"binary_data_output": {json.dumps(binary)}}}}}')
    plan = v2mod._json_plan(schema)
    assert plan is not None
    fast = plan.decode(text.encode())
    assert fast is not None and fast[3] is binary
    same_request(fast, python_decode(text.encode(), schema))
    request = decode_infer(text.encode(), content_type="application/json", header_length=None, schema=schema)
    response = InferResponse(model_name="m", model_version="1", outputs={"Y": output("INT32", [7, 8, 9], (1, 3))})
    _, headers = encode_infer(response, request, accept=None, content_type="application/json")
    assert ("Inference-Header-Content-Length" in headers) is binary


def test_input_parameters_the_codec_ignores_are_read_in_c() -> None:
    schema = make_schema([("X", "INT32", (-1, 3))], 8)
    plan = v2mod._json_plan(schema)
    assert plan is not None
    text = ('{"inputs": [{"name": "X", "shape": [1, 3], "datatype": "INT32", '
            '"parameters": {"content_type": "np", "n": -2, "ok": true}, "data": [[1, 2, 3]]}]}')
    fast = plan.decode(text.encode())
    assert fast is not None
    same_request(fast, python_decode(text.encode(), schema))


def test_nested_data_as_numpy_writes_it_is_decoded_in_c() -> None:
    schema = make_schema([("X", "FP32", (-1, 2, 3)), ("M", "INT64", (-1, 2))], 4)
    x = [[[0.5, -1.0, 2.0], [3.0, 4.25, -5.0]], [[6.0, 7.0, 8.0], [9.0, 10.0, 11.5]]]
    body = json.dumps({"inputs": [{"name": "X", "datatype": "FP32", "shape": [2, 2, 3], "data": x},
                                  {"name": "M", "datatype": "INT64", "shape": [2, 2], "data": [[1, 2], [3, -4]]}]})
    plan = v2mod._json_plan(schema)
    assert plan is not None
    fast = plan.decode(body.encode())
    assert fast is not None
    same_request(fast, python_decode(body.encode(), schema))
    assert list(memoryview(fast[0][0].data).cast("f")) == [v for plane in x for row in plane for v in row]


def test_plain_requests_in_the_common_key_order_with_values_in_range_are_all_decoded_in_c() -> None:
    schema = make_schema([("INPUT0", "INT32", (-1, 4)), ("INPUT1", "FP32", (-1, 4)), ("B", "BOOL", (-1,))], 8)
    body = json.dumps({"inputs": [
        {"name": "INPUT1", "shape": [2, 4], "datatype": "FP32", "data": [0.1, -2, 3e-7, 1e38, 0, -0.0, 5, 6.5]},
        {"name": "B", "shape": [2], "datatype": "BOOL", "data": [True, False]},
        {"name": "INPUT0", "shape": [2, 4], "datatype": "INT32", "data": [-(2**31), 2**31 - 1, 0, 1, 2, 3, 4, 5]},
    ]}).encode()
    request = decode_infer(body, content_type="application/json", header_length=None, schema=schema)
    assert schema.json_plan is not None and schema.json_plan.decode(body) is not None
    same_request(schema.json_plan.decode(body), python_decode(body, schema))
    assert request.samples == 2
    assert list(memoryview(request.inputs[0].data).cast("B").cast("i")) == [-(2**31), 2**31 - 1, 0, 1, 2, 3, 4, 5]
    assert list(memoryview(request.inputs[1].data).cast("B").cast("f"))[:3] == \
        [struct.unpack("f", struct.pack("f", x))[0] for x in (0.1, -2, 3e-7)]


@pytest.mark.parametrize("text", [
    '{"inputs": [{"name": "X", "datatype": "INT32", "shape": [1, 3], "data": [1, 2, 3]}], "id": "a\\u0041"}',
    '{"inputs": [{"name": "X", "datatype": "INT32", "shape": [1, 3], "data": [1, 2, 3]}], "id": 7}',
    '{"id": "a", "id": "b", "inputs": [{"name": "X", "datatype": "INT32", "shape": [1, 3], "data": [1, 2, 3]}]}',
    '{"id": "a"}',
    '{"id": "a", "inputs": [{"name": "X", "datatype": "INT32", "shape": [1, 3], "data": [1, 2, 3]}],}',
    '{"inputs": [{"name": "X", "datatype": "INT32", "shape": [1, 3], "data": [1, 2, 3]}], "parameters": {}}',
    ('{"inputs": [{"name": "X", "datatype": "INT32", "shape": [1, 3], "data": [1, 2, 3]}], '
     '"parameters": {"binary_data_output": 1}}'),
    ('{"inputs": [{"name": "X", "datatype": "INT32", "shape": [1, 3], "data": [1, 2, 3]}], '
     '"parameters": {"binary_data_output": true, "timeout": 5}}'),
    ('{"inputs": [{"name": "X", "datatype": "INT32", "shape": [1, 3], "data": [1, 2, 3]}], '
     '"parameters": {"latency_budget_ms": 5}}'),
    ('{"parameters": {"binary_data_output": true}, "parameters": {"binary_data_output": true}, '
     '"inputs": [{"name": "X", "datatype": "INT32", "shape": [1, 3], "data": [1, 2, 3]}]}'),
    '{"inputs": [{"name": "X", "datatype": "INT32", "shape": [1, 3], "data": [1, 2, 3]}], "outputs": []}',
    '{"inputs": [{"name": "X", "datatype": "INT32", "data": [[1, 2, 3]], "shape": [1, 3]}]}',
    '{"inputs": [{"name": "X", "datatype": "INT32", "shape": [2, 3], "data": [[1, 2, 3], [4, 5]]}]}',
    '{"inputs": [{"name": "X", "datatype": "INT32", "shape": [2, 3], "data": [[1, 2, 3], [4, 5, 6, 7]]}]}',
    '{"inputs": [{"name": "X", "datatype": "INT32", "shape": [2, 3], "data": [[1, 2, 3]]}]}',
    '{"inputs": [{"name": "X", "datatype": "INT32", "shape": [2, 3], "data": [[1, 2, 3], 4, 5, 6]}]}',
    '{"inputs": [{"name": "X", "datatype": "INT32", "shape": [1, 3], "data": [[[1, 2, 3]]]}]}',
    '{"inputs": [{"name": "X", "datatype": "INT32", "shape": [1, 3], "data": [[1, [2], 3]]}]}',
    '{"inputs": [{"name": "X", "datatype": "INT32", "shape": [1, 3], "data": [[]]}]}',
    '{"inputs": [{"name": "X", "datatype": "INT32", "shape": [1, 3], "data": [[1, 2, 3],]}]}',
    '{"inputs": [{"name": "X", "datatype": "INT32", "shape": [1, 3], "data": [1, 2, 3], "parameters": {"a": {}}}]}',
    '{"inputs": [{"name": "X", "datatype": "INT32", "shape": [1, 3], "data": [1, 2, 3], "parameters": {"a": [1]}}]}',
    '{"inputs": [{"name": "X", "datatype": "INT32", "shape": [1, 3], "data": [1, 2, 3], "parameters": {"a": 01}}]}',
    ('{"inputs": [{"name": "X", "datatype": "INT32", "shape": [1, 3], "data": [1, 2, 3], '
     '"parameters": {"binary_data_size": 12}}]}'),
    ('{"inputs": [{"name": "X", "datatype": "INT32", "shape": [1, 3], "data": [1, 2, 3], '
     '"parameters": {"shared_memory_region": "r"}}]}'),
    ('{"inputs": [{"name": "X", "datatype": "INT32", "shape": [1, 3], "data": [1, 2, 3], '
     '"parameters": {"binary\\u005fdata_size": 12}}]}'),
    ('{"inputs": [{"name": "X", "datatype": "INT32", "shape": [1, 3], "data": [1, 2, 3], '
     '"parameters": {}, "parameters": {}}]}'),
    '{"inputs": [{"name": "X", "datatype": "INT32", "shape": [1, 3], "data": [1, 2.0, 3]}]}',
    '{"inputs": [{"name": "X", "datatype": "INT32", "shape": [1, 3], "data": [1, 2, 3]}]} x',
    '{"inputs": [{"name": "X", "datatype": "INT32", "shape": [1, 3], "data": [1, 2]}]}',
    '{"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}]}',
    '{"inputs": [{"name": "X", "datatype": "INT32", "shape": [9, 3], "data": [1, 2, 3]}]}',
    '{"inputs": [{"name": "X", "datatype": "INT32", "shape": [1, 2], "data": [1, 2]}]}',
    '{"inputs": [{"name": "X", "datatype": "INT32", "shape": [0, 3], "data": []}]}',
    '{"inputs": [{"name": "\\u0058", "datatype": "INT32", "shape": [1, 3], "data": [1, 2, 3]}]}',
    '{"inputs": [{"name": "X", "name": "X", "datatype": "INT32", "shape": [1, 3], "data": [1, 2, 3]}]}',
    ('{"inputs": [{"name": "X", "datatype": "INT32", "shape": [1, 3], "data": [1, 2, 3]}, '
     '{"name": "X", "datatype": "INT32", "shape": [1, 3], "data": [1, 2, 3]}]}'),
    '{"inputs": [{"name": "Z", "datatype": "INT32", "shape": [1, 3], "data": [1, 2, 3]}]}',
    '{"inputs": []}',
    '{"inputs": [{"name": "X", "datatype": "INT32", "shape": [1, 3], "data": [1, 2, 01]}]}',
    '{"inputs": [{"name": "X", "datatype": "INT32", "shape": [1, 3], "data": [1, 2, 2147483648]}]}',
    '{"inputs": [{"name": "X", "datatype": "INT32", "shape": [1, 3], "data": [1, 2, 3]',
    '[{"name": "X", "datatype": "INT32", "shape": [1, 3], "data": [1, 2, 3]}]',
])
def test_what_is_not_plain_is_left_to_the_codec(text: str) -> None:
    schema = make_schema([("X", "INT32", (-1, 3))], 8)
    plan = v2mod._json_plan(schema)
    assert plan is not None and plan.decode(text.encode()) is None
    # the codec gives it the answer it gave before the C path existed
    python = python_decode(text.encode(), schema)
    try:
        got: Any = decode_infer(text.encode(), content_type="application/json", header_length=None, schema=schema)
    except AserveError as exc:
        got = exc
    assert type(got) is type(python) and str(got) == str(python)


def test_mutated_bodies_are_answered_in_c_only_as_the_codec_answers_them() -> None:
    rng = random.Random(11)
    inputs = [("A", "INT16", (-1, 2)), ("B", "FP64", (-1,))]
    schema = make_schema(inputs, 4)
    plan = v2mod._json_plan(schema)
    answered = 0
    for _ in range(1500):
        body = bytearray(body_text(inputs, rng, order=rng.random() < 0.7, noise=rng.random() < 0.2,
                                   nested=rng.random() < 0.4)[0].encode())
        for _ in range(rng.choice([0, 0, 1, 1, 2, 3])):  # bytes changed, dropped or repeated
            i = rng.randrange(len(body))
            op = rng.randrange(3)
            if op == 0:
                body[i] = rng.choice(b'{}[],:"-+.eE0123456789 \\tnul')
            elif op == 1:
                del body[i]
            else:
                body[i:i] = body[i:i + rng.randint(1, 8)]
        fast = plan.decode(bytes(body))
        if fast is not None:
            same_request(fast, python_decode(bytes(body), schema))
            answered += 1
    assert answered > 100


def test_models_with_other_datatypes_keep_the_codec() -> None:
    for datatype in ("BYTES", "FP16", "BF16"):
        assert v2mod._json_plan(make_schema([("X", datatype, (-1,))], 8)) is None


def reference_encode(response: InferResponse, request: InferRequest, monkeypatch: pytest.MonkeyPatch) -> Any:
    with monkeypatch.context() as m:
        m.setattr(v2mod._native, "v2_json_encode", lambda *args: None)
        m.setattr(v2mod._native, "v2_binary_encode", lambda *args: None)
        return encode_infer(response, request, accept=None, content_type="application/json")


def output(datatype: str, values: list[Any], shape: tuple[int, ...]) -> Tensor:
    return Tensor(datatype, shape, memoryview(struct.pack(f"<{len(values)}{PACK[datatype]}", *values)))


def float_values(rng: random.Random, n: int) -> list[float]:
    special = [0.0, -0.0, math.nan, math.inf, -math.inf, 1e-5, 2.5e-5, -1e-5, 9.99999e-6, 1e-6, 1e16, 1e15,
               123456789012345.6, 5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, 0.1, 1 / 3]
    return [rng.choice(special) if rng.random() < 0.3 else rng.uniform(-1, 1) * 10 ** rng.randint(-30, 30)
            for _ in range(n)]


def test_answers_of_integer_and_boolean_outputs_are_written_in_c_byte_for_byte_as_the_codec_writes_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(3)
    schema = make_schema([("X", "INT32", (-1,))], 8, output="INT32")  # declared integral: C is asked first
    assert schema.integral_outputs
    request = InferRequest(schema=schema, inputs=[], samples=1)
    written = 0
    for _ in range(300):
        outputs = {}
        for k in range(rng.randint(1, 3)):
            datatype = rng.choice(NUMERIC)
            shape = (rng.randint(1, 3), rng.randint(1, 4))
            n = math.prod(shape)
            if datatype == "BOOL":
                values: list[Any] = [rng.random() < 0.5 for _ in range(n)]
            elif datatype in INT_RANGES:
                lo, hi = INT_RANGES[datatype]
                values = [rng.choice([lo, hi, 0, rng.randint(lo, hi)]) for _ in range(n)]
            else:
                values = float_values(rng, n)
                if datatype == "FP32":
                    values = [v if not math.isfinite(v) or abs(v) <= FLT_MAX else 1.0 for v in values]
            outputs[rng.choice(["OUT", "ü", "a b", "Y"]) + str(k)] = output(datatype, values, shape)
        response = InferResponse(model_name=rng.choice(["m", "mødel"]), model_version=rng.choice(["1", "v2"]),
                                 outputs=outputs, id=rng.choice([None, "req-1"]))
        body = _native.v2_json_encode(response.model_name, response.model_version, response.id, outputs)
        floats = any(t.datatype in ("FP32", "FP64") for t in outputs.values())
        assert (body is None) == floats  # float outputs are left to msgspec
        reference, headers = reference_encode(response, request, monkeypatch)
        assert encode_infer(response, request, accept=None, content_type="application/json") == \
            (reference, headers)
        if body is not None:
            assert body == b"".join(reference)
            written += 1
    assert written > 50


@pytest.mark.parametrize("case", ["quote in a name", "BYTES output", "FP16 output", "bad size", "no dict",
                                  "non-contiguous", "bool 2"])
def test_answers_it_cannot_write_as_is_are_left_to_the_codec(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    name, tensor = "Y", output("INT32", [1, 2], (1, 2))
    if case == "quote in a name":
        name = 'Y"'
    elif case == "BYTES output":
        tensor = Tensor("BYTES", (1,), struct.pack("<I", 1) + b"a")
    elif case == "FP16 output":
        tensor = Tensor("FP16", (1,), struct.pack("<e", 1.0))
    elif case == "bad size":
        tensor = Tensor("INT32", (1, 3), struct.pack("<2i", 1, 2))
    elif case == "non-contiguous":
        tensor = Tensor("INT32", (2,), memoryview(struct.pack("<4i", 1, 2, 3, 4)).cast("i")[::2])
    elif case == "bool 2":
        tensor = Tensor("BOOL", (2,), b"\x01\x02")
    outputs: Any = {name: tensor}
    if case == "no dict":
        with pytest.raises(TypeError):
            _native.v2_json_encode("m", "1", None, list(outputs.items()))
        return
    assert _native.v2_json_encode("m", "1", None, outputs) is None
    request = InferRequest(schema=make_schema([("X", "INT32", (-1,))], 8, output="INT32"), inputs=[], samples=1)
    response = InferResponse(model_name="m", model_version="1", outputs=outputs)
    try:
        got: Any = encode_infer(response, request, accept=None, content_type="application/json")
    except Exception as exc:  # noqa: BLE001 - the codec's own error, compared below
        got = (type(exc), str(exc))
    try:
        want: Any = reference_encode(response, request, monkeypatch)
    except Exception as exc:  # noqa: BLE001
        want = (type(exc), str(exc))
    assert got == want


def answer_bytes(answer: tuple[list[Any], dict[str, str]]) -> tuple[list[bytes], dict[str, str]]:
    return [bytes(chunk) for chunk in answer[0]], answer[1]


def test_binary_answers_of_every_datatype_are_written_in_c_byte_for_byte_as_the_codec_writes_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(5)
    schema = make_schema([("X", "INT32", (-1,))], 8)
    written = 0
    for _ in range(300):
        outputs: dict[str, Tensor] = {}
        for k in range(rng.randint(1, 3)):
            shape = (rng.randint(1, 3), rng.randint(0, 4))
            n = math.prod(shape)
            datatype = rng.choice([*NUMERIC, "FP16", "BF16", "BYTES"])
            if datatype == "BYTES":
                items = [bytes(rng.randrange(256) for _ in range(rng.randint(0, 5))) for _ in range(n)]
                data: Any = b"".join(struct.pack("<I", len(i)) + i for i in items)
            else:  # any bit pattern: a binary answer formats nothing
                itemsize = 2 if datatype in ("FP16", "BF16") else struct.calcsize(PACK[datatype])
                data = bytes(rng.randrange(256) for _ in range(n * itemsize))
                if datatype == "BOOL":
                    data = bytes(b & 1 for b in data)
            kind = rng.randrange(3)  # how the model's output came: bytes, a byte view, a typed view
            if kind == 1:
                data = memoryview(data)
            elif kind == 2 and datatype not in ("BYTES", "FP16", "BF16"):
                data = memoryview(data).cast(PACK[datatype].replace("?", "B"))
            outputs[rng.choice(["OUT", "ü", "a b", "Y"]) + str(k)] = Tensor(datatype, shape, data)
        names = list(outputs)
        if rng.random() < 0.5:  # outputs asked for by name (tritonclient's way), in another order
            asked = rng.sample(names, rng.randint(1, len(names)))
            request = InferRequest(schema=schema, inputs=[], samples=1,
                                   outputs=[v2mod.RequestedOutput(name, True, 0) for name in asked])
        else:
            request = InferRequest(schema=schema, inputs=[], samples=1, binary_outputs=True)
        response = InferResponse(model_name=rng.choice(["m", "mødel"]), model_version=rng.choice(["1", None]),
                                 outputs=outputs, id=rng.choice([None, "req-1"]))
        reference = answer_bytes(reference_encode(response, request, monkeypatch))
        got = encode_infer(response, request, accept=None, content_type="application/json")
        assert answer_bytes(got) == reference
        assert len(reference[0]) > 1  # binary data follows the header
        written += 1
        names_asked = [r.name for r in request.outputs] if request.outputs else None
        chunks = _native.v2_binary_encode(response.model_name, response.model_version, response.id, outputs,
                                          names_asked)
        assert chunks is not None and [bytes(c) for c in chunks] == reference[0]
    assert written == 300


@pytest.mark.parametrize("case", ["quote in a name", "unknown datatype", "bad size", "missing output",
                                  "non-contiguous", "one output as JSON", "classification", "no outputs"])
def test_binary_answers_it_cannot_write_as_is_are_left_to_the_codec(
        case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    name, tensor = "Y", Tensor("FP32", (1, 2), struct.pack("<2f", 1.0, 2.0))
    asked: list[Any] = []
    if case == "quote in a name":
        name = 'Y"'
    elif case == "unknown datatype":
        tensor = Tensor("FP8", (1,), b"\x01")
    elif case == "bad size":
        tensor = Tensor("FP32", (1, 3), struct.pack("<2f", 1.0, 2.0))
    elif case == "missing output":
        asked = [v2mod.RequestedOutput("Z", True, 0)]
    elif case == "non-contiguous":
        tensor = Tensor("INT32", (2,), memoryview(struct.pack("<4i", 1, 2, 3, 4)).cast("i")[::2])
    elif case == "one output as JSON":
        asked = [v2mod.RequestedOutput("Y", False, 0)]
    elif case == "classification":
        asked = [v2mod.RequestedOutput("Y", True, 1)]
    outputs: Any = {} if case == "no outputs" else {name: tensor}
    if case in ("quote in a name", "unknown datatype", "bad size", "non-contiguous", "no outputs"):
        assert _native.v2_binary_encode("m", "1", None, outputs, None) is None
    if case == "missing output":
        assert _native.v2_binary_encode("m", "1", None, outputs, ["Z"]) is None
    request = InferRequest(schema=make_schema([("X", "INT32", (-1,))], 8), inputs=[], samples=1,
                           outputs=asked, binary_outputs=not asked)
    response = InferResponse(model_name="m", model_version="1", outputs=outputs)

    def encoded() -> Any:
        try:
            return answer_bytes(encode_infer(response, request, accept=None, content_type="application/json"))
        except Exception as exc:  # noqa: BLE001 - the codec's own error, compared below
            return type(exc), str(exc)

    got = encoded()
    with monkeypatch.context() as m:
        m.setattr(v2mod._native, "v2_json_encode", lambda *args: None)
        m.setattr(v2mod._native, "v2_binary_encode", lambda *args: None)
        want = encoded()
    assert got == want


def number_texts(rng: random.Random, n: int) -> list[str]:
    """JSON numbers as clients write them, and the hard cases of reading one: 17-digit reprs,
    float32 values widened, more than 19 significant digits, half-way cases, the edges of
    the normal and subnormal ranges, long runs of zeros."""
    out = []
    for _ in range(n):
        kind = rng.randrange(10)
        if kind == 0:
            text = repr(rng.uniform(-1, 1) * 10 ** rng.randint(-320, 308))
        elif kind == 1:
            text = repr(struct.unpack("<f", struct.pack("<f", rng.gauss(0, 10 ** rng.randint(-30, 30))))[0])
        elif kind == 2:  # a random digit string with a random exponent
            digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 25)))
            point = rng.randint(0, len(digits))
            mantissa = (digits[:point] or "0").lstrip("0") or "0"
            text = mantissa + ("." + digits[point:] if point < len(digits) else "")
            if rng.random() < 0.6:
                text += rng.choice("eE") + rng.choice(["", "+", "-"]) + str(rng.randint(0, 330))
        elif kind == 3:  # half-way between two doubles, and one unit either side
            m = rng.getrandbits(53) | (1 << 52)
            x = (2 * m + 1) * 2 ** rng.randint(-60, 10)  # exactly half-way when the exponent allows
            text = format(x, ".40g") if isinstance(x, float) else str(x)
        elif kind == 4:
            text = rng.choice(["9007199254740993", "9007199254740992", "9007199254740991", "1e23", "8.5e-323",
                               "2.2250738585072011e-308", "2.2250738585072014e-308", "4.9e-324", "2.4703282292062327e-324",
                               "2.4703282292062328e-324", "1.7976931348623157e308", "1.7976931348623158e308",
                               "0.000000000000000000000000000000001", "100000000000000000000000", "1e-400",
                               "123456789012345678901234567890", "0.1e1", "5e-324", "1.0000000000000002",
                               "0.30000000000000004", "7.2057594037927933e16", "1448997445238699"])
        elif kind == 5:
            text = str(rng.getrandbits(rng.randint(1, 70)))
        else:
            text = repr(rng.uniform(-1, 1))
        if rng.random() < 0.3 and text[0] != "-":
            text = "-" + text
        out.append(text)
    return out


@pytest.mark.parametrize("datatype", ["FP64", "FP32"])
def test_numbers_are_read_as_the_nearest_double_as_python_reads_them(datatype: str) -> None:
    # the C reader of JSON numbers (Clinger's fast path, Eisel-Lemire, CPython's strtod for
    # what they leave) against float(): every number the codec accepts, the same bits
    rng = random.Random(17 if datatype == "FP64" else 19)
    schema = make_schema([("X", datatype, (-1,))], 0)
    plan = v2mod._json_plan(schema)
    assert plan is not None
    checked = 0
    for _ in range(200):
        texts = number_texts(rng, 1000)
        values = [float(t) for t in texts]
        keep = [(t, v) for t, v in zip(texts, values)
                if math.isfinite(v) and (datatype == "FP64" or abs(v) <= FLT_MAX)]
        data = ", ".join(t for t, _ in keep)
        body = f'{{"inputs": [{{"name": "X", "datatype": "{datatype}", "shape": [{len(keep)}], "data": [{data}]}}]}}'.encode()
        fast = plan.decode(body)
        assert fast is not None
        want = [0.0 if v == 0 and t.lstrip("-").isdigit() else v for t, v in keep]  # an integer -0 is 0
        got = bytes(fast[0][0].data)
        expected = struct.pack(f"<{len(want)}{'d' if datatype == 'FP64' else 'f'}", *want)
        if got != expected:
            size = 8 if datatype == "FP64" else 4
            bad = next(i for i in range(len(keep)) if got[i * size:(i + 1) * size] != expected[i * size:(i + 1) * size])
            raise AssertionError(f"{keep[bad][0]!r}: read as {got[bad * size:(bad + 1) * size]!r}, "
                                 f"Python reads {expected[bad * size:(bad + 1) * size]!r}")
        checked += len(keep)
    assert checked > 150_000
