"""What a front hands the data plane and gets back, and what requests are decoded against.

A front (the HTTP server, a test, a benchmark) hands the data plane an `InferCall`: which
model, the body as it arrived and the few headers the codec reads, and the `Codec`
that reads and writes that body. The data plane decodes it with the codec into an
`InferRequest` checked against the model's `ModelSchema` (a loaded model's contract,
prepared once per load), runs it, and encodes the `InferResponse` into an `Answer`:
the body's buffers and headers. None of these types knows HTTP.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

import msgspec

from .bounded import Bounded
from .runtime.datatypes import DATATYPES
from .runtime.model import TensorSpec
from .tensor import Tensor


class InputSpec(NamedTuple):
    """One declared input: its position among the model's inputs, and its element size
    (0 for BYTES, whose elements carry their own lengths)."""

    position: int
    name: str
    datatype: str
    shape: tuple[int, ...]
    itemsize: int


INTEGRAL = frozenset({"BOOL", "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64"})
MAX_REMEMBERED = 64  # distinct request headers / inputs remembered per model load


class ModelSchema:
    """A loaded model's inputs and outputs as codecs check requests against them.

    max_batch_size > 0: the first dimension of every input is the batch dimension,
    1..max_batch_size, the same for every input. `uniform`: no dimension but the
    batch dimension varies, so any two requests can share a batch.
    `max_latency_budget_ms`: the largest per-request latency budget accepted (the
    model's timeout)."""

    __slots__ = ("by_name", "checked", "grpc_plans", "inputs", "integral_outputs", "json_plan", "max_batch_size",
                 "max_latency_budget_ms", "name", "outputs", "plans", "uniform", "version")

    def __init__(self, name: str, version: str, *, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec],
                 max_batch_size: int, max_latency_budget_ms: float | None = None) -> None:
        self.name = sys.intern(name)
        self.version = sys.intern(version)
        self.inputs = tuple(
            InputSpec(i, sys.intern(s.name), s.datatype, tuple(s.shape), DATATYPES[s.datatype].itemsize)
            for i, s in enumerate(inputs)
        )
        self.by_name = {s.name: s for s in self.inputs}
        self.outputs = tuple(TensorSpec(sys.intern(s.name), s.datatype, tuple(s.shape)) for s in outputs)
        # every declared output an integer or boolean tensor (the V2 JSON answers written in C)
        self.integral_outputs = bool(self.outputs) and all(s.datatype in INTEGRAL for s in self.outputs)
        self.max_batch_size = max_batch_size
        self.max_latency_budget_ms = max_latency_budget_ms
        skip = 1 if max_batch_size > 0 else 0
        self.uniform = all(-1 not in s.shape[skip:] for s in self.inputs)
        # the V2 codec's checked decodings of repeated binary headers, found in C
        # (`_native.V2Binary`): None until the first binary request (aserve.protocol.v2)
        self.plans: Any = None
        # (name, datatype, shape) of a request's input -> its spec, once checked (aserve.protocol.validate)
        self.checked: Bounded[tuple[str, str, tuple[int, ...]], InputSpec] = Bounded(MAX_REMEMBERED)
        # the V2 JSON codec's decoder in C of this model's common requests: False until first
        # asked for, None where its inputs' datatypes are not ones it decodes (aserve.protocol.v2)
        self.json_plan: Any = False
        # the gRPC codec's checked decodings of repeated ModelInferRequests, by their bytes but the
        # id and the raw contents (`_native.grpc_split`; aserve.protocol.grpc.codec)
        self.grpc_plans: Bounded[bytes, Any] = Bounded(MAX_REMEMBERED)

    @property
    def input_names(self) -> list[str]:
        return [s.name for s in self.inputs]

    def accepts(self, other: ModelSchema) -> bool:
        """True when a request decoded against `other` is valid for this schema too (a
        reload that kept the inputs, outputs and batching)."""
        return other is self or (
            other.inputs == self.inputs and other.outputs == self.outputs
            and other.max_batch_size == self.max_batch_size
            and other.max_latency_budget_ms == self.max_latency_budget_ms
        )


class RequestedOutput(msgspec.Struct, frozen=True, gc=False):
    """An output the client asked for; `binary`: send its data as raw bytes (V2's binary
    tensor extension) rather than in the message; `classification`: send its top N
    classes instead (Triton's classification extension; 0: the tensor itself)."""

    name: str
    binary: bool
    classification: int = 0


