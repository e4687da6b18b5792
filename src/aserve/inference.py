"""What a front hands the data plane and gets back, and what it decodes against.

`ModelSchema` is a loaded model's contract, prepared once per load: its interned
name and input names, the declared inputs in order, the batching limit. A codec
decodes a request body straight into an `InferRequest` whose inputs are already in
that order and whose sample count it derived from them (and checked); the data plane
answers with an `InferResponse`. Neither type knows HTTP.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, NamedTuple

import msgspec

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


class ModelSchema:
    """A loaded model's inputs and outputs as codecs check requests against them.

    max_batch_size > 0: the first dimension of every input is the batch dimension,
    1..max_batch_size, the same for every input. `uniform`: no dimension but the
    batch dimension varies, so any two requests can share a batch.
    `max_latency_budget_ms`: the largest per-request latency budget accepted (the
    model's timeout)."""

    __slots__ = ("by_name", "checked", "inputs", "max_batch_size", "max_latency_budget_ms", "name", "outputs",
                 "plans", "uniform", "version")

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
        self.max_batch_size = max_batch_size
        self.max_latency_budget_ms = max_latency_budget_ms
        skip = 1 if max_batch_size > 0 else 0
        self.uniform = all(-1 not in s.shape[skip:] for s in self.inputs)
        self.plans: dict[bytes | memoryview, Any] = {}  # a codec's checked decodings of repeated headers (aserve.protocol.v2)
        # (name, datatype, shape) of a request's input -> its spec, once checked against it (aserve.protocol.v2)
        self.checked: dict[tuple[str, str, tuple[int, ...]], InputSpec] = {}

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
    form: how the codec answers (V2: the default binary flag; TF-Serving: columnar).
    """

    schema: ModelSchema
    inputs: list[Tensor]
    samples: int
    id: str | None = None
    outputs: list[RequestedOutput] = []
    parameters: dict[str, Any] = {}
    timeout_ms: float | None = None
    latency_budget_ms: float | None = None
    form: Any = None

    def named(self) -> dict[str, Tensor]:
        """The inputs by name."""
        return {spec.name: t for spec, t in zip(self.schema.inputs, self.inputs)}


class InferResponse(msgspec.Struct, kw_only=True, gc=False):
    """The outputs of one request: named tensors over the interpreter's memory."""

    model_name: str
    model_version: str
    outputs: dict[str, Tensor]
    id: str | None = None
