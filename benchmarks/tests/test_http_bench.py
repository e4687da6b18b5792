"""`benchmarks.http`: a short real run (aserve and the ceiling on loopback), its records and plot,
and the pieces that decide whether an answer counts: the peers' V2 codec and the answer check."""

from __future__ import annotations

import json
import pathlib
from array import array
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

from aserve import cpus
from aserve.config import default_loops
from benchmarks import http, servers
from benchmarks.peers import models, native, v2, v2_structs

from .conftest import EXAMPLES, needs_torch

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _run(tmp_path: pathlib.Path, *argv: str) -> list[dict]:
    out = tmp_path / "http.json"
    assert http.main([*argv, "--json", str(out)]) == 0
    return json.loads(out.read_text())


def test_short_run_records_every_field_and_plots(tmp_path: pathlib.Path) -> None:
    png = tmp_path / "http.png"
    records = _run(tmp_path, "--duration", "1", "--warmup", "1", "--connections", "1,4", "--servers",
                   "aserve,ceiling", "--models", "simple", "--bodies", "json,binary", "--plot", str(png))
    problems = [r for r in records if "error" in r or "skipped" in r]
    assert not problems, problems
    points = [r for r in records if "requests_per_s" in r and not r.get("generator_check")]
    assert sorted((r["server"], r["body"], r["connections"]) for r in points) == [
        (server, body, c) for server in ("aserve", "ceiling") for body in ("binary", "json") for c in (1, 4)
    ]
    for r in points:
        assert set(http.POINT_FIELDS) <= set(r), set(http.POINT_FIELDS) - set(r)
        assert r["bench"] == "http" and r["model"] == "simple"
        assert r["errors"] == r["non_2xx"] == r["socket_errors"] == 0
        assert r["requests_per_s"] > 0 and 0 < r["p50_ms"] <= r["p99_ms"]
        assert r["pss_mb"] > 0 and r["loop_cpu_us_per_request"] > 0
        assert r["server_cpu_cores"] > 0 and r["generator_cpu_cores"] > 0
        assert r["generator"] in ("wrk", "aiohttp")
        threads = r["thread_cpu_us_per_request"]
        assert (threads["interpreters"] > 0) == (r["server"] == "aserve"), threads
        if r["server"] == "ceiling" or default_loops(cpus.available()) == 0:  # the host's loop serves alone
            assert threads["host"] > 0 and threads["loops"] == 0, threads
        else:  # the front loops serve every connection; the host's loop only accepts them
            assert threads["loops"] > 0, threads
    binary = {r["server"]: r["response"] for r in points if r["body"] == "binary"}
    assert binary == {"aserve": "binary", "ceiling": "json"}  # aserve answered the binary extension in kind
    summary = records[-1]["summary"]
    assert summary["errors"] == 0
    ratios = {(p["server"], p["body"]): p["vs_ceiling"] for p in summary["peaks"]}
    assert ratios[("ceiling", "json")] == 1.0 and ratios[("aserve", "json")] > 0
    assert set(summary["aserve"]["p50_ms_at_1_connection"]) == {"simple/json", "simple/binary"}
    sizing = {(z["model"], z["body"]): z for z in summary["sizing"]}
    assert set(sizing) == {("simple", "json"), ("simple", "binary")}
    for (_, body), z in sizing.items():  # the best point within the bound, or none when no point kept it
        within = [r for r in points if r["server"] == "aserve" and r["body"] == body and r["p99_ms"] <= z["p99_bound_ms"]]
        if not within:  # a loaded machine can push every short point's p99 past it: no speed is asserted here
            assert z["requests_per_s"] is None, z
            continue
        assert z["requests_per_s"] == max(r["requests_per_s"] for r in within) and z["p99_ms"] <= z["p99_bound_ms"]
        assert z["requests_per_s_per_core"] > 0
    assert png.read_bytes()[:8] == PNG_MAGIC


