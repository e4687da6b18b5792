"""`benchmarks.observability`: a brief run records every configuration, each pair agreeing on its output."""

from __future__ import annotations

import json
import pathlib

from benchmarks import observability


def test_a_brief_run_records_each_part_against_its_library(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "observability.json"
    assert observability.main(["--rounds", "1", "--seconds", "0.002", "--models", "2", "--requests", "16", "--batches", "5",
                               "--json", str(out)]) == 0
    *points, summary = json.loads(out.read_text())
    parts = {(r["part"], r["config"]) for r in points}
    assert {p for p, _ in parts} == {"exposition", "otlp", "sampler", "model_context"}
    assert len(parts) == 4 + 2 + 8 + 4
    for r in points:
        us = r.get("us_per_scrape", r.get("us_per_request", r.get("cpu_us_per_batch")))
        assert 0 < r["min"] <= us <= r["max"]
    s = summary["summary"]
    assert s["otlp_library_vs_native"] > 1 and s["exposition_loop_stall_ms_handwritten_openmetrics"] > 0
    assert s["first_traced_batch_ms"] > 0


def test_the_encoders_write_the_same_spans() -> None:
    records = observability.traced_records(64)
    spans = observability.decoded(observability.native_encode(records))
    assert len(spans) == 64 * 6
    assert spans == observability.decoded(observability.proto_encode(records))
