"""Overload over HTTP: does admission hold the budget of what it admits, and keep throughput?

Starts `aserve serve` twice, one after the other, each on a temporary repository
holding a copy of the bundled `cnn` (2 private interpreters), its config overridden
to the window policy (the server's default: batches of up to max_batch_size, a 1 ms
window) and then to the adaptive policy (latency budget `--budget-ms`). Against the
window server it first measures the capacity (OK/s with `--connections` clients in
a closed loop), then drives each server for `--duration` seconds with Poisson
arrivals at `--factor` times that capacity (V2 binary tensor requests of one image, at
most `--connections` in flight: arrivals beyond wait in the client, and their latency
counts from the scheduled arrival). With `--closed`, `--connections` clients in a
closed loop instead: each sends its next request when its answer comes, or after a 503
once its Retry-After (whole seconds) has passed, as HTTP clients that honour it do
(`--ignore-retry-after`: at once, as clients that ignore it do; refusals then become
much of the server's work). A V2 request may carry a latency budget up to the model's
timeout (30 s unless `--timeout-ms`), so admission control refuses one from its head,
before its body is read, only where that timeout is at most `--budget-ms`; otherwise
only once the body says what budget it carries.
The client is a keep-alive HTTP/1.1 client of its
own on uvloop that sends one prepared request and reads only the status line, the
headers and the body's length: it shares the 2 cores with the server, and every
request it sends that the server refuses costs it as much as one it answers (aiohttp's
client on asyncio spent 0.36-0.5 cores at 3x the capacity, taken from the
interpreters; this one 0.17-0.21).

Prints JSON: per policy, the requests sent, answered 200 (OK/s over the drive), their
p50/p99 latency against the budget and the share within it (as the client saw it, from
the scheduled arrival and from the moment the request was handed to the connection, and
by the server's own duration histogram), the client's own delay in sending (the
generator shares the cores: its p99 says how much of the first figure is the
client's), 503s and how many carried Retry-After,
other 5xx (must be 0), other failures, the server's PSS before the drive, at its peak
(sampled every 0.25 s) and after it (`pss_mb`; `own_mb` the same less the shared
libraries' mappings, whose share moves when other processes map them), the cores its event loop, its other threads (the
interpreters) and the client used while the requests arrived, the event loop's CPU
milliseconds per answer and per 200 (and per 503, estimated where the same round has a
run without refusals to say what a 200 costs the loop), the batcher's counters
(mean queueing and batch time per request, requests per batch, layer joins, the
adaptive policy's state) and, per batch size, how many batches ran and their mean
milliseconds; and adaptive's OK/s over
each other policy's (`window-N`, the window policy held to batches of at most N, shows
what batches small enough for the budget serve without admission control; `adaptive-R`,
the adaptive policy with admission_reserve R, compares two reserves in one run). With
`--before PYTHON`, every policy also runs on the build that Python serves, at the same
offered load, keyed `POLICY@before`, the two builds' order alternating round by round;
each policy's OK/s over its run on that build is `POLICY_ok_per_s_over_before`. The exit
status is 1 when a policy answered another 5xx, a 503 without Retry-After, or its PSS
less libraries grew more than `--max-pss-growth-mb` over the drive (the queue is bounded: so is memory).

With `--budget-capacity`, each server first serves Poisson arrivals at rates a bisection
chooses, to find the largest it serves within the budget: the p99 from the scheduled
arrival within `--budget-ms`, a refusal counting as beyond it (MLPerf's server scenario;
Triton's perf_analyzer `--latency-threshold`). A model with a latency budget cannot be asked more
than that: the window policy's closed-loop throughput comes from batches whose p99 is
several budgets long. `adaptive_ok_per_s_over_budget_capacity` is adaptive's OK/s under
the drive over the largest such rate of its build's servers.

    .venv/bin/python loadtests/overload.py                 # about a minute and a half
    .venv/bin/python loadtests/overload.py --duration 5 --factor 3 --json out.json
    .venv/bin/python loadtests/overload.py --policies window,window-4,adaptive --rounds 3
    .venv/bin/python loadtests/overload.py --policies window,window-4,adaptive --closed
    .venv/bin/python loadtests/overload.py --policies window,adaptive --closed --connections 16 --ignore-retry-after
    .venv/bin/python loadtests/overload.py --closed --ignore-retry-after --rounds 2 --before ../base/python.sh
    .venv/bin/python loadtests/overload.py --closed --ignore-retry-after --connections 16 --budget-capacity

Both servers, the client and the interpreters share the machine's cores: on 2 cores
the figures move with whatever else runs, so compare the two policies within a run.
The client runs as a batch thread (SCHED_BATCH, `--client-sched normal` to leave it
be), the server as a normal process: a remote client never takes the server's CPU, and
one on the same cores that is woken by an answer preempted the server's event loop
thread in the middle of its callbacks (the answers the adaptive policy writes come
one by one, 1500 a second, not in batches of 30), which cost adaptive a tenth of its
throughput here (0.71 of the window's OK/s in one round against 0.77 in three).
The client's cyclic garbage collector is off while it drives (its thousands of pending
tasks made each full collection stall it for about 90 ms, charged to the requests
scheduled meanwhile).
"""

