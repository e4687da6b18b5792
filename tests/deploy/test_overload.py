"""loadtests/overload.py, short: `aserve serve` with the adaptive cnn driven at 3x its capacity
refuses with 503 + Retry-After, answers no other 5xx, and its memory stays bounded."""

from __future__ import annotations

import os
import pathlib
import sys
import tomllib

import pytest

from tests.conftest import load_script, needs_torch

pytestmark = pytest.mark.serial  # timed against the CPU it gets: run alone (pyproject's markers)


@needs_torch  # the bundled cnn
@pytest.mark.asyncio(loop_factories=["asyncio"])  # spawns `aserve serve` (MagicStack/uvloop#650)
async def test_overload_refuses_with_retry_after_and_nothing_else() -> None:
    overload = load_script("overload")
    # the capacity is measured on the window server, as the load test does: measured on the
    # adaptive one, the closed loop's refused clients send again at once, and their 503s take
    # the cores from the interpreters (about a fifth of the capacity read, so 3x that is no overload)
    # memory (PSS less the libraries): the window server, without admission control, runs batches
    # of up to 32 images in both interpreters at once, and each interpreter's C library keeps the
    # largest working set its arenas held: it is held to 500 MB, against a leak; the adaptive
    # one's small batches to 100 MB below
    args = overload.parse(["--policies", "window,adaptive", "--duration", "3", "--capacity-seconds", "2",
                           "--connections", "64", "--factor", "3", "--max-pss-growth-mb", "500"])
    result = await overload.run(args)
    adaptive = result["policies"]["adaptive"]
    assert overload.problems(result, args.max_pss_growth_mb) == [], adaptive
    assert adaptive["refused_503"] > 0, adaptive  # 3x the capacity: admission control refused some
    assert adaptive["refused_503_with_retry_after"] == adaptive["refused_503"]
    assert adaptive["other_5xx"] == 0 and adaptive["other_failures"] == {}, adaptive
    assert adaptive["ok"] > 0 and adaptive["ok"] + adaptive["refused_503"] == adaptive["sent"], adaptive
    for r in result["policies"].values():  # the server counts the drive's answers, not the capacity probe's
        assert r["server_ok"] == r["ok"], r
    # latency from the send is part of latency from the scheduled arrival; the client's own delay is reported
    assert adaptive["admitted_from_send_p99_ms"] <= adaptive["admitted_p99_ms"], adaptive
    assert adaptive["client_send_lag_p99_ms"] >= 0.0 and 0.0 <= adaptive["within_budget_from_send"] <= 1.0, adaptive
    own = adaptive["own_mb"]  # PSS less the libraries, whose share moves as other processes map them
    assert own["peak"] - own["before"] <= 100, own


@needs_torch
@pytest.mark.asyncio(loop_factories=["asyncio"])
async def test_closed_loop_clients_wait_out_retry_after() -> None:
    # 64 clients in a closed loop against the adaptive cnn: more than it answers within
    # 50 ms, so some are refused; each refused client waits the whole second its
    # Retry-After says before it sends again, so no client is refused twice in a second
    overload = load_script("overload")
    args = overload.parse(["--policies", "adaptive", "--closed", "--duration", "2.5", "--connections", "64"])
    with overload.scheduled(args.client_sched):  # as its main() runs it: the client a batch thread
        assert args.client_sched == "batch" and os.sched_getscheduler(0) == os.SCHED_BATCH
        result = await overload.run(args)
    assert os.sched_getscheduler(0) == os.SCHED_OTHER
    adaptive = result["policies"]["adaptive"]
    assert adaptive["server_loop_sched"] == "normal", adaptive  # the server's loop is not
    assert result["load"] == "closed" and overload.problems(result, args.max_pss_growth_mb) == [], adaptive
    assert adaptive["refused_503"] > 0 and adaptive["refused_503_with_retry_after"] == adaptive["refused_503"]
    assert adaptive["refused_503"] <= 64 * 3, adaptive  # at most one refusal per client per second (and one more)
    assert adaptive["ok"] > 0 and adaptive["other_5xx"] == 0 and adaptive["other_failures"] == {}, adaptive
    assert adaptive["cores"]["server_other_threads"] > 0.0, adaptive


