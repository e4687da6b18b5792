"""The server side of deploy/: real `aserve serve` processes as Kubernetes runs them.

- KServe's storage initializer leaves a single model's files in /mnt/models; the
  ServingRuntime's own arguments serve that folder as the model named after the
  InferenceService (`--model-name`), and it answers an infer request;
- the drain: readiness 503 while requests are still served (each response closing its
  connection), then the listener closes; SIGUSR1 (the preStop hook) begins it, SIGTERM
  begins or finishes it;
- a rolling update behind a stand-in for a Service (a proxy that round-robins over the
  backends whose readiness answers 200, re-probed every 50 ms like kube-proxy's endpoints)
  under closed-loop load: both servers replaced, one leaving through the preStop hook's own
  code then SIGTERM, one through SIGTERM alone; no request fails.

Spawning tests run on asyncio's loop (uvloop's child side of a spawn crashes a process that
holds PEP 684 subinterpreters, MagicStack/uvloop#650; tests/server/test_cli.py); the served
processes run on uvloop.
"""

from __future__ import annotations

import asyncio
import collections
import os
import pathlib
import shutil
import signal
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp
import grpc
import pytest
import yaml
from aiohttp import web
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from aserve.repository import RepositoryError
from aserve.repository.scan import ModelSource, root_model, scan_model, scan_repository

from ..conftest import EXAMPLES, free_port, needs_torch, spawns, until
from ..conftest import wait_ready as ready
from .conftest import DEPLOY

READY, LIVE = "/v2/health/ready", "/v2/health/live"
RUNTIME = DEPLOY / "kserve" / "servingruntime.yaml"
SIMPLE = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": list(range(16))},
                     {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [1] * 16}]}
