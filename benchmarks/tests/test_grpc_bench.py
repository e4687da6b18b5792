"""`benchmarks.grpc`: a brief run of aserve's two fronts on both models (MLServer's environment is
made only by a real run), its records and summary, and the answer checks that guard every number."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

from benchmarks import grpc as bench


def test_a_brief_run_records_both_fronts_on_each_model_and_their_ratio(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "grpc.json"
    argv = ["--servers", "aserve-grpc,aserve-http", "--models", "simple,mlp", "--duration", "0.3", "--warmup", "0.1",
            "--rounds", "2", "--concurrency", "2", "--interpreters", "1", "--json", str(out)]
    assert bench.main(argv) == 0
    *points, summary = json.loads(out.read_text())
    assert [(r["round"], r["model"], r["server"]) for r in points] == [
        (0, "simple", "aserve-grpc"), (0, "simple", "aserve-http"), (0, "mlp", "aserve-grpc"), (0, "mlp", "aserve-http"),
        (1, "simple", "aserve-http"), (1, "simple", "aserve-grpc"), (1, "mlp", "aserve-http"), (1, "mlp", "aserve-grpc"),
    ]  # one server for both models, the order of the configurations rotating each round
    for r in points:
        assert r["requests"] > 0 and r["errors"] == 0 and r["concurrency"] == 2
        assert r["server_cpu_us_per_request"] > 0 and r["p50_ms"] <= r["p99_ms"]
    assert "left_out" not in summary
    for model in ("simple", "mlp"):
        table = summary["summary"][model]
        grpc_rps = [r["requests_per_s"] for r in points if (r["model"], r["server"]) == (model, "aserve-grpc")]
        assert table["aserve-grpc"]["2"]["requests_per_s"] == pytest.approx(sum(grpc_rps) / 2)
        ratio = summary["ratios"][model]["aserve-grpc/aserve-http"]["2"]["requests_per_s"]
        assert ratio == pytest.approx(table["aserve-grpc"]["2"]["requests_per_s"]
                                      / table["aserve-http"]["2"]["requests_per_s"], rel=0.01)


def test_requests_follow_each_models_config() -> None:
    simple, mlp = (bench.read_spec(bench.ROOT / "examples" / name) for name in ("simple", "mlp"))
    inputs = bench.sample(mlp)
    assert list(inputs) == ["INPUT"] and inputs["INPUT"].dtype == np.float32 and inputs["INPUT"].shape == (1, 16)
    body, headers = bench.http_body(inputs)
    head = json.loads(body[:int(headers["Inference-Header-Content-Length"])])
    assert head["inputs"] == [{"name": "INPUT", "datatype": "FP32", "shape": [1, 16],
                               "parameters": {"binary_data_size": 64}}]
    a, b = bench.sample(simple).values()
    assert a.dtype == b.dtype == np.int32 and a.shape == b.shape == (1, 16)
    assert bench.grpc_message("simple", {"INPUT0": a, "INPUT1": b}) == bench.grpc_message("simple", bench.sample(simple))


def test_answers_are_read_from_raw_and_typed_contents() -> None:
    from aserve.protocol.grpc import protos

    outputs = {"OUTPUT0": np.arange(16, dtype=np.int32).reshape(1, 16),
               "OUTPUT": np.linspace(-1, 1, 16, dtype=np.float32).reshape(1, 16)}
    raw = protos.ModelInferResponse()
    typed = protos.ModelInferResponse()
    for name, value in outputs.items():
        datatype = "INT32" if value.dtype == np.int32 else "FP32"
        raw.outputs.add(name=name, datatype=datatype, shape=list(value.shape))
        raw.raw_output_contents.append(value.tobytes())
        contents = typed.outputs.add(name=name, datatype=datatype, shape=list(value.shape)).contents
        (contents.int_contents if datatype == "INT32" else contents.fp32_contents).extend(value.ravel().tolist())
    for message in (raw, typed):
        got = bench.grpc_outputs(message.SerializeToString())
        assert bench.differs(got, outputs) is None


def test_a_wrong_answer_is_named_and_a_left_out_peer_is_said() -> None:
    mlp = bench.read_spec(bench.ROOT / "examples" / "mlp")
    right = {"OUTPUT": np.ones((1, 16), np.float32)}
    assert bench.undeclared(mlp, right) is None and bench.differs(right, right) is None
    assert "config.toml declares ['OUTPUT']" in (bench.undeclared(mlp, {}) or "")
    assert "FP32" in (bench.undeclared(mlp, {"OUTPUT": np.ones((1, 16), np.float64)}) or "")
    assert "[2, 16]" in (bench.undeclared(mlp, {"OUTPUT": np.ones((2, 16), np.float32)}) or "")
    other_bits = {"OUTPUT": np.nextafter(right["OUTPUT"], 2)}  # equal to 1e-7: not bit for bit
    assert (bench.differs(other_bits, right) or "").startswith("OUTPUT = float32")
    assert bench.left_out(["simple", "mlp"], list(bench.SERVERS)) == {
        "mlp": {"mlserver-grpc": "MLServer's custom runtime serves only simple"}}
    record = {"requests_per_s": 10.0, "server_cpu_us_per_request": 5.0, "client_cpu_us_per_request": 1.0,
              "p50_ms": 1.0, "p99_ms": 2.0, "errors": 0, "concurrency": 1}
    records = [{**record, "model": model, "server": server} for model, server in (
        ("simple", "aserve-grpc"), ("simple", "mlserver-grpc"), ("mlp", "aserve-grpc"), ("mlp", "aserve-http"))]
    summary = bench.summarize(records, left_out=bench.left_out(["simple", "mlp"], list(bench.SERVERS)))
    assert set(summary["ratios"]["simple"]) == {"aserve-grpc/mlserver-grpc"}
    assert set(summary["ratios"]["mlp"]) == {"aserve-grpc/aserve-http"}
    assert summary["left_out"] == {"mlp": {"mlserver-grpc": "MLServer's custom runtime serves only simple"}}