from __future__ import annotations

import argparse
import array
import asyncio
import collections
import contextlib
import gc
import json
import math
import os
import pathlib
import random
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, cast

import aiohttp
import psutil
import uvloop
from served import free_port, wait_ready

from aserve.runtime import memory

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODEL = "cnn"
SHAPE = (1, 3, 64, 64)


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=10.0, help="seconds of open-loop load per policy")
    ap.add_argument("--factor", type=float, default=3.0, help="offered rate as a multiple of the capacity")
    ap.add_argument("--capacity-seconds", type=float, default=4.0, help="closed-loop capacity measurement")
    ap.add_argument("--connections", type=int, default=256, help="most requests in flight (and capacity clients)")
    ap.add_argument("--budget-ms", type=float, default=50.0, help="the adaptive policy's latency budget")
    ap.add_argument("--timeout-ms", type=float,
                    help="the model's timeout_ms (default: its own, 30 s). A V2 request may carry a budget up to "
                         "it, so admission refuses a V2 head before its body only with a timeout at most the budget")
    ap.add_argument("--interpreters", type=int, default=2)
    ap.add_argument("--admission-reserve", type=float, help="the adaptive policy's admission_reserve (default: its own)")
    ap.add_argument("--policies", default="window,adaptive",
                    help="comma-separated: window, window-N (batches of at most N), adaptive, adaptive-R (with "
                         "admission_reserve R: two reserves compared in one run), join (adaptive, joining under "
                         "LBCI's budget rule); default %(default)s")
    ap.add_argument("--capacity", type=float, help="requests/s to take as the capacity instead of measuring it")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--serve-args", default="", help="more arguments for `aserve serve` (e.g. \"--spin-us 0\")")
    ap.add_argument("--client-sched", choices=("batch", "normal"), default="batch",
                    help="the client's scheduling policy (batch: its wake-ups never preempt the server)")
    ap.add_argument("--closed", action="store_true",
                    help="instead of Poisson arrivals: --connections clients in a closed loop that honour Retry-After")
    ap.add_argument("--ignore-retry-after", action="store_true",
                    help="with --closed: each client sends its next request at once after a 503")
    ap.add_argument("--max-pss-growth-mb", type=float, default=300.0,
                    help="largest growth of the server's PSS less libraries over a drive (peak minus before)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run everything this many times; the JSON then holds each round and the medians")
    ap.add_argument("--before", metavar="PYTHON",
                    help="also run every policy on the build this Python's `-m aserve.cli` serves (a script that "
                         "sets PYTHONPATH to another checkout and runs the venv's python, as for benchmarks.http): "
                         "its runs are keyed POLICY@before, at the same offered load, the two builds' order "
                         "alternating round by round")
    ap.add_argument("--budget-capacity", action="store_true",
                    help="also find, on each server before its drive, the largest Poisson rate it serves within "
                         "the budget (every request answered 200, p99 from the scheduled arrival within "
                         "--budget-ms), and report adaptive's OK/s over the largest such rate of its build")
    ap.add_argument("--budget-seconds", type=float, default=4.0, help="seconds of each --budget-capacity probe")
    ap.add_argument("--budget-steps", type=int, default=6, help="probes of the --budget-capacity bisection")
    ap.add_argument("--json", help="also write the result here")
    args = ap.parse_args(argv)
    if args.ignore_retry_after and not args.closed:
        ap.error("--ignore-retry-after is for the closed loop (--closed)")
    for policy in filter(None, args.policies.split(",")):
        kind, _, value = policy.partition("-")
        if kind not in ("window", "adaptive", "join") or (value and (kind == "join" or not _variant(kind, value))):
            ap.error(f"--policies: {policy!r} is none of window, window-N (N >= 1), adaptive, adaptive-R (0 <= R < 1), "
                     "join")
    return args


def _variant(kind: str, value: str) -> bool:
    """Whether `value` is a window-N's N or an adaptive-R's R."""
    try:
        return int(value) >= 1 if kind == "window" else 0.0 <= float(value) < 1.0
    except ValueError:
        return False


# ---- the servers ----


