"""GET /metrics as Prometheus scrapes it: the exposition format, and counters that follow the traffic."""

from __future__ import annotations

import asyncio
import math
import pathlib
import re
from dataclasses import dataclass, field

import aiohttp
import numpy as np
import pytest

from .conftest import MODELS, write_repository
from .test_errors import slow_body
from .test_infer import add_inputs

ADAPTIVE_CONFIG = MODELS["add"][1].replace(
    "[batching]\nmax_queue_delay_ms = 2.0\n",
    "[batching]\npolicy = \"adaptive\"\nlatency_budget_ms = 20.0\ntimeout_ms = 2000.0\n",
)
assert 'policy = "adaptive"' in ADAPTIVE_CONFIG


def adaptive_repository(root: pathlib.Path) -> pathlib.Path:
    """The conftest models plus `fast`: the add model batched by the adaptive policy."""
    return write_repository(root, {**MODELS, "fast": (MODELS["add"][0], ADAPTIVE_CONFIG)})


# ---- a small parser of the text exposition format 0.0.4 ----

_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})? (?P<value>\S+)$")
_LABEL = re.compile(r'\s*(?P<key>[a-zA-Z_][a-zA-Z0-9_]*)="(?P<value>(?:[^"\\]|\\.)*)"\s*(?:,|$)')
_SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}


@dataclass
class Family:
    kind: str
    help: str
    samples: list[tuple[str, dict[str, str], float]] = field(default_factory=list)


def _labels(text: str | None) -> dict[str, str]:
    out: dict[str, str] = {}
    pos = 0
    text = text or ""
    while pos < len(text):
        m = _LABEL.match(text, pos)
        assert m, f"bad labels {text!r} at {pos}"
        key = m["key"]
        assert key not in out, f"label {key} repeated in {text!r}"
        out[key] = re.sub(r"\\(.)", lambda e: "\n" if e[1] == "n" else e[1], m["value"])
        pos = m.end()
    return out


def parse(text: str) -> dict[str, Family]:
    """Families by name; asserts what Prometheus' parser would reject."""
    assert text.endswith("\n")
    families: dict[str, Family] = {}
    helps: dict[str, str] = {}
    current: str | None = None
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, doc = line[7:].partition(" ")
            assert name not in helps, f"HELP {name} twice"
            helps[name] = doc
        elif line.startswith("# TYPE "):
            name, kind = line[7:].split(" ")
            assert kind in ("counter", "gauge", "histogram", "summary", "untyped"), line
            assert name not in families, f"family {name} declared twice (its samples must be together)"
            families[name] = Family(kind, helps.get(name, ""))
            current = name
        elif line.startswith("#") or not line.strip():
            continue
        else:
            m = _SAMPLE.match(line)
            assert m, f"bad sample line {line!r}"
            assert current is not None, f"sample before any TYPE: {line!r}"
            fam = families[current]
            name = m["name"]
            allowed = {current} | {current + s for s in _SUFFIXES.get(fam.kind, ())}
            assert name in allowed, f"{name} is outside its family {current}"
            value = float(m["value"])  # Go's ParseFloat accepts what float() does here (+Inf, NaN, 1e-05)
            fam.samples.append((name, _labels(m["labels"]), value))
    for name, fam in families.items():
        assert fam.help, f"{name} has no HELP"
        assert fam.samples, f"{name} has no samples"
    return families


def value(families: dict[str, Family], name: str, **labels: str) -> float:
    """The one sample named `name` whose labels include `labels`."""
    family = families.get(name) or families[re.sub(r"_(bucket|sum|count)$", "", name)]
    found = [v for n, ls, v in family.samples if n == name and labels.items() <= ls.items()]
    assert len(found) == 1, f"{name}{labels}: {len(found)} samples"
    return found[0]


async def scrape(http: aiohttp.ClientSession, url: str) -> dict[str, Family]:
    async with http.get(f"{url}/metrics") as r:
        assert r.status == 200
        assert r.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        return parse(await r.text())


async def infer_add(http: aiohttp.ClientSession, url: str, model: str, rows: int, first: int = 1) -> int:
    a = np.full((rows, 4), first, np.int32)
    async with http.post(f"{url}/v2/models/{model}/infer", json={"inputs": add_inputs(a, a)}) as r:
        body = await r.json()
        if r.status == 200:
            assert body["outputs"][0]["data"] == (2 * a).ravel().tolist()
        return r.status


