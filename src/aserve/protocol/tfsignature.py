"""TensorFlow-Serving's metadata, classify and regress messages.

- `GET /v1/models/{m}[/versions/{v}]/metadata`: the model's signature (`serving_default`)
  in TF-Serving's form: input and output TensorInfos (`DT_FLOAT`, shapes with -1 for
  the batch and variable dimensions).
- `POST /v1/models/{m}:classify` and `:regress` take `{"examples": [...], "context": {...}}`
  (each example an object of feature name -> value, the context's features shared by
  every example). The features are the model's inputs, one sample per example; they are
  decoded exactly as predict's row format decodes instances.
  A model fits `:regress` when it has one numeric output with one value per sample;
  `:classify` when it has one numeric output of class scores per sample (or outputs
  named `scores`, with `classes` holding the labels). Labels are the `classes` output,
  else the model's classification labels, else the class index. Other models get 501
  naming what they do support.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

import msgspec

from ..errors import InvalidInput, NotSupported
from ..inference import Answer, InferCall, InferRequest, InferResponse, Labels, ModelSchema
from ..runtime.datatypes import element_count
from ..runtime.model import TensorSpec
from ..tensor import Tensor
from . import arrays
from .formats import DECODE_ERRORS, decode_error
from .tfserving import decode_predict

Method = Literal["classify", "regress"]

TF_DTYPES = {
    "BOOL": "DT_BOOL", "UINT8": "DT_UINT8", "UINT16": "DT_UINT16", "UINT32": "DT_UINT32", "UINT64": "DT_UINT64",
    "INT8": "DT_INT8", "INT16": "DT_INT16", "INT32": "DT_INT32", "INT64": "DT_INT64", "FP16": "DT_HALF",
    "FP32": "DT_FLOAT", "FP64": "DT_DOUBLE", "BF16": "DT_BFLOAT16", "BYTES": "DT_STRING",
}
METHOD_NAMES = {"predict": "tensorflow/serving/predict", "classify": "tensorflow/serving/classify",
                "regress": "tensorflow/serving/regress"}


# ---- metadata ----

class TFDim(msgspec.Struct):
    size: Annotated[str, msgspec.Meta(description="the dimension; -1: any size (the batch, or variable)")]


class TFTensorShape(msgspec.Struct):
    dim: list[TFDim]
    unknown_rank: bool = False


class TFTensorInfo(msgspec.Struct):
    dtype: str
    tensor_shape: TFTensorShape
    name: str


class TFSignatureDef(msgspec.Struct):
    inputs: dict[str, TFTensorInfo]
    outputs: dict[str, TFTensorInfo]
    method_name: str


class TFSignatureDefMap(msgspec.Struct):
    signature_def: dict[str, TFSignatureDef]


class TFModelMetadata(msgspec.Struct):
    signature_def: TFSignatureDefMap


class TFModelSpec(msgspec.Struct):
    name: str
    signature_name: str
    version: str


class TFMetadataResponse(msgspec.Struct):
    """`GET /v1/models/{model}[/versions/{version} | /labels/{label}]/metadata`."""

    model_spec: TFModelSpec
    metadata: TFModelMetadata


def _info(spec: TensorSpec, batched: bool) -> TFTensorInfo:
    shape = list(spec.shape)
    if batched and (not shape or shape[0] != -1):
        shape = [-1, *shape]
    return TFTensorInfo(TF_DTYPES.get(spec.datatype, "DT_INVALID"),
                        TFTensorShape([TFDim(str(d)) for d in shape]), spec.name)


def metadata(name: str, version: str, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec], *,
             max_batch_size: int) -> TFMetadataResponse:
    """A model's TF-Serving metadata: its signature `serving_default` (predict), plus
    `classify` / `regress` signatures when it fits them."""
    batched = max_batch_size > 0
    sig_inputs = {s.name: _info(s, False) for s in inputs}
    sig_outputs = {s.name: _info(s, False) for s in outputs}
    signatures = {"serving_default": TFSignatureDef(sig_inputs, sig_outputs, METHOD_NAMES["predict"])}
    for method in ("classify", "regress"):
        if fits(method, outputs, batched=batched) is None:
            signatures[method] = TFSignatureDef(sig_inputs, sig_outputs, METHOD_NAMES[method])
    return TFMetadataResponse(TFModelSpec(name, "", version), TFModelMetadata(TFSignatureDefMap(signatures)))


# ---- classify and regress ----

class ExamplesRequest(msgspec.Struct):
    """`POST /v1/models/{model}:classify` / `:regress`."""

    examples: list[dict[str, Any]]
    signature_name: str | None = None
    context: dict[str, Any] | None = None


class ClassifyResponse(msgspec.Struct):
    """Per example, every class as [label, score], in the model's order."""

    result: list[list[tuple[str, float]]]


class RegressResponse(msgspec.Struct):
    """Per example, the model's value."""

    result: list[float]


_DECODER = msgspec.json.Decoder(ExamplesRequest)
_ENCODER = msgspec.json.Encoder()


def _per_sample(spec: TensorSpec, batched: bool) -> tuple[int, ...]:
    shape = tuple(spec.shape)
    return shape[1:] if batched and shape else shape