def repository(base: pathlib.Path, policy: str, budget_ms: float, reserve: float | None = None,
               timeout_ms: float | None = None) -> pathlib.Path:
    """A repository holding the bundled cnn with its [batching] table replaced (`window-N`:
    the window policy with max_batch_size N; `adaptive-R`: the adaptive policy with
    admission_reserve R, rather than `reserve`; `join`: the adaptive policy, its requests joining
    running batches at stage boundaries whenever every budget still holds)."""
    repo = base / policy
    shutil.copytree(ROOT / "examples" / MODEL, repo / MODEL, ignore=shutil.ignore_patterns("__pycache__"))
    config = repo / MODEL / "config.toml"
    head = config.read_text().split("[batching]")[0].rstrip()
    if policy.startswith(("adaptive", "join")):
        table = f'[batching]\npolicy = "adaptive"\nlatency_budget_ms = {budget_ms}\n'
        if policy == "join":
            table += 'layer_join = true\njoin_rule = "budget"\n'
        if policy.startswith("adaptive-"):
            reserve = float(policy.split("-", 1)[1])
        if reserve is not None:
            table += f"admission_reserve = {reserve}\n"
    else:
        table = '[batching]\npolicy = "window"\n'
        if policy.startswith("window-"):  # window-N: batches of at most N
            head = re.sub(r"(?m)^max_batch_size = \d+$", f"max_batch_size = {int(policy.split('-', 1)[1])}", head)
    if timeout_ms is not None:
        table += f"timeout_ms = {timeout_ms}\n"
    config.write_text(f"{head}\n\n{table}")
    return repo


SCHED_NAMES = {os.SCHED_OTHER: "normal", os.SCHED_BATCH: "batch"}


@contextlib.contextmanager
def scheduled(policy: str) -> Iterator[None]:
    """This thread (the client's loop) under `policy` ("batch" or "normal") meanwhile."""
    before = os.sched_getscheduler(0)
    os.sched_setscheduler(0, os.SCHED_BATCH if policy == "batch" else os.SCHED_OTHER, os.sched_param(0))
    try:
        yield
    finally:
        os.sched_setscheduler(0, before, os.sched_param(0))


class Server:
    """`aserve serve` in a child process, ready when the model is."""

    def __init__(self, repo: pathlib.Path, interpreters: int, extra: list[str] | None = None,
                 python: str = sys.executable) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - the server's output, closed in stop()
        self.proc = subprocess.Popen(
            # chrt: the normal scheduling policy, whatever the client's (util-linux)
            ["chrt", "--other", "0", python, "-m", "aserve.cli", "serve", str(repo), "--port",
             str(self.port), "--interpreters", str(interpreters), "--log-level", "warning", *(extra or [])],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
        )

    async def ready(self, session: aiohttp.ClientSession, timeout: float = 180.0) -> None:
        await wait_ready(session, f"{self.url}/v2/models/{MODEL}/ready", self.proc.poll, timeout=timeout, every=0.25,
                         output=self.output)

    def pss_mb(self) -> float:
        return float(psutil.Process(self.proc.pid).memory_full_info().pss) / 2**20

    def own_mb(self) -> float:
        """PSS less the shared libraries' mappings: what the server allocated and mapped itself.
        A library's PSS is divided with every other process that maps it, so it moves by tens
        to hundreds of MB when another torch process starts or exits, whatever the server does."""
        return memory.pss(self.proc.pid, libraries=False) / 2**20

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-4000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


async def within_budget_by_server(session: aiohttp.ClientSession, url: str, budget_us: float) -> tuple[int, int]:
    """(successful requests, of them at most `budget_us`) from the server's duration histogram."""
    async with session.get(f"{url}/metrics") as r:
        text = await r.text()
    count = within = 0
    for line in text.splitlines():
        if not line.startswith("aserve_inference_request_duration_us") or f'model="{MODEL}"' not in line:
            continue
        value = float(line.rsplit(" ", 1)[1])
        if line.startswith("aserve_inference_request_duration_us_count"):
            count = int(value)
        m = re.search(r'le="([^"]+)"', line)
        if m and m.group(1) != "+Inf" and float(m.group(1)) <= budget_us:
            within = max(within, int(value))
    return count, within