class InferRequest(msgspec.Struct, kw_only=True, gc=False):
    """A decoded, validated infer request.

    schema: the model it was decoded against. inputs: the model's inputs in the
    schema's order. samples: batch rows (the leading
    dimension of the inputs, checked equal; 1 if the model does not batch).
    outputs: the outputs asked for, in order (empty: every output the model returns).
    timeout_ms: the caller's deadline (it may only shorten the model's).
    latency_budget_ms: this request's latency budget (None: the model's own).
    binary_outputs: V2: outputs not named in `outputs` are sent as binary tensors.
    columnar: TF-Serving: the request came in the columnar format, and is answered in it.
    """

    schema: ModelSchema
    inputs: list[Tensor]
    samples: int
    id: str | None = None
    outputs: list[RequestedOutput] = []
    parameters: dict[str, Any] = {}
    timeout_ms: float | None = None
    latency_budget_ms: float | None = None
    binary_outputs: bool = False
    columnar: bool = False

    def named(self) -> dict[str, Tensor]:
        """The inputs by name."""
        return {spec.name: t for spec, t in zip(self.schema.inputs, self.inputs)}


class InferResponse(msgspec.Struct, kw_only=True, gc=False):
    """The outputs of one request: named tensors over the interpreter's memory."""

    model_name: str
    model_version: str
    outputs: dict[str, Tensor]
    id: str | None = None


Labels = Callable[[str], Sequence[str] | None]  # an output's class labels (Triton's classification extension)


class Answer:
    """A successful answer, as a codec encoded it: the body's buffers (bytes and flat byte
    views, written in order, never joined) and its headers (Content-Type among them). A front
    sends it as it is: `status` 200, and the connection stays open (`close`)."""

    __slots__ = ("chunks", "headers")
    status = 200
    close = False

    def __init__(self, chunks: list[Any], headers: dict[str, str]) -> None:
        self.chunks = chunks
        self.headers = headers


class Codec(Protocol):
    """Reads one wire format's infer requests and writes its answers (aserve.protocol).

    `budgets`: its requests may carry their own latency budget (a check made before the
    body is read allows for the largest the model accepts)."""

    budgets: bool

    def decode(self, call: InferCall, schema: ModelSchema, /) -> InferRequest:
        """The request in `call.body`, checked against `schema`; InvalidInput names the field."""
        ...

    def encode(self, call: InferCall, request: InferRequest, response: InferResponse, labels: Labels, /) -> Answer:
        """The answer to `request`; `labels(output)` reads an output's class labels."""
        ...

    def protocol(self, call: InferCall, /) -> str:
        """What a trace names the call's protocol (`v2-json`, `v2-binary`, `tfserving`, ...)."""
        ...


class InferCall(msgspec.Struct, kw_only=True, gc=False):
    """An infer request as a front received it, for `DataPlane.infer`.

    codec: reads the body and writes the answer. model, version: what the caller named
    (version None: the latest; a number or a label). body: the whole body, any buffer.
    content_type, accept, header_length: the headers a codec reads (header_length: V2's
    Inference-Header-Content-Length). headers: where a trace context is read from
    (`traceparent`, lower-case names). received: time.monotonic() when the request's first
    bytes arrived (its latency budget counts from then). route, host: the route template
    (gRPC: the method's full name) and Host a trace's server span names. timeout_ms: the
    deadline the front itself was given (gRPC's `grpc-timeout`); it may only shorten the
    model's and the request's own. held: the connection held it unread after a refusal, and
    `received` counts that hold (the batcher's admission judges it, `Batcher.submit`).
    admission: what the batcher was asked to admit (samples, latency budget in seconds or
    None), set by `DataPlane.submit` once the body is decoded (`DataPlane.refuse_again`).
    whole: time.perf_counter() when another loop had the whole request and handed it over (a
    front's, `--loops`): its duration counts from then, not from `DataPlane.submit`. client:
    who sent it, where the front can tell (an HTTP connection's identity; None: unknown),
    for `DataPlane.sole`. describe: the front's (name, attributes) of a sampled call's server
    span for its transport (server/spans.py; None: its route alone)."""

    codec: Codec
    model: str
    version: str | None = None
    body: Any = b""
    content_type: str | None = None
    accept: str | None = None
    header_length: int | None = None
    headers: Mapping[str, str] = {}
    received: float | None = None
    route: str = ""
    host: str = ""
    timeout_ms: float | None = None
    front: str = "http"  # the protocol it came in (http, grpc): what the metrics label it
    held: bool = False
    admission: tuple[int, float | None] | None = None
    whole: float | None = None
    client: int | None = None
    describe: Any = None
