"""HTTP throughput and latency of `aserve serve`, per model and engine.

`aserve bench http [--json FILE] [--models simple,mlp,cnn] [--engines main,private]`

For each engine it starts the server in a subprocess on loopback, then drives each
model's V2 infer endpoint (binary tensor extension, one sample per request) with many
concurrent connections for a fixed time, and prints one JSON record per run:
requests/s, p50 and p99 latency, errors, and the CPU the load generator and the
server used. The load generator is `wrk` when installed (C, event-driven), else a
multi-process aiohttp client.

The same run measures a baseline: `GET /v2/health/live` through the same server and
generator. It bounds what the HTTP path and the generator can do together; an infer
rate well below it, with the generator using a fraction of a core, means the
generator was not the bottleneck (`generator_cpu` is in cores: CPU seconds / wall
seconds).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import pathlib
import re
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from typing import Any

import psutil

from ..cli import bundled_examples

DEFAULT_MODELS = ("simple", "mlp", "cnn")
DEFAULT_ENGINES = ("main", "private")
_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 6e4}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


class ServerProcess:
    """`aserve serve` in a subprocess; `start()` waits until the models are ready (or failed)."""

    def __init__(self, repository: pathlib.Path, *, engine: str, interpreters: int, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.argv = [
            sys.executable,
            "-m",
            "aserve.cli",
            "serve",
            str(repository),
            "--engine",
            engine,
            "--interpreters",
            str(interpreters),
            "--port",
            str(port),
            "--log-level",
            "warning",
        ]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 300.0) -> list[str]:
        """Start and wait for loading to finish; returns the names of the models that are READY."""
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}")
            try:
                status, body = _post(f"{self.url}/v2/repository/index", b"", {})
                index = json.loads(body)
                if status == 200 and all(m["state"] != "LOADING" for m in index):
                    return [m["name"] for m in index if m["state"] == "READY"]
            except (OSError, ValueError):
                pass
            time.sleep(0.2)
        raise RuntimeError("server did not finish loading its models")

    def cpu_seconds(self) -> float:
        assert self.proc is not None
        t = psutil.Process(self.proc.pid).cpu_times()
        return float(t.user + t.system)

    def stop(self) -> int:
        assert self.proc is not None
        self.proc.terminate()
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def infer_body(metadata: dict[str, Any], seed: int = 0) -> tuple[bytes, dict[str, str]]:
    """A one-sample binary V2 infer request for a model's metadata (random inputs)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    header: dict[str, Any] = {"inputs": [], "parameters": {"binary_data_output": True}}
    blobs = []
    for spec in metadata["inputs"]:
        shape = [1 if d == -1 else d for d in spec["shape"]]
        dtype = {"INT32": np.int32, "FP32": np.float32, "INT64": np.int64, "FP64": np.float64}[
            spec["datatype"]
        ]
        arr = (rng.random(shape) * 100).astype(dtype)
        blobs.append(arr.tobytes())
        header["inputs"].append(
            {
                "name": spec["name"],
                "datatype": spec["datatype"],
                "shape": shape,
                "parameters": {"binary_data_size": arr.nbytes},
            }
        )
    head = json.dumps(header).encode()
    headers = {"Inference-Header-Content-Length": str(len(head)), "Content-Type": "application/octet-stream"}
    return head + b"".join(blobs), headers


# ---- load generators ----

_WRK_LUA = """
local f = io.open(os.getenv("ASERVE_BENCH_BODY"), "rb")
wrk.method = os.getenv("ASERVE_BENCH_METHOD")
if wrk.method == "POST" then
  wrk.body = f:read("*all")
  wrk.headers["Content-Type"] = "application/octet-stream"
  wrk.headers["Inference-Header-Content-Length"] = os.getenv("ASERVE_BENCH_HEADER_LENGTH")
end
f:close()
"""


def _ms(text: str) -> float:
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text.strip())
    if not m:
        raise ValueError(f"cannot read wrk latency {text!r}")
    return float(m[1]) * _UNITS[m[2]]


def run_wrk(
    url: str,
    *,
    method: str,
    body: bytes,
    headers: dict[str, str],
    connections: int,
    duration: float,
    threads: int,
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        body_file = pathlib.Path(tmp) / "body"
        body_file.write_bytes(body)
        script = pathlib.Path(tmp) / "infer.lua"
        script.write_text(_WRK_LUA)
        env = dict(
            os.environ,
            ASERVE_BENCH_BODY=str(body_file),
            ASERVE_BENCH_METHOD=method,
            ASERVE_BENCH_HEADER_LENGTH=headers.get("Inference-Header-Content-Length", "0"),
        )
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        out = subprocess.run(
            [
                "wrk",
                "-t",
                str(threads),
                "-c",
                str(connections),
                "-d",
                f"{max(1, round(duration))}s",
                "--latency",
                "-s",
                str(script),
                url,
            ],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        ).stdout
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out)[1])  # type: ignore[index]
    lat = dict(re.findall(r"^\s+(50|99)%\s+(\S+)$", out, re.MULTILINE))
    errors = 0
    for m in re.finditer(r"Non-2xx or 3xx responses: (\d+)", out):
        errors += int(m[1])
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    if sock:
        errors += sum(int(g) for g in sock.groups())
    return {
        "requests_per_s": rps,
        "p50_ms": _ms(lat["50"]),
        "p99_ms": _ms(lat["99"]),
        "errors": errors,
        "generator": "wrk",
        "generator_cpu": cpu / max(1, round(duration)),
    }