async def batcher_state(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """What /metrics says of the model's batcher (cumulative): mean queueing and batch
    time per request, requests per batch, refusals, and the adaptive policy's state."""
    async with session.get(f"{url}/metrics") as r:
        text = await r.text()
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or f'model="{MODEL}"' not in line or "{" not in line:
            continue
        name = line.split("{", 1)[0]
        if name.startswith(("aserve_batcher_", "aserve_batching_", "aserve_layer_joins", "aserve_inference_exec_count",
                            "aserve_inference_queue_duration", "aserve_inference_compute_duration")):
            values[name] = float(line.rsplit(" ", 1)[1])
    out: dict[str, float] = {}
    requests = values.get("aserve_batcher_requests_total", 0.0)
    if requests:
        out["queue_ms_mean"] = round(values.get("aserve_inference_queue_duration_us_total", 0.0) / requests / 1e3, 2)
        out["batch_ms_mean"] = round(values.get("aserve_inference_compute_duration_us_total", 0.0) / requests / 1e3, 2)
        out["requests_per_batch"] = round(requests / max(1.0, values.get("aserve_inference_exec_count_total", 1.0)), 2)
    if "aserve_layer_joins_total" in values:
        out["joins"] = values["aserve_layer_joins_total"]
    for name, value in values.items():
        if name.startswith("aserve_batching_") and name != "aserve_batching_interpreters":
            out[name.removeprefix("aserve_batching_")] = round(value, 4)
    return out


async def batch_sizes(session: aiohttp.ClientSession, url: str) -> dict[str, list[float]]:
    """Per batch size: how many batches ran and their mean milliseconds (the statistics
    extension's batch_stats)."""
    async with session.get(f"{url}/v2/models/{MODEL}/stats") as r:
        body = await r.json()
    out: dict[str, list[float]] = {}
    for s in body["model_stats"][0]["batch_stats"]:
        count = int(s["compute_infer"]["count"])
        out[str(s["batch_size"])] = [count, round(s["compute_infer"]["ns"] / max(1, count) / 1e6, 2)]
    return out


# ---- the client ----


def request(port: int) -> bytes:
    """A V2 binary-tensor request of one image, as it goes on the wire."""
    raw = array.array("f", ((i % 251) / 251.0 for i in range(math.prod(SHAPE)))).tobytes()
    header = json.dumps({"inputs": [{"name": "IMAGE", "datatype": "FP32", "shape": list(SHAPE),
                                     "parameters": {"binary_data_size": len(raw)}}]}).encode()
    head = (f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Type: application/octet-stream\r\nInference-Header-Content-Length: {len(header)}\r\n"
            f"Content-Length: {len(header) + len(raw)}\r\n\r\n")
    return head.encode() + header + raw


class Tally:
    def __init__(self) -> None:
        self.ok: list[float] = []  # latency of each 200, from its scheduled arrival
        self.sent_ok: list[float] = []  # latency of each 200, from the moment it was sent
        self.lag: list[float] = []  # how late the client sent each request (scheduled arrival to send)
        self.ok_at: list[float] = []  # when each 200 came back
        self.refused = 0
        self.retry_after = 0
        self.other_5xx: dict[int, int] = {}
        self.other: dict[str, int] = {}


class Answer(NamedTuple):
    status: int
    retry_after: float | None  # its Retry-After in seconds (None: it had none)
    body: bytes


class Connection(asyncio.Protocol):
    """One keep-alive connection: writes a request, parses the response's head and
    Content-Length body (the server always sends one), hands it to the waiting future."""

    def __init__(self, lost: Callable[[Connection], None]) -> None:
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[Answer] | None = None
        self.buf = b""
        self.head: tuple[int, float | None, int, bool] | None = None  # status, Retry-After, body length, close
        self.closed = False
        self._lost = lost

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's does not subclass it

    def send(self, data: bytes) -> asyncio.Future[Answer]:
        assert self.transport is not None and self.waiter is None
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        return self.waiter

    def data_received(self, data: bytes) -> None:
        self.buf = self.buf + data if self.buf else data
        while True:
            if self.head is None:
                end = self.buf.find(b"\r\n\r\n")
                if end < 0:
                    return
                lines = self.buf[:end].decode("latin-1").split("\r\n")
                fields = {}
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    fields[name.strip().lower()] = value.strip()
                retry_field = fields.get("retry-after")
                self.head = (int(lines[0].split(" ", 2)[1]), None if retry_field is None else float(retry_field),
                             int(fields.get("content-length", "0")), fields.get("connection", "").lower() == "close")
                self.buf = self.buf[end + 4:]
            status, retry, length, close = self.head
            if len(self.buf) < length:
                return
            body, self.buf, self.head = self.buf[:length], self.buf[length:], None
            waiter, self.waiter = self.waiter, None
            if waiter is not None and not waiter.done():
                waiter.set_result(Answer(status, retry, body))
            if close and self.transport is not None:
                self.transport.close()
            if not self.buf:
                return

    def connection_lost(self, exc: BaseException | None) -> None:
        self.closed = True
        self.transport = None
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(ConnectionResetError(f"the server closed the connection: {exc}"))
        self._lost(self)


class Client:
    """At most `limit` keep-alive connections to 127.0.0.1:`port`; a request beyond them
    waits (first come, first served) for one to come free."""

    def __init__(self, port: int, limit: int) -> None:
        self.port = port
        self.limit = limit
        self.idle: list[Connection] = []
        self.open = 0
        self.waiting: collections.deque[asyncio.Future[Connection | None]] = collections.deque()

    def _lost(self, conn: Connection) -> None:
        if conn in self.idle:
            self.idle.remove(conn)
        self.open -= 1
        if self.waiting:  # a place came free: the next in line opens a connection
            waiter = self.waiting.popleft()
            if not waiter.done():
                self.open += 1
                waiter.set_result(None)

    async def acquire(self) -> Connection:
        if self.idle:
            return self.idle.pop()
        if self.open < self.limit:
            self.open += 1
            conn = None
        else:
            waiter: asyncio.Future[Connection | None] = asyncio.get_running_loop().create_future()
            self.waiting.append(waiter)
            conn = await waiter
        if conn is None:  # counted in `open` already
            try:
                _, conn = await asyncio.get_running_loop().create_connection(
                    lambda: Connection(self._lost), "127.0.0.1", self.port)
            except OSError:
                self.open -= 1
                raise
        return conn

    def release(self, conn: Connection) -> None:
        if conn.closed:
            return
        while self.waiting:
            waiter = self.waiting.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        self.idle.append(conn)

    async def post(self, data: bytes, sent: Callable[[], None] | None = None) -> Answer:
        conn = await self.acquire()
        while conn.transport is None or conn.transport.is_closing():  # the server closed it while idle
            conn = await self.acquire()
        if sent is not None:
            sent()
        answer = await conn.send(data)
        self.release(conn)
        return answer

    def close(self) -> None:
        for conn in self.idle:
            if conn.transport is not None:
                conn.transport.close()
        self.idle.clear()


async def one(client: Client, data: bytes, tally: Tally, at: float) -> None:
    loop = asyncio.get_running_loop()
    sent = at

    def on_send() -> None:
        nonlocal sent
        sent = loop.time()
        tally.lag.append(sent - at)

    try:
        answer = await client.post(data, on_send)
    except OSError as e:
        tally.other[type(e).__name__] = tally.other.get(type(e).__name__, 0) + 1
        return
    done = loop.time()
    status = answer.status
    if status == 200:
        if not answer.body.startswith(b"{") or b'"outputs"' not in answer.body:
            tally.other["200 without outputs"] = tally.other.get("200 without outputs", 0) + 1
            return
        tally.ok.append(done - at)
        tally.sent_ok.append(done - sent)
        tally.ok_at.append(done)
    elif status == 503:
        tally.refused += 1
        tally.retry_after += answer.retry_after is not None
    elif status >= 500:
        tally.other_5xx[status] = tally.other_5xx.get(status, 0) + 1
    else:
        tally.other[str(status)] = tally.other.get(str(status), 0) + 1


async def capacity(client: Client, connections: int, seconds: float) -> float:
    """OK/s with `connections` clients in a closed loop."""
    data = request(client.port)
    loop = asyncio.get_running_loop()
    stop = loop.time() + seconds
    done = 0

    async def closed_loop() -> None:
        nonlocal done
        while loop.time() < stop:
            answer = await client.post(data)
            done += answer.status == 200  # not `done += await ...`: that reads `done` before the wait

    start = loop.time()
    await asyncio.gather(*(closed_loop() for _ in range(connections)))
    return done / (loop.time() - start)


async def drive(client: Client, rate: float, seconds: float, seed: int) -> tuple[Tally, int, float]:
    """Poisson arrivals at `rate` for `seconds`; waits for every answer. (tally, sent, span)"""
    data = request(client.port)
    loop = asyncio.get_running_loop()
    rng = random.Random(seed)
    tally = Tally()
    tasks = []
    gc.collect()
    gc.disable()  # see the module doc: the generator must not stall itself
    try:
        start = loop.time()
        t = 0.0
        while True:
            t += rng.expovariate(rate)
            if t >= seconds:
                break
            delay = start + t - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(one(client, data, tally, start + t)))
        await asyncio.gather(*tasks)
    finally:
        gc.enable()
    return tally, len(tasks), seconds


