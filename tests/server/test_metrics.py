"""GET /metrics as Prometheus scrapes it: the exposition format (checked by prometheus_client's parser),
and counters that follow the traffic."""

from __future__ import annotations

import asyncio
import math
import pathlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np
import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from ..conftest import until
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


# ---- the exposition, as Prometheus' own Python client parses it ----


@dataclass
class Scrape:
    """Families by name as `text_string_to_metric_families` names them (a counter without its
    `_total`), and the family of every sample name (`..._total`, `..._bucket`, ...)."""

    families: dict[str, Metric]
    by_sample: dict[str, Metric] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for family in self.families.values():
            for sample in family.samples:
                self.by_sample.setdefault(sample.name, family)

    def family(self, sample_name: str) -> Metric:
        """The family a sample name belongs to (KeyError if no sample has that name)."""
        return self.by_sample[sample_name]

    def samples(self, sample_name: str, **labels: str) -> list[Sample]:
        """Samples named `sample_name` whose labels include `labels`."""
        family = self.by_sample.get(sample_name)
        return [s for s in (family.samples if family else ()) if s.name == sample_name
                and labels.items() <= s.labels.items()]


_TYPES = {"counter", "gauge", "histogram", "unknown"}  # what aserve exports ("untyped" parses as "unknown")


def parse(text: str) -> Scrape:
    """The whole exposition through prometheus_client's parser, plus what that lax parser lets
    through and Prometheus' Go parser rejects: a sample outside any declared family (it becomes
    an untyped family without HELP), a family split or repeated (twice by name, or one series
    twice), and counters or histograms that break their own rules."""
    assert text.endswith("\n")
    families: dict[str, Metric] = {}
    for family in text_string_to_metric_families(text):
        assert family.name not in families, f"family {family.name} twice (its samples must be together)"
        assert family.documentation, f"{family.name} has no HELP (a sample outside its family?)"
        assert family.type in _TYPES, f"{family.name}: unexpected type {family.type}"
        assert family.samples, f"{family.name} has no samples"
        series = [(s.name, tuple(sorted(s.labels.items()))) for s in family.samples]
        assert len(series) == len(set(series)), f"{family.name}: a series appears twice"
        families[family.name] = family
        if family.type == "counter":
            assert all(s.name == family.name + "_total" and s.value >= 0 for s in family.samples), family
        if family.type == "histogram":
            _check_histogram(family)
    return Scrape(families)


def _check_histogram(family: Metric) -> None:
    """Per series: cumulative buckets, sorted bounds ending at +Inf, whose count is _count."""
    series: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
    for s in family.samples:
        key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
        entry = series.setdefault(key, {"buckets": []})
        if s.name.endswith("_bucket"):
            entry["buckets"].append((float(s.labels["le"]), s.value))
        else:
            entry[s.name.removeprefix(family.name)] = s.value
    for key, entry in series.items():
        bounds = [b for b, _ in entry["buckets"]]
        counts = [c for _, c in entry["buckets"]]
        assert bounds == sorted(bounds) and math.isinf(bounds[-1]), (family.name, key, bounds)
        assert counts == sorted(counts), (family.name, key, counts)
        assert entry["_count"] == counts[-1] and entry["_sum"] >= 0, (family.name, key, entry)


def value(m: Scrape, name: str, **labels: str) -> float:
    """The one sample named `name` whose labels include `labels`."""
    found = m.samples(name, **labels)
    assert len(found) == 1, f"{name}{labels}: {len(found)} samples"
    return found[0].value


async def scrape(http: aiohttp.ClientSession, url: str) -> Scrape:
    async with http.get(f"{url}/metrics") as r:
        assert r.status == 200
        assert r.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        return parse(await r.text())


async def scrape_until(http: aiohttp.ClientSession, url: str, predicate: Callable[[Scrape], bool], *,
                       what: str, timeout: float = 30.0) -> Scrape:
    """Scrape until `predicate` holds of the exposition (polling the state /metrics shows, as
    `tests.conftest.until` polls a predicate); the scrape it held of."""
    held: list[Scrape] = []

    async def holds() -> bool:
        m = await scrape(http, url)
        held[:] = [m]
        return predicate(m)

    await until(holds, timeout=timeout, what=what, every=0.002)
    return held[0]


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
    # polling stays on rather than probed: the spin counter below must grow while the
    # interpreters serve, and whether polling pays on this host is the probe's to say
    _, base = await start_server(repo, spin_always=True)
    return base