@needs_torch
def test_cnn_is_served_by_aserve_and_skipped_by_the_peers(tmp_path: pathlib.Path) -> None:
    records = _run(tmp_path, "--duration", "1", "--warmup", "0", "--connections", "2", "--servers", "aserve,inline",
                   "--models", "cnn", "--bodies", "binary", "--no-generator-check")
    (point,) = [r for r in records if "requests_per_s" in r]
    assert point["server"] == "aserve" and point["model"] == "cnn" and point["errors"] == 0
    (skipped,) = [r for r in records if "skipped" in r]
    assert skipped["server"] == "inline" and skipped["skipped"] == "inline serves only simple, mlp"


def test_nested_bodies_are_served_by_aserve_and_skipped_by_the_peers(tmp_path: pathlib.Path) -> None:
    nested, flat = (json.loads(_case(kind).body) for kind in ("nested", "json"))
    for n, f in zip(nested["inputs"], flat["inputs"], strict=True):
        assert n["shape"] == f["shape"] == [1, 16] and n["data"] == [f["data"]]  # one list per dimension
    records = _run(tmp_path, "--duration", "1", "--warmup", "0", "--connections", "2", "--servers", "aserve,inline",
                   "--models", "simple", "--bodies", "nested", "--no-generator-check")
    (point,) = [r for r in records if "requests_per_s" in r]
    assert (point["server"], point["body"], point["errors"]) == ("aserve", "nested", 0)
    (skipped,) = [r for r in records if "skipped" in r]
    assert (skipped["server"], skipped["body"]) == ("inline", "nested")


def test_the_baseline_without_polling_runs_aserve_with_spin_off(tmp_path: pathlib.Path) -> None:
    records = _run(tmp_path, "--duration", "1", "--warmup", "0", "--connections", "1", "--servers", "aserve-nospin",
                   "--models", "simple", "--bodies", "binary", "--no-generator-check")
    (point,) = [r for r in records if "requests_per_s" in r]
    assert point["server"] == "aserve-nospin" and point["errors"] == 0 and point["requests"] > 0
    assert point["arguments"] == "--spin-us 0"


def test_generator_threads_and_four_front_loops(tmp_path: pathlib.Path) -> None:
    # as on many cores: several wrk threads (aiohttp: processes), never more than connections, against --loops 4
    records = _run(tmp_path, "--threads", "2", "--duration", "1", "--warmup", "0", "--connections", "1,4",
                   "--servers", "aserve-loops4", "--models", "simple", "--bodies", "json", "--no-generator-check")
    points = {r["connections"]: r for r in records if "requests_per_s" in r}
    assert {c: (p["threads"], p["errors"], p["arguments"]) for c, p in points.items()} == {
        1: (1, 0, "--loops 4"), 4: (2, 0, "--loops 4")}
    assert all(p["requests"] > 0 for p in points.values())
    # the front loops answered: their threads' CPU is the loop's, by name
    for p in points.values():
        threads = p["thread_cpu_us_per_request"]
        assert threads["loops"] > 0 and threads["interpreters"] > 0, threads
        assert p["loop_cpu_us_per_request"] >= threads["loops"] > 0


def test_a_plot_names_the_machine_its_records_were_measured_on(tmp_path: pathlib.Path) -> None:
    records = [{"bench": "http", "server": "ceiling", "model": "simple", "body": "json", "connections": c,
                "requests_per_s": 1000.0 * c, "p99_ms": 1.0 + c, "cpus": 16, "python": "3.11.7"} for c in (1, 4)]
    assert http.title(records) == "benchmarks.http (16 CPUs, Python 3.11.7)"
    png = tmp_path / "other.png"
    http.plot(records, str(png))
    assert png.read_bytes()[:8] == PNG_MAGIC


def test_aiohttp_generator_when_asked(tmp_path: pathlib.Path) -> None:
    records = _run(tmp_path, "--generator", "aiohttp", "--duration", "1", "--warmup", "0", "--connections", "2",
                   "--servers", "ceiling", "--models", "simple", "--bodies", "json")
    (point,) = [r for r in records if "requests_per_s" in r]
    assert point["generator"] == "aiohttp" and point["errors"] == 0 and point["requests"] > 0


