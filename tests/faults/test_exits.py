"""Model code that tries to end the process fails its own request; the server and its other models go on."""

from __future__ import annotations

import asyncio

import pytest

from .conftest import ENGINES, EXITS, call_faulty, call_ok


@pytest.mark.parametrize("engine", ENGINES)
async def test_exit_calls_fail_only_their_request(engine, repository, start_server, http) -> None:
    _, url = await start_server(repository, engine=engine, interpreters=2)
    for act, called in EXITS.items():
        (status, answer), ok = await asyncio.gather(call_faulty(http, url, act), call_ok(http, url, act))
        assert status == 500, answer
        assert f"model faulty version 1 called {called}" in answer["error"], answer
        assert ok == (200, act + 1)
        # the interpreter that ran it (faulty has only interpreter 0) answers the next request
        assert await call_faulty(http, url, 0) == (200, {"model_name": "faulty", "model_version": "1",
                                                          "outputs": [{"name": "OUT", "datatype": "INT32",
                                                                       "shape": [1], "data": [0]}]})


@pytest.mark.parametrize("engine", ENGINES)
async def test_exit_calls_in_load_fail_the_load(engine, repository, start_server, http) -> None:
    """A model whose load() calls os._exit does not load; the server and the other model serve."""
    (repository / "faulty" / "model.py").write_text(
        "import os\nfrom aserve.runtime import Model\nclass Quits(Model):\n"
        "    def load(self):\n        os._exit(2)\n    def __call__(self, inputs):\n        return {}\n")
    server, url = await start_server(repository, engine=engine, interpreters=2)
    handle = server.plane.registry.get("faulty")
    assert handle.state == "UNAVAILABLE"
    assert "model faulty version 1 called os._exit(2)" in handle.reason
    assert await call_ok(http, url, 1) == (200, 2)
