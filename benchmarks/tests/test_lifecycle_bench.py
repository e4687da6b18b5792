"""`benchmarks.lifecycle`: a short real run of its reload part (the memory part is
tests/runtime/test_memory.py's), and the summary of its memory records."""

from __future__ import annotations

import json
import pathlib

from benchmarks import lifecycle


def test_short_reload_run(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "lifecycle.json"
    assert lifecycle.main(["--model", "simple", "--no-memory", "--seconds", "2", "--interval", "0.6",
                           "--repeat", "1", "--connections", "8", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    reload = result["reload"]
    (rnd,) = reload["rounds"]
    assert [r["version"] for r in rnd["reloads"]] == [2, 3]  # every reload loaded the next version
    assert all(0 < r["seconds"] < 60 for r in rnd["reloads"])
    for run in ("baseline", "reloading"):
        assert rnd[run]["errors"] == 0 and rnd[run]["requests"] > 0 and 0 < rnd[run]["p50_ms"] <= rnd[run]["p99_ms"]
    summary = reload["summary"]
    assert summary["reloads"] == 2 and summary["errors_reloading"] == 0 and reload["server_exit"] == 0
    assert "memory" not in result


def test_memory_summary() -> None:
    def record(variant: str, k: int, added: float | None) -> dict:
        r: dict = {"variant": variant, "interpreters": k}
        if added is not None:
            r["per_added_interpreter_mb"] = added
        return r

    memory = {
        "weights_mb": 224.1, "interpreter_mb": [143.5, 143.4],
        "records": [record("copy", 1, None), record("copy", 2, 224.2), record("idiom", 2, 0.2),
                    record("idiom", 4, 0.1)],
        "load_unload": [
            {"variant": "copy", "cycles": 50, "malloc_trim": True, "mmap_while_loading": True, "growth_mb": 0.5,
             "left_after_first_unload_mb": 0.25},
            {"variant": "copy", "cycles": 50, "malloc_trim": False, "mmap_while_loading": False,
             "growth_mb": 9.0, "left_after_first_unload_mb": 64.0},
        ],
    }
    summary = lifecycle.memory_summary(memory)
    assert summary["per_added_interpreter_mb"] == {"copy": {"k2": 224.2}, "idiom": {"k2": 0.2, "k4": 0.1}}
    assert summary["load_unload_growth_mb"] == {"copy": 0.75} and summary["load_unload_cycles"] == 50
