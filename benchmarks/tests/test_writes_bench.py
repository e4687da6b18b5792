"""`benchmarks.writes`: a brief run records both ways in every round, and their medians."""

from __future__ import annotations

import json
import pathlib

import pytest

from benchmarks import writes


def test_a_brief_run_records_both_ways_and_the_medians(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "writes.json"
    assert writes.main(["--answers", "200", "--rounds", "2", "--json", str(out)]) == 0
    records = json.loads(out.read_text())
    points = [r for r in records if "mode" in r]
    assert [(r["mode"], r["round"]) for r in points] == [
        ("join", 1), ("writelines", 1), ("join", 2), ("writelines", 2)]
    assert all(r["us_per_answer"] > 0 for r in points)
    summary = records[-1]["summary"]
    medians = summary["median_us_per_answer"]
    assert set(medians) == {"join", "writelines"}
    assert summary["join_over_writelines"] == pytest.approx(medians["join"] / medians["writelines"], abs=0.001)