def _case(kind: str) -> http.Case:
    return http.make_cases("simple", [kind], EXAMPLES)[kind]


def test_the_inline_peer_answers_what_the_check_expects() -> None:
    for kind in ("json", "binary"):
        case = _case(kind)
        length = case.headers.get("Inference-Header-Content-Length")
        request = v2.decode_request(case.body, int(length) if length else None)
        assert request.binary_output == (kind == "binary")
        body, head = v2.encode_response("simple", models.simple(request.inputs), binary=request.binary_output)
        headers = {} if head is None else {"Inference-Header-Content-Length": str(head)}
        assert http.check_answer("inline", case, 200, headers, body) == (None, kind)


def test_the_mosec_peers_answer_what_the_check_expects() -> None:
    decode = v2_structs.Decoder("simple")
    for kind in ("json", "binary"):  # V2 in msgspec Structs, binary bodies read without their header length
        x, y = decode(_case(kind).body)
        add, sub = models.add_sub(x, y)
        body = msgspec.json.encode(v2_structs.int_response("simple", {"OUTPUT0": add, "OUTPUT1": sub}))
        assert http.check_answer("mosec", _case(kind), 200, {}, body) == (None, "json")
    (case,) = http.native_cases(http.make_cases("simple", ["json", "binary"], EXAMPLES)).values()
    assert json.loads(case.body).keys() == {"a", "b"} and case.headers == {"Content-Type": "application/json"}
    request = msgspec.json.decode(case.body, type=native.SimpleRequest)
    body = msgspec.json.encode(native.SimpleResponse(*models.add_sub(request.a, request.b)))
    assert http.check_answer("mosec-native", case, 200, {}, body) == (None, "native")
    wrong = msgspec.json.encode(native.SimpleResponse(request.a, request.b))
    problem, _ = http.check_answer("mosec-native", case, 200, {}, wrong)
    assert problem is not None and "OUTPUT0 is wrong" in problem


@needs_torch
def test_the_mosec_peers_run_mlp_rows_as_the_check_expects() -> None:
    cases = http.make_cases("mlp", ["json", "binary"], EXAMPLES)
    mlp = models.MLP(EXAMPLES / "mlp" / "model.py")
    decode = v2_structs.Decoder("mlp")
    rows = mlp.rows([decode(cases[kind].body)[0] for kind in ("json", "binary")])
    for kind, row in zip(("json", "binary"), rows, strict=True):
        body = msgspec.json.encode(v2_structs.float_response("mlp", {"OUTPUT": row}))
        assert http.check_answer("mosec", cases[kind], 200, {}, body) == (None, "json")
    (case,) = http.native_cases(cases).values()
    (row,) = mlp.rows([msgspec.json.decode(case.body, type=native.MLPRequest).x])
    assert http.check_answer("mosec-native", case, 200, {}, msgspec.json.encode(native.MLPResponse(row))) == (
        None, "native")


def test_the_mosec_peers_refuse_what_their_structs_do_not_hold() -> None:
    decode = v2_structs.Decoder("simple")
    bad = json.loads(_case("json").body)
    bad["inputs"][0]["datatype"] = "FP32"
    with pytest.raises(v2.BadRequest, match="INPUT0: expected INT32"):
        decode(json.dumps(bad).encode())
    with pytest.raises(v2.BadRequest, match="not a V2 JSON request"):
        decode(b'{"inputs": [{"name": 1}]}')
    with pytest.raises(msgspec.ValidationError, match="length"):
        msgspec.json.decode(b'{"a": [1, 2], "b": [3, 4]}', type=native.SimpleRequest)