def test_the_loops_cpu_per_answer_and_per_refusal() -> None:
    overload = load_script("overload")
    with pytest.raises(SystemExit):  # a client that ignores Retry-After is one of the closed loop's
        overload.parse(["--ignore-retry-after"])
    assert overload.parse(["--closed", "--ignore-retry-after"]).ignore_retry_after

    def run(ok: int, refused: int, loop_s: float) -> dict[str, object]:
        r: dict[str, object] = {"ok": ok, "refused_503": refused, "other_5xx": 0, "other_failures": {}}
        r["loop_cpu"] = overload.loop_cpu(loop_s, r)
        return r

    policies = {"window": run(800, 0, 0.4), "adaptive": run(500, 10_000, 1.5)}
    assert policies["window"]["loop_cpu"] == {"total_ms": 400.0, "per_answer_ms": 0.5, "per_ok_ms": 0.5}
    overload.refusal_cpu(policies)
    # the 200s at the window run's 0.5 ms each: 250 of the 1500 ms, the rest over 10 000 refusals
    assert policies["adaptive"]["loop_cpu"] == {"total_ms": 1500.0, "per_answer_ms": round(1500 / 10_500, 4),
                                                "per_ok_ms": 3.0, "per_refused_ms_est": 0.125,
                                                "per_ok_ms_from": "window"}
    alone = {"adaptive": run(500, 10_000, 1.5)}
    overload.refusal_cpu(alone)  # no run without refusals to lean on: no estimate
    assert "per_refused_ms_est" not in alone["adaptive"]["loop_cpu"]


@needs_torch
@pytest.mark.asyncio(loop_factories=["asyncio"])
async def test_closed_loop_clients_that_ignore_retry_after_send_again_at_once() -> None:
    # 16 clients that send again as soon as they are refused: many more refusals than clients
    # that wait out Retry-After could get (one per client per second), each answered with it
    overload = load_script("overload")
    args = overload.parse(["--policies", "adaptive", "--closed", "--ignore-retry-after", "--duration", "2",
                           "--connections", "16"])
    result = await overload.run(args)
    adaptive = result["policies"]["adaptive"]
    assert result["ignore_retry_after"] is True and overload.problems(result, args.max_pss_growth_mb) == [], adaptive
    assert adaptive["refused_503"] > 16 * 3 * 2, adaptive
    assert adaptive["refused_503_with_retry_after"] == adaptive["refused_503"] and adaptive["ok"] > 0, adaptive
    cpu = adaptive["loop_cpu"]
    assert cpu["total_ms"] > 0 and 0 < cpu["per_answer_ms"] <= cpu["per_ok_ms"], cpu


@needs_torch
@pytest.mark.asyncio(loop_factories=["asyncio"])
async def test_before_runs_every_policy_on_the_other_build_too(tmp_path: pathlib.Path) -> None:
    # `--before PYTHON`: the same policy on the build that Python serves (here this one, through a
    # script that leaves a mark), keyed POLICY@before; in an odd round it runs first
    overload = load_script("overload")
    mark = tmp_path / "ran"
    script = tmp_path / "python.sh"
    script.write_text(f'#!/bin/sh\ntouch "{mark}"\nexec "{sys.executable}" "$@"\n')
    script.chmod(0o755)
    args = overload.parse(["--policies", "window", "--closed", "--duration", "1", "--connections", "4",
                           "--before", str(script)])
    result = await overload.run(args, 1)
    assert mark.exists()
    assert list(result["policies"]) == ["window@before", "window"]
    this, before = result["policies"]["window"], result["policies"]["window@before"]
    for r in (this, before):
        assert r["ok"] > 0 and r["refused_503"] == 0 and r["other_5xx"] == 0 and r["other_failures"] == {}, r
    assert result["window_ok_per_s_over_before"] == round(this["ok_per_s"] / before["ok_per_s"], 3)
    assert overload.problems(result, args.max_pss_growth_mb) == []
    medians = overload.medians([result, result])
    assert medians["window_ok_per_s_over_before"] == result["window_ok_per_s_over_before"]


