"""`benchmarks.parsers`: a brief run, its records, and both parsers reading the request alike."""

from __future__ import annotations

import json
import os
import pathlib
import platform

import pytest

from benchmarks import parsers


def test_a_brief_run_records_both_parsers_and_their_ratio(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "parsers.json"
    assert parsers.main(["--rounds", "3", "--number", "200", "--json", str(out)]) == 0
    records = json.loads(out.read_text())
    *points, summary = records
    assert [r["parser"] for r in points] == ["httptools", "regex_head"]
    for r in records:
        assert r["bench"] == "parsers" and r["python"] == platform.python_version() and r["cpus"] == os.cpu_count()
        assert r["rounds"] == 3 and r["number"] == 200 and 250 <= r["body_bytes"] <= 400
    for r in points:
        assert 0 < r["us_min"] <= r["us_per_request"] <= r["us_max"]
    s = summary["summary"]
    assert s["httptools_us"] == points[0]["us_per_request"] and s["regex_head_us"] == points[1]["us_per_request"]
    assert s["httptools_vs_regex_head"] == pytest.approx(s["httptools_us"] / s["regex_head_us"], rel=0.01)


def test_both_parsers_read_the_target_the_fields_and_the_body() -> None:
    message = parsers.infer_request()
    _, body = message.split(b"\r\n\r\n", 1)
    want = ("/v2/models/simple/infer", {"Host": "127.0.0.1:8000", "Content-Type": "application/json",
                                        "Content-Length": str(len(body))}, body)
    for make in parsers.READERS.values():
        read = make()
        assert read(message) == want
        assert read(message) == want  # and the next message on the same connection
    assert json.loads(body)["inputs"][0]["name"] == "INPUT0"


def test_the_baseline_hands_off_what_it_does_not_read() -> None:
    assert parsers.parse_head("POST /v2/models/simple/infer HTTP/1.1\r\nContent-Length: 3") is None  # no Host
    assert parsers.parse_head("POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked") is None
    assert parsers.parse_head("POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 3") == (
        "POST", "/x", [("Host", "a"), ("Content-Length", "3")], 3, False)
