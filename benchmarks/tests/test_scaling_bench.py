"""`benchmarks.scaling` end to end on the cheapest example: the records it writes."""

from __future__ import annotations

import json
import pathlib
import shutil

import pytest

from benchmarks import scaling

from .conftest import EXAMPLES

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


def test_skips_a_model_that_does_not_load(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    # mlp as a Python without torch sees it: its model.py fails at import
    repo = tmp_path / "repository"
    (repo / "mlp").mkdir(parents=True)
    shutil.copy(EXAMPLES / "mlp" / "config.toml", repo / "mlp" / "config.toml")
    (repo / "mlp" / "model.py").write_text('raise ImportError("No module named \'torch\' (this test)")\n')
    (repo / "simple").symlink_to(EXAMPLES / "simple", target_is_directory=True)
    out = tmp_path / "scaling.json"
    argv = ["--models", "mlp,simple", "--engines", "main", "--requesters", "1", "--repository", str(repo)]
    argv += ["--requests", "50", "--rounds", "1", "--warmup", "0", "--json", str(out)]
    assert scaling.main(argv) == 0
    records = json.loads(out.read_text())
    skipped = [r for r in records if "skipped" in r]
    assert [(r["model"], r["engine"]) for r in skipped] == [("mlp", "main")]
    assert "No module named 'torch' (this test)" in skipped[0]["skipped"]
    assert [(r["model"], r["requests"]) for r in records if "skipped" not in r] == [("simple", 50)]
    assert "scaling: skipping mlp on main" in capsys.readouterr().err
