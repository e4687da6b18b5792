"""`aserve serve` as a subprocess: settings precedence, SIGTERM with requests in flight."""

from __future__ import annotations

import asyncio
import os
import pathlib
import re
import signal
import sys

import aiohttp
import pytest

from aserve.cli import build_parser, bundled_examples, settings_from_args
from aserve.config import ServerSettings, Setting, SettingsError, load_settings, settings_fields

from ..conftest import free_port, spawns, wait_ready
from .test_errors import slow_body


def test_settings_precedence(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    file = tmp_path / "aserve.toml"
    file.write_text('port = 9000\nhost = "0.0.0.0"\ninterpreters = 3\nengine = "main"\n')
    monkeypatch.setenv("ASERVE_PORT", "9100")
    monkeypatch.setenv("ASERVE_MAX_BODY_BYTES", "2048")
    monkeypatch.setenv("ASERVE_NO_REEXEC", "0")  # not a setting: ignored
    args = build_parser().parse_args(["serve", "repo", "--config", str(file), "--interpreters", "4"])
    s = settings_from_args(args)
    assert s == ServerSettings(repository="repo", host="0.0.0.0", port=9100, engine="main", interpreters=4,
                               max_body_bytes=2048, log_level=os.environ.get("ASERVE_LOG_LEVEL", "info"),
                               grpc_port=int(os.environ.get("ASERVE_GRPC_PORT", "8001")))


def serve_help(capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
    """`aserve serve --help`, one entry per option: its first spelling -> its help, on one line."""
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    text = capsys.readouterr().out
    entries = re.split(r"\n  (?=\S)", text.split("\noptions:\n", 1)[1])
    return {entry.split()[0].rstrip(","): " ".join(entry.split()) for entry in entries if entry.strip()}


def shown_default(setting: Setting) -> str:
    v = setting.default
    if v is None or v == []:
        return "none"
    if isinstance(v, bool):
        return "on" if v else "off"
    return f"{v:g}" if isinstance(v, float) else str(v)


def test_every_setting_has_a_flag_naming_its_variable_and_default(capsys: pytest.CaptureFixture[str]) -> None:
    options = serve_help(capsys)
    for setting in settings_fields():
        if setting.kind is dict:  # a nested table ([tracing]): the file's and the environment's only
            continue
        flag = setting.extra.get("flag", "--" + setting.name.replace("_", "-"))
        if setting.name == "repository":
            assert flag is None  # the positional argument
            continue
        assert flag in options, f"{setting.name}: no {flag} in aserve serve --help"
        assert setting.variable in options[flag], (setting.name, options[flag])
        assert f"(default {shown_default(setting)}" in options[flag], (setting.name, options[flag])


def non_default(setting: Setting) -> tuple[list[str], object]:
    """Arguments that set `setting` to a value other than its default, and that value."""
    flag = setting.extra.get("flag", "--" + setting.name.replace("_", "-"))
    if setting.kind is bool:
        return ([f"--no-{flag[2:]}"], False) if setting.default in (None, True) else ([flag], True)
    if setting.kind is list:
        return [flag, "https://a.example", flag, "*"], ["https://a.example", "*"]
    if "choices" in setting.extra:
        value = setting.extra["choices"][-1]
        return [flag, value], value
    if setting.kind is str:
        return [flag, "x"], "x"
    value = 1 if setting.default is None else setting.kind(setting.default + 1)
    return [flag, str(value)], value


def test_every_flag_sets_its_setting() -> None:
    for setting in settings_fields():
        if setting.kind is dict or setting.extra.get("flag", "") is None:
            continue
        argv, value = non_default(setting)
        assert value != setting.default
        got = getattr(settings_from_args(build_parser().parse_args(["serve", *argv])), setting.name)
        assert got == value, (argv, got)
    assert settings_from_args(build_parser().parse_args(["serve", "repo"])).repository == "repo"


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
        # the host's loop alone: the state waited for below (one running, two queued) is its batcher's;
        # with front loops a batch handed to an interpreter still finishing its last one counts in the
        # model's queue until the interpreter takes it, so three requests at once against max_queue_size
        # 2 may see one refused (drain across loops: test_loops.py, test_drain.py)
        sys.executable, "-m", "aserve.cli", "serve", str(repository), "--engine", "main", "--interpreters", "2",
        "--loops", "0", "--port", str(port), env=env, stderr=asyncio.subprocess.PIPE,
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


@spawns
async def test_serve_refuses_loops_and_interpreters_beyond_glibcs_namespaces(tmp_path: pathlib.Path) -> None:
    """Front loops and private interpreters take a link-map namespace each: flags that need
    more than glibc's 15 end the command at once, naming what fits, before anything starts."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "aserve.cli", "serve", str(tmp_path), "--engine", "private", "--loops", "8",
        "--interpreters", "12", "--port", "0", stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2
    assert "12 private interpreters and 8 front loops (--loops) need 20 link-map namespaces" in err.decode()
    assert "expected --interpreters of at most 7 with 8 loops" in err.decode()