# ---- tests ----


@pytest.fixture
async def url(start_server, tmp_path: pathlib.Path) -> str:
    repo = adaptive_repository(tmp_path / "repo")
    write_repository(repo, {"badcode": ("raise RuntimeError('cannot import me')\n", "")})
    _, base = await start_server(repo)
    return base


async def test_counters_follow_requests(url: str, http: aiohttp.ClientSession) -> None:
    before = await scrape(http, url)
    add = {"model": "add", "version": "1"}
    assert value(before, "aserve_inference_request_success_total", **add) == 0
    assert value(before, "aserve_model_ready", **add) == 1
    assert value(before, "aserve_model_ready", model="badcode") == 0
    assert value(before, "aserve_model_info", **add, engine="main", batching_policy="window") == 1
    assert before["aserve_inference_request_success_total"].kind == "counter"
    assert before["aserve_queue_samples"].kind == "gauge"
    assert before["aserve_inference_request_duration_us"].kind == "histogram"
    models = {ls["model"] for _, ls, _ in before["aserve_inference_request_success_total"].samples}
    assert models == {"add", "badcode", "fast", "slow", "upper"}

    rows = [1, 3, 1, 2, 1, 1, 4, 1]
    statuses = await asyncio.gather(*(infer_add(http, url, "add", n) for n in rows))
    assert statuses == [200] * len(rows)
    assert await infer_add(http, url, "add", 9) == 400  # over max_batch_size 8
    assert await infer_add(http, url, "add", 1, first=-999) == 500  # the model raises
    async with http.post(f"{url}/v1/models/add:predict", json={"instances": [{"A": [1] * 4, "B": [2] * 4}]}) as r:
        assert r.status == 200
    async with http.post(f"{url}/v2/models/badcode/infer", json={"inputs": []}) as r:
        assert r.status == 503

    after = await scrape(http, url)
    ok = len(rows) + 1
    assert value(after, "aserve_inference_request_success_total", **add) == ok
    assert value(after, "aserve_inference_count_total", **add) == sum(rows) + 1
    assert value(after, "aserve_inference_request_failure_total", **add, reason="invalid") == 1
    assert value(after, "aserve_inference_request_failure_total", **add, reason="model") == 1
    assert value(after, "aserve_inference_request_failure_total", model="badcode", reason="unavailable") == 1
    # batches: however the batcher merged them, at least one and at most one per request
    # that reached it (the failing one included)
    execs = value(after, "aserve_inference_exec_count_total", **add)
    assert 1 <= execs <= ok + 1
    assert value(after, "aserve_batcher_requests_total", **add) == ok
    assert value(after, "aserve_queue_samples", **add) == 0
    assert value(after, "aserve_batches_in_flight", **add) == 0
    # Triton's cumulative queue and compute durations: every answered request ran, and
    # a request's duration end to end covers its queueing and its batch's run
    compute = value(after, "aserve_inference_compute_duration_us_total", **add)
    queue = value(after, "aserve_inference_queue_duration_us_total", **add)
    assert compute > 0 and queue >= 0
    assert queue + compute <= value(after, "aserve_inference_request_duration_us_sum", **add) * 2

    # the histogram: cumulative buckets ending at +Inf == count == successes; a positive sum
    buckets = [(ls["le"], v) for n, ls, v in after["aserve_inference_request_duration_us"].samples
               if n.endswith("_bucket") and ls["model"] == "add"]
    assert buckets[-1][0] == "+Inf" and buckets[-1][1] == ok
    counts = [v for _, v in buckets]
    assert counts == sorted(counts)
    bounds = [float(le) for le, _ in buckets]
    assert bounds == sorted(bounds) and math.isinf(bounds[-1])
    assert value(after, "aserve_inference_request_duration_us_count", **add) == ok
    assert value(after, "aserve_inference_request_duration_us_sum", **add) > 0
    # other models' counters did not move
    assert value(after, "aserve_inference_request_success_total", model="upper") == 0

    # pool gauges per engine
    assert value(after, "aserve_pool_interpreters", engine="main") == 2
    assert value(after, "aserve_pool_busy", engine="main") == 0
    assert after["aserve_pool_queued"].kind == "gauge"
    assert value(after, "aserve_pool_batch_slots", engine="main") == 2
    assert value(after, "aserve_pool_batch_slots_in_use", engine="main") == 0


