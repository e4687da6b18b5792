"""Several event loops in one process: what a front of more than one loop could carry.

    python -m benchmarks.loops [--json FILE] [--loops 1,2] [--connections 64] [--duration 5]

One event loop caps aserve's requests/s (see `benchmarks.http`). This
measures the part of a multi-loop front that exists today: k copies of the ceiling
handler (read the body, answer a fixed body), each on its own uvloop loop in its own
private interpreter (a dlmopen'ed libpython with its own GIL, run as a job that never
returns on one of the pool's native threads), all listening on one port with
SO_REUSEPORT so that the kernel spreads connections over them. The baseline is the
same handler on one loop in the host interpreter, in the same run. Each record:
`loops`, `where` (host | private), `requests_per_s`, `p50_ms`, `p99_ms`, `errors`,
`server_cpu_cores`, `pss_mb` (the whole process).

The process that hosts the loops cannot stop them (their jobs never return); it
exits when the run is over.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import subprocess
import sys
import time
import urllib.request
from typing import Any

from . import child_env
from .loadgen import have_wrk, run_wrk
from .servers import free_port

LOOP_SOURCE = """
import asyncio, uvloop
from aiohttp import web

async def infer(request):
    await request.read()
    return web.Response(body=b'{{"model_name":"ceiling","outputs":[]}}', content_type="application/json")

async def serve():
    app = web.Application()
    app.router.add_post("/v2/models/{{model}}/infer", infer)
    app.router.add_get("/v2/health/live", lambda r: web.Response(text="ok"))
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", {port}, reuse_port=True, backlog=1024).start()
    await asyncio.Event().wait()

loop = uvloop.new_event_loop()  # no signal handlers: signals belong to the host
asyncio.set_event_loop(loop)
loop.run_until_complete(serve())
"""


def _host(port: int, loops: int, where: str) -> None:
    """The server process: `loops` loops in private interpreters, or one in the host."""
    if where == "host":
        exec(LOOP_SOURCE.format(port=port), {"__name__": "__aserve_loop__"})  # noqa: S102 - our own source
        return
    from aserve.engine import Pool, ensure_glibc_tunables

    ensure_glibc_tunables()

    async def main() -> None:
        pool = Pool(engine="private", interpreters=loops)
        await pool.start()
        jobs = [asyncio.ensure_future(pool.execute(i, LOOP_SOURCE.format(port=port))) for i in range(loops)]
        done, _ = await asyncio.wait(jobs, return_when=asyncio.FIRST_COMPLETED)
        for job in done:  # a loop that ended is a loop that failed
            print(f"benchmarks.loops: a loop ended: {job.exception()!r}", file=sys.stderr, flush=True)
        os._exit(1)

    asyncio.run(main())


def _wait_listening(port: int, proc: subprocess.Popen[bytes], timeout: float = 120.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/live", timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("the loops did not start listening")


def _cpu(pid: int) -> float:
    import psutil

    p = psutil.Process(pid)
    total = p.cpu_times().user + p.cpu_times().system
    return float(total)


def _pss(pid: int) -> int:
    import psutil

    return int(psutil.Process(pid).memory_full_info().pss)


def _point(loops: int, where: str, args: argparse.Namespace) -> dict[str, Any]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.loops", "--serve", str(port), str(loops), where],
                            env=child_env())
    try:
        _wait_listening(port, proc)
        body = b'{"inputs": []}'
        url = f"http://127.0.0.1:{port}/v2/models/m/infer"
        headers = {"Content-Type": "application/json"}
        run_wrk(url, body=body, headers=headers, connections=args.connections, seconds=1,
                threads=args.threads)  # warm-up
        cpu0, t0 = _cpu(proc.pid), time.monotonic()
        load = run_wrk(url, body=body, headers=headers, connections=args.connections, seconds=args.duration,
                       threads=args.threads)
        wall = time.monotonic() - t0
        return {"bench": "loops", "loops": loops, "where": where, "connections": args.connections,
                "requests_per_s": load.requests_per_s, "p50_ms": load.p50_ms, "p99_ms": load.p99_ms,
                "errors": load.errors, "server_cpu_cores": round((_cpu(proc.pid) - cpu0) / wall, 3),
                "pss_mb": round(_pss(proc.pid) / 2**20, 1),
                "generator_cpu_cores": round(load.generator_cpu_s / wall, 3), "threads": load.threads,
                "cpus": os.cpu_count()}
    finally:
        proc.kill()
        proc.wait()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve"]:
        _host(int(argv[1]), int(argv[2]), argv[3])
        return 0
    p = argparse.ArgumentParser(prog="python -m benchmarks.loops", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", help="write the records to this file (a JSON list)")
    p.add_argument("--loops", default="1,2", help="numbers of loops in private interpreters")
    p.add_argument("--connections", type=int, default=64)
    p.add_argument("--duration", type=int, default=5, help="seconds per point (wrk takes whole seconds)")
    p.add_argument("--threads", type=int, default=1, help="wrk threads (default %(default)s)")
    args = p.parse_args(argv)
    if not have_wrk():
        print("benchmarks.loops: needs wrk (apt-get install wrk; ./dev bench installs it)", file=sys.stderr)
        return 2
    records = [_point(1, "host", args)]
    print(json.dumps(records[-1]), flush=True)
    for k in (int(x) for x in args.loops.split(",")):
        records.append(_point(k, "private", args))
        print(json.dumps(records[-1]), flush=True)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(records, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