async def budget_capacity(client: Client, top: float, budget_ms: float, seconds: float, steps: int,
                          seed: int) -> dict[str, Any]:
    """The largest Poisson rate (requests/s) the server serves within the budget: the p99 of
    the requests' latency from the scheduled arrival at most `budget_ms`, a refusal or failure
    counting as beyond it (so at most 1% of them). A bisection between 0 and `top` (the server's
    closed-loop throughput: no rate above it can be served) over `steps` drives of `seconds`,
    as MLPerf's server scenario and perf_analyzer's --latency-threshold define a server's
    capacity under a latency bound. {"rps": the rate, "probes": each drive's rate, answers, p99}"""
    lo, hi = 0.0, top
    probes = []
    for step in range(steps):
        rate = (lo + hi) / 2
        tally, sent, _ = await drive(client, rate, seconds, seed + 1000 + step)
        latencies = sorted(tally.ok) + [math.inf] * (sent - len(tally.ok))
        p99 = latencies[max(0, math.ceil(0.99 * len(latencies)) - 1)] if latencies else math.inf
        meets = p99 <= budget_ms / 1e3
        probes.append({"rate": round(rate, 1), "sent": sent, "ok": len(tally.ok), "refused_503": tally.refused,
                       "p99_ms": round(1e3 * p99, 1) if p99 < math.inf else None, "within": meets})
        if meets:
            lo = rate
        else:
            hi = rate
    return {"rps": round(lo, 1), "top_rps": round(top, 1), "probes": probes}


def cpu_seconds(pid: int) -> dict[str, float]:
    """CPU seconds so far of the server's event loop (its main thread), of its other
    threads (the interpreters, mostly) and of this client."""
    proc = psutil.Process(pid)
    loop = other = 0.0
    for t in proc.threads():
        if t.id == pid:
            loop += t.user_time + t.system_time
        else:
            other += t.user_time + t.system_time
    own = psutil.Process().cpu_times()
    return {"server_loop": loop, "server_other_threads": other, "client": own.user + own.system}


