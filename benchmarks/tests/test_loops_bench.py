"""`benchmarks.loops`: the ceiling handler on the host's loop and on front loops in private
interpreters, loaded by wrk over loopback."""

from __future__ import annotations

import json
import pathlib

import pytest

from benchmarks import loops
from benchmarks.loadgen import have_wrk


@pytest.mark.skipif(not have_wrk(), reason="benchmarks.loops drives its servers with wrk")
def test_host_and_two_private_loops_answer_with_the_threads_asked(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "loops.json"
    assert loops.main(["--loops", "2", "--connections", "4", "--duration", "1", "--threads", "2",
                       "--json", str(out)]) == 0
    records = json.loads(out.read_text())
    assert [(r["loops"], r["where"]) for r in records] == [(1, "host"), (2, "private")]
    for r in records:
        assert r["errors"] == 0 and r["requests_per_s"] > 0 and r["threads"] == 2
        assert r["server_cpu_cores"] > 0 and r["pss_mb"] > 0 and r["cpus"] >= 1
