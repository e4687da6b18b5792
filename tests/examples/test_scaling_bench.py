"""`aserve bench scaling` end to end on the cheapest example: the records it writes."""

from __future__ import annotations

import json
import pathlib

from aserve.bench import scaling

KEYS = {
    "model",
    "engine",
    "interpreters",
    "requesters",
    "requests_per_s",
    "p50_ms",
    "p99_ms",
    "rss_mb",
    "pss_mb",
    "speedup",
    "startup_s_first",
    "startup_s_per_interpreter",
    "pss_mb_per_interpreter",
    "load_s",
}


def test_writes_one_record_per_run(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "scaling.json"
    argv = ["--models", "simple", "--engines", "main,private", "--requesters", "1,2"]
    argv += ["--requests", "200", "--rounds", "2", "--warmup", "0", "--json", str(out)]
    assert scaling.main(argv) == 0
    records = json.loads(out.read_text())
    assert [(r["engine"], r["interpreters"], r["requesters"]) for r in records] == [
        ("main", 1, 1),
        ("main", 2, 2),
        ("private", 1, 1),
        ("private", 2, 2),
    ]
    for r in records:
        assert KEYS <= set(r), KEYS - set(r)
        assert r["model"] == "simple"
        assert r["requests"] == 200 and len(r["rounds_requests_per_s"]) == 2
        assert r["requests_per_s"] > 0 and 0 < r["p50_ms"] <= r["p99_ms"]
        assert r["pss_mb"] > 0 and r["rss_mb"] >= r["pss_mb"]
    ones = {r["engine"]: r for r in records if r["interpreters"] == 1}
    assert all(r["speedup"] == 1.0 for r in ones.values())
    # a private interpreter is a libpython copy (megabytes); a main-engine thread is not
    private = ones["private"]
    assert private["pss_mb_per_interpreter"] > 1.0