@pytest.mark.serial  # the spin counter grows only while an interpreter gets the CPU to poll
async def test_counters_follow_requests(url: str, http: aiohttp.ClientSession) -> None:
    before = await scrape(http, url)
    add = {"model": "add", "version": "1"}
    assert value(before, "aserve_inference_request_success_total", **add) == 0
    assert value(before, "aserve_model_ready", **add) == 1
    assert value(before, "aserve_model_ready", model="badcode") == 0
    assert value(before, "aserve_model_info", **add, engine="main", batching_policy="window") == 1
    assert before.family("aserve_inference_request_success_total").type == "counter"
    assert before.family("aserve_inference_request_success_total").name == "aserve_inference_request_success"
    assert before.family("aserve_queue_samples").type == "gauge"
    assert before.family("aserve_inference_request_duration_us_bucket").type == "histogram"
    assert before.family("aserve_inference_request_duration_us_sum").name == "aserve_inference_request_duration_us"
    models = {s.labels["model"] for s in before.samples("aserve_inference_request_success_total")}
    assert models == {"add", "badcode", "fast", "slow", "upper"}
    assert all(set(s.labels) == {"model", "version"} for s in before.samples("aserve_inference_request_success_total"))

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

    # the histogram: cumulative buckets ending at +Inf == count == successes (parse() checked
    # that every series' buckets are cumulative over sorted bounds); a positive sum
    buckets = [(s.labels["le"], s.value) for s in after.samples("aserve_inference_request_duration_us_bucket", **add)]
    assert len(buckets) > 1
    assert buckets[-1] == ("+Inf", ok)
    assert value(after, "aserve_inference_request_duration_us_count", **add) == ok
    assert value(after, "aserve_inference_request_duration_us_sum", **add) > 0
    # other models' counters did not move
    assert value(after, "aserve_inference_request_success_total", model="upper") == 0

    # pool gauges per engine
    assert value(after, "aserve_pool_interpreters", engine="main") == 2
    assert value(after, "aserve_pool_busy", engine="main") == 0
    assert after.family("aserve_pool_queued").type == "gauge"
    assert {s.labels["engine"] for s in after.samples("aserve_pool_interpreters")} == {"main"}
    assert value(after, "aserve_pool_batch_slots", engine="main") == 2
    assert value(after, "aserve_pool_batch_slots_in_use", engine="main") == 0
    # the time interpreters spent polling for their next batch (spin_us): a counter (how it grows
    # with the batches is tests/engine/test_spin.py's: whether these few requests meet a poll
    # depends on the arrivals the pool learned), and how many poll right now
    assert after.family("aserve_pool_spin_seconds_total").type == "counter"
    spun = value(after, "aserve_pool_spin_seconds_total", engine="main")
    assert spun >= value(before, "aserve_pool_spin_seconds_total", engine="main") > 0  # spin_always: warm-up polled
    assert 0 <= value(after, "aserve_pool_spinning", engine="main") <= 1
    # and the batches that found an interpreter polling for them
    assert after.family("aserve_pool_polled_batches_total").type == "counter"
    assert value(after, "aserve_pool_polled_batches_total", engine="main") >= value(
        before, "aserve_pool_polled_batches_total", engine="main")
    # or had to wake one: asleep until its polling window, or blocked
    for name in ("aserve_pool_woke_napping_batches_total", "aserve_pool_woke_blocked_batches_total"):
        assert after.family(name).type == "counter"
        assert value(after, name, engine="main") >= value(before, name, engine="main")


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
    points = {s.labels["batch_size"]: s.value for s in m.samples("aserve_cost_model_latency_us", **fast)}
    assert set(points) == {"1", "2", "4", "8"}  # the warm-up ladder up to max_batch_size 8
    assert all(v > 0 for v in points.values())
    assert {s.labels["param"] for s in m.samples("aserve_cost_model_parameter", **fast)} == {"a", "c"}
    assert m.family("aserve_cost_model_observations_total").type == "counter"
    # a window-policy model has none of it
    assert not m.samples("aserve_latency_budget_us", model="add")


