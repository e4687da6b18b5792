"""A real server on 127.0.0.1 (ephemeral port) serving small pure-Python models.

Every test here that starts a server runs three times: on the host's loop alone
(`loops0`, the default on one CPU), and with one and with two front loops
(`--loops 1`, `--loops 2`), where connections are served by the fronts. A client must
not be able to tell them apart, so the tests observe what a client or an operator can
(answers, `/metrics`, `/v2/models/stats`, the log), not one loop's objects. A test that
must look at them (a connection's flow control, the policy a batcher is shown) is marked
`host_loop` and runs on the host's loop alone: the fronts run the same classes. The
fronts run on uvloop only, so they are left out of the default asyncio loop's run.
"""

from __future__ import annotations

import logging
import pathlib
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import pytest

from ..conftest import until

# one front and two on 3.11; on 3.12+ (fronts are private interpreters there too) two only,
# which keeps the suite's time in bounds
LOOPS = (0, 1, 2) if sys.version_info < (3, 12) else (0, 2)


@pytest.fixture(params=LOOPS, ids=lambda n: f"loops{n}")
def loops(request: pytest.FixtureRequest) -> int:
    """Front loops of the servers a test starts (a test that names `loops` itself keeps its own)."""
    return int(request.param)


@pytest.fixture
def start_server(start_server: Callable[..., Any], loops: int) -> Callable[..., Any]:
    async def start(repository: pathlib.Path, **settings: object) -> Any:
        settings.setdefault("loops", loops)
        return await start_server(repository, **settings)

    return start


async def logged(caplog: pytest.LogCaptureFixture, count: int = 1,
                 where: Callable[[logging.LogRecord], bool] = lambda r: True,
                 what: str = "the log records") -> list[logging.LogRecord]:
    """The captured records `where` picks, once there are `count` of them: a front loop's
    records reach the host's handlers a moment after its answer reached the client."""
    await until(lambda: len([r for r in caplog.records if where(r)]) >= count, what=what, timeout=10.0)
    return [r for r in caplog.records if where(r)]


def open_connections(server: Any) -> int:
    """Client connections open on every loop: the host's own and those its fronts hold."""
    return int(server.app.stats.connections + (server.loops.connections if server.loops is not None else 0))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Fronts run on uvloop: drop their runs on asyncio's loop and those of `host_loop` tests
    (see the module's docstring)."""
    kept, dropped = [], []
    for item in items:
        spec = getattr(item, "callspec", None)
        loops = spec.params.get("loops", 0) if spec is not None else 0
        if loops and ("asyncio" in spec.id.split("-") or item.get_closest_marker("host_loop") is not None):
            dropped.append(item)
        else:
            kept.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept

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