def _client_worker(
    args: tuple[str, str, bytes, dict[str, str], int, float],
) -> tuple[list[float], int, float]:
    url, method, body, headers, connections, duration = args
    import aiohttp

    async def run() -> tuple[list[float], int]:
        latencies: list[float] = []
        errors = 0
        loop = asyncio.get_running_loop()
        end = loop.time() + duration

        async def conn(session: aiohttp.ClientSession) -> None:
            nonlocal errors
            while loop.time() < end:
                t0 = loop.time()
                async with session.request(method, url, data=body or None, headers=headers) as r:
                    await r.read()
                    if r.status != 200:
                        errors += 1
                latencies.append((loop.time() - t0) * 1000)

        connector = aiohttp.TCPConnector(limit=connections)
        async with aiohttp.ClientSession(connector=connector) as session:
            await asyncio.gather(*(conn(session) for _ in range(connections)))
        return latencies, errors

    start = time.process_time()
    latencies, errors = asyncio.run(run())
    return latencies, errors, time.process_time() - start


def run_aiohttp(
    url: str,
    *,
    method: str,
    body: bytes,
    headers: dict[str, str],
    connections: int,
    duration: float,
    threads: int,
) -> dict[str, Any]:
    per = max(1, connections // threads)
    with multiprocessing.get_context("spawn").Pool(threads) as pool:
        results = pool.map(_client_worker, [(url, method, body, headers, per, duration)] * threads)
    latencies = sorted(x for r in results for x in r[0])
    n = len(latencies)
    return {
        "requests_per_s": n / duration,
        "p50_ms": latencies[n // 2] if n else 0.0,
        "p99_ms": latencies[min(n - 1, int(n * 0.99))] if n else 0.0,
        "errors": sum(r[1] for r in results),
        "generator": "aiohttp",
        "generator_cpu": sum(r[2] for r in results) / duration,
    }


def drive(url: str, **kw: Any) -> dict[str, Any]:
    return (run_wrk if shutil.which("wrk") else run_aiohttp)(url, **kw)


def bench_engine(
    repository: pathlib.Path, engine: str, models: list[str], args: argparse.Namespace
) -> list[dict]:
    server = ServerProcess(repository, engine=engine, interpreters=args.interpreters, port=_free_port())
    records: list[dict[str, Any]] = []
    ready = server.start()
    try:
        common = {
            "bench": "http",
            "engine": engine,
            "interpreters": args.interpreters,
            "connections": args.connections,
            "duration_s": args.duration,
        }
        runs: list[tuple[str, str, str, bytes, dict[str, str]]] = [
            ("baseline:health/live", "GET", f"{server.url}/v2/health/live", b"", {})
        ]
        for model in models:
            if model not in ready:
                records.append({**common, "model": model, "error": "model not ready in this server"})
                continue
            _, meta = _get(f"{server.url}/v2/models/{model}")
            body, headers = infer_body(json.loads(meta))
            status, answer = _post(f"{server.url}/v2/models/{model}/infer", body, headers)
            if status != 200:
                records.append(
                    {**common, "model": model, "error": f"probe request failed: {status} {answer[:200]!r}"}
                )
                continue
            runs.append((model, "POST", f"{server.url}/v2/models/{model}/infer", body, headers))
        for name, method, url, body, headers in runs:
            drive(
                url,
                method=method,
                body=body,
                headers=headers,
                connections=args.connections,
                duration=min(1.0, args.duration),
                threads=args.threads,
            )  # warm-up
            cpu0 = server.cpu_seconds()
            result = drive(
                url,
                method=method,
                body=body,
                headers=headers,
                connections=args.connections,
                duration=args.duration,
                threads=args.threads,
            )
            result["server_cpu"] = (server.cpu_seconds() - cpu0) / args.duration
            record = {
                **common,
                "model": name,
                **{k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()},
            }
            records.append(record)
            print(json.dumps(record), flush=True)
    finally:
        rc = server.stop()
        if rc != 0:
            records.append(
                {"bench": "http", "engine": engine, "error": f"server exited with {rc} on SIGTERM"}
            )
    return records


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="aserve bench http", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--json", help="write the records to this file (a JSON list)")
    p.add_argument("--repository", help="model repository (default: the bundled examples/)")
    p.add_argument("--models", default=",".join(DEFAULT_MODELS))
    p.add_argument("--engines", default=",".join(DEFAULT_ENGINES))
    p.add_argument("--interpreters", type=int, default=os.cpu_count() or 1)
    p.add_argument("--connections", type=int, default=32)
    p.add_argument("--threads", type=int, default=1, help="load generator threads/processes")
    p.add_argument("--duration", type=float, default=5.0, help="seconds per run")
    args = p.parse_args(argv)
    repository = pathlib.Path(args.repository) if args.repository else bundled_examples()
    if repository is None:
        p.error("no --repository and no bundled examples/ folder")
    records: list[dict[str, Any]] = []
    for engine in args.engines.split(","):
        records.extend(bench_engine(repository, engine, args.models.split(","), args))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(records, indent=1) + "\n")
    return 0
