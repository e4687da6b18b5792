"""The V2 JSON body as msgspec Structs, as a MOSEC user serving V2 would decode it (MOSEC's
own typed mixins decode with msgspec too): one Struct per model's element type, decoded in
one pass with the values typed, and the answer encoded from Structs.

A binary request (the tensor extension: a JSON header, then the raw tensors) has no
header-length here (MOSEC hands a worker the body, not the headers): when the body is not
JSON as a whole, the JSON header's end is found by parsing it (`v2.split`), and the header
alone is decoded into the same Structs.

Imports msgspec and the standard library only: MOSEC's environment loads it.
"""

from __future__ import annotations

from array import array
from typing import Any

import msgspec

from . import v2


class BinaryData(msgspec.Struct):
    binary_data_size: int | None = None


class IntInput(msgspec.Struct):
    name: str
    datatype: str
    shape: list[int]
    data: list[int] = []
    parameters: BinaryData | None = None


class FloatInput(msgspec.Struct):
    name: str
    datatype: str
    shape: list[int]
    data: list[float] = []
    parameters: BinaryData | None = None


class IntRequest(msgspec.Struct):
    inputs: list[IntInput]


class FloatRequest(msgspec.Struct):
    inputs: list[FloatInput]


class IntOutput(msgspec.Struct):
    name: str
    datatype: str
    shape: list[int]
    data: list[int]


class FloatOutput(msgspec.Struct):
    name: str
    datatype: str
    shape: list[int]
    data: list[float]


class Response(msgspec.Struct):
    model_name: str
    outputs: list[IntOutput] | list[FloatOutput]


# per model: its inputs' names, their V2 datatype, and the request Struct
MODELS: dict[str, tuple[tuple[str, ...], str, type[IntRequest | FloatRequest]]] = {
    "simple": (("INPUT0", "INPUT1"), "INT32", IntRequest),
    "mlp": (("INPUT",), "FP32", FloatRequest),
}
WIDTH = 16


class Decoder:
    """Decodes one model's V2 requests into its inputs' values, one list of WIDTH per input
    (one sample per request, as the benchmark sends); raises v2.BadRequest."""

    def __init__(self, model: str) -> None:
        self.names, self.datatype, request = MODELS[model]
        self.typecode = v2.TYPECODES[self.datatype]
        self.decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(request)

    def __call__(self, body: bytes) -> list[list[Any]]:
        blob = memoryview(b"")
        try:
            try:
                request = self.decoder.decode(body)
            except msgspec.DecodeError:  # a binary request: decode its JSON header alone
                _, blob = v2.split(body, None)
                request = self.decoder.decode(body[:len(body) - len(blob)])
        except msgspec.DecodeError as e:
            raise v2.BadRequest(f"the request is not a V2 JSON request: {e}") from e
        by_name = {item.name: item for item in request.inputs}
        values = []
        offset = 0
        for name in self.names:
            item = by_name.get(name)
            if item is None:
                raise v2.BadRequest(f"input {name} is missing; got {sorted(by_name)}")
            if item.datatype != self.datatype or item.shape not in ([1, WIDTH], [-1, WIDTH]):
                raise v2.BadRequest(f"input {name}: expected {self.datatype} [1, {WIDTH}], got {item.datatype} "
                                    f"{item.shape}")
            data: list[Any] = item.data
            size = item.parameters.binary_data_size if item.parameters is not None else None
            if size is not None:
                if size != WIDTH * 4 or offset + size > len(blob):
                    raise v2.BadRequest(f"input {name}: binary_data_size {size}, {len(blob) - offset} bytes left")
                elements = array(self.typecode)
                elements.frombytes(blob[offset:offset + size])
                data = elements.tolist()
                offset += size
            if len(data) != WIDTH:
                raise v2.BadRequest(f"input {name}: {len(data)} values, shape [1, {WIDTH}] needs {WIDTH}")
            values.append(data)
        return values


def int_response(model: str, outputs: dict[str, list[int]]) -> Response:
    return Response(model, [IntOutput(name, "INT32", [1, len(v)], v) for name, v in outputs.items()])


def float_response(model: str, outputs: dict[str, list[float]]) -> Response:
    return Response(model, [FloatOutput(name, "FP32", [1, len(v)], v) for name, v in outputs.items()])