MLP = {"inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 16], "data": [i / 10 for i in range(16)]}]}



def runtime_container() -> dict:
    [container] = yaml.safe_load(RUNTIME.read_text())["spec"]["containers"]
    return container


def copy_model(example: str, to: pathlib.Path) -> pathlib.Path:
    """What KServe's storage initializer leaves for a storageUri holding the model folder's files."""
    shutil.copytree(EXAMPLES / example, to, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return to


# ---- the scan: a repository folder that is itself a model ----


def test_root_model_flat_layout(tmp_path: pathlib.Path) -> None:
    mount = copy_model("simple", tmp_path / "mnt" / "models")
    assert root_model(mount) == "models" and root_model(mount, "simple-isvc") == "simple-isvc"
    for name, expected in ((None, "models"), ("simple-isvc", "simple-isvc")):
        found = scan_repository(mount, model_name=name)
        assert list(found.models) == [expected] and not found.skipped
        model = found.models[expected]
        assert model.name == expected and model.directory == str(mount.resolve())
        assert list(model.versions) == [1] and model.versions[1].model_file == str(mount.resolve() / "model.py")
        assert model.config is not None and model.config.class_name == "Simple"
    # a load request names the model; the folder is the model, whatever the name
    again = scan_model(mount, "simple-isvc", model_name="simple-isvc")
    assert isinstance(again, ModelSource) and again.name == "simple-isvc" and list(again.versions) == [1]
    other = scan_model(mount, "mlp", model_name="simple-isvc")
    assert "is itself the model 'simple-isvc'" in getattr(other, "reason", "")


def test_root_model_versioned_layout(tmp_path: pathlib.Path) -> None:
    mount = tmp_path / "models"
    for v in (1, 2):
        copy_model("simple", mount / str(v))
        (mount / str(v) / "config.toml").unlink()
    shutil.copy(EXAMPLES / "simple" / "config.toml", mount / "config.toml")
    (mount / "config.toml").write_text((mount / "config.toml").read_text() + "\n[version_policy]\nall = true\n")
    found = scan_repository(mount, model_name="vm")
    assert list(found.models) == ["vm"] and sorted(found.models["vm"].versions) == [1, 2]
    assert found.models["vm"].served() == [1, 2]
    # without the name, a config.toml and numbered folders stay a repository (a stray file, models 1 and 2)
    assert root_model(mount) is None
    plain = scan_repository(mount)
    assert sorted(plain.models) == ["1", "2"] and [s.path for s in plain.skipped] == [str(mount / "config.toml")]
    # numbered folders alone are versions only when the server is given the model's name:
    # otherwise they are models named 1 and 2, as before
    (mount / "config.toml").unlink()
    shutil.copy(EXAMPLES / "simple" / "config.toml", mount / "1" / "config.toml")
    shutil.copy(EXAMPLES / "simple" / "config.toml", mount / "2" / "config.toml")
    assert root_model(mount) is None
    assert sorted(scan_repository(mount).models) == ["1", "2"]
    assert sorted(scan_repository(mount, model_name="vm").models["vm"].versions) == [1, 2]


def test_model_name_needs_a_model_folder(tmp_path: pathlib.Path) -> None:
    repo = tmp_path / "repo"
    copy_model("simple", repo / "simple")
    assert root_model(repo) is None and list(scan_repository(repo).models) == ["simple"]
    with pytest.raises(RepositoryError, match="was to be served as the one model 'x' .--model-name."):
        scan_repository(repo, model_name="x")
    assert "storageUri" in getattr(scan_model(repo, "simple", model_name="x"), "reason", "")


# ---- real servers ----


@dataclass
class Served:
    proc: asyncio.subprocess.Process
    port: int
    log: pathlib.Path
    grpc_port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass
class Processes:
    """`aserve serve` subprocesses, each logging to a file; all ended at close."""

    tmp: pathlib.Path
    started: list[Served] = field(default_factory=list)

    async def start(self, *args: str, port: int | None = None) -> Served:
        port = port or free_port()
        grpc_port = free_port()  # after the deployment's own --grpc-port: the last flag wins
        log = self.tmp / f"aserve-{len(self.started)}.log"
        env = dict(os.environ, ASERVE_LOG_LEVEL="info")
        with log.open("wb") as out:  # the child writes to its own copy of the descriptor
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "aserve.cli", "serve", *args, f"--port={port}", f"--grpc-port={grpc_port}",
                env=env, stdout=out, stderr=out)
        served = Served(proc, port, log, grpc_port)
        self.started.append(served)
        return served

    async def close(self) -> None:
        for s in self.started:
            if s.proc.returncode is None:
                s.proc.kill()
                await s.proc.wait()
        for s in self.started:
            text = s.log.read_text(errors="replace")
            assert "Traceback" not in text, f"{s.log}:\n{text}"


async def wait_ready(http: aiohttp.ClientSession, served: Served) -> None:
    await ready(http, served.url, served.proc, log=served.log.read_text)


async def ready_status(http: aiohttp.ClientSession, served: Served) -> int:
    async with http.get(served.url + READY) as r:
        return r.status


def unready(http: aiohttp.ClientSession, served: Served) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return await ready_status(http, served) == 503
    return check


def simple_ok(body: dict) -> bool:
    out = {o["name"]: o["data"] for o in body["outputs"]}
    return out == {"OUTPUT0": [i + 1 for i in range(16)], "OUTPUT1": [i - 1 for i in range(16)]}


@spawns
@pytest.mark.parametrize("example", ["simple", pytest.param("mlp", marks=needs_torch)])
async def test_kserve_model_mount_is_served(example: str, tmp_path: pathlib.Path) -> None:
    """The ServingRuntime's container arguments, as KServe fills them in, over the layout its
    storage initializer leaves: /mnt/models/model.py + config.toml."""
    mount = copy_model(example, tmp_path / "mnt" / "models")
    container = runtime_container()
    assert container["command"] == ["aserve", "serve"]
    isvc = f"{example}-isvc"
    args = []
    for arg in container["args"]:
        arg = arg.replace("{{.Name}}", isvc).replace("/mnt/models", str(mount))
        if arg.startswith("--host="):
            arg = "--host=127.0.0.1"  # loopback only here
        if not arg.startswith("--port="):
            args.append(arg)
    args.append("--drain-seconds=0")  # appended like an InferenceService's args: the last flag wins
    processes = Processes(tmp_path)
    try:
        served = await processes.start(*args)
        async with aiohttp.ClientSession() as http:
            await wait_ready(http, served)
            body = SIMPLE if example == "simple" else MLP
            async with http.post(f"{served.url}/v2/models/{isvc}/infer", json=body) as r:
                assert r.status == 200, await r.text()
                answer = await r.json()
            assert answer["model_name"] == isvc
            if example == "simple":
                assert simple_ok(answer)
            else:
                [out] = answer["outputs"]
                assert out["name"] == "OUTPUT" and out["shape"] == [1, 16] and out["datatype"] == "FP32"
            async with http.post(f"{served.url}/v2/repository/index", json={}) as r:
                index = await r.json()
            assert [(m["name"], m["state"]) for m in index] == [(isvc, "READY")]
            async with http.get(f"{served.url}/v2/models/{example}") as r:
                assert r.status == 404
        # the runtime's gRPC front: the probes' health service, the model under the same name
        async with grpc.aio.insecure_channel(f"127.0.0.1:{served.grpc_port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for service in ("", "liveness"):
                check = await health.Check(health_pb2.HealthCheckRequest(service=service))
                assert check.status == health_pb2.HealthCheckResponse.SERVING
            model = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            assert (await model.ModelReady(service_pb2.ModelReadyRequest(name=isvc))).ready
        served.proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(served.proc.wait(), 60) == 0
    finally:
        await processes.close()


@spawns
async def test_drain_serves_on_unready_then_closes(tmp_path: pathlib.Path) -> None:
    repo = tmp_path / "repo"
    copy_model("simple", repo / "simple")
    drain = 2.0
    processes = Processes(tmp_path)
    try:
        served = await processes.start(str(repo), "--interpreters=1", f"--drain-seconds={drain}")
        async with aiohttp.ClientSession() as http:
            await wait_ready(http, served)
            async with http.post(f"{served.url}/v2/models/simple/infer", json=SIMPLE) as r:
                assert r.status == 200 and r.headers.get("Connection", "").lower() != "close"
            loop = asyncio.get_running_loop()
            # SIGUSR1 (the preStop hook): unready, serving on, not stopping
            began = loop.time()
            served.proc.send_signal(signal.SIGUSR1)
            await until(unready(http, served), what="readiness 503 after SIGUSR1")
            async with http.post(f"{served.url}/v2/models/simple/infer", json=SIMPLE) as r:
                assert r.status == 200 and simple_ok(await r.json())
                assert r.headers["Connection"].lower() == "close"  # keep-alive clients move elsewhere
            async with http.get(served.url + LIVE) as r:
                assert r.status == 200
            while loop.time() < began + drain + 0.5:
                await asyncio.sleep(0.05)
            assert served.proc.returncode is None, "SIGUSR1 stopped the server"
            assert await ready_status(http, served) == 503
            # SIGTERM after the drain time: the listener closes, the process ends
            served.proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(served.proc.wait(), 60) == 0

        second = await processes.start(str(repo), "--interpreters=1", f"--drain-seconds={drain}")
        async with aiohttp.ClientSession() as http:
            await wait_ready(http, second)
            sent = loop.time()
            second.proc.send_signal(signal.SIGTERM)  # SIGTERM alone begins the drain
            await until(unready(http, second), what="readiness 503 after SIGTERM")
            async with http.post(f"{second.url}/v2/models/simple/infer", json=SIMPLE) as r:
                assert r.status == 200 and r.headers["Connection"].lower() == "close"
            assert await asyncio.wait_for(second.proc.wait(), 60) == 0
            assert loop.time() - sent >= drain  # it served on for the whole drain
            with pytest.raises(aiohttp.ClientConnectionError):
                async with http.get(second.url + LIVE):
                    pass
        assert "draining" in second.log.read_text()
    finally:
        await processes.close()


# ---- a rolling update behind a Service stand-in ----


class Endpoints:
    """What a Service does for its clients, on loopback: round-robin over the backends whose
    readiness answers 200, re-probed every 50 ms (as the endpoints controller and kube-proxy
    follow readiness). It forwards each request once and never retries, so a request a
    backend fails is a failed request."""

    def __init__(self) -> None:
        self.backends: list[str] = []
        self.ready: list[str] = []
        self.served: collections.Counter[str] = collections.Counter()
        self._turn = 0
        self._session: aiohttp.ClientSession | None = None
        self._probing: asyncio.Task[None] | None = None
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        self._probing = asyncio.get_running_loop().create_task(self._probe())
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"

    async def _probe(self) -> None:
        assert self._session is not None
        while True:
            ready = []
            for backend in list(self.backends):
                try:
                    async with self._session.get(backend + READY, timeout=aiohttp.ClientTimeout(total=1)) as r:
                        if r.status == 200:
                            ready.append(backend)
                except (TimeoutError, aiohttp.ClientError):
                    pass
            self.ready = ready
            await asyncio.sleep(0.05)

    async def _forward(self, request: web.Request) -> web.Response:
        ready = self.ready
        if not ready:
            return web.Response(status=503, text="no ready endpoint")
        backend = ready[self._turn % len(ready)]
        self._turn += 1
        assert self._session is not None
        body = await request.read()
        headers = {"Content-Type": request.headers.get("Content-Type", "application/json")}
        try:
            async with self._session.request(request.method, backend + request.path_qs, data=body,
                                             headers=headers) as r:
                payload = await r.read()
                self.served[backend] += 1
                return web.Response(status=r.status, body=payload, content_type=r.content_type)
        except (TimeoutError, aiohttp.ClientError) as e:
            return web.Response(status=502, text=f"{backend}: {type(e).__name__}: {e}")

    async def close(self) -> None:
        if self._probing is not None:
            self._probing.cancel()
            await asyncio.gather(self._probing, return_exceptions=True)
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()


def pre_stop(served: Served) -> str:
    """The runtime's (and the chart's) preStop hook code, aimed at this process and port."""
    code: str = runtime_container()["lifecycle"]["preStop"]["exec"]["command"][2]
    assert "os.kill(1, " in code and "127.0.0.1:8000/" in code
    return code.replace("os.kill(1, ", f"os.kill({served.proc.pid}, ").replace(
        "127.0.0.1:8000/", f"127.0.0.1:{served.port}/")


@spawns
async def test_rolling_update_loses_no_request(tmp_path: pathlib.Path) -> None:
    repo = tmp_path / "repo"
    copy_model("simple", repo / "simple")
    args = (str(repo), "--interpreters=1", "--drain-seconds=2", "--shutdown-timeout=20")
    processes = Processes(tmp_path)
    service = Endpoints()
    statuses: collections.Counter[int] = collections.Counter()
    failures: list[str] = []
    stop = asyncio.Event()

    async def client(http: aiohttp.ClientSession) -> None:
        while not stop.is_set():
            try:
                async with http.post(f"{service.url}/v2/models/simple/infer", json=SIMPLE) as r:
                    statuses[r.status] += 1
                    if r.status != 200:
                        failures.append(f"{r.status}: {await r.text()}")
                    elif not simple_ok(await r.json()):
                        failures.append("a wrong answer")
            except aiohttp.ClientError as e:
                statuses[0] += 1
                failures.append(f"{type(e).__name__}: {e}")

    async def serves(served: Served, more: int) -> None:
        """Wait until `served` answered `more` requests through the service from now on."""
        goal = service.served[served.url] + more
        await until(lambda: service.served[served.url] >= goal, what=f"{served.url} to serve {more}")

    async def replace(old: Served, new_args: tuple[str, ...], http: aiohttp.ClientSession, *,
                      hook: bool) -> Served:
        """maxSurge 1, maxUnavailable 0: the new pod is ready and serving before the old one leaves."""
        new = await processes.start(*new_args)
        await wait_ready(http, new)
        service.backends.append(new.url)
        await serves(new, 20)
        if hook:  # the kubelet runs preStop, then sends SIGTERM
            hook_run = await asyncio.create_subprocess_exec(sys.executable, "-c", pre_stop(old))
            assert await asyncio.wait_for(hook_run.wait(), 30) == 0
            assert await ready_status(http, old) == 503
        old.proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(old.proc.wait(), 60) == 0
        service.backends.remove(old.url)  # the endpoints controller forgets the pod
        return new

    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            a, b = await processes.start(*args), await processes.start(*args)
            await wait_ready(http, a)
            await wait_ready(http, b)
            await service.start()
            service.backends += [a.url, b.url]
            await until(lambda: len(service.ready) == 2, what="both backends in the service")
            clients = [asyncio.ensure_future(client(http)) for _ in range(8)]
            try:
                await serves(a, 20)
                await serves(b, 20)
                c = await replace(a, args, http, hook=True)
                d = await replace(b, args, http, hook=False)
                await serves(c, 20)
                await serves(d, 20)
            finally:
                stop.set()
                await asyncio.gather(*clients)
        assert not failures, f"{len(failures)} failed of {sum(statuses.values())}: {failures[:5]}"
        assert statuses[200] >= 160 and set(statuses) == {200}
        assert all("draining" in s.log.read_text() for s in (a, b))
    finally:
        await service.close()
        await processes.close()
