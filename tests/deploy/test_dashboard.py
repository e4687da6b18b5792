"""docker/grafana/dashboards/aserve.json: Grafana's dashboard format, the provisioned datasource,
and every metric its PromQL names exported by a real server's /metrics."""

from __future__ import annotations

import json
import pathlib
import re

import aiohttp
import pytest
import yaml

from ..server.test_metrics import Scrape, adaptive_repository, infer_add, scrape
from .conftest import DOCKER

DASHBOARD = DOCKER / "grafana" / "dashboards" / "aserve.json"
MEMORY = "aserve_model_memory_bytes"
PANEL_TYPES = {"timeseries", "stat", "gauge", "bargauge", "table", "text", "heatmap", "row"}

# ---- PromQL: the metric names an expression selects ----

_FUNCTION_OR_NAME = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?")
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left",
             "group_right", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """Names of the series an expression selects: identifiers that are neither functions,
    aggregations, keywords, label names (matchers, `by (...)`), nor Grafana variables."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings (label values, regexes)
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges, [$__rate_interval]
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\$\w+", " ", text)  # Grafana variables
    text = re.sub(r"\b\d+(ms|[smhdwy])\b", " ", text)  # durations (offset 5m)
    text = re.sub(r"\b\d+(\.\d+)?(e[+-]?\d+)?\b", " ", text)  # numbers
    names = set()
    for m in _FUNCTION_OR_NAME.finditer(text):
        if not m[2] and m[1].lower() not in _KEYWORDS:
            names.add(m[1])
    return names


def rated(expr: str) -> set[str]:
    """Names inside rate(), irate() or increase(): they must be counters (or histogram series)."""
    text = re.sub(r"\{[^}]*\}", "", expr)
    return set(re.findall(r"\b(?:rate|irate|increase)\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)", text))


def test_metric_names_reads_promql() -> None:
    expr = ('histogram_quantile(0.99, sum by (model, le) (rate(aserve_x_bucket{model=~"$model",le!="a b"}'
            '[$__rate_interval]))) / on (model) group_left sum without (engine) (aserve_y) > bool 2e3')
    assert metric_names(expr) == {"aserve_x_bucket", "aserve_y"}
    assert rated(expr) == {"aserve_x_bucket"}
    assert metric_names('sum(rate(a_total[5m])) / ignoring (reason) b offset 5m') == {"a_total", "b"}


# ---- the dashboard ----


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


@pytest.fixture(scope="module")
def datasource() -> dict:
    provisioned = yaml.safe_load((DOCKER / "grafana" / "provisioning" / "datasources" / "prometheus.yaml").read_text())
    (source,) = (s for s in provisioned["datasources"] if s["type"] == "prometheus")  # Jaeger is beside it
    return {"type": source["type"], "uid": source["uid"]}


def expressions(dashboard: dict) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", ())]


def used_names(dashboard: dict) -> set[str]:
    names = set().union(*(metric_names(e) for e in expressions(dashboard)))
    for variable in dashboard["templating"]["list"]:
        m = re.fullmatch(r"label_values\(\s*([a-zA-Z_:][\w:]*)\s*,\s*\w+\s*\)", variable["definition"])
        assert m, f"variable {variable['name']}: {variable['definition']}"
        names.add(m[1])
    return names


def test_grafana_dashboard_format(dashboard: dict, datasource: dict) -> None:
    for key, kind in (("uid", str), ("title", str), ("schemaVersion", int), ("panels", list),
                      ("templating", dict), ("time", dict)):
        assert isinstance(dashboard.get(key), kind), key
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,40}", dashboard["uid"])
    assert dashboard["title"] == "aserve"
    assert dashboard["schemaVersion"] >= 36  # datasource references by uid
    assert "id" not in dashboard or dashboard["id"] is None  # provisioning assigns it
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    occupied: set[tuple[int, int]] = set()
    for panel in dashboard["panels"]:
        assert panel["type"] in PANEL_TYPES, panel["type"]
        assert panel["title"]
        grid = panel["gridPos"]
        assert all(isinstance(grid[k], int) for k in ("x", "y", "w", "h"))
        assert grid["x"] >= 0 and grid["w"] > 0 and grid["x"] + grid["w"] <= 24 and grid["h"] > 0
        cells = {(x, y) for x in range(grid["x"], grid["x"] + grid["w"])
                 for y in range(grid["y"], grid["y"] + grid["h"])}
        assert not cells & occupied, f"panel {panel['title']!r} overlaps another"
        occupied |= cells
        assert panel["datasource"] == datasource, panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs))
        for target in panel["targets"]:
            assert target["expr"].strip() and target["datasource"] == datasource
            assert target["expr"].count("(") == target["expr"].count(")"), target["expr"]
    (variable,) = dashboard["templating"]["list"]
    assert variable["name"] == "model" and variable["datasource"] == datasource


def test_dashboard_has_the_panels_asked_for(dashboard: dict) -> None:
    exprs = expressions(dashboard)

    def some(pattern: str) -> bool:
        return any(re.search(pattern, e) for e in exprs)

    assert some(r"sum by \(model\) \(rate\(aserve_inference_request_success_total")  # request rate per model
    for q in ("0.5", "0.99"):
        assert some(rf"histogram_quantile\({q}, sum by \(model, le\) \(rate\(aserve_inference_request_duration_us_bucket")
    for part in ("queue", "compute"):  # per request: the _total counter over the successes
        assert some(rf"aserve_inference_{part}_duration_us_total.*\) / .*aserve_inference_request_success_total")
    assert some(r"aserve_inference_count_total.*\) / .*aserve_inference_exec_count_total")  # batch size
    assert some(r"aserve_pool_busy / aserve_pool_interpreters")
    assert some(r"aserve_inference_refused_total") and some(r"aserve_inference_timed_out_total")
    assert some(r"by \(model, reason\) \(rate\(aserve_inference_request_failure_total")
    assert some(rf"^{MEMORY}\{{")
    assert some(r"sum by \(protocol\) \(rate\(aserve_inference_request_protocol_total")  # HTTP against gRPC
    assert some(r"rate\(aserve_event_loop_cpu_seconds_total") and some(r"rate\(aserve_interpreter_cpu_seconds_total")


# ---- against a real server ----


async def exported(start_server, http: aiohttp.ClientSession, root: pathlib.Path) -> Scrape:
    """/metrics of a server with window and adaptive models after a few requests, a failure among them
    (so that every family, the labelled failure counter included, has its series)."""
    _, url = await start_server(adaptive_repository(root))
    for model, rows in (("add", 1), ("add", 3), ("fast", 1), ("fast", 2)):
        assert await infer_add(http, url, model, rows) == 200
    assert await infer_add(http, url, "add", 9) == 400  # over max_batch_size: reason="invalid"
    return await scrape(http, url)  # parsed whole by prometheus_client (tests/server/test_metrics.py)


def check_exported(names: set[str], m: Scrape, dashboard: dict) -> None:
    missing = sorted(n for n in names if not m.samples(n))
    assert not missing, f"the dashboard uses metrics /metrics does not export: {missing}"
    counters = {n for n in names if m.family(n).type == "counter" or n.endswith("_bucket")}
    for name in names:
        family = m.family(name)
        if family.type == "histogram":
            assert name in {family.name + s for s in ("_bucket", "_sum", "_count")}, name
    for expr in expressions(dashboard):
        wrong = (rated(expr) & names) - counters
        assert not wrong, f"rate() over what is no counter: {wrong} in {expr}"


async def test_dashboard_metrics_are_exported(start_server, http: aiohttp.ClientSession, tmp_path: pathlib.Path,
                                              dashboard: dict) -> None:
    names = used_names(dashboard)
    assert MEMORY in names and len(names) > 10
    m = await exported(start_server, http, tmp_path / "repo")
    check_exported(names - {MEMORY}, m, dashboard)


async def test_dashboard_memory_gauge_is_exported(start_server, http: aiohttp.ClientSession,
                                                  tmp_path: pathlib.Path, dashboard: dict) -> None:
    m = await exported(start_server, http, tmp_path / "repo")
    check_exported({MEMORY}, m, dashboard)
    assert m.family(MEMORY).type == "gauge"
    series = m.samples(MEMORY)
    assert {s.labels["model"] for s in series} >= {"add", "fast"}
    assert all(set(s.labels) == {"model", "version"} and s.value >= 0 for s in series)
