"""Suite-wide set-up: glibc tunables for private interpreters, event loops, example paths."""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import os
import pathlib
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from types import ModuleType
from typing import Any

import aiohttp
import pytest
import uvloop

# Private interpreters need glibc tunables at process start: the `aserve.testing`
# plugin (pyproject addopts) re-executes pytest with them before capture starts.

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
LOADTESTS = ROOT / "loadtests"
sys.path.append(str(LOADTESTS))  # the load-test scripts import each other from beside them, as when run

import served  # loadtests/served.py
from served import free_port  # noqa: F401  (the tests' too)

try:
    import torch  # noqa: F401

    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False

needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="torch is installed only for the Python 3.11 run")


# A staged pure-Python model: three stages, each x -> 2x + k (k = stage index) on every
# element of FP32 rows of 4, sleeping `delay` seconds (parameters); a row holding
# `fail_on` makes it raise. Activations are lists of rows; __call__ runs the same stages.
STAGED_MODEL = """
import time
from aserve.runtime import Model, TensorSpec

class Staged(Model):
    inputs = (TensorSpec("X", "FP32", (-1, 4)),)
    outputs = (TensorSpec("Y", "FP32", (-1, 4)),)

    def load(self):
        delay = float(self.parameters.get("delay", 0.0))
        fail = float(self.parameters.get("fail_on", -1.0))

        def stage(k):
            def run(rows):
                time.sleep(delay)
                if any(v == fail for row in rows for v in row):
                    raise ValueError(f"stage {k} refuses {fail}")
                return [[2 * v + k for v in row] for row in rows]
            return run

        self.stages = [stage(k) for k in range(3)]

    def stage_input(self, inputs):
        return inputs["X"].tolist()

    def stage_concat(self, parts):
        return [row for part in parts for row in part]

    def __call__(self, inputs):
        x = self.stage_input(inputs)
        for stage in self.stages:
            x = stage(x)
        return self.stage_output(x)
"""


def load_script(name: str) -> ModuleType:
    """loadtests/NAME.py as a module, by path, under a name of its own (Locust imports
    `scenario` from beside the locustfile; the scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(f"aserve_loadtests_{name}", LOADTESTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The server runs on uvloop (`aserve serve`), so every test does; the server's, the data
# plane's and the batcher's tests also run on the default asyncio loop, so that nothing
# relies on one loop's quirks (uvloop's handles for near deadlines have no `when()`). The
# loops do not differ between Pythons: the second loop runs on 3.11 only, where torch is.
BOTH_LOOPS = ("tests/server/", "tests/batching/", "tests/dataplane/") if sys.version_info < (3, 12) else ()


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item
                                  ) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    path = item.nodeid.replace("\\", "/")
    marker = item.get_closest_marker("asyncio")
    asked = marker.kwargs.get("loop_factories", ()) if marker is not None else ()
    if path.startswith(BOTH_LOOPS) or "asyncio" in asked:
        return {"uvloop": uvloop.new_event_loop, "asyncio": asyncio.new_event_loop}
    return {"uvloop": uvloop.new_event_loop}


# Tests that spawn `aserve serve` do it from asyncio's loop: uvloop's child side of a spawn calls
# PyOS_AfterFork_Child, which crashes a process that holds PEP 684 subinterpreters (earlier tests
# leave some parked in this process): MagicStack/uvloop#650. The spawned server runs on uvloop all
# the same; only the spawning test uses asyncio's loop.
spawns = pytest.mark.asyncio(loop_factories=["asyncio"])


async def until(predicate: Callable[[], object | Awaitable[object]], *, timeout: float = 60.0,
                what: str = "the condition", every: float = 0.001) -> None:
    """Wait until `predicate()` (a function, or a coroutine function) holds, polling observable
    state every `every` seconds (never a fixed sleep); AssertionError naming `what` after
    `timeout` seconds."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return
        if loop.time() > end:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(every)


async def wait_ready(http: aiohttp.ClientSession, url: str, proc: asyncio.subprocess.Process, *,
                     timeout: float = 120.0, log: Callable[[], str] = lambda: "") -> None:
    """Poll `url`/v2/health/ready until it answers 200 (the load tests' wait: loadtests/served.py);
    the server process `proc` must stay alive meanwhile. A failure says what `log()` returns
    (the server's output)."""
    await served.wait_ready(http, f"{url}/v2/health/ready", lambda: proc.returncode, timeout=timeout, every=0.02,
                            output=log)


@pytest.fixture
def examples() -> pathlib.Path:
    return EXAMPLES


@pytest.fixture
def model_dir(tmp_path: pathlib.Path):
    """Write a model.py (and optional config.toml) into a fresh folder; returns its path."""

    def make(source: str, config: str | None = None, name: str = "m") -> pathlib.Path:
        d = tmp_path / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "model.py").write_text(source)
        if config is not None:
            (d / "config.toml").write_text(config)
        return d

    return make


@pytest.fixture
async def start_server() -> AsyncIterator[Callable[..., Any]]:
    """start(repository, **settings) -> (Server, base URL): a real server on 127.0.0.1
    (ephemeral port, engine main and 2 interpreters unless told otherwise; the host's loop
    alone unless `loops` says otherwise (tests/server runs each test on 0, 1 and 2 front
    loops); gRPC off unless `grpc=True`, then on an ephemeral port too), its models loaded;
    every server is closed at teardown."""
    from aserve.config import ServerSettings
    from aserve.server import Server

    servers: list[Server] = []

    async def start(repository: pathlib.Path, **settings: object) -> tuple[Server, str]:
        values: dict[str, object] = {"host": "127.0.0.1", "port": 0, "engine": "main", "interpreters": 2, "loops": 0,
                                     "log_level": "warning", "grpc": False, "grpc_port": 0}
        values.update(settings)
        server = Server(ServerSettings(**values), repository=repository)  # type: ignore[arg-type]
        servers.append(server)
        await server.start()
        await server.loaded()
        return server, f"http://127.0.0.1:{server.port}"

    yield start
    for s in servers:
        await s.close()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


os.environ.setdefault("ASERVE_LOG_LEVEL", "warning")
# servers the tests spawn (`aserve serve`) take a free gRPC port rather than 8001, which another
# server, or a test before, may hold
os.environ.setdefault("ASERVE_GRPC_PORT", "0")
