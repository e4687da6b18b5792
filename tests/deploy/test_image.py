"""The image docker/Dockerfile builds, run as a user runs it, with docker or podman.

`./dev test-image` builds the image (docker/image.sh) and runs these; the default run leaves
them out (the `image` marker, pyproject.toml): building takes minutes. Without a container
engine they are skipped, and without the image (ASERVE_IMAGE, default aserve:latest) too.

- the bundled models: the container runs as its non-root user, its HEALTHCHECK reports
  healthy, tritonclient infers through the published ports (HTTP with JSON and binary
  tensors, and gRPC) and gets the answers computed here, the spans reach an OTLP/HTTP
  receiver on the host under the caller's traceparent (examples/traced's own, opened with
  the OpenTelemetry API, under its batch's run, with the caller's baggage), and /metrics
  counts the requests;
- a mounted repository replaces the bundled models; SIGTERM with requests queued and running
  answers every one of them with its own values, and the container exits 0;
- the compose stack (`./dev compose`, docker/compose.sh): aserve and Prometheus come up,
  Prometheus scrapes every bundled model's series, a headless Locust run loads aserve
  without a failure, and `down` leaves no container behind.

podman runs health checks from systemd timers: on a host without systemd the test runs the
image's HEALTHCHECK itself (`podman healthcheck run`), which records the same health status.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import pathlib
import random
import re
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import numpy as np
import pytest
import tritonclient.http as triton
from prometheus_client.parser import text_string_to_metric_families

from ..conftest import EXAMPLES, ROOT, load_script, needs_torch, spawns, until
from ..peers import Receiver

IMAGE = os.environ.get("ASERVE_IMAGE", "aserve:latest")
NON_ROOT_UID = 10001  # the Dockerfile's `useradd --uid`


def find_engine() -> str | None:
    """ASERVE_ENGINE, else docker when its daemon answers, else podman (docker/image.sh's choice)."""
    if os.environ.get("ASERVE_ENGINE"):
        return os.environ["ASERVE_ENGINE"]
    if shutil.which("docker") and subprocess.run(["docker", "info"], check=False, capture_output=True).returncode == 0:
        return "docker"
    return "podman" if shutil.which("podman") else None


ENGINE = ""
pytestmark = [pytest.mark.image, needs_torch]  # the mlp's answers are computed here with torch


@pytest.fixture(autouse=True, scope="module")
def image_engine() -> str:
    """The engine that has the image; the tests are skipped, saying why, where there is none."""
    global ENGINE
    found = find_engine()
    if found is None:
        pytest.skip("no container engine (docker with its daemon, or podman)")
    if subprocess.run([found, "image", "inspect", IMAGE], check=False, capture_output=True).returncode != 0:
        pytest.skip(f"no image {IMAGE} in {found}: ./dev image builds it (./dev test-image builds it and runs these)")
    ENGINE = found
    return found


def host_name() -> str:
    """The host as containers see it, for the OTLP receiver."""
    return "host.docker.internal" if ENGINE == "docker" else "host.containers.internal"


async def engine(*args: str, check: bool = True, timeout: float = 120.0) -> str:
    proc = await asyncio.create_subprocess_exec(
        str(ENGINE), *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{ENGINE} {' '.join(args)}: exit status {proc.returncode}: {err.decode()}")
    return out.decode()


@dataclass
class Container:
    name: str
    url: str
    grpc: str  # host:port of the published gRPC port
    started: float  # time.monotonic() of `run`

    async def inspect(self) -> dict[str, Any]:
        [state] = json.loads(await engine("inspect", self.name))
        return state  # type: ignore[no-any-return]

    async def logs(self) -> str:
        proc = await asyncio.create_subprocess_exec(
            str(ENGINE), "logs", self.name, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        out, _ = await proc.communicate()
        return out.decode(errors="replace")

    async def wait_healthy(self, timeout: float = 240.0) -> float:
        """Seconds from `run` to the HEALTHCHECK's first healthy status."""
        drive = ENGINE == "podman" and not pathlib.Path("/run/systemd/system").is_dir()
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            state = (await self.inspect())["State"]
            health = state.get("Health") or state.get("Healthcheck") or {}
            if health.get("Status") == "healthy":
                return time.monotonic() - self.started
            assert state["Running"] and health.get("Status") != "unhealthy", (state, await self.logs())
            if drive:
                await engine("healthcheck", "run", self.name, check=False)
            else:
                await asyncio.sleep(0.1)
        raise AssertionError(f"not healthy after {timeout} s: {await self.logs()}")


@asynccontextmanager
async def container(*options: str) -> AsyncIterator[Container]:
    """`run -d` of the image on a port published on 127.0.0.1; removed (with its logs shown
    on failure) on the way out."""
    name = f"aserve-test-{uuid.uuid4().hex[:12]}"
    started = time.monotonic()
    await engine("run", "-d", "--name", name, "-p", "127.0.0.1::8000", "-p", "127.0.0.1::8001", *options, IMAGE)
    try:
        address = (await engine("port", name, "8000/tcp")).split()[0]
        grpc = (await engine("port", name, "8001/tcp")).split()[0]
        yield Container(name, f"http://{address}", grpc, started)
    except BaseException:
        print(f"---- {name} logs ----\n{await Container(name, '', '', started).logs()}")
        raise
    finally:
        await engine("rm", "-f", "-t", "0", name, check=False)


@asynccontextmanager
async def receiver() -> AsyncIterator[tuple[Receiver, int]]:
    """Listening on every address: the container reaches the host through its bridge."""
    r = Receiver()
    async with r.serving("0.0.0.0") as port:
        yield r, port


def mlp_network() -> Any:
    """examples/mlp's network with its seeded weights, built here to compute the answers."""
    spec = importlib.util.spec_from_file_location("image_test_mlp", EXAMPLES / "mlp" / "model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build()


def grpc_infer(address: str, a: np.ndarray, b: np.ndarray) -> dict[str, np.ndarray]:
    """tritonclient.grpc's `simple` call on one thread: its outputs."""
    import tritonclient.grpc as triton_grpc

    client = triton_grpc.InferenceServerClient(address)
    try:
        inputs = []
        for name, value in (("INPUT0", a), ("INPUT1", b)):
            tensor = triton_grpc.InferInput(name, list(value.shape), "INT32")
            tensor.set_data_from_numpy(value)
            inputs.append(tensor)
        result = client.infer("simple", inputs)
        return {name: result.as_numpy(name) for name in ("OUTPUT0", "OUTPUT1")}
    finally:
        client.close()


def triton_infer(url: str, calls: list[tuple[str, dict[str, np.ndarray], bool, dict[str, str]]]
                 ) -> list[dict[str, np.ndarray]]:
    """tritonclient.http on one thread: each (model, inputs, binary, headers) -> its outputs."""
    client = triton.InferenceServerClient(url.removeprefix("http://"))
    try:
        assert client.is_server_ready()
        out = []
        for model, arrays, binary, headers in calls:
            inputs = []
            for name, value in arrays.items():
                tensor = triton.InferInput(name, list(value.shape), triton.np_to_triton_dtype(value.dtype))
                tensor.set_data_from_numpy(value, binary_data=binary)
                inputs.append(tensor)
            outputs = [triton.InferRequestedOutput(name, binary_data=binary)
                       for name in [o["name"] for o in client.get_model_metadata(model)["outputs"]]]
            result = client.infer(model, inputs, outputs=outputs, headers=headers)
            out.append({o.name(): result.as_numpy(o.name()) for o in outputs})
        return out
    finally:
        client.close()


async def scrape(http: aiohttp.ClientSession, url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with http.get(f"{url}/metrics") as r:
        assert r.status == 200
        text = await r.text()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def counted(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, model: str) -> float:
    return sum(v for (n, labels), v in samples.items() if n == name and ("model", model) in labels)


@spawns
async def test_bundled_models_answer_trace_and_count_through_the_published_port() -> None:
    rng = np.random.default_rng(27)
    a, b = rng.integers(-1000, 1000, (2, 16), dtype=np.int32), rng.integers(-1000, 1000, (2, 16), dtype=np.int32)
    x = rng.standard_normal((3, 16)).astype(np.float32)
    import torch

    with torch.inference_mode():
        expected_mlp = mlp_network()(torch.from_numpy(x)).numpy()
    trace_id, parent_id = random.getrandbits(128), random.getrandbits(64)
    traceparent = {"traceparent": f"00-{trace_id:032x}-{parent_id:016x}-01"}
    # examples/traced opens spans with the OpenTelemetry API alone and reads the caller's baggage
    scaled = rng.standard_normal((2, 4)).astype(np.float32)
    traced_id = random.getrandbits(128)
    traced_headers = {"traceparent": f"00-{traced_id:032x}-{random.getrandbits(64):016x}-01",
                      "baggage": "tenant=acme"}

    async with receiver() as (collector, receiver_port), container(
        "-e", f"OTEL_EXPORTER_OTLP_ENDPOINT=http://{host_name()}:{receiver_port}",
        "-e", "OTEL_SERVICE_NAME=aserve-in-a-container", "-e", "OTEL_BSP_SCHEDULE_DELAY=50",
        *(["--add-host", f"{host_name()}:host-gateway"] if ENGINE == "docker" else []),
    ) as c:
        image = json.loads(await engine("image", "inspect", IMAGE))[0]
        config = image.get("Config") or {}
        assert config.get("User") == "aserve"
        assert (config.get("Healthcheck") or image.get("Healthcheck") or {}).get("Test"), "the image lost HEALTHCHECK"
        healthy_s = await c.wait_healthy()
        # the server itself (PID 1) runs as the image's user, not root
        status = await engine("exec", c.name, "cat", "/proc/1/status")
        uids = next(line.split()[1:] for line in status.splitlines() if line.startswith("Uid:"))
        assert uids == [str(NON_ROOT_UID)] * 4, uids

        json_simple, binary_simple, json_mlp, binary_mlp, traced = await asyncio.to_thread(triton_infer, c.url, [
            ("simple", {"INPUT0": a, "INPUT1": b}, False, traceparent),
            ("simple", {"INPUT0": a, "INPUT1": b}, True, {}),
            ("mlp", {"INPUT": x}, False, {}),
            ("mlp", {"INPUT": x}, True, {}),
            ("traced", {"X": scaled}, True, traced_headers),
        ])
        np.testing.assert_array_equal(traced["Y"], scaled * 2)  # its scale without a feature service
        over_grpc = await asyncio.to_thread(grpc_infer, c.grpc, a, b)  # the published gRPC port
        np.testing.assert_array_equal(over_grpc["OUTPUT0"], a + b)
        np.testing.assert_array_equal(over_grpc["OUTPUT1"], a - b)
        for answer in (json_simple, binary_simple):
            np.testing.assert_array_equal(answer["OUTPUT0"], a + b)
            np.testing.assert_array_equal(answer["OUTPUT1"], a - b)
        for answer in (json_mlp, binary_mlp):
            np.testing.assert_allclose(answer["OUTPUT"], expected_mlp, rtol=1e-5, atol=1e-6)

        # the request's spans reach the receiver on the host, under the caller's span, and its
        # batch's spans (a trace of their own) link to it
        def named(name: str) -> list[Any]:
            return [s for s in collector.spans if s.name == name]

        def batch_of_request() -> list[Any]:
            return [s for s in named("batch simple")
                    if any(int.from_bytes(link.trace_id, "big") == trace_id for link in s.links)]

        await until(lambda: batch_of_request() and named("run in interpreter"), timeout=60,
                    what="the traced request's spans at the receiver", every=0.05)
        request_spans = {s.name: s for s in collector.spans if int.from_bytes(s.trace_id, "big") == trace_id}
        server_span = request_spans.pop("POST /v2/models/{model}/infer")
        assert int.from_bytes(server_span.parent_span_id, "big") == parent_id
        assert {"decode", "queue", "encode"} <= request_spans.keys(), request_spans.keys()
        assert all(s.parent_span_id == server_span.span_id for s in request_spans.values())
        [batch] = batch_of_request()
        assert any(link.span_id == server_span.span_id for link in batch.links)
        assert any(s.trace_id == batch.trace_id and s.parent_span_id == batch.span_id
                   for s in named("run in interpreter"))
        assert {"service.name": "aserve-in-a-container"}.items() <= collector.resources[0].items()

        # the model's own spans (the OpenTelemetry API in the image's interpreters) hang from
        # its batch's run, and carry the caller's baggage
        def model_spans() -> list[Any]:
            batches = [s for s in named("batch traced")
                       if any(int.from_bytes(link.trace_id, "big") == traced_id for link in s.links)]
            runs = [s for s in named("run in interpreter") for b in batches if s.parent_span_id == b.span_id]
            return [s for s in collector.spans for r in runs if s.parent_span_id == r.span_id]

        await until(lambda: {"fetch scale", "scale rows"} <= {s.name for s in model_spans()}, timeout=60,
                    what="the traced model's OpenTelemetry API spans at the receiver", every=0.05)
        [rows] = [s for s in model_spans() if s.name == "scale rows"]
        attributes = {a.key: a.value for a in rows.attributes}
        assert attributes["tenant"].string_value == "acme" and attributes["rows"].int_value == 2

        async with aiohttp.ClientSession() as http:
            samples = await scrape(http, c.url)
        for model, requests in (("simple", 3), ("mlp", 2), ("traced", 1)):
            assert counted(samples, "aserve_inference_request_success_total", model) == requests, model
            assert counted(samples, "aserve_inference_request_failure_total", model) == 0, model
    print(f"\n{ENGINE} {IMAGE}: healthy {healthy_s:.1f} s after run; {len(collector.spans)} spans received")


@spawns
async def test_mounted_repository_and_sigterm_under_load(tmp_path: pathlib.Path) -> None:
    drain = load_script("drain")  # loadtests/drain.py: its slow model, its repository and its client
    requests = 48
    args = argparse.Namespace(requests=requests, rows=4, model_ms=50.0, interpreters=2, shutdown_timeout=30.0)
    repo = drain.repository(tmp_path, args)
    shutil.copytree(EXAMPLES / "simple", repo / "adder", ignore=shutil.ignore_patterns("__pycache__"))
    for path in [repo, *repo.rglob("*")]:  # readable by the container's user
        path.chmod(0o755 if path.is_dir() else 0o644)

    async with container("-v", f"{repo}:/models:ro", "-e", "ASERVE_SHUTDOWN_TIMEOUT_S=30") as c:
        healthy_s = await c.wait_healthy()
        a, b = np.arange(16, dtype=np.int32).reshape(1, 16), np.full((1, 16), 7, dtype=np.int32)
        [answer] = await asyncio.to_thread(triton_infer, c.url, [("adder", {"INPUT0": a, "INPUT1": b}, False, {})])
        np.testing.assert_array_equal(answer["OUTPUT0"], a + b)
        np.testing.assert_array_equal(answer["OUTPUT1"], a - b)
        timeout = aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as http:
            async with http.post(f"{c.url}/v2/repository/index") as r:
                served = sorted(m["name"] for m in await r.json())
            assert served == ["adder", "drain"], served  # the mount replaced the bundled models

            calls = [asyncio.ensure_future(drain.call(http, c.url, i, args.rows)) for i in range(requests)]

            async def held() -> bool:  # every request is in the server: answered, queued or running
                state: dict[str, float] = await drain.gauges(http, c.url)
                return sum(state.values()) >= requests

            await until(held, timeout=60, what="every request inside the server", every=0.005)
            at_signal = await drain.gauges(http, c.url)
            signalled = time.monotonic()
            await engine("kill", "--signal", "TERM", c.name)
            outcomes = await asyncio.gather(*calls)
        exit_code = int((await engine("wait", c.name, timeout=60)).split()[0])
        stopped_s = time.monotonic() - signalled
        assert exit_code == 0, await c.logs()
        statuses = [code for code, _ in outcomes]
        assert statuses == [200] * requests, statuses
        assert all(right for _, right in outcomes)
        assert at_signal["queued"] + at_signal["running"] > 0, at_signal  # some were still to answer
        assert "Traceback" not in await c.logs()
    print(f"\n{ENGINE} {IMAGE}, mounted repository: healthy {healthy_s:.1f} s after run; SIGTERM with "
          f"{int(at_signal['queued'])} queued and {int(at_signal['running'])} running of {requests}: all "
          f"answered 200, exit 0 {stopped_s:.1f} s after the signal")


def compose(*args: str, timeout: float = 600.0) -> str:
    done = subprocess.run([str(ROOT / "docker" / "compose.sh"), *args], check=False, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, f"compose {' '.join(args)}: exit status {done.returncode}: {done.stderr[-3000:]}"
    return done.stdout


def test_compose_stack_up_scraped_and_loaded() -> None:
    for port in (8000, 9090):  # the compose file publishes these on the host
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                pytest.skip(f"port {port} is taken on this host: the compose stack publishes it")
    models = sorted(p.name for p in EXAMPLES.iterdir() if (p / "config.toml").is_file())
    compose("up", "-d")
    try:
        def query(expr: str) -> list[dict[str, Any]]:
            url = "http://127.0.0.1:9090/api/v1/query?" + urllib.parse.urlencode({"query": expr})
            with urllib.request.urlopen(url, timeout=5) as r:
                return json.load(r)["data"]["result"]  # type: ignore[no-any-return]

        end = time.monotonic() + 120
        while True:  # Prometheus scrapes aserve every 5 s (docker/prometheus.yml)
            try:
                ready = query('aserve_model_ready{job="aserve"} == 1')
                if sorted(r["metric"]["model"] for r in ready) == models:
                    break
            except OSError:
                pass  # Prometheus still starting
            assert time.monotonic() < end, f"Prometheus never saw every model ready: {models}"
            time.sleep(0.5)
        [target] = query('up{job="aserve"}')
        assert target["value"][1] == "1"

        out = compose("--profile", "load", "run", "--rm", "locust", "--headless", "--users", "4",
                      "--spawn-rate", "4", "--run-time", "8s", "--json")
        # the engine's run mixes Locust's log into its output: the statistics are the JSON list
        # that starts a line of its own
        start = re.search(r"^\[\s*$", out, re.MULTILINE)
        assert start, out[-3000:]
        stats, _ = json.JSONDecoder().raw_decode(out[start.start():])
        assert stats and sum(s["num_requests"] for s in stats) > 0
        assert sum(s["num_failures"] for s in stats) == 0, stats
    finally:
        compose("down")
    left = subprocess.run([str(ENGINE), "ps", "-a", "--filter", "name=^aserve_", "-q"], check=False,
                          capture_output=True, text=True).stdout.split()
    assert not left, left
    print(f"\ncompose: aserve and Prometheus up, {len(models)} models scraped, Locust "
          f"{sum(s['num_requests'] for s in stats)} requests without a failure")
