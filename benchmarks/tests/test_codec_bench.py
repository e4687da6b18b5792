"""`benchmarks.codec`: a brief run, its records, and every build answering the same values."""

from __future__ import annotations

import json
import pathlib
import sys

import pytest

from benchmarks import codec


def test_a_brief_run_records_each_case_and_build_and_their_ratios(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "codec.json"
    # the build to compare with: this tree again, through --before
    assert codec.main(["--rounds", "2", "--scale", "0.001", "--cases", "simple-binary,mlp-json",
                       "--before", sys.executable, "--json", str(out)]) == 0
    records = json.loads(out.read_text())
    points = [r for r in records if "build" in r]
    assert [(r["case"], r["build"]) for r in points] == [
        (case, build) for case in ("simple-binary", "mlp-json") for build in ("head", "codec", "before")]
    for r in points:
        assert r["rounds"] == 2
        for field in ("decode_us", "encode_us"):
            lo, hi = r[field + "_range"]
            assert 0 < lo <= r[field] <= hi
    summaries = [r for r in records if "summary" in r]
    assert [(r["case"], r["summary"]) for r in summaries] == [
        (case, f"head / {other}") for case in ("simple-binary", "mlp-json") for other in ("codec", "before")]
    head = {r["case"]: r for r in points if r["build"] == "head"}
    codec_alone = {r["case"]: r for r in points if r["build"] == "codec"}
    s = summaries[0]
    assert s["decode_us_ratio"] == pytest.approx(
        head["simple-binary"]["decode_us"] / codec_alone["simple-binary"]["decode_us"], rel=0.01)


@pytest.mark.parametrize("c_paths", [True, False], ids=["c-paths", "codec-alone"])
def test_every_case_decodes_to_its_values_and_answers_every_output(c_paths: bool) -> None:
    # _measure checks each request's tensors and each answer's values before it times them
    from aserve import _native

    encoders = (_native.v2_json_encode, _native.v2_binary_encode)
    timings = codec._measure(list(codec.CASES), 0.0001, c_paths)
    assert sorted(timings) == sorted(codec.CASES)
    assert (_native.v2_json_encode, _native.v2_binary_encode) == encoders  # put back


def test_unknown_cases_are_refused() -> None:
    with pytest.raises(SystemExit):
        codec.main(["--cases", "simple-json,resnet-json"])