async def cpu_over(pid: int, seconds: float, out: dict[str, float], spent: dict[str, float]) -> None:
    """Fill `out` with the cores each part used over the next `seconds` (the arrivals), and
    `spent` with the CPU seconds."""
    before, began = cpu_seconds(pid), time.monotonic()
    await asyncio.sleep(seconds)
    after, span = cpu_seconds(pid), time.monotonic() - began
    out.update({k: round((after[k] - before[k]) / span, 3) for k in after})
    spent.update({k: after[k] - before[k] for k in after})


def loop_cpu(spent_s: float, r: dict[str, Any]) -> dict[str, float | None]:
    """The server loop's CPU milliseconds per answer and per 200 over a drive (`spent_s` of
    it while the requests arrived; answers that came after count too, so it is a bound
    from below for the open loop's stragglers)."""
    answers = r["ok"] + r["refused_503"] + r["other_5xx"] + sum(r["other_failures"].values())
    ms = 1e3 * spent_s
    return {"total_ms": round(ms, 1), "per_answer_ms": round(ms / answers, 4) if answers else None,
            "per_ok_ms": round(ms / r["ok"], 4) if r["ok"] else None}


def refusal_cpu(policies: dict[str, Any]) -> None:
    """Per run with 503s, the loop's CPU per 503, estimated where a run of the same round had
    none (window, usually): its CPU per 200 is taken for this run's 200s, and the rest of
    the loop's CPU shared by the 503s. A 200 costs the loop more or less under another
    policy (other batch sizes): an estimate, named with the run it leans on."""
    base = next((name for name, r in policies.items() if r["refused_503"] == 0 and r["loop_cpu"]["per_ok_ms"]),
                None)
    if base is None:
        return
    per_ok = policies[base]["loop_cpu"]["per_ok_ms"]
    for r in policies.values():
        if r["refused_503"]:
            cpu = r["loop_cpu"]
            cpu["per_refused_ms_est"] = round(max(0.0, cpu["total_ms"] - per_ok * r["ok"]) / r["refused_503"], 4)
            cpu["per_ok_ms_from"] = base


async def drive_closed(client: Client, seconds: float, clients: int,
                       honour_retry_after: bool = True) -> tuple[Tally, int, float]:
    """`clients` clients in a closed loop for `seconds`: each sends its next request as soon
    as its answer comes, or, after a 503, once the Retry-After it carries has passed (as
    HTTP clients that honour it do; not `honour_retry_after`: at once). Latency counts from
    the send. (tally, sent, span)"""
    data = request(client.port)
    loop = asyncio.get_running_loop()
    tally = Tally()
    sent = 0
    start = loop.time()
    stop = start + seconds

    async def closed_loop() -> None:
        nonlocal sent
        while loop.time() < stop:
            began = loop.time()
            sent += 1
            tally.lag.append(0.0)
            try:
                answer = await client.post(data)
            except OSError as e:
                tally.other[type(e).__name__] = tally.other.get(type(e).__name__, 0) + 1
                continue
            done = loop.time()
            if answer.status == 200:
                tally.ok.append(done - began)
                tally.sent_ok.append(done - began)
                tally.ok_at.append(done)
            elif answer.status == 503:
                tally.refused += 1
                if answer.retry_after is not None:
                    tally.retry_after += 1
                    if honour_retry_after:
                        await asyncio.sleep(min(answer.retry_after, max(0.0, stop - loop.time())))
            elif answer.status >= 500:
                tally.other_5xx[answer.status] = tally.other_5xx.get(answer.status, 0) + 1
            else:
                tally.other[str(answer.status)] = tally.other.get(str(answer.status), 0) + 1

    gc.collect()
    gc.disable()
    try:
        await asyncio.gather(*(closed_loop() for _ in range(clients)))
    finally:
        gc.enable()
    return tally, sent, seconds


async def watch_pss(server: Server, peak: list[float], own_peak: list[float]) -> None:
    """Sample the server's PSS, with and without its libraries, every 0.25 s until cancelled."""
    while True:
        await asyncio.sleep(0.25)
        peak.append(await asyncio.to_thread(server.pss_mb))
        own_peak.append(await asyncio.to_thread(server.own_mb))


def problems(result: dict[str, Any], max_pss_growth_mb: float) -> list[str]:
    """What breaks overload's promises in a run: other 5xx, a 503 without Retry-After, memory that grows."""
    out = []
    for policy, r in result["policies"].items():
        if r["other_5xx"]:
            out.append(f"{policy}: {r['other_5xx']} other 5xx ({r['other_5xx_by_status']})")
        if r["refused_503_with_retry_after"] != r["refused_503"]:
            out.append(f"{policy}: {r['refused_503'] - r['refused_503_with_retry_after']} 503s without Retry-After")
        own = r.get("own_mb")
        if own and own["peak"] - own["before"] > max_pss_growth_mb:
            out.append(f"{policy}: PSS less libraries grew {own['peak'] - own['before']:.0f} MiB over the drive "
                       f"(more than {max_pss_growth_mb:g})")
    return out


