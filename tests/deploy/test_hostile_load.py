"""loadtests/hostile.py, short: well-behaved load beside slowloris heads, abandoned and
never-reading gRPC streams, bombs and clients that leave mid-body, against a real
`aserve serve` on the bundled examples. Only what is no timing threshold is asserted: the
server exits 0 after SIGTERM, no well-behaved request fails, every hostile kind ran and was
answered as the server promises, and the server was sampled. The latency ratio and the
growth of memory and descriptors are the full run's verdicts (on demand, on a quiet machine),
not this test's."""

from __future__ import annotations

import json
import pathlib
import shutil

from tests.conftest import load_script, needs_torch, spawns

# what each kind must have been answered with, at least once (the script counts any other answer)
ANSWERED = {"slowloris": "408", "abandoned_stream": "CANCELLED", "gzip_bomb": "413", "trailer_bomb": "431",
            "head_bomb": "431", "grpc_bomb": "UNAUTHENTICATED", "length_bomb": "401", "leaver_fin": "closed",
            "leaver_rst": "reset sent"}


@needs_torch  # the bundled examples hold cnn and mlp
@spawns  # `aserve serve` and the hostile clients' process, from asyncio's loop
async def test_hostile_clients_get_their_answers_and_the_well_behaved_theirs(tmp_path: pathlib.Path) -> None:
    hostile = load_script("hostile")
    # a request timeout of 3 s: slowloris heads get their 408 within the run; the well-behaved
    # clients wait for any answer as long as it takes (no timing threshold)
    args = hostile.parse(["--quiet-seconds", "3", "--minutes", "0.3", "--window-seconds", "6", "--rate", "200",
                          "--connections", "4", "--slowloris", "20", "--slowloris-interval", "1",
                          "--abandon-rate", "5", "--never-read-seconds", "6", "--bomb-rate", "2",
                          "--grpc-bomb-seconds", "4", "--leaver-rate", "10", "--sample-seconds", "1",
                          "--after-seconds", "1", "--client-timeout", "60", "--answer-timeout", "60",
                          "--serve-args", "--request-timeout 3"])
    result = await hostile.run(args)
    json.dumps(result)  # what the script prints
    assert result["generator"] == ("wrk" if shutil.which("wrk") else "python")
    assert "--api-token" in result["server_command"] and "--request-timeout 3" in result["server_command"]

    assert result["server_exit_status"] == 0, result["server_log_tail"]
    assert result["verdicts"]["server_exit_0"] and result["verdicts"]["no_well_behaved_errors"]
    windows = [result["quiet"], *result["windows"]]
    assert len(result["windows"]) == 3 and all(w["errors"] == 0 and w["requests"] > 0 for w in windows), windows

    got = result["hostile"]
    assert "error" not in got, got
    kinds = got["kinds"]
    for kind, answer in ANSWERED.items():
        assert kinds[kind]["sent"] > 0 and kinds[kind]["answered"].get(answer, 0) > 0, (kind, kinds[kind])
        assert kinds[kind]["unexpected"] == 0, (kind, kinds[kind])
    # the stream that never reads: the server ends none of them, the client cancels each (whether
    # its writes were held by then depends on how fast this machine wrote: the full run's verdict)
    never = kinds["never_reading_stream"]
    assert never["sent"] > 0 and all(a.startswith("CANCELLED") or a == "cut short by the end of the run"
                                     for a in never["answered"]), never
    assert result["hostile_not_run"] == []

    samples = result["samples"]
    assert {s["phase"] for s in samples} == {"quiet", "mixed"}
    assert all(s["rss_mb"] > 0 and s["fds"] > 0 and s["threads"] > 0 for s in samples), samples
    assert result["after_hostile"]["fds"] > 0
    assert {"rss_mb", "fds"} <= set(result["growth"]) and result["p99"]["worst_window_ratio"] is not None
    assert set(result["verdicts"]) == {"rss_and_fds_flat", "p99_within_ratio", "no_well_behaved_errors",
                                       "hostile_answered_as_expected", "server_exit_0"}
    if hostile.plot(result, tmp_path / "hostile.png") is True:  # False without matplotlib (the bench extra)
        assert (tmp_path / "hostile.png").stat().st_size > 0


def test_wrk_paces_each_connection_and_growth_reads_the_samples(tmp_path: pathlib.Path) -> None:
    hostile = load_script("hostile")
    # wrk's delay(): each of 8 connections waits 8/2000 s after an answer, so at most 2000 requests/s
    script = hostile.wrk_script(tmp_path / "body", 8 / 2000)
    assert "function delay()\n  return 4\nend" in script and 'wrk.method = "POST"' in script
    assert f"Bearer {hostile.TOKEN}" in script
    assert hostile.windows(600, 30) == [30] * 20 and hostile.windows(20, 6) == [6, 6, 6, 2]
    samples = [{"t": float(t), "phase": "mixed", "rss_mb": 100.0 + t, "fds": 50, "threads": 10}
               for t in range(10, 131, 5)]
    grown = hostile.growth(samples, 10.0, 60.0)  # around 70 s: 65, 70, 75; the last three: 120, 125, 130
    assert grown["around_mark_t"] == [65.0, 70.0, 75.0] and grown["last_t"] == [120.0, 125.0, 130.0]
    assert grown["rss_mb"] == {"at_mark": 170.0, "end": 225.0, "growth": round(55 / 170, 4)}
    assert grown["fds"]["growth"] == 0.0