@needs_torch
@pytest.mark.asyncio(loop_factories=["asyncio"])
async def test_the_capacity_within_the_budget_is_the_fastest_rate_whose_p99_met_it() -> None:
    # `--budget-capacity`: before its drive, each server serves Poisson arrivals at rates a
    # bisection chooses; the capacity is the fastest rate whose p99 (refusals beyond it) met the budget
    overload = load_script("overload")
    args = overload.parse(["--policies", "window,adaptive", "--closed", "--ignore-retry-after", "--duration", "1",
                           "--connections", "16", "--capacity-seconds", "1", "--budget-capacity",
                           "--budget-seconds", "1", "--budget-steps", "3"])
    result = await overload.run(args)
    assert overload.problems(result, args.max_pss_growth_mb) == []
    found = {}
    for name, r in result["policies"].items():
        searched = r["budget_capacity"]
        probes = searched["probes"]
        assert len(probes) == 3 and searched["top_rps"] > 0, searched
        lo, hi = 0.0, searched["top_rps"]
        for probe in probes:  # each rate halves the interval the ones before left
            assert probe["rate"] == pytest.approx((lo + hi) / 2, abs=0.1), searched
            assert 0 < probe["ok"] + probe["refused_503"] <= probe["sent"], searched
            missed = probe["sent"] - probe["ok"]  # refused or failed: beyond the budget
            assert probe["within"] == (missed <= probe["sent"] // 100 and probe["p99_ms"] is not None
                                       and probe["p99_ms"] <= args.budget_ms), searched
            lo, hi = (probe["rate"], hi) if probe["within"] else (lo, probe["rate"])
        assert searched["rps"] == max([p["rate"] for p in probes if p["within"]], default=0.0), searched
        found[name] = searched["rps"]
    assert result["budget_capacity_rps"] == max(found.values())
    if result["budget_capacity_rps"] > 0:
        assert result["adaptive_ok_per_s_over_budget_capacity"] == round(
            result["policies"]["adaptive"]["ok_per_s"] / result["budget_capacity_rps"], 3)


def test_policies_name_a_reserve_to_compare_in_one_run(tmp_path: pathlib.Path) -> None:
    # adaptive-R: the adaptive policy with admission_reserve R, beside plain adaptive (its own
    # reserve, or --admission-reserve's); anything else in --policies is refused
    overload = load_script("overload")
    args = overload.parse(["--policies", "adaptive,adaptive-0.4,window-4", "--admission-reserve", "0.1"])
    tables = {}
    for policy in args.policies.split(","):
        config = overload.repository(tmp_path, policy, 50.0, args.admission_reserve) / "cnn" / "config.toml"
        tables[policy] = config.read_text().split("[batching]")[1]
    assert "admission_reserve = 0.1\n" in tables["adaptive"]
    assert "admission_reserve = 0.4\n" in tables["adaptive-0.4"] and 'policy = "adaptive"' in tables["adaptive-0.4"]
    assert 'policy = "window"' in tables["window-4"] and "admission_reserve" not in tables["window-4"]
    for wrong in ("adaptive-1.0", "adaptive-x", "window-0", "fifo"):
        with pytest.raises(SystemExit):
            overload.parse(["--policies", f"adaptive,{wrong}"])


def test_the_join_policy_is_the_adaptive_one_joining_under_the_budget_rule(tmp_path: pathlib.Path) -> None:
    overload = load_script("overload")
    assert overload.parse(["--policies", "adaptive,join"]).policies == "adaptive,join"
    with pytest.raises(SystemExit):
        overload.parse(["--policies", "join-2"])
    repo = overload.repository(tmp_path, "join", 40.0)
    config = tomllib.loads((repo / "cnn" / "config.toml").read_text())
    assert config["batching"] == {"policy": "adaptive", "latency_budget_ms": 40.0, "layer_join": True,
                                  "join_rule": "budget"}
