"""HTTP load generators for `benchmarks.http`: wrk when installed, else a multi-process aiohttp client.

Both drive `connections` keep-alive connections, each sending its next POST when its
previous answer is in (a closed loop), for whole seconds, and report the same `Load`:
requests completed, latency percentiles, errors split as wrk splits them, and the CPU
the generator itself used (to show it was not the bottleneck).
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import pathlib
import re
import resource
import shutil
import subprocess
import tempfile
import time
from typing import Any, NamedTuple

_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 6e4}


class Load(NamedTuple):
    requests: int  # completed, whatever their status
    wall_s: float  # the generator's measured interval
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    non_2xx: int
    socket_errors: int  # connect, read, write errors and timeouts
    generator_cpu_s: float  # user + system CPU of the generator's processes
    generator: str  # "wrk" or "aiohttp"
    threads: int

    @property
    def errors(self) -> int:
        return self.non_2xx + self.socket_errors


def have_wrk() -> bool:
    return shutil.which("wrk") is not None


# ---- wrk -----------------------------------------------------------------------

def lua_script(body_file: pathlib.Path, headers: dict[str, str]) -> str:
    """wrk script: every request is this POST (body read once from a file: binary-safe)."""
    lines = ['wrk.method = "POST"', f"local f = assert(io.open({json.dumps(str(body_file))}, \"rb\"))",
             'wrk.body = f:read("*all")', "f:close()"]
    lines += [f"wrk.headers[{json.dumps(k)}] = {json.dumps(v)}" for k, v in headers.items()]
    return "\n".join(lines) + "\n"


def _ms(text: str) -> float:
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text.strip())
    if not m:
        raise ValueError(f"cannot read wrk latency {text!r}")
    return float(m[1]) * _UNITS[m[2]]


def parse_wrk(out: str) -> dict[str, Any]:
    """The figures of wrk's `--latency` report."""
    done = re.search(r"(\d+) requests in ([\d.]+)(us|ms|s|m),", out)
    rate = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if not done or not rate:
        raise RuntimeError(f"cannot read wrk's report:\n{out}")
    lat = dict(re.findall(r"^\s+(50|99)(?:\.0+)?%\s+(\S+)$", out, re.MULTILINE))
    non_2xx = sum(int(m[1]) for m in re.finditer(r"Non-2xx or 3xx responses: (\d+)", out))
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    return {
        "requests": int(done[1]),
        "wall_s": float(done[2]) * _UNITS[done[3]] / 1e3,
        "requests_per_s": float(rate[1]),
        "p50_ms": _ms(lat["50"]) if "50" in lat else 0.0,
        "p99_ms": _ms(lat["99"]) if "99" in lat else 0.0,
        "non_2xx": non_2xx,
        "socket_errors": sum(int(g) for g in sock.groups()) if sock else 0,
    }


def run_wrk(url: str, *, body: bytes, headers: dict[str, str], connections: int, seconds: int,
            threads: int = 1) -> Load:
    threads = min(threads, connections)  # wrk refuses more threads than connections
    with tempfile.TemporaryDirectory(prefix="aserve-wrk-") as tmp:
        body_file = pathlib.Path(tmp) / "body"
        body_file.write_bytes(body)
        script = pathlib.Path(tmp) / "post.lua"
        script.write_text(lua_script(body_file, headers))
        argv = ["wrk", "-t", str(threads), "-c", str(connections), "-d", f"{seconds}s", "--timeout", "5s",
                "--latency", "-s", str(script), url]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"wrk exited with {proc.returncode}: {proc.stderr.strip() or proc.stdout.strip()}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Load(**parse_wrk(proc.stdout), generator_cpu_s=cpu, generator="wrk", threads=threads)


# ---- aiohttp (fallback) --------------------------------------------------------

def _client_process(args: tuple[str, bytes, dict[str, str], int, float]) -> tuple[list[float], int, int, float]:
    url, body, headers, connections, seconds = args
    import aiohttp

    async def run() -> tuple[list[float], int, int]:
        latencies: list[float] = []
        non_2xx = socket_errors = 0
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds

        async def connection(session: aiohttp.ClientSession) -> None:
            nonlocal non_2xx, socket_errors
            while loop.time() < end:
                t0 = loop.time()
                try:
                    async with session.post(url, data=body, headers=headers) as r:
                        await r.read()
                        if not 200 <= r.status < 300:
                            non_2xx += 1
                except (TimeoutError, aiohttp.ClientError, OSError):
                    socket_errors += 1
                    continue
                latencies.append((loop.time() - t0) * 1e3)

        timeout = aiohttp.ClientTimeout(total=5)
        connector = aiohttp.TCPConnector(limit=connections)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            await asyncio.gather(*(connection(session) for _ in range(connections)))
        return latencies, non_2xx, socket_errors

    cpu0 = time.process_time()
    latencies, non_2xx, socket_errors = asyncio.run(run())
    return latencies, non_2xx, socket_errors, time.process_time() - cpu0


def run_aiohttp(url: str, *, body: bytes, headers: dict[str, str], connections: int, seconds: int,
                threads: int = 1) -> Load:
    """`threads` client processes share the connections (a Python client needs several to keep up)."""
    procs = max(1, min(threads, connections))
    shares = [connections // procs + (i < connections % procs) for i in range(procs)]
    with multiprocessing.get_context("spawn").Pool(procs) as pool:
        results = pool.map(_client_process, [(url, body, headers, n, float(seconds)) for n in shares])
    latencies = sorted(x for r in results for x in r[0])
    n = len(latencies)
    return Load(
        requests=n,
        wall_s=float(seconds),
        requests_per_s=n / seconds,
        p50_ms=latencies[n // 2] if n else 0.0,
        p99_ms=latencies[min(n - 1, int(n * 0.99))] if n else 0.0,
        non_2xx=sum(r[1] for r in results),
        socket_errors=sum(r[2] for r in results),
        generator_cpu_s=sum(r[3] for r in results),
        generator="aiohttp",
        threads=procs,
    )


def drive(generator: str, url: str, **kw: Any) -> Load:
    return (run_wrk if generator == "wrk" else run_aiohttp)(url, **kw)
