"""MOSEC serving `simple` or `mlp`: Rust HTTP front, 2 Python worker processes, dynamic batching.

Runs in MOSEC's own virtual environment (`benchmarks.http` creates it), with the
repository on `PYTHONPATH` for the shared V2 codec and models (standard library only; torch
for `mlp`). MOSEC reads its own flags (`--address`, `--port`, `--log-level`, ...), so the
model comes from the environment:

    ASERVE_BENCH_MODEL=simple python -m benchmarks.peers.mosec_server --address 127.0.0.1 --port 8003
    ASERVE_BENCH_MODEL=mlp ASERVE_BENCH_MODEL_PY=examples/mlp/model.py python -m benchmarks.peers.mosec_server

One stage: each worker deserializes every request of its batch (V2 JSON, or the binary
tensor extension: MOSEC gives a worker the body but not the HTTP headers, so the JSON
header's end is found by parsing it), runs the batch (up to 8 requests, waiting at most
10 ms for it to fill) and serializes each answer. Answers are V2 JSON, also for binary
requests: MOSEC cannot set the `Inference-Header-Content-Length` response header that a
binary response needs, and JSON is a valid V2 answer a client can read.
Served on `/inference` and on `/v2/models/{model}/infer`.
"""

from __future__ import annotations

import os
from typing import Any

from mosec import Server, Worker
from mosec.errors import DecodingError

from benchmarks.peers import models, v2

MODEL = os.environ.get("ASERVE_BENCH_MODEL", "simple")
WORKERS = 2
MAX_BATCH = 8
WAIT_MS = 10


class V2Worker(Worker):  # type: ignore[misc]  # mosec is not typed
    """Decodes V2 requests; answers are encoded by `forward` and passed through."""

    def deserialize(self, data: bytes) -> Any:
        try:
            request = v2.decode_request(data)
            models.validate(MODEL, request.inputs)
        except v2.BadRequest as e:
            raise DecodingError(str(e)) from e  # 400
        return request.inputs

    def serialize(self, data: bytes) -> bytes:
        return data

    def forward(self, data: Any) -> Any:
        raise NotImplementedError


class SimpleWorker(V2Worker):
    def forward(self, data: list[dict[str, v2.Tensor]]) -> list[bytes]:
        return [v2.encode_response(MODEL, models.simple(inputs), binary=False)[0] for inputs in data]


class MLPWorker(V2Worker):
    def __init__(self) -> None:
        super().__init__()
        self.mlp = models.MLP(os.environ["ASERVE_BENCH_MODEL_PY"])

    def forward(self, data: list[dict[str, v2.Tensor]]) -> list[bytes]:
        return [v2.encode_response(MODEL, outputs, binary=False)[0] for outputs in self.mlp(data)]


def main() -> None:
    worker = {"simple": SimpleWorker, "mlp": MLPWorker}[MODEL]
    server = Server()
    server.append_worker(worker, num=WORKERS, max_batch_size=MAX_BATCH, max_wait_time=WAIT_MS,
                         route=["/inference", f"/v2/models/{MODEL}/infer"])
    server.run()


if __name__ == "__main__":
    main()
