"""`benchmarks.decide`: a brief run times both ways at each queue length."""

from __future__ import annotations

import json
import pathlib

import pytest

from benchmarks import decide


def test_a_brief_run_records_each_length(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "decide.json"
    assert decide.main(["--lengths", "1,40", "--rounds", "2", "--number", "50", "--json", str(out)]) == 0
    records = json.loads(out.read_text())
    assert [r["length"] for r in records] == [1, 40]
    for r in records:
        assert r["walk_us"] > 0 and r["told_us"] > 0
        assert r["told_over_walk"] == pytest.approx(r["told_us"] / r["walk_us"], abs=0.001)