async def test_adaptive_model_exports_its_cost_model(url: str, http: aiohttp.ClientSession) -> None:
    for rows in (1, 2, 1):
        assert await infer_add(http, url, "fast", rows) == 200
    m = await scrape(http, url)
    fast = {"model": "fast", "version": "1"}
    assert value(m, "aserve_model_info", **fast, batching_policy="adaptive") == 1
    assert value(m, "aserve_latency_budget_us", **fast) == pytest.approx(20_000)
    assert value(m, "aserve_batching_interpreters", **fast) == 2
    assert value(m, "aserve_arrival_rate_samples_per_second", **fast) >= 0
    batch1 = value(m, "aserve_cost_model_batch1_latency_us", **fast)
    assert 0 < batch1 < 1e6
    assert value(m, "aserve_cost_model_info", **fast, form="affine") == 1
    assert value(m, "aserve_cost_model_per_sample_latency_us", **fast) >= 0
    assert 1 <= value(m, "aserve_cost_model_throughput_optimal_batch", **fast) <= 8
    assert value(m, "aserve_cost_model_throughput_optimal_samples_per_second", **fast) > 0
    assert value(m, "aserve_cost_model_observations_total", **fast) >= 1  # the requests above refined it
    points = {ls["batch_size"]: v for _, ls, v in m["aserve_cost_model_latency_us"].samples if ls["model"] == "fast"}
    assert set(points) == {"1", "2", "4", "8"}  # the warm-up ladder up to max_batch_size 8
    assert all(v > 0 for v in points.values())
    assert {ls["param"] for _, ls, _ in m["aserve_cost_model_parameter"].samples if ls["model"] == "fast"} == {"a", "c"}
    # a window-policy model has none of it
    assert not [ls for _, ls, _ in m["aserve_latency_budget_us"].samples if ls["model"] == "add"]


async def test_refusals_timeouts_and_queue_depth(url: str, http: aiohttp.ClientSession) -> None:
    slow = {"model": "slow", "version": "1"}

    async def call(ms: float, **parameters: object) -> int:
        async with http.post(f"{url}/v2/models/slow/infer", json=slow_body(ms, **parameters)) as r:
            await r.read()
            return r.status

    running = asyncio.ensure_future(call(400))
    await asyncio.sleep(0.1)
    waiting = [asyncio.ensure_future(call(1)) for _ in range(2)]
    await asyncio.sleep(0.05)
    during = await scrape(http, url)
    assert value(during, "aserve_batches_in_flight", **slow) == 1
    assert value(during, "aserve_queue_requests", **slow) == 2
    assert value(during, "aserve_queue_samples", **slow) == 2
    assert await call(1) == 503  # max_queue_size 2
    assert await running == 200 and [await w for w in waiting] == [200, 200]

    blocker = asyncio.ensure_future(call(300))
    await asyncio.sleep(0.05)
    assert await call(1, timeout=20_000) == 504  # 20 ms, behind a 300 ms request
    assert await blocker == 200

    m = await scrape(http, url)
    assert value(m, "aserve_inference_refused_total", **slow) == 1
    assert value(m, "aserve_inference_timed_out_total", **slow) == 1
    assert value(m, "aserve_inference_request_failure_total", **slow, reason="overloaded") == 1
    assert value(m, "aserve_inference_request_failure_total", **slow, reason="timeout") == 1
    assert value(m, "aserve_inference_request_success_total", **slow) == 4
    assert value(m, "aserve_queue_requests", **slow) == 0


def test_parser_rejects_malformed_text() -> None:
    good = '# HELP x_total A.\n# TYPE x_total counter\nx_total{model="a\\"b"} 3\n'
    assert value(parse(good), "x_total", model='a"b') == 3
    for bad in (
        "x_total 3\n",  # no TYPE
        '# HELP x A.\n# TYPE x gauge\nx{model="a} 1\n',  # unterminated label
        "# HELP x A.\n# TYPE x gauge\nx 1\n# HELP x A.\n# TYPE x gauge\nx 2\n",  # family split
        "# HELP x A.\n# TYPE x gauge\ny 1\n",  # sample outside its family
    ):
        with pytest.raises(AssertionError):
            parse(bad)
