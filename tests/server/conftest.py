"""A real server on 127.0.0.1 (ephemeral port) serving small pure-Python models."""

from __future__ import annotations

import pathlib
import textwrap

import pytest

# OUTPUT SUM = A + B, DIFF = A - B (INT32, 32-bit wrap-around); a row starting with -999 raises.
ADD_MODEL = '''
from array import array
from aserve.runtime import Model, TensorSpec

class Add(Model):
    inputs = [TensorSpec("A", "INT32", (-1, 4)), TensorSpec("B", "INT32", (-1, 4))]
    outputs = [TensorSpec("SUM", "INT32", (-1, 4)), TensorSpec("DIFF", "INT32", (-1, 4))]

    def __call__(self, inputs):
        a = inputs["A"].cast("B").cast("i")
        b = inputs["B"].cast("B").cast("i")
        for i in range(0, len(a), 4):
            if a[i] == -999:
                raise ValueError(f"row {i // 4}: A starts with -999")
        wrap = lambda v: ((v + 2**31) % 2**32) - 2**31
        return {"SUM": array("i", [wrap(x + y) for x, y in zip(a, b)]),
                "DIFF": array("i", [wrap(x - y) for x, y in zip(a, b)])}
'''

ADD_CONFIG = '''
max_batch_size = 8
[[inputs]]
name = "A"
datatype = "INT32"
shape = [-1, 4]
[[inputs]]
name = "B"
datatype = "INT32"
shape = [-1, 4]
[[outputs]]
name = "SUM"
datatype = "INT32"
shape = [-1, 4]
[[outputs]]
name = "DIFF"
datatype = "INT32"
shape = [-1, 4]
[batching]
max_queue_delay_ms = 2.0
'''

# BYTES in, BYTES (upper-cased) and INT32 lengths out.
UPPER_MODEL = '''
from aserve.runtime import Model, TensorSpec

class Upper(Model):
    inputs = [TensorSpec("TEXT", "BYTES", (-1, 2))]
    outputs = [TensorSpec("UPPER", "BYTES", (-1, 2)), TensorSpec("LENGTH", "INT32", (-1, 2))]

    def __call__(self, inputs):
        items = inputs["TEXT"]
        rows = [items[i:i + 2] for i in range(0, len(items), 2)]
        return {"UPPER": [[s.upper() for s in r] for r in rows], "LENGTH": [[len(s) for s in r] for r in rows]}
'''

UPPER_CONFIG = '''
max_batch_size = 16
[[inputs]]
name = "TEXT"
datatype = "BYTES"
shape = [-1, 2]
[[outputs]]
name = "UPPER"
datatype = "BYTES"
shape = [-1, 2]
[[outputs]]
name = "LENGTH"
datatype = "INT32"
shape = [-1, 2]
'''

# Sleeps MS milliseconds (FP32 scalar); does not batch; one interpreter; a queue of 2.
SLOW_MODEL = '''
import time
from aserve.runtime import Model, TensorSpec

class Slow(Model):
    inputs = [TensorSpec("MS", "FP32", (1,))]
    outputs = [TensorSpec("MS", "FP32", (1,))]

    def __call__(self, inputs):
        ms = inputs["MS"].cast("B").cast("f")[0]
        time.sleep(ms / 1000.0)
        return {"MS": [ms]}
'''

SLOW_CONFIG = '''
interpreters = 1
max_batch_size = 0
[[inputs]]
name = "MS"
datatype = "FP32"
shape = [1]
[[outputs]]
name = "MS"
datatype = "FP32"
shape = [1]
[batching]
max_queue_size = 2
timeout_ms = 5000
'''

MODELS = {
    "add": (ADD_MODEL, ADD_CONFIG),
    "upper": (UPPER_MODEL, UPPER_CONFIG),
    "slow": (SLOW_MODEL, SLOW_CONFIG),
}


def write_repository(root: pathlib.Path, models: dict[str, tuple[str, str]] = MODELS) -> pathlib.Path:
    for name, (source, config) in models.items():
        d = root / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "model.py").write_text(textwrap.dedent(source))
        (d / "config.toml").write_text(textwrap.dedent(config))
    return root


@pytest.fixture
def repository(tmp_path: pathlib.Path) -> pathlib.Path:
    return write_repository(tmp_path / "repo")


@pytest.fixture
async def base_url(start_server, repository: pathlib.Path) -> str:
    _, url = await start_server(repository)
    return url
