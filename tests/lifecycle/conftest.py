"""Versioned repositories for the lifecycle tests, and a real server over them.

Every version of `VERSIONED` answers Y = X * version and VERSION = version, so an answer
shows which version computed it. Parameters: `delay_ms` (each call sleeps that long) and
`load_gate` (a file: load() waits until it exists, so that a test can hold a load open).
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import textwrap
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import aiohttp
import pytest

VERSIONED = '''
import os
import time
from array import array
from aserve.runtime import Model, TensorSpec

VERSION = {version}


class Versioned(Model):
    inputs = [TensorSpec("X", "INT32", (-1, 1))]
    outputs = [TensorSpec("Y", "INT32", (-1, 1)), TensorSpec("VERSION", "INT32", (-1, 1))]

    def load(self):
        gate = self.parameters.get("load_gate")
        while gate and not os.path.exists(gate):
            time.sleep(0.002)
        self.delay = float(self.parameters.get("delay_ms", 0)) / 1000.0

    def __call__(self, inputs):
        if self.delay:
            time.sleep(self.delay)
        x = inputs["X"].cast("B").cast("i")
        return {{"Y": array("i", [v * VERSION for v in x]), "VERSION": array("i", [VERSION] * len(x))}}
'''



def write_version(root: pathlib.Path, name: str, version: int, *, source: str | None = None,
                  config: str | None = None) -> pathlib.Path:
    """Write `root/name/version/model.py` (VERSIONED unless `source`), bumping its mtime
    so that a rewrite within the file system's time granularity is still a change."""
    d = root / name / str(version)
    d.mkdir(parents=True, exist_ok=True)
    file = d / "model.py"
    old = file.stat().st_mtime_ns if file.exists() else 0
    file.write_text(textwrap.dedent(source) if source is not None else VERSIONED.format(version=version))
    st = file.stat()
    if st.st_mtime_ns <= old:
        os.utime(file, ns=(st.st_atime_ns, old + 1_000_000))
    if config is not None:
        (d / "config.toml").write_text(config)
    return d


def write_config(root: pathlib.Path, name: str, text: str, *, max_batch_size: int = 16) -> None:
    (root / name).mkdir(parents=True, exist_ok=True)
    # top-level fields first, then the caller's fields and tables, then [batching]
    (root / name / "config.toml").write_text(
        f"max_batch_size = {max_batch_size}\n" + textwrap.dedent(text) + "\n[batching]\nmax_queue_delay_ms = 0.5\n")


def infer_body(*xs: int) -> dict[str, Any]:
    return {"inputs": [{"name": "X", "datatype": "INT32", "shape": [len(xs), 1], "data": list(xs)}]}


async def answer(http: aiohttp.ClientSession, url: str, path: str, *xs: int) -> tuple[int, dict[str, Any]]:
    """POST an infer request; (status, JSON body)."""
    async with http.post(url + path, json=infer_body(*xs)) as r:
        return r.status, await r.json()


def version_of(body: dict[str, Any]) -> tuple[str, int]:
    """(the model_version the response names, the version that computed it)."""
    outputs = {o["name"]: o for o in body["outputs"]}
    computed = set(outputs["VERSION"]["data"])
    assert len(computed) == 1, body
    return body["model_version"], computed.pop()


async def index(http: aiohttp.ClientSession, url: str, **wanted: Any) -> dict[tuple[str, str], dict[str, Any]]:
    async with http.post(url + "/v2/repository/index", json=wanted) as r:
        assert r.status == 200, await r.text()
        return {(row["name"], row["version"]): row for row in await r.json()}


@pytest.fixture
def repo(tmp_path: pathlib.Path) -> pathlib.Path:
    root = tmp_path / "repo"
    root.mkdir()
    return root


class Triton:
    """A tritonclient.http client made, used and closed on one thread of its own: its
    gevent hub belongs to that thread, and the test's event loop thread never runs one."""

    def __init__(self, url: str) -> None:
        import tritonclient.http as triton

        self._thread = ThreadPoolExecutor(1, thread_name_prefix="tritonclient")
        self._client = self._thread.submit(triton.InferenceServerClient, url.removeprefix("http://")).result()

    async def __call__(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """`await client("load_model", "m")`: the client's method, run on its thread."""
        return await asyncio.wrap_future(self._thread.submit(getattr(self._client, method), *args, **kwargs))

    def close(self) -> None:
        self._thread.submit(self._client.close).result()
        self._thread.shutdown()
