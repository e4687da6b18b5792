"""`aserve serve` as a subprocess: settings precedence, SIGTERM with requests in flight."""

from __future__ import annotations

import asyncio
import os
import pathlib
import signal
import socket
import sys

import aiohttp
import pytest

from aserve.cli import build_parser, bundled_examples, settings_from_args
from aserve.config import ServerSettings, SettingsError, load_settings

from ..conftest import wait_ready
from .test_errors import slow_body

# These tests spawn `aserve serve` from the test's loop. uvloop's child side of a spawn calls
# PyOS_AfterFork_Child, which crashes a process that holds PEP 684 subinterpreters (earlier
# tests leave some parked in this process): MagicStack/uvloop#650. The served process runs
# on uvloop all the same; only the spawning test uses asyncio's loop.
spawns = pytest.mark.asyncio(loop_factories=["asyncio"])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_settings_precedence(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    file = tmp_path / "aserve.toml"
    file.write_text('port = 9000\nhost = "0.0.0.0"\ninterpreters = 3\nengine = "main"\n')
    monkeypatch.setenv("ASERVE_PORT", "9100")
    monkeypatch.setenv("ASERVE_MAX_BODY_BYTES", "2048")
    monkeypatch.setenv("ASERVE_NO_REEXEC", "0")  # not a setting: ignored
    args = build_parser().parse_args(["serve", "repo", "--config", str(file), "--interpreters", "4"])
    s = settings_from_args(args)
    assert s == ServerSettings(repository="repo", host="0.0.0.0", port=9100, engine="main", interpreters=4,
                               max_body_bytes=2048, log_level=os.environ.get("ASERVE_LOG_LEVEL", "info"))


def test_settings_errors_name_source_and_field(tmp_path: pathlib.Path) -> None:
    with pytest.raises(SettingsError, match="ASERVE_PORT: Expected `int`"):
        load_settings(environ={"ASERVE_PORT": "eighty"})
    with pytest.raises(SettingsError, match="ASERVE_ENGINE: engine: expected one of auto, private"):
        load_settings(environ={"ASERVE_ENGINE": "gpu"})
    bad = tmp_path / "bad.toml"
    bad.write_text("prot = 1\n")
    with pytest.raises(SettingsError, match="bad.toml: unknown setting 'prot'"):
        load_settings(file=bad, environ={})


def test_bundled_examples_found() -> None:
    examples = bundled_examples()
    assert examples is not None and (examples / "simple" / "config.toml").is_file()


async def metric(http: aiohttp.ClientSession, url: str, name: str, model: str) -> float:
    async with http.get(f"{url}/metrics") as r:
        for line in (await r.text()).splitlines():
            if line.startswith(f'{name}{{model="{model}"'):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} of {model} not exported")


@spawns
async def test_sigterm_answers_in_flight_requests(repository: pathlib.Path) -> None:
    port = free_port()
    env = dict(os.environ, ASERVE_LOG_LEVEL="warning")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "aserve.cli", "serve", str(repository), "--engine", "main", "--interpreters", "2",
        "--port", str(port), env=env, stderr=asyncio.subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http:
            await wait_ready(http, url, proc)

            async def call(ms: float) -> tuple[int, dict]:
                async with http.post(f"{url}/v2/models/slow/infer", json=slow_body(ms)) as r:
                    return r.status, await r.json()

            # one runs (400 ms) and two wait in the queue when SIGTERM arrives
            inflight = [asyncio.ensure_future(call(ms)) for ms in (400, 50, 50)]
            loop = asyncio.get_running_loop()
            give_up = loop.time() + 30
            while (await metric(http, url, "aserve_batches_in_flight", "slow"),
                   await metric(http, url, "aserve_queue_requests", "slow")) != (1, 2):
                assert loop.time() < give_up, "the three requests never got in flight"
            proc.send_signal(signal.SIGTERM)
            results = await asyncio.gather(*inflight)
            assert [status for status, _ in results] == [200, 200, 200]
            assert [body["outputs"][0]["data"] for _, body in results] == [[400.0], [50.0], [50.0]]
            # no longer accepting
            give_up = loop.time() + 30
            while True:
                try:
                    async with http.get(f"{url}/v2/health/live", timeout=aiohttp.ClientTimeout(total=2)):
                        pass
                except aiohttp.ClientConnectionError:
                    break
                assert loop.time() < give_up, "the server still accepts connections after SIGTERM"
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        assert proc.stderr is not None
        err = (await proc.stderr.read()).decode()
        assert "Traceback" not in err, err


@spawns
async def test_serve_reports_missing_repository(tmp_path: pathlib.Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "aserve.cli", "serve", str(tmp_path / "absent"), "--engine", "main", "--port", "0",
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2
    assert "is not a folder" in err.decode()
