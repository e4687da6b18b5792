"""Graceful shutdown under load: does SIGTERM answer every request the server accepted?

Starts `aserve serve` on a temporary repository holding one slow-ish model (`drain`: a
pure-Python model that sleeps `--model-ms` per batch, `--interpreters` interpreters,
batches of `--rows` samples), puts `--requests` requests of `--rows` samples each in
flight at once, waits until the server holds every one of them (its /metrics: the
answered, the queued, and one per running batch, since each request fills a batch), sends
SIGTERM, and checks that every request is answered 200 with its own values and that
the process exits with status 0 within `--shutdown-timeout` seconds of the signal (the
server's own flag of that name is set to it).

Prints JSON: the requests, their statuses, wrong answers, where the requests were when
the signal went (answered, queued, running), the exit status and the seconds from the
signal to the exit; `ok` says whether everything held (the exit status is 1 when not).

    .venv/bin/python loadtests/drain.py                      # 200 requests, a few seconds
    .venv/bin/python loadtests/drain.py --requests 500 --model-ms 20 --engine private
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import signal
import sys
import tempfile
import textwrap
import time
from typing import Any

import aiohttp
from served import free_port, wait_ready

MODEL = "drain"

MODEL_SOURCE = '''
import time
from aserve.runtime import Model, TensorSpec

class Drain(Model):
    """Y = X (FP32 [n, 1]), after sleeping `ms` milliseconds per batch."""
    inputs = [TensorSpec("X", "FP32", (-1, 1))]
    outputs = [TensorSpec("Y", "FP32", (-1, 1))]

    def load(self):
        self.seconds = float(self.parameters.get("ms", 20)) / 1000.0

    def __call__(self, inputs):
        time.sleep(self.seconds)
        return {"Y": [[v] for v in inputs["X"].cast("B").cast("f")]}
'''


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=200, help="requests in flight when SIGTERM is sent")
    ap.add_argument("--rows", type=int, default=4, help="samples per request (the model's max_batch_size)")
    ap.add_argument("--model-ms", type=float, default=50.0, help="milliseconds the model sleeps per batch")
    ap.add_argument("--interpreters", type=int, default=2)
    ap.add_argument("--engine", default="main", help="the server's --engine (main, private, subinterp, auto)")
    ap.add_argument("--shutdown-timeout", type=float, default=30.0,
                    help="seconds the process may take to exit after SIGTERM (the server's flag too)")
    ap.add_argument("--ready-timeout", type=float, default=180.0, help="seconds to wait for the model to load")
    ap.add_argument("--json", help="also write the result here")
    return ap.parse_args(argv)


def repository(base: pathlib.Path, args: argparse.Namespace) -> pathlib.Path:
    folder = base / "repo" / MODEL
    folder.mkdir(parents=True)
    (folder / "model.py").write_text(textwrap.dedent(MODEL_SOURCE))
    (folder / "config.toml").write_text(
        f"interpreters = {args.interpreters}\nmax_batch_size = {args.rows}\n"
        f"[parameters]\nms = {args.model_ms}\n"
        f'[batching]\npolicy = "window"\nmax_queue_size = {args.requests * args.rows}\n'
        f"timeout_ms = {max(60_000.0, 2 * args.shutdown_timeout * 1000)}\n"
    )
    return base / "repo"


async def gauges(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """The model's answered, queued and running counts on /metrics."""
    async with session.get(f"{url}/metrics") as r:
        text = await r.text()
    names = {"aserve_batcher_requests_total": "answered", "aserve_queue_requests": "queued",
             "aserve_batches_in_flight": "running"}
    out = dict.fromkeys(names.values(), 0.0)
    for line in text.splitlines():
        name, _, rest = line.partition("{")
        if name in names and rest.startswith(f'model="{MODEL}"'):
            out[names[name]] = float(line.rsplit(" ", 1)[1])
    return out


async def call(session: aiohttp.ClientSession, url: str, index: int, rows: int) -> tuple[int | str, bool]:
    """(status or the error's name, whether the answer holds this request's own values)."""
    values = [float(index * rows + k) for k in range(rows)]
    body = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [rows, 1], "data": values}]}
    try:
        async with session.post(f"{url}/v2/models/{MODEL}/infer", json=body) as r:
            answer = await r.json(content_type=None)
            if r.status != 200:
                return r.status, False
            return 200, answer["outputs"][0]["data"] == values
    except (aiohttp.ClientError, TimeoutError, ValueError) as e:
        return type(e).__name__, False


async def run(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {"requests": args.requests, "rows": args.rows, "model_ms": args.model_ms,
                              "interpreters": args.interpreters, "engine": args.engine,
                              "shutdown_timeout_s": args.shutdown_timeout}
    with tempfile.TemporaryDirectory(prefix="aserve-drain-") as tmp, tempfile.TemporaryFile() as log:
        repo = repository(pathlib.Path(tmp), args)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "aserve.cli", "serve", str(repo), "--port", str(port), "--engine", args.engine,
            "--interpreters", str(args.interpreters), "--shutdown-timeout", str(args.shutdown_timeout),
            "--log-level", "warning",
            stdout=log, stderr=asyncio.subprocess.STDOUT, start_new_session=True,
        )
        try:
            connector = aiohttp.TCPConnector(limit=0)
            timeout = aiohttp.ClientTimeout(total=args.shutdown_timeout + 60)
            async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
                await ready(session, url, proc, args.ready_timeout)
                loop = asyncio.get_running_loop()
                calls = [asyncio.ensure_future(call(session, url, i, args.rows)) for i in range(args.requests)]
                # every request in the server: answered + queued + running (one request per batch)
                end = loop.time() + 60
                while sum((state := await gauges(session, url)).values()) < args.requests:
                    if loop.time() > end:
                        raise RuntimeError(f"the requests never all reached the server: {state}")
                    await asyncio.sleep(0.002)
                result["at_sigterm"] = {k: int(v) for k, v in state.items()}
                signalled = time.monotonic()
                proc.send_signal(signal.SIGTERM)
                outcomes = await asyncio.gather(*calls)
                result["answered_s"] = round(time.monotonic() - signalled, 3)
            try:
                status: int | None = await asyncio.wait_for(proc.wait(), args.shutdown_timeout + 30)
            except TimeoutError:
                status = None
            exited = time.monotonic() - signalled
        finally:
            if proc.returncode is None:
                os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
            log.seek(0)
            output = log.read().decode(errors="replace")
    statuses: dict[str, int] = {}
    for code, _ in outcomes:
        statuses[str(code)] = statuses.get(str(code), 0) + 1
    result["statuses"] = statuses
    result["answered_200"] = statuses.get("200", 0)
    result["wrong_answers"] = sum(1 for code, right in outcomes if code == 200 and not right)
    result["exit_status"] = status
    result["exit_s"] = round(exited, 3)
    result["traceback_in_log"] = "Traceback" in output
    result["ok"] = (result["answered_200"] == args.requests and result["wrong_answers"] == 0 and status == 0
                    and exited <= args.shutdown_timeout and not result["traceback_in_log"])
    if not result["ok"]:
        result["server_log_tail"] = output[-3000:]
    return result


async def ready(session: aiohttp.ClientSession, url: str, proc: asyncio.subprocess.Process, timeout: float) -> None:
    await wait_ready(session, f"{url}/v2/models/{MODEL}/ready", lambda: proc.returncode, timeout=timeout, every=0.05)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    result = asyncio.run(run(args))
    text = json.dumps(result, indent=2)
    if args.json:
        pathlib.Path(args.json).write_text(text + "\n")
    print(text)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
