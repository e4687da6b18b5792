"""loadtests/: the scenario's requests and checks, a short headless Locust run against a real
server on loopback, and loadtests/plot.py's PNG of it."""

from __future__ import annotations

import asyncio
import csv
import importlib.util
import math
import os
import pathlib
import shutil
import sys

import aiohttp
import pytest

from tests.conftest import EXAMPLES, HAVE_TORCH, LOADTESTS, load_script

scenario = load_script("scenario")
MODELS = ["simple", "textclass", *(["mlp"] if HAVE_TORCH else [])]  # mlp needs torch (the 3.11 run)
PAIRS = [(m, e) for m in MODELS for e in scenario.ENCODINGS]


def repository(root: pathlib.Path) -> pathlib.Path:
    for name in MODELS:
        shutil.copytree(EXAMPLES / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    return root


# ---- the scenario, without Locust ----


def test_weights() -> None:
    default = scenario.parse_weights(scenario.DEFAULT_WEIGHTS)
    assert set(default) == {(m, e) for m in ("simple", "mlp", "textclass") for e in scenario.ENCODINGS}
    assert scenario.parse_weights(" simple:json=2, mlp:binary=0,cnn:msgpack=1 ") == {
        ("simple", "json"): 2, ("cnn", "msgpack"): 1}
    for bad, says in (("simple=1", "model:encoding=weight"), ("resnet:json=1", "model 'resnet'"),
                      ("simple:xml=1", "encoding 'xml'"), ("simple:json=-1", "integer >= 0"),
                      ("simple:json=x", "integer >= 0"), ("simple:json=0", "no pair")):
        with pytest.raises(ValueError, match=says):
            scenario.parse_weights(bad)
    assert scenario.parse_max_rows(None) == 1 and scenario.parse_max_rows("4") == 4
    with pytest.raises(ValueError, match="ASERVE_LOCUST_MAX_ROWS"):
        scenario.parse_max_rows("0")
    weights = {("simple", "json"): 3, ("mlp", "binary"): 1}
    cycle = scenario.cycle(weights)
    assert sorted(cycle) == sorted([("simple", "json")] * 3 + [("mlp", "binary")])


def _outputs(**tensors: tuple[str, list[int], list]) -> dict:
    return {name: (name, datatype, shape, values) for name, (datatype, shape, values) in tensors.items()}


def test_checks_catch_wrong_answers() -> None:
    [(_, _, _, a), (_, _, _, b)], check = scenario.MODELS["simple"].inputs(2)
    right = [x + y for x, y in zip(a, b)], [x - y for x, y in zip(a, b)]
    check(_outputs(OUTPUT0=("INT32", [2, 16], right[0]), OUTPUT1=("INT32", [2, 16], right[1])))
    for wrong in (
        _outputs(OUTPUT0=("INT32", [2, 16], right[1]), OUTPUT1=("INT32", [2, 16], right[1])),  # another answer
        _outputs(OUTPUT0=("INT32", [1, 32], right[0]), OUTPUT1=("INT32", [2, 16], right[1])),  # shape
        _outputs(OUTPUT0=("INT64", [2, 16], right[0]), OUTPUT1=("INT32", [2, 16], right[1])),  # datatype
        _outputs(OUTPUT0=("INT32", [2, 16], right[0])),  # an output missing
    ):
        with pytest.raises(scenario.Mismatch):
            check(wrong)

    _, check = scenario.MODELS["mlp"].inputs(1)
    check(_outputs(OUTPUT=("FP32", [1, 16], [0.5] * 16)))
    with pytest.raises(scenario.Mismatch, match="finite"):
        check(_outputs(OUTPUT=("FP32", [1, 16], [0.5] * 15 + [math.nan])))

    _, check = scenario.MODELS["textclass"].inputs(1)
    check(_outputs(LABEL=("BYTES", [1], [b"food"]), SCORES=("FP32", [1, 3], [0.1, 0.2, 0.7])))
    for label, scores in ((b"weather", [0.1, 0.2, 0.7]), (b"sports", [0.1, 0.2, 0.7]), (b"food", [0.1, 0.2, 0.2])):
        with pytest.raises(scenario.Mismatch):
            check(_outputs(LABEL=("BYTES", [1], [label]), SCORES=("FP32", [1, 3], scores)))


async def test_every_pair_against_the_server(start_server, http: aiohttp.ClientSession,
                                             tmp_path: pathlib.Path) -> None:
    """The scenario's encoders and decoders with a real server, without Locust: each pair answers
    and passes its check, for 1 and 3 samples."""
    _, url = await start_server(repository(tmp_path / "repo"))
    for model, encoding in PAIRS:
        for rows in (1, 3):
            inputs, check = scenario.MODELS[model].inputs(rows)
            body, headers = scenario.REQUESTS[encoding](inputs)
            async with http.post(f"{url}/v2/models/{model}/infer", data=body, headers=headers) as r:
                content = await r.read()
                assert r.status == 200, (model, encoding, content[:300])
                check(scenario.decode_answer(encoding, content, r.headers))


# ---- Locust itself ----


def read_csv(path: str) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.asyncio(loop_factories=["asyncio"])  # spawns Locust (MagicStack/uvloop#650)
async def test_headless_locust_run_and_its_plot(start_server, tmp_path: pathlib.Path) -> None:
    # only looked up, never imported here: importing locust monkey-patches this process with gevent
    if importlib.util.find_spec("locust") is None:
        pytest.skip("locust is not installed (the `test` extra)")
    if importlib.util.find_spec("matplotlib") is None:
        pytest.skip("matplotlib is not installed (the `bench` extra: plot.py)")
    _, url = await start_server(repository(tmp_path / "repo"))
    prefix = tmp_path / "run"
    env = {**os.environ, "ASERVE_LOCUST_WEIGHTS": ",".join(f"{m}:{e}=1" for m, e in PAIRS),
           "ASERVE_LOCUST_MAX_ROWS": "2"}
    # Locust runs in a process of its own (it monkey-patches the standard library with gevent),
    # while this test's event loop serves it; 3 users for 4 s of mixed requests
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "locust", "-f", str(LOADTESTS / "locustfile.py"), "--headless",
        "--users", "3", "--spawn-rate", "3", "--run-time", "4s", "--host", url, "--csv", str(prefix),
        "--only-summary", "--loglevel", "WARNING", "--exit-code-on-error", "1",
        cwd=tmp_path, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    output, _ = await asyncio.wait_for(process.communicate(), timeout=60)
    log = output.decode(errors="replace")
    assert process.returncode == 0, log[-3000:]

    rows = {row["Name"]: row for row in read_csv(f"{prefix}_stats.csv")}
    aggregated = rows.pop("Aggregated")
    assert int(aggregated["Failure Count"]) == 0, log[-3000:]
    assert int(aggregated["Request Count"]) >= len(PAIRS)
    assert set(rows) == {f"{m}:{e}" for m, e in PAIRS}, f"pairs exercised: {sorted(rows)}"
    for name, row in rows.items():
        assert int(row["Request Count"]) > 0 and int(row["Failure Count"]) == 0, (name, row)
    assert read_csv(f"{prefix}_failures.csv") == []

    png = tmp_path / "run.png"
    plot = await asyncio.create_subprocess_exec(
        sys.executable, str(LOADTESTS / "plot.py"), f"{prefix}_stats_history.csv", "-o", str(png),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    output, _ = await asyncio.wait_for(plot.communicate(), timeout=60)
    assert plot.returncode == 0, output.decode(errors="replace")
    data = png.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (900, 600)  # plot.py's 9 x 6 in at 100 dpi


def test_plot_refuses_what_is_not_a_history(tmp_path: pathlib.Path) -> None:
    plot = load_script("plot")
    stats = tmp_path / "x_stats.csv"
    stats.write_text("Type,Name,Request Count\nPOST,simple:json,3\n")
    assert plot.main([str(stats)]) == 1
    empty = tmp_path / "y_stats_history.csv"
    empty.write_text("Timestamp,User Count,Type,Name,Requests/s,Failures/s,50%,95%,99%\n"
                     "1,0,,Aggregated,0,0,N/A,N/A,N/A\n")
    assert plot.main([str(empty)]) == 1
    assert not list(tmp_path.glob("*.png"))