def summary(tally: Tally, sent: int, seconds: float, budget_ms: float, server: tuple[int, int] | None,
            start: float) -> dict[str, Any]:
    lat = sorted(tally.ok)
    n = len(lat)
    in_window = sum(1 for t in tally.ok_at if t <= start + seconds)

    def pct(q: float, values: list[float] = lat) -> float | None:
        return round(1e3 * values[max(0, math.ceil(q / 100 * len(values)) - 1)], 1) if values else None

    from_send = sorted(tally.sent_ok)
    lag = sorted(tally.lag)

    out: dict[str, Any] = {
        "sent": sent,
        "offered_rps": round(sent / seconds, 1),
        "ok": n,
        "ok_per_s": round(in_window / seconds, 1),
        "admitted_p50_ms": pct(50),
        "admitted_p99_ms": pct(99),
        "admitted_mean_ms": round(1e3 * statistics.fmean(lat), 1) if n else None,
        "admitted_from_send_p50_ms": pct(50, from_send),
        "admitted_from_send_p99_ms": pct(99, from_send),
        "client_send_lag_p99_ms": pct(99, lag),
        "budget_ms": budget_ms,
        "within_budget": round(sum(1 for x in lat if x <= budget_ms / 1e3) / n, 4) if n else None,
        "within_budget_from_send": round(sum(1 for x in from_send if x <= budget_ms / 1e3) / n, 4) if n else None,
        "refused_503": tally.refused,
        "refused_503_with_retry_after": tally.retry_after,
        "other_5xx": sum(tally.other_5xx.values()),
        "other_5xx_by_status": tally.other_5xx,
        "other_failures": tally.other,
    }
    if server is not None:
        count, within = server
        out["server_ok"] = count
        out["server_within_budget"] = round(within / count, 4) if count else None
    return out


BEFORE = "@before"  # the suffix of the runs on the `--before` build


