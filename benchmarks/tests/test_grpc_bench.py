"""`benchmarks.grpc`: a brief run of aserve's two fronts (MLServer's environment is made only
by a real run), its records and summary, and the answer check that guards every number."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

from benchmarks import grpc as bench


def test_a_brief_run_records_both_fronts_and_their_ratio(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "grpc.json"
    argv = ["--servers", "aserve-grpc,aserve-http", "--duration", "0.3", "--warmup", "0.1", "--rounds", "2",
            "--concurrency", "2", "--interpreters", "1", "--json", str(out)]
    assert bench.main(argv) == 0
    *points, summary = json.loads(out.read_text())
    assert [(r["server"], r["round"]) for r in points] == [
        ("aserve-grpc", 0), ("aserve-http", 0), ("aserve-http", 1), ("aserve-grpc", 1)]  # the order rotates
    for r in points:
        assert r["requests"] > 0 and r["errors"] == 0 and r["concurrency"] == 2
        assert r["server_cpu_us_per_request"] > 0 and r["p50_ms"] <= r["p99_ms"]
    grpc_rps = sorted(r["requests_per_s"] for r in points if r["server"] == "aserve-grpc")
    assert summary["summary"]["aserve-grpc"]["2"]["requests_per_s"] == pytest.approx(sum(grpc_rps) / 2)
    ratio = summary["ratios"]["aserve-grpc/aserve-http"]["2"]["requests_per_s"]
    assert ratio == pytest.approx(summary["summary"]["aserve-grpc"]["2"]["requests_per_s"]
                                  / summary["summary"]["aserve-http"]["2"]["requests_per_s"], rel=0.01)


def test_answers_are_read_from_raw_and_typed_contents() -> None:
    from aserve.protocol.grpc import protos

    a, b = bench.tensors(3)
    raw = protos.ModelInferResponse()
    typed = protos.ModelInferResponse()
    for name, value in (("OUTPUT0", a + b), ("OUTPUT1", a - b)):
        raw.outputs.add(name=name, datatype="INT32", shape=list(value.shape))
        raw.raw_output_contents.append(value.tobytes())
        typed.outputs.add(name=name, datatype="INT32", shape=list(value.shape)).contents.int_contents.extend(
            value.ravel().tolist())
    for message in (raw, typed):
        got = bench.grpc_outputs(message.SerializeToString())
        np.testing.assert_array_equal(got["OUTPUT0"], a + b)
        np.testing.assert_array_equal(got["OUTPUT1"], a - b)
    body, headers = bench.http_body(a, b)
    assert int(headers["Inference-Header-Content-Length"]) + a.nbytes + b.nbytes == len(body)
