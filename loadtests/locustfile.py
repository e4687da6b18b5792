"""Locust scenario: the bundled models through every V2 encoding, each answer checked.

Each request goes to `/v2/models/MODEL/infer` as one (model, encoding) pair:

- models: `simple` (INT32 sum and difference), `mlp` (FP32 [n, 16]), `textclass`
  (BYTES texts -> labels and scores) and, optional, `cnn` (FP32 [n, 3, 64, 64]);
- encodings: `json` (V2 JSON), `binary` (V2 binary tensor extension,
  `Inference-Header-Content-Length`, outputs asked for as binary too) and `msgpack`
  (`Content-Type: application/msgpack`, tensors as raw little-endian bytes).

Every answer is checked against what the user computes (`scenario.py`): its status,
output names, datatypes and shapes; `simple`'s sums and differences element by element
(an answer carrying another request's tensors fails); `mlp`'s and `cnn`'s values finite;
`textclass`'s labels among the known classes, its scores summing to one per text with
their argmax the label. A failed check is a Locust failure of that pair.

Environment:

    ASERVE_LOCUST_WEIGHTS   relative weights of the pairs, "model:encoding=weight,..."; pairs
                            not named get 0. Default:
                            simple:json=3,simple:binary=3,simple:msgpack=2,
                            mlp:json=1,mlp:binary=2,mlp:msgpack=1,
                            textclass:json=1,textclass:binary=1,textclass:msgpack=1
                            (cnn is heavy: add e.g. cnn:binary=1 to include it)
    ASERVE_LOCUST_MAX_ROWS  samples per request, drawn from 1..N (default 1)

Each user walks its own shuffled cycle of the weighted pairs (a pair of weight w comes
w times a cycle), so the mix is exact over every cycle and every weighted pair is sent
within sum(weights) requests of each user. Requests are named `model:encoding` in
Locust's statistics and CSV files.

Headless against a local server, statistics as CSV, then a plot of them:

    .venv/bin/aserve serve &                  # examples/ on 127.0.0.1:8000
    .venv/bin/locust -f loadtests/locustfile.py --headless -u 20 -r 10 -t 30s \\
        --host http://127.0.0.1:8000 --csv results/aserve
    .venv/bin/python loadtests/plot.py results/aserve_stats_history.csv   # -> results/aserve.png
"""

from __future__ import annotations

import os
import random
import struct

from locust import FastHttpUser, between, task

# beside this file: Locust puts the locustfile's folder on sys.path
from scenario import (
    DEFAULT_WEIGHTS,
    MODELS,
    REQUESTS,
    Mismatch,
    cycle,
    decode_answer,
    parse_max_rows,
    parse_weights,
)

WEIGHTS = parse_weights(os.environ.get("ASERVE_LOCUST_WEIGHTS") or DEFAULT_WEIGHTS)
MAX_ROWS = parse_max_rows(os.environ.get("ASERVE_LOCUST_MAX_ROWS"))


class InferUser(FastHttpUser):
    wait_time = between(0, 0.01)

    def on_start(self) -> None:
        self.pairs = cycle(WEIGHTS)
        self.next = 0

    @task
    def infer(self) -> None:
        model, encoding = self.pairs[self.next]
        self.next = (self.next + 1) % len(self.pairs)
        inputs, check = MODELS[model].inputs(random.randint(1, MAX_ROWS))
        body, headers = REQUESTS[encoding](inputs)
        # FastHttpSession.post sends bytes as they are; its annotation names only str and dict
        with self.client.post(f"/v2/models/{model}/infer", data=body, headers=headers,  # type: ignore[arg-type]
                              name=f"{model}:{encoding}", catch_response=True) as r:
            if r.status_code != 200:
                r.failure(f"status {r.status_code}: {(r.text or '')[:200]}")
                return
            try:
                check(decode_answer(encoding, r.content or b"", r.headers))
            except (Mismatch, ValueError, KeyError, TypeError, struct.error) as e:
                r.failure(f"{type(e).__name__}: {e}")
