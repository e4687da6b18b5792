"""`aserve bench batching` end to end, shortened: the records LBCI's Figure 5 needs, for every policy."""

from __future__ import annotations

import json
import pathlib

from aserve.bench import batching

from ..conftest import needs_torch

pytestmark = needs_torch


def test_writes_a_record_per_policy_kind_and_load(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "batching.json"
    argv = ["--seconds", "0.4", "--capacity-seconds", "0.4", "--loads", "0.5", "--json", str(out), "--plot", ""]
    assert batching.main(argv) == 0
    result = json.loads(out.read_text())
    records = result["records"]
    assert sorted((r["policy"], r["requests"], r["load"]) for r in records) == sorted(
        (p, k, 0.5) for p in ("serial", "fixed10", "adaptive", "adaptive_join") for k in ("single", "multi")
    )
    for r in records:
        assert r["mean_ms"] > 0 and r["p99_ms"] >= r["mean_ms"] * 0.5
        assert r["throughput_rps"] > 0
        assert 0.0 <= r["over_budget"] <= 1.0
    joined = [r for r in records if r["policy"] == "adaptive_join"]
    assert all({"joins", "joined_requests", "offers_turned_away"} <= r.keys() for r in joined)
    assert result["stage_profile"]["stages"] == 4
    assert set(result["summary"]) == {"single@0.5", "multi@0.5"}