async def run(args: argparse.Namespace, round_index: int = 0) -> dict[str, Any]:
    """One round: every policy on this build, and on `--before`'s when given (first in the odd
    rounds); the capacity (open loop) is measured on the round's first server."""
    builds = [("", sys.executable)] + ([(BEFORE, args.before)] if args.before else [])
    if round_index % 2:
        builds.reverse()
    runs = [(policy, suffix, python) for suffix, python in builds for policy in args.policies.split(",") if policy]
    results: dict[str, Any] = {"model": MODEL, "interpreters": args.interpreters,
                               "load": "closed" if args.closed else "poisson",
                               "factor": None if args.closed else args.factor,
                               "ignore_retry_after": args.ignore_retry_after, "timeout_ms": args.timeout_ms,
                               "duration_s": args.duration, "connections": args.connections,
                               "client_sched": args.client_sched,
                               "loadavg_1m_start": os.getloadavg()[0], "policies": {}}
    rate: float | None = None  # offered requests/s, from the capacity measured on the first server
    timeout = aiohttp.ClientTimeout(total=120)
    with tempfile.TemporaryDirectory(prefix="aserve-overload-") as tmp:
        for policy, suffix, python in runs:
            server = Server(repository(pathlib.Path(tmp) / f"build{suffix}", policy, args.budget_ms,
                                       args.admission_reserve, args.timeout_ms),
                            args.interpreters,
                            shlex.split(args.serve_args), python)
            name = policy + suffix
            try:
                client = Client(server.port, args.connections)
                async with aiohttp.ClientSession(timeout=timeout) as session:
                    await server.ready(session)
                    if rate is None and not args.closed:
                        cap = args.capacity or await capacity(client, min(args.connections, 64), args.capacity_seconds)
                        results["capacity_rps"] = round(cap, 1)
                        results["capacity_measured_on"] = name if args.capacity is None else "given"
                        rate = args.factor * cap
                    searched = None
                    if args.budget_capacity:
                        top = await capacity(client, min(args.connections, 64), args.capacity_seconds)
                        searched = await budget_capacity(client, top, args.budget_ms, args.budget_seconds,
                                                         args.budget_steps, args.seed)
                        print(f"# {name}: within budget {json.dumps(searched)}", file=sys.stderr, flush=True)
                    # the probes above answered requests too: the server's counts of the drive start here
                    probed = await within_budget_by_server(session, server.url, args.budget_ms * 1e3)
                    loop = asyncio.get_running_loop()
                    start = loop.time()
                    before, own_before = server.pss_mb(), server.own_mb()
                    peak, own_peak = [before], [own_before]
                    watch = asyncio.ensure_future(watch_pss(server, peak, own_peak))
                    cores: dict[str, float] = {}
                    spent: dict[str, float] = {}
                    split = asyncio.ensure_future(cpu_over(server.proc.pid, args.duration, cores, spent))
                    try:
                        if args.closed:
                            tally, sent, seconds = await drive_closed(client, args.duration, args.connections,
                                                                      not args.ignore_retry_after)
                        else:
                            assert rate is not None, "the open loop measured the capacity first"
                            tally, sent, seconds = await drive(client, rate, args.duration, args.seed)
                    finally:
                        watch.cancel()
                        client.close()
                    await split
                    answered, in_budget = await within_budget_by_server(session, server.url, args.budget_ms * 1e3)
                    counts = (answered - probed[0], in_budget - probed[1])
                    results["policies"][name] = summary(tally, sent, seconds, args.budget_ms, counts, start)
                    results["policies"][name]["pss_mb"] = {
                        "before": round(before, 1), "peak": round(max(peak), 1), "after": round(server.pss_mb(), 1)}
                    results["policies"][name]["own_mb"] = {
                        "before": round(own_before, 1), "peak": round(max(own_peak), 1),
                        "after": round(server.own_mb(), 1)}
                    if searched is not None:
                        results["policies"][name]["budget_capacity"] = searched
                    results["policies"][name]["batcher"] = await batcher_state(session, server.url)
                    results["policies"][name]["batch_sizes"] = await batch_sizes(session, server.url)
                    results["policies"][name]["cores"] = cores
                    results["policies"][name]["loop_cpu"] = loop_cpu(spent["server_loop"], results["policies"][name])
                    results["policies"][name]["server_loop_sched"] = SCHED_NAMES.get(
                        os.sched_getscheduler(server.proc.pid), "other")
                    print(f"# {name}: {json.dumps(results['policies'][name])}", file=sys.stderr, flush=True)
            finally:
                server.stop()
    results["loadavg_1m_end"] = os.getloadavg()[0]
    got = results["policies"]
    for suffix in ("", BEFORE) if args.before else ("",):  # each build's runs against its own
        built = {name: r for name, r in got.items() if name.endswith(BEFORE) == bool(suffix)}
        refusal_cpu(built)
        adaptive = built.get("adaptive" + suffix)
        tag = suffix.replace("@", "_")  # the build's suffix in the result's keys
        for name, r in built.items():
            if adaptive is not None and r is not adaptive and r["ok_per_s"]:
                policy = name.removesuffix(suffix).replace("-", "_")
                results[f"adaptive_ok_per_s_over_{policy}{tag}"] = round(adaptive["ok_per_s"] / r["ok_per_s"], 3)
        within = max((r["budget_capacity"]["rps"] for r in built.values() if "budget_capacity" in r), default=None)
        if within is not None:
            results[f"budget_capacity_rps{tag}"] = within
            if adaptive is not None and within > 0:
                results[f"adaptive_ok_per_s_over_budget_capacity{tag}"] = round(adaptive["ok_per_s"] / within, 3)
    for name, r in got.items():  # this build over the one before, policy by policy
        before = got.get(name + BEFORE)
        if before is not None and before["ok_per_s"]:
            results[f"{name.replace('-', '_')}_ok_per_s_over_before"] = round(r["ok_per_s"] / before["ok_per_s"], 3)
    return results


MEDIAN_FIELDS = ("ok_per_s", "admitted_p50_ms", "admitted_p99_ms", "within_budget", "server_within_budget")


def medians(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per policy, the median over rounds of each of MEDIAN_FIELDS, of the cores and of the
    loop's CPU per answer; and of each *_ok_per_s_over_* ratio (each taken within its round)
    and each build's capacity within the budget."""
    out: dict[str, Any] = {}
    for policy in rounds[0]["policies"]:
        runs = [r["policies"][policy] for r in rounds]
        entry = {k: statistics.median(x[k] for x in runs) for k in MEDIAN_FIELDS
                 if all(x.get(k) is not None for x in runs)}
        entry["cores"] = {k: round(statistics.median(x["cores"][k] for x in runs), 3) for k in runs[0]["cores"]}
        entry["loop_cpu"] = {k: round(statistics.median(x["loop_cpu"][k] for x in runs), 4)
                             for k, v in runs[0]["loop_cpu"].items()
                             if isinstance(v, float) and all(isinstance(x["loop_cpu"].get(k), float) for x in runs)}
        out[policy] = entry
    for key in rounds[0]:
        if "_ok_per_s_over_" in key or key.startswith("budget_capacity_rps"):
            out[key] = round(statistics.median(r[key] for r in rounds), 3)
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    with scheduled(args.client_sched):
        rounds = [uvloop.run(run(args, i)) for i in range(args.rounds)]  # the client's loop, as cheap as the server's
    result = rounds[0] if len(rounds) == 1 else {"rounds": rounds, "medians": medians(rounds)}
    text = json.dumps(result, indent=2)
    if args.json:
        pathlib.Path(args.json).write_text(text + "\n")
    print(text)
    bad = [line for r in rounds for line in problems(r, args.max_pss_growth_mb)]
    for line in bad:
        print(f"# {line}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