def test_the_headline_is_aserve_against_the_faster_mosec_row() -> None:
    def peak(server: str, body: str, rps: float) -> dict[str, Any]:
        return {"model": "simple", "body": body, "server": server, "peak_requests_per_s": rps}

    peaks = [peak("aserve", "json", 30000.0), peak("mosec", "json", 20000.0), peak("mosec-native", "json", 25000.0),
             peak("aserve", "binary", 30000.0), peak("mosec", "binary", 24000.0), peak("ceiling", "json", 1e5)]
    out = {v["body"]: v for v in http.versus_mosec(peaks)}
    assert out["json"]["mosec_server"] == "mosec-native" and out["json"]["ratio"] == 1.2
    assert out["binary"]["mosec_server"] == "mosec" and out["binary"]["ratio"] == 1.25


def test_binary_request_without_header_length_is_read_as_mosec_reads_it() -> None:
    case = _case("binary")
    with_length = v2.decode_request(case.body, int(case.headers["Inference-Header-Content-Length"]))
    assert v2.decode_request(case.body) == with_length


def test_a_wrong_answer_is_an_error() -> None:
    case = _case("json")
    outputs = models.simple(v2.decode_request(case.body).inputs)
    values = outputs["OUTPUT0"].values()
    values[3] += 1
    outputs["OUTPUT0"] = outputs["OUTPUT0"]._replace(data=array("i", values).tobytes())
    body, _ = v2.encode_response("simple", outputs, binary=False)
    problem, _ = http.check_answer("inline", case, 200, {}, body)
    assert problem is not None and "OUTPUT0 is wrong at element 3" in problem
    problem, _ = http.check_answer("aserve", case, 503, {}, b"overloaded")
    assert problem is not None and problem.startswith("status 503")


