"""The benchmarks' tests: the suite's set-up (tests/conftest.py) for this folder too.

glibc's tunables come from the `aserve.testing` plugin (pyproject addopts), as for tests/.
Async tests run on uvloop, as the server does; the suite's own hook does not reach this
folder (pytest-asyncio asks the hooks of the test's own directory).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import pytest
import uvloop

from tests.conftest import EXAMPLES, HAVE_TORCH, ROOT, needs_torch

__all__ = ["EXAMPLES", "HAVE_TORCH", "ROOT", "needs_torch"]


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item
                                  ) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    return {"uvloop": uvloop.new_event_loop}
