"""MOSEC serving `simple` or `mlp` over V2 JSON: Rust HTTP front, Python worker processes (2, or
`ASERVE_BENCH_WORKERS`: as many as aserve's interpreters), dynamic batching; the body decoded
and the answer encoded with msgspec Structs.

Runs in MOSEC's own virtual environment (`benchmarks.http` creates it, msgspec included),
with the repository on `PYTHONPATH` for the shared models and codecs (msgspec and the
standard library; torch for `mlp`). MOSEC reads its own flags (`--address`, `--port`,
`--log-level`, ...), so the model comes from the environment:

    ASERVE_BENCH_MODEL=simple python -m benchmarks.peers.mosec_server --address 127.0.0.1 --port 8003
    ASERVE_BENCH_MODEL=mlp ASERVE_BENCH_MODEL_PY=examples/mlp/model.py python -m benchmarks.peers.mosec_server

One stage, as MOSEC's documentation sets up a batched model: each worker deserializes
every request of its batch (`v2_structs.Decoder`: V2 JSON, or the binary tensor extension,
whose JSON header is found by parsing it since MOSEC gives a worker the body but not the
HTTP headers), runs the batch (up to 8 requests, waiting at most 10 ms for it to fill) and
serializes each answer with msgspec. Answers are V2 JSON, also for binary requests: MOSEC
cannot set the `Inference-Header-Content-Length` response header that a binary response
needs, and JSON is a valid V2 answer a client can read. Served on `/inference` and on
`/v2/models/{model}/infer`. `mosec_native` serves MOSEC's own, smaller JSON body instead.
"""

from __future__ import annotations

import os
from typing import Any

import msgspec
from mosec import Server, Worker
from mosec.errors import DecodingError

from benchmarks.peers import models, v2, v2_structs

MODEL = os.environ.get("ASERVE_BENCH_MODEL", "simple")
WORKERS = int(os.environ.get("ASERVE_BENCH_WORKERS", "2"))
MAX_BATCH = 8
WAIT_MS = 10


class V2Worker(Worker):  # type: ignore[misc]  # mosec is not typed
    """Decodes V2 requests into their inputs' values and encodes V2 answers, with msgspec."""

    def __init__(self) -> None:
        super().__init__()
        self.decode = v2_structs.Decoder(MODEL)
        self.encoder = msgspec.json.Encoder()

    def deserialize(self, data: bytes) -> Any:
        try:
            return self.decode(data)
        except v2.BadRequest as e:
            raise DecodingError(str(e)) from e  # 400

    def serialize(self, data: v2_structs.Response) -> bytes:
        return self.encoder.encode(data)

    def forward(self, data: Any) -> Any:
        raise NotImplementedError


class SimpleWorker(V2Worker):
    def forward(self, data: list[list[list[int]]]) -> list[v2_structs.Response]:
        answers = []
        for x, y in data:
            add, sub = models.add_sub(x, y)
            answers.append(v2_structs.int_response(MODEL, {"OUTPUT0": add, "OUTPUT1": sub}))
        return answers


class MLPWorker(V2Worker):
    def __init__(self) -> None:
        super().__init__()
        self.mlp = models.MLP(os.environ["ASERVE_BENCH_MODEL_PY"])

    def forward(self, data: list[list[list[float]]]) -> list[v2_structs.Response]:
        rows = self.mlp.rows([inputs[0] for inputs in data])
        return [v2_structs.float_response(MODEL, {"OUTPUT": row}) for row in rows]


def serve(worker: type[Worker], **routes: Any) -> None:
    """Run MOSEC with `worker`, in the settings every MOSEC row of the benchmark shares."""
    server = Server()
    server.append_worker(worker, num=WORKERS, max_batch_size=MAX_BATCH, max_wait_time=WAIT_MS, **routes)
    server.run()


def main() -> None:
    serve({"simple": SimpleWorker, "mlp": MLPWorker}[MODEL], route=["/inference", f"/v2/models/{MODEL}/infer"])


if __name__ == "__main__":
    main()
