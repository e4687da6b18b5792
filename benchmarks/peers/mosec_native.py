"""MOSEC serving `simple` or `mlp` in its own kind of JSON body (`native`): the peer at its
fastest, set up as MOSEC's examples set up a typed model, with msgspec Structs decoded and
encoded by the worker and no V2 envelope.

Runs in MOSEC's virtual environment as `mosec_server` does, with its settings
(`mosec_server.serve`), on MOSEC's default route `/inference`:

    ASERVE_BENCH_MODEL=simple python -m benchmarks.peers.mosec_native --address 127.0.0.1 --port 8004

A request that is not the model's Struct gets 400 (not JSON) or 422 (wrong fields or
lengths), as MOSEC's own typed mixin answers.
"""

from __future__ import annotations

import os
from typing import Any

import msgspec
from mosec import Worker
from mosec.errors import DecodingError, ValidationError

from benchmarks.peers import models, native
from benchmarks.peers.mosec_server import MODEL, serve


class NativeWorker(Worker):  # type: ignore[misc]  # mosec is not typed
    """Decodes the model's request Struct and encodes its response Struct, with msgspec JSON."""

    def __init__(self) -> None:
        super().__init__()
        self.decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(native.REQUESTS[MODEL])
        self.encoder = msgspec.json.Encoder()

    def deserialize(self, data: bytes) -> Any:
        try:
            return self.decoder.decode(data)
        except msgspec.ValidationError as e:
            raise ValidationError(str(e)) from e  # 422
        except msgspec.DecodeError as e:
            raise DecodingError(str(e)) from e  # 400

    def serialize(self, data: msgspec.Struct) -> bytes:
        return self.encoder.encode(data)

    def forward(self, data: Any) -> Any:
        raise NotImplementedError


class SimpleWorker(NativeWorker):
    def forward(self, data: list[native.SimpleRequest]) -> list[native.SimpleResponse]:
        return [native.SimpleResponse(*models.add_sub(r.a, r.b)) for r in data]


class MLPWorker(NativeWorker):
    def __init__(self) -> None:
        super().__init__()
        self.mlp = models.MLP(os.environ["ASERVE_BENCH_MODEL_PY"])

    def forward(self, data: list[native.MLPRequest]) -> list[native.MLPResponse]:
        return [native.MLPResponse(row) for row in self.mlp.rows([r.x for r in data])]


def main() -> None:
    serve({"simple": SimpleWorker, "mlp": MLPWorker}[MODEL])


if __name__ == "__main__":
    main()
