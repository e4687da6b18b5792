"""`benchmarks.batching` end to end, shortened: the records LBCI's Figure 5 needs, for every
policy, measured on the bundled CNN or simulated in virtual time; and its plot."""

from __future__ import annotations

import json
import pathlib
import sys

import pytest

from benchmarks import batching

from .conftest import ROOT, needs_torch

POINTS = sorted((p, k, 0.5) for p in ("serial", "fixed10", "adaptive", "adaptive_join") for k in ("single", "multi"))


@needs_torch
def test_writes_a_record_per_policy_kind_and_load(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "batching.json"
    argv = ["--seconds", "0.4", "--capacity-seconds", "0.4", "--loads", "0.5", "--json", str(out), "--plot", ""]
    assert batching.main(argv) == 0
    result = json.loads(out.read_text())
    records = result["records"]
    assert sorted((r["policy"], r["requests"], r["load"]) for r in records) == POINTS
    for r in records:
        assert r["mean_ms"] > 0 and r["p99_ms"] >= r["mean_ms"] * 0.5
        assert r["throughput_rps"] > 0
        assert 0.0 <= r["over_budget"] <= 1.0 and 0.0 <= r["admitted_over_budget"] <= 1.0
        assert r["refused"] >= 0
    joined = [r for r in records if r["policy"] == "adaptive_join"]
    assert all({"joins", "joined_requests", "offers_turned_away"} <= r.keys() for r in joined)
    assert result["stage_profile"]["stages"] == 4
    assert set(result["summary"]) == {"single@0.5", "multi@0.5"}
    for r in records:  # a mean per round (None: no answer in it), the rounds paired across policies
        assert len(r["round_mean_ms"]) == 4 and all(m is None or m > 0 for m in r["round_mean_ms"])
    for entry in result["summary"].values():
        lo, hi = entry["adaptive"]["mean_vs_serial_ci95"]
        assert 0 < lo <= hi
        won, rounds = map(int, entry["adaptive"]["rounds_not_slower_than_serial"].split("/"))
        assert 0 <= won <= rounds <= 4


@needs_torch
def test_the_papers_set_up_on_a_second_cnn(tmp_path: pathlib.Path) -> None:
    # LBCI's set-up: one interpreter whose torch threads use every CPU (the model's
    # <class>AllCores); the join judged against adaptive without it, refusals replayed
    out = tmp_path / "paper.json"
    argv = ["--model", str(ROOT / "benchmarks" / "models" / "resnet"), "--setup", "paper", "--kinds", "single",
            "--policies", "serial,adaptive,adaptive_join", "--seconds", "0.6", "--capacity-seconds", "0.6",
            "--rounds", "2", "--loads", "0.5", "--budget-ms", "500", "--json", str(out), "--plot", ""]
    assert batching.main(argv) == 0
    result = json.loads(out.read_text())
    assert (result["setup"], result["class"], result["interpreters"]) == ("paper", "ResNetAllCores", 1)
    assert result["join_rule"] == "benefit" and result["stage_profile"]["stages"] == 5
    assert {(r["policy"], r["requests"]) for r in result["records"]} == {
        ("serial", "single"), ("adaptive", "single"), ("adaptive_join", "single")}
    for r in result["records"]:
        if r["policy"].startswith("adaptive"):
            assert 0 <= r["refused_in_time"] <= r["refused"]
    entry = result["summary"]["single@0.5"]["adaptive_join"]
    lo, hi = entry["mean_vs_adaptive_ci95"]
    assert 0 < lo <= hi and entry["mean_vs_adaptive"] > 0
    assert entry["slower_than_adaptive"] == (lo > 1.0)
    with pytest.raises(SystemExit):
        batching.parse(["--kinds", "double"])


@needs_torch
def test_the_adaptive_policies_on_the_native_queue(tmp_path: pathlib.Path) -> None:
    # --queue native: adaptive and adaptive_join batched by the pool's queue in C (copies of the
    # model in a data plane, a front loop's NativeBatcher each); serial stays on the Batcher
    out = tmp_path / "native.json"
    argv = ["--queue", "native", "--kinds", "single", "--policies", "serial,adaptive,adaptive_join",
            "--seconds", "0.6", "--capacity-seconds", "0.4", "--rounds", "2", "--loads", "0.5",
            "--json", str(out), "--plot", ""]
    assert batching.main(argv) == 0
    result = json.loads(out.read_text())
    assert result["queue"] == "native"
    by = {(r["policy"], r["load"]): r for r in result["records"]}
    assert {p for p, _ in by} == {"serial", "adaptive", "adaptive_join"}
    for (policy, _), r in by.items():
        assert r["queue"] == ("host" if policy == "serial" else "native")
        assert r["mean_ms"] > 0 and r["mean_batch_requests"] >= 1.0
        if policy != "serial":
            assert 0 <= r["refused_in_time"] <= r["refused"]
        if policy == "adaptive_join":  # counted per point, from the copy's Plan
            assert min(r["joins"], r["joined_requests"], r["offers_turned_away"]) >= 0


def test_paired_ratio_interval() -> None:
    serial = [5.0, 7.0, 6.0, 9.0, 5.5, 6.5, 8.0, 7.5]
    assert batching.paired_ratio_ci(serial, serial) == (1.0, 1.0)
    lo, hi = batching.paired_ratio_ci([1.1 * x for x in serial], serial)
    assert lo == pytest.approx(1.1) and hi == pytest.approx(1.1)
    # noise that is not paired with the rounds' drift widens the interval around the ratio of sums
    noisy = [x * f for x, f in zip(serial, (0.9, 1.15, 1.0, 0.95, 1.1, 0.92, 1.05, 1.0))]
    lo, hi = batching.paired_ratio_ci(noisy, serial)
    assert lo < sum(noisy) / sum(serial) < hi and lo < 1.0 < hi
    # a round where one policy answered nothing is left out
    assert batching.paired_ratio_ci([None, *serial], [4.0, *serial]) == (1.0, 1.0)


def test_simulated_run_on_a_given_curve(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("matplotlib")
    out, png = tmp_path / "sim.json", tmp_path / "sim.png"
    argv = ["--simulate", "2.7,3.1", "--seconds", "3", "--loads", "0.25,0.5", "--json", str(out), "--plot", str(png)]
    assert batching.main(argv) == 0
    result = json.loads(out.read_text())
    assert result["mode"] == "simulated"
    assert sorted((r["policy"], r["requests"], r["load"]) for r in result["records"] if r["load"] == 0.5) == POINTS
    single = result["summary"]["single@0.25"]["adaptive"]
    assert single["mean_vs_serial"] <= 1.0 and single["mean_cut_vs_fixed10"] >= 0.25
    assert png.stat().st_size > 10_000
    assert batching.main(argv) == 0 and json.loads(out.read_text()) == result  # deterministic


def test_a_plot_without_matplotlib_fails_before_measuring(tmp_path: pathlib.Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    out = tmp_path / "never.json"
    with pytest.raises(SystemExit, match=r"matplotlib.*'\.\[bench\]'.*--plot ''"):
        batching.main(["--simulate", "2.7,3.1", "--json", str(out), "--plot", str(tmp_path / "p.png")])
    assert not out.exists()
    assert batching.main(["--simulate", "2.7,3.1", "--seconds", "0.5", "--loads", "0.25", "--json", str(out),
                          "--plot", ""]) == 0


def test_a_subset_of_policies_takes_the_turns_alone(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "two.json"
    argv = ["--simulate", "2.7,3.1", "--seconds", "2", "--loads", "0.5", "--policies", "serial,adaptive",
            "--json", str(out), "--plot", str(tmp_path / "two.png") if _has_matplotlib() else ""]
    assert batching.main(argv) == 0
    result = json.loads(out.read_text())
    assert sorted({r["policy"] for r in result["records"]}) == ["adaptive", "serial"]
    summary = result["summary"]["single@0.5"]["adaptive"]
    assert "mean_cut_vs_fixed10" not in summary and summary["mean_vs_serial"] > 0  # no fixed10 to compare with
    with pytest.raises(SystemExit):
        batching.parse(["--policies", "serial,greedy"])


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True
