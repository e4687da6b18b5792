"""Locust scenario: V2 infer on the bundled `simple` model, JSON and binary tensor bodies.

Headless against a local server:

    aserve serve &                      # examples/ on 127.0.0.1:8000
    locust -f loadtests/locustfile.py --headless -u 50 -r 10 -t 30s --host http://127.0.0.1:8000

Every answer is checked against the sums and differences computed here, so a
response carrying another request's tensors counts as a failure. MODEL (default
`simple`) picks another model with the same INPUT0/INPUT1 INT32 [-1, 16] contract.
"""

from __future__ import annotations

import json
import os
import random
import struct

from locust import FastHttpUser, between, task

MODEL = os.environ.get("MODEL", "simple")
WIDTH = 16


def _pair() -> tuple[list[int], list[int]]:
    a = [random.randint(-1000, 1000) for _ in range(WIDTH)]
    b = [random.randint(-1000, 1000) for _ in range(WIDTH)]
    return a, b


class InferUser(FastHttpUser):
    wait_time = between(0, 0.01)

    @task(1)
    def infer_json(self) -> None:
        a, b = _pair()
        body = {"inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [1, WIDTH], "data": a},
            {"name": "INPUT1", "datatype": "INT32", "shape": [1, WIDTH], "data": b},
        ]}
        with self.client.post(f"/v2/models/{MODEL}/infer", json=body, name="infer json",
                              catch_response=True) as r:
            if r.status_code != 200:
                r.failure(f"status {r.status_code}: {r.text[:200]}")
                return
            outputs = {o["name"]: o["data"] for o in r.json()["outputs"]}
            if outputs["OUTPUT0"] != [x + y for x, y in zip(a, b)] or outputs["OUTPUT1"] != [x - y for x, y in zip(a, b)]:
                r.failure("wrong result")

    @task(1)
    def infer_binary(self) -> None:
        a, b = _pair()
        raw = struct.pack(f"<{WIDTH}i", *a) + struct.pack(f"<{WIDTH}i", *b)
        header = json.dumps({
            "inputs": [
                {"name": "INPUT0", "datatype": "INT32", "shape": [1, WIDTH], "parameters": {"binary_data_size": 4 * WIDTH}},
                {"name": "INPUT1", "datatype": "INT32", "shape": [1, WIDTH], "parameters": {"binary_data_size": 4 * WIDTH}},
            ],
            "parameters": {"binary_data_output": True},
        }).encode()
        headers = {"Inference-Header-Content-Length": str(len(header)), "Content-Type": "application/octet-stream"}
        with self.client.post(f"/v2/models/{MODEL}/infer", data=header + raw, headers=headers, name="infer binary",
                              catch_response=True) as r:
            if r.status_code != 200:
                r.failure(f"status {r.status_code}: {r.text[:200]}")
                return
            n = int(r.headers["Inference-Header-Content-Length"])
            meta = json.loads(r.content[:n])
            blobs, offset = {}, n
            for o in meta["outputs"]:
                size = o["parameters"]["binary_data_size"]
                blobs[o["name"]] = list(struct.unpack(f"<{WIDTH}i", r.content[offset:offset + size]))
                offset += size
            if blobs["OUTPUT0"] != [x + y for x, y in zip(a, b)] or blobs["OUTPUT1"] != [x - y for x, y in zip(a, b)]:
                r.failure("wrong result")