async def test_refusals_timeouts_and_queue_depth(url: str, http: aiohttp.ClientSession) -> None:
    slow = {"model": "slow", "version": "1"}

    async def call(ms: float, **parameters: object) -> int:
        async with http.post(f"{url}/v2/models/slow/infer", json=slow_body(ms, **parameters)) as r:
            await r.read()
            return r.status

    # one request runs on the model's only interpreter, two wait: the queue is full. The
    # running one sleeps long enough (1 s) for the scrapes and the refused call to happen
    # while it runs; each step waits for the state /metrics shows, not for a time.
    running = asyncio.ensure_future(call(1000))
    await scrape_until(http, url, lambda m: value(m, "aserve_batches_in_flight", **slow) == 1,
                       what="the 1 s request to run")
    waiting = [asyncio.ensure_future(call(1)) for _ in range(2)]
    during = await scrape_until(http, url, lambda m: value(m, "aserve_queue_requests", **slow) == 2,
                                what="two requests queued behind it")
    assert value(during, "aserve_batches_in_flight", **slow) == 1
    assert value(during, "aserve_queue_samples", **slow) == 2
    refused = await call(1)
    assert not running.done(), "the running request ended before the queue could be seen full"
    assert refused == 503  # max_queue_size 2
    assert await running == 200 and [await w for w in waiting] == [200, 200]

    blocker = asyncio.ensure_future(call(1000))
    await scrape_until(http, url, lambda m: value(m, "aserve_batches_in_flight", **slow) == 1,
                       what="the blocking request to run")
    late = await call(1, timeout=20_000)  # 20 ms, behind a 1 s request
    assert not blocker.done(), "the blocking request ended before the deadline passed"
    assert late == 504
    assert await blocker == 200

    m = await scrape(http, url)
    assert value(m, "aserve_inference_refused_total", **slow) == 1
    assert value(m, "aserve_inference_timed_out_total", **slow) == 1
    assert value(m, "aserve_inference_request_failure_total", **slow, reason="overloaded") == 1
    assert value(m, "aserve_inference_request_failure_total", **slow, reason="timeout") == 1
    assert value(m, "aserve_inference_request_success_total", **slow) == 4
    assert value(m, "aserve_queue_requests", **slow) == 0


def test_parse_rejects_malformed_text() -> None:
    good = ('# HELP x_total A.\n# TYPE x_total counter\nx_total{model="a\\"b"} 3\n'
            '# HELP h H.\n# TYPE h histogram\nh_bucket{le="1"} 1\nh_bucket{le="+Inf"} 2\nh_sum 3\nh_count 2\n')
    m = parse(good)
    assert value(m, "x_total", model='a"b') == 3
    assert m.family("x_total").name == "x" and m.family("h_count").name == "h"
    for bad in (
        "x_total 3\n",  # no TYPE
        '# HELP x A.\n# TYPE x gauge\nx{model="a} 1\n',  # unterminated label
        "# HELP x A.\n# TYPE x gauge\nx 1\n# HELP x A.\n# TYPE x gauge\nx 2\n",  # family repeated
        "# HELP x A.\n# TYPE x gauge\nx 1\n# HELP y A.\n# TYPE y gauge\ny 1\n# HELP x A.\n# TYPE x gauge\nx 2\n",
        "# HELP x A.\n# TYPE x gauge\ny 1\n",  # sample outside its family
        "# HELP x_total A.\n# TYPE x_total counter\nx_total -1\n",  # a counter below zero
        '# HELP h H.\n# TYPE h histogram\nh_bucket{le="1"} 2\nh_bucket{le="+Inf"} 1\nh_sum 3\nh_count 1\n',
        '# HELP h H.\n# TYPE h histogram\nh_bucket{le="1"} 1\nh_bucket{le="+Inf"} 2\nh_sum 3\nh_count 3\n',
    ):
        with pytest.raises((AssertionError, ValueError)):
            parse(bad)
