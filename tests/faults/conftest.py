"""Models that misbehave the ways model code can, and helpers to serve and call them."""

from __future__ import annotations

import pathlib
import sys
from typing import Any

import aiohttp
import pytest

# What each interpreter engine contains is tested where it runs: private and the host's own
# threads on Python 3.11 (the torch environment), private and PEP 684 subinterpreters on 3.12+.
ENGINES = ("private", "subinterp") if sys.version_info >= (3, 12) else ("private", "main")

# ACT selects what the model does with a request.
SPIN, SLEEP, PAUSE, SEGFAULT = 4, 5, 6, 7
EXITS = {1: "sys.exit(3)", 2: "os._exit(1)", 3: "os.abort()"}
FAULTY_MODEL = '''
import ctypes, os, sys, time
from array import array
from aserve.runtime import Model, TensorSpec

class Faulty(Model):
    """ACT: 0 answers it back; 1 sys.exit(3); 2 os._exit(1); 3 os.abort(); 4 spins in Python;
    5 sleeps in time.sleep; 6 blocks in libc's pause() (native code); 7 reads address 0."""
    inputs = [TensorSpec("ACT", "INT32", (1,))]
    outputs = [TensorSpec("OUT", "INT32", (1,))]

    def __call__(self, inputs):
        act = inputs["ACT"].cast("B").cast("i")[0]
        if act == 1:
            sys.exit(3)
        if act == 2:
            os._exit(1)
        if act == 3:
            os.abort()
        if act == 4:
            while True:
                pass
        if act == 5:
            time.sleep(1e9)
        if act == 6:
            ctypes.CDLL(None).pause()  # signals are blocked on worker threads: this never returns
        if act == 7:
            ctypes.string_at(0)
        return {"OUT": array("i", [act])}
'''
# on interpreter 0 only: the interpreter a hang holds is the one that must answer next
FAULTY_CONFIG = '''
interpreters = 1
[[inputs]]
name = "ACT"
datatype = "INT32"
shape = [1]
[[outputs]]
name = "OUT"
datatype = "INT32"
shape = [1]
'''
OK_MODEL = '''
from array import array
from aserve.runtime import Model, TensorSpec

class Ok(Model):
    inputs = [TensorSpec("X", "INT32", (1,))]
    outputs = [TensorSpec("Y", "INT32", (1,))]

    def __call__(self, inputs):
        return {"Y": array("i", [inputs["X"].cast("B").cast("i")[0] + 1])}
'''
OK_CONFIG = '''
[[inputs]]
name = "X"
datatype = "INT32"
shape = [1]
[[outputs]]
name = "Y"
datatype = "INT32"
shape = [1]
'''


@pytest.fixture
def repository(tmp_path: pathlib.Path) -> pathlib.Path:
    """`faulty` (on interpreter 0) and `ok` (on every interpreter), in one pool."""
    repo = tmp_path / "models"
    for name, source, config in (("faulty", FAULTY_MODEL, FAULTY_CONFIG), ("ok", OK_MODEL, OK_CONFIG)):
        (repo / name).mkdir(parents=True)
        (repo / name / "model.py").write_text(source)
        (repo / name / "config.toml").write_text(config)
    return repo


def body(name: str, value: int, timeout_us: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"inputs": [{"name": name, "datatype": "INT32", "shape": [1], "data": [value]}]}
    if timeout_us is not None:
        out["parameters"] = {"timeout": timeout_us}
    return out


async def call_faulty(http: aiohttp.ClientSession, url: str, act: int, *, timeout_us: int | None = None
                      ) -> tuple[int, Any]:
    async with http.post(f"{url}/v2/models/faulty/infer", json=body("ACT", act, timeout_us)) as r:
        return r.status, await r.json()


async def call_ok(http: aiohttp.ClientSession, url: str, value: int) -> tuple[int, Any]:
    async with http.post(f"{url}/v2/models/ok/infer", json=body("X", value)) as r:
        answer = await r.json()
        return r.status, answer["outputs"][0]["data"][0] if r.status == 200 else answer


async def metrics(http: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """/metrics as {'name{labels}': value}."""
    async with http.get(f"{url}/metrics") as r:
        assert r.status == 200
        text = await r.text()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out
