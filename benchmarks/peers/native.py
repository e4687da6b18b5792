"""MOSEC's own kind of JSON body for the benchmarked models, as a MOSEC user would write it:
small msgspec Structs, no V2 envelope (`benchmarks.peers.mosec_native` serves it).

- `simple`: `{"a": [16 ints], "b": [16 ints]}` -> `{"sum": [...], "difference": [...]}` (INT32
  arithmetic, as the V2 model);
- `mlp`: `{"x": [16 floats]}` -> `{"y": [16 floats]}`, examples/mlp's network on one row.

The benchmark makes its requests and reads the answers here (`request_body`,
`outputs`), so that they are checked against the same expected values as V2 answers.
Imports msgspec and the standard library only: MOSEC's environment loads it too.
"""

from __future__ import annotations

from array import array
from typing import Annotated

import msgspec

from .v2 import Tensor

WIDTH = 16
Vector = Annotated[list[int], msgspec.Meta(min_length=WIDTH, max_length=WIDTH)]
Row = Annotated[list[float], msgspec.Meta(min_length=WIDTH, max_length=WIDTH)]


class SimpleRequest(msgspec.Struct, forbid_unknown_fields=True):
    a: Vector
    b: Vector


class SimpleResponse(msgspec.Struct):
    sum: list[int]
    difference: list[int]


class MLPRequest(msgspec.Struct, forbid_unknown_fields=True):
    x: Row


class MLPResponse(msgspec.Struct):
    y: list[float]


REQUESTS: dict[str, type[msgspec.Struct]] = {"simple": SimpleRequest, "mlp": MLPRequest}
RESPONSES: dict[str, type[msgspec.Struct]] = {"simple": SimpleResponse, "mlp": MLPResponse}


def request_body(model: str, inputs: dict[str, Tensor]) -> bytes:
    """The native body carrying the same values as the V2 request's `inputs` (one sample)."""
    if model == "simple":
        return msgspec.json.encode(SimpleRequest(a=list(inputs["INPUT0"].values()),
                                                 b=list(inputs["INPUT1"].values())))
    if model == "mlp":
        return msgspec.json.encode(MLPRequest(x=list(inputs["INPUT"].values())))
    raise ValueError(f"no native body for model {model!r}")


def outputs(model: str, body: bytes) -> dict[str, Tensor]:
    """A native answer as the V2 outputs it stands for (the benchmark checks those)."""
    answer = msgspec.json.decode(body, type=RESPONSES[model])
    if isinstance(answer, SimpleResponse):
        return {"OUTPUT0": Tensor("INT32", (1, len(answer.sum)), array("i", answer.sum).tobytes()),
                "OUTPUT1": Tensor("INT32", (1, len(answer.difference)), array("i", answer.difference).tobytes())}
    assert isinstance(answer, MLPResponse)
    return {"OUTPUT": Tensor("FP32", (1, len(answer.y)), array("f", answer.y).tobytes())}