def fits(method: Method | str, outputs: Sequence[TensorSpec], *, batched: bool) -> str | None:
    """None when a model with these outputs fits `method`, else what it would need."""
    numeric = [s for s in outputs if s.datatype not in ("BYTES", "BOOL")]
    if method == "regress":
        if len(outputs) == 1 and numeric and -1 not in _per_sample(numeric[0], batched) \
                and element_count(_per_sample(numeric[0], batched)) == 1:
            return None
        return "one numeric output with one value per example (shape [-1] or [-1, 1])"
    by_name = {s.name: s for s in outputs}
    scores = by_name.get("scores") if "scores" in by_name else (numeric[0] if len(outputs) == 1 and numeric else None)
    per_sample = _per_sample(scores, batched) if scores is not None else ()
    if scores is not None and scores.datatype not in ("BYTES", "BOOL") and len(per_sample) == 1 and per_sample[0] != 1:
        classes = by_name.get("classes")
        if classes is None or (classes.datatype == "BYTES" and len(outputs) == 2):
            return None
    return ("one numeric output of class scores per example (shape [-1, K], K > 1), or outputs 'scores' and "
            "'classes' (BYTES labels)")


def check_fits(method: Method, schema: ModelSchema) -> None:
    """NotSupported (501) naming what `method` needs and what the model has."""
    need = fits(method, schema.outputs, batched=schema.max_batch_size > 0)
    if need is not None:
        has = ", ".join(f"{s.name!r} {s.datatype} {list(s.shape)}" for s in schema.outputs) or "none"
        raise NotSupported(f":{method} needs a model with {need}; model {schema.name!r} has outputs {has}: "
                           f"use :predict (POST /v1/models/{schema.name}:predict)")


def examples_to_predict(body: bytes | bytearray | memoryview, schema: ModelSchema) -> bytes:
    """A classify/regress body as the predict row-format body of the same samples."""
    try:
        wire = _DECODER.decode(body)
    except msgspec.ValidationError as exc:
        raise decode_error(exc, "json", document=body) from None
    except DECODE_ERRORS as exc:
        raise decode_error(exc, "json") from None
    if not wire.examples:
        raise InvalidInput("examples: expected at least one example, got []")
    batched = schema.max_batch_size > 0
    shapes = {s.name: s.shape[1:] if batched and s.shape else s.shape for s in schema.inputs}
    instances = []
    for example in wire.examples:
        merged = {**(wire.context or {}), **example}
        for name, value in merged.items():
            shape = shapes.get(name)
            if shape is not None and len(shape) == 1 and not isinstance(value, list):
                merged[name] = [value]  # a feature's single value, for a one-dimensional input
        instances.append(merged)
    if len(schema.inputs) == 1:
        only = schema.inputs[0].name
        instances = [inst[only] if inst.keys() == {only} else inst for inst in instances]
    return _ENCODER.encode({"instances": instances})


def _rows(tensor: Tensor, samples: int) -> list[list[Any]]:
    values = arrays.unpack(tensor.datatype, tensor.data)
    per = len(values) // samples if samples else 0
    return [values[i * per:(i + 1) * per] for i in range(samples)]


def encode_regress(outputs: dict[str, Tensor], samples: int) -> bytes:
    (tensor,) = outputs.values()
    return _ENCODER.encode(RegressResponse([float(row[0]) for row in _rows(tensor, samples)]))


def encode_classify(outputs: dict[str, Tensor], samples: int, labels: Sequence[str] | None) -> bytes:
    scores = outputs["scores"] if "scores" in outputs else next(iter(outputs.values()))
    classes = _rows(outputs["classes"], samples) if "classes" in outputs else None
    result = []
    for i, row in enumerate(_rows(scores, samples)):
        names = classes[i] if classes is not None else None
        pairs = []
        for k, score in enumerate(row):
            if names is not None and k < len(names):
                label = names[k].decode("utf-8", "replace")
            elif labels is not None and k < len(labels):
                label = labels[k]
            else:
                label = str(k)
            pairs.append((label, float(score)))
        result.append(pairs)
    return _ENCODER.encode(ClassifyResponse(result))


class ExamplesCodec:
    """TF-Serving's classify or regress: examples in, one result per example out, for a model
    whose outputs fit the method (else NotSupported, 501, naming what it needs)."""

    budgets = False  # no parameters: the model's budget

    def __init__(self, method: Method) -> None:
        self.method = method

    def decode(self, call: InferCall, schema: ModelSchema, /) -> InferRequest:
        check_fits(self.method, schema)
        try:
            return decode_predict(examples_to_predict(call.body, schema), schema=schema)
        except InvalidInput as e:
            raise InvalidInput(str(e).replace("instances", "examples")) from None

    def encode(self, call: InferCall, request: InferRequest, response: InferResponse, labels: Labels, /) -> Answer:
        outputs = response.outputs
        if self.method == "regress":
            body = encode_regress(outputs, request.samples)
        else:
            scores = "scores" if "scores" in outputs else next(iter(outputs))
            body = encode_classify(outputs, request.samples, labels(scores))
        return Answer([body], {"Content-Type": "application/json"})

    def protocol(self, call: InferCall, /) -> str:
        return "tfserving"


CLASSIFY = ExamplesCodec("classify")
REGRESS = ExamplesCodec("regress")