def test_check_request_waits_out_admission_control() -> None:
    """A 503 with Retry-After (the previous sweep's queue still draining) is sent again;
    a 503 without it, or any other status, is the answer."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    statuses = [503, 503, 200]
    seen: list[int] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            status = statuses[len(seen)] if len(seen) < len(statuses) else 503
            seen.append(status)
            self.send_response(status)
            if status == 503 and len(seen) < 3:
                self.send_header("Retry-After", "0.01")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v2/models/simple/infer"
        case = http_bench_case()
        assert http.post_check(url, case)[0] == 200 and seen == [503, 503, 200]
        seen.clear()
        statuses[:] = [503, 503, 503, 503]  # the third 503 has no Retry-After: returned as it is
        assert http.post_check(url, case)[0] == 503 and len(seen) == 3
    finally:
        server.shutdown()
        server.server_close()


def http_bench_case() -> http.Case:
    return http.make_cases("simple", ["json"], EXAMPLES)["json"]


def test_repeats_run_in_rounds_and_report_each_servers_median(monkeypatch: pytest.MonkeyPatch) -> None:
    # every server once per round, so that a drift of the machine's speed over the run
    # weighs on each alike, each round starting one server later; each point is the median
    # of its server's runs
    calls: list[str] = []
    speed = {"a": [300.0, 100.0, 200.0], "b": [10.0, 30.0, 20.0]}

    def bench_server(run: object, kind: str, model: str, cases: object) -> Iterator[dict[str, Any]]:
        calls.append(kind)
        rps = speed[kind][calls.count(kind) - 1]
        yield {"server": kind, "model": model, "body": "json", "connections": 8, "requests_per_s": rps,
               "p99_ms": rps / 10, "errors": 0}
        yield {"server": kind, "model": model, "body": "binary", "skipped": "not this body", "errors": 0}

    monkeypatch.setattr(http, "bench_server", bench_server)
    records = list(http.repeated(None, ["a", "b"], "simple", {}, 3))  # type: ignore[arg-type]
    assert calls == ["a", "b", "b", "a", "a", "b"]
    points = {r["server"]: r for r in records if "requests_per_s" in r}
    assert points["a"]["requests_per_s"] == 200.0 and points["a"]["requests_per_s_runs"] == [300.0, 100.0, 200.0]
    assert points["b"]["requests_per_s"] == 20.0 and points["b"]["p99_ms"] == 2.0 and points["b"]["runs"] == 3
    assert sum(1 for r in records if "skipped" in r) == 6


def test_variants_are_compared_with_aserve_round_by_round() -> None:
    def point(server: str, runs: list[float]) -> dict[str, Any]:
        return {"server": server, "model": "simple", "body": "binary", "connections": 64,
                "requests_per_s": sorted(runs)[len(runs) // 2], "requests_per_s_runs": runs}

    # the machine slows down over the rounds: each round's pair keeps the ratio the medians blur
    pts = [point("aserve", [20000.0, 16000.0, 12000.0]), point("aserve-trace", [18000.0, 14400.0, 10800.0]),
           point("aserve-same", [19800.0, 16160.0, 12000.0]), point("ceiling", [1.0, 1.0, 1.0])]
    out = {v["server"]: v for v in http.versus_aserve(pts)}
    assert set(out) == {"aserve-trace", "aserve-same"}
    assert out["aserve-trace"]["change"] == -0.1 and out["aserve-trace"]["rounds"] == 3
    assert out["aserve-trace"]["paired_median"] == out["aserve-trace"]["paired_max"] == -0.1
    assert out["aserve-same"]["paired_min"] == -0.01 and out["aserve-same"]["paired_max"] == 0.01
    assert "aserve-trace against aserve, simple/binary at 64 connections: -10.0% req/s" in http.summary_text(
        {"summary": {"peaks": [], "aserve": {"p50_ms_at_1_connection": {}, "loop_cpu_us_per_request_at_peak": {},
                                             "mlp_pss_mb": None, "mosec_mlp_pss_mb": None},
                     "generator_check": {}, "versus_aserve": list(out.values()), "errors": 0}})


def test_a_baseline_build_runs_next_to_aserve_whether_or_not_it_is_named(tmp_path: pathlib.Path) -> None:
    before = tmp_path / "python"
    args = http.parse_args(["--servers", "aserve,ceiling", "--before", str(before)])
    assert args.servers == ["aserve", servers.BEFORE, "ceiling"]
    args = http.parse_args(["--servers", f"ceiling,{servers.BEFORE},aserve", "--before", str(before)])
    assert args.servers == ["ceiling", servers.BEFORE, "aserve"]  # named: where it was named
    assert http.parse_args(["--servers", "ceiling"]).servers == ["ceiling"]
    with pytest.raises(SystemExit):
        http.parse_args(["--servers", servers.BEFORE])  # a baseline with no build to run


def test_the_server_cpu_at_one_connection_is_judged_against_the_ceiling_round_by_round() -> None:
    def point(server: str, cpu_runs: list[float]) -> dict[str, Any]:
        return {"server": server, "model": "simple", "body": "json", "connections": 1, "requests_per_s": 1000.0,
                "p50_ms": 0.5, "p99_ms": 1.0, "loop_cpu_us_per_request": 100.0,
                "server_cpu_us_per_request": sorted(cpu_runs)[len(cpu_runs) // 2],
                "server_cpu_us_per_request_runs": cpu_runs, "pss_mb": None, "errors": 0}

    # the host slows down in the second round: both servers with it; each round's ratio is 1.5
    records = [point("aserve", [300.0, 450.0, 330.0]), point("ceiling", [200.0, 300.0, 220.0])]
    versus = http.summarize(records)["summary"]["aserve"]["server_cpu_at_1_connection_vs_ceiling"]
    assert versus == {"simple/json": {"aserve_us": 330.0, "ceiling_us": 220.0, "ratio": 1.5, "rounds": 3,
                                      "paired_median": 1.5, "paired_min": 1.5, "paired_max": 1.5}}
    assert http.cpu_versus_ceiling(point("aserve", [300.0]), point("ceiling", [0.0])) is None
    one = http.cpu_versus_ceiling({"server_cpu_us_per_request": 300.0}, {"server_cpu_us_per_request": 250.0})
    assert one == {"aserve_us": 300.0, "ceiling_us": 250.0, "ratio": 1.2}  # one round: no pairs
