"""Hostile clients beside well-behaved ones: do the well-behaved keep their latency, and the server its memory?

Starts `aserve serve` on the bundled examples (or the repository given) with `--api-token`,
free HTTP and gRPC ports, its default settings otherwise (on 2 CPUs: two front loops) and
`ASERVE_LOG_LEVEL=warning`, plus `--serve-args`. Well-behaved load: `simple` V2 JSON infer
requests with the token over `--connections` keep-alive connections, each waiting
connections/`--rate` seconds after an answer before its next request (so at most `--rate`
requests/s), measured in windows of `--window-seconds`: requests, errors (non-2xx and
socket errors), p50 and p99. The generator is wrk when it is installed (paced with its Lua
`delay()`, one wrk run per window), else a keep-alive client of raw sockets on this
process's loop (uvloop when run as a script) that paces and measures the same way; the
JSON says which ran. First `--quiet-seconds` of the well-behaved load alone (its p99 is the
baseline), then `--minutes` of it in windows back to back while hostile clients run in a
process of their own (multiprocessing, its own uvloop), each kind a loop at its own rate:

- slowloris: `--slowloris` connections that each send a partial request head and one more
  header byte every `--slowloris-interval` seconds; when the server answers one (408 at
  its `--request-timeout`, 60 s by default) and closes it, another opens;
- abandoned gRPC streams: a ModelStreamInfer with the token, one request written, then
  cancelled without reading, `--abandon-rate` per second;
- a stream that never reads: one ModelStreamInfer writing `--never-read-rate` requests a
  second (0: as fast as gRPC lets it) and reading no answer, its window HTTP/2's first
  64 KiB (the client takes in no more answers than that), cancelled after
  `--never-read-seconds`, then the next; the server reads no more while 32 answers wait, so
  the writes must be held (flow control). Not reading is what is hostile here: a client that
  writes as fast as the server answers is load as any other, and on 2 CPUs takes the
  well-behaved clients' share whether it reads or not;
- bombs, rotating at `--bomb-rate` per second: a gzip bomb (an infer POST with the token
  whose gzip body inflates to `--gzip-bomb-mib` 512 MiB of zeros: 413), a trailer bomb (a
  chunked GET /v2/health/live whose trailer is 1 MiB of empty `a:` fields: 431), a head of
  62 KB of empty `a:` fields (431), an unauthenticated gRPC ModelInfer of 48 MiB
  (UNAUTHENTICATED; at most one every `--grpc-bomb-seconds`) and an infer POST announcing
  `Content-Length: 50331648` without the token (401 from the head);
- clients that leave mid-body: an infer head with the token and half its body, then a
  FIN (the server must close without an answer) or, alternately, an RST (SO_LINGER 0),
  `--leaver-rate` per second.

Every `--sample-seconds` from the start of the quiet phase to the end of the mixed one it
samples the server process's RSS, open descriptors and threads (psutil), and once more
`--after-seconds` after the hostile clients have gone. Then SIGTERM, and the server's
exit status.

Prints JSON: the command lines, the generator, every window (quiet and mixed), each
hostile kind's count and what the server answered (statuses, gRPC codes, closes; those
not expected counted apart), the samples, the server's ERROR records (counted, and the
log's tail), and the verdicts: (i) after the first
`--settle-minutes` of the mixed phase, RSS and descriptors grow at most
`--growth-tolerance` (the median of the three samples around that mark against the median
of the last three), (ii) every mixed window's p99 within `--p99-ratio` of the quiet p99
(the worst and the median window's ratio are reported), (iii) no well-behaved error, (iv)
every hostile kind ran and was answered as expected, (v) the server exited 0. The exit
status is 1 when a verdict fails. `--out DIR` writes the JSON (`hostile.json`) and a plot
(`hostile.png`: RSS and descriptors over time, each window's p99 against the quiet
baseline and the `--p99-ratio` line; matplotlib, the `bench` extra) there.

On demand, not in CI (it takes `--minutes` plus the quiet phase, and its latency figures
mean something only on a quiet machine):

    .venv/bin/python loadtests/hostile.py --out benchmarks/results/hostile    # about 12 minutes
    .venv/bin/python loadtests/hostile.py --minutes 0.5 --quiet-seconds 10
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import importlib
import importlib.util
import json
import math
import multiprocessing
import os
import pathlib
import random
import shlex
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Awaitable, Callable
from multiprocessing.connection import Connection as Pipe
from multiprocessing.synchronize import Event
from types import ModuleType
from typing import Any, cast

import aiohttp
import grpc
import psutil
import uvloop
from overload import Connection as KeepAlive  # one keep-alive connection's requests and answers, parsed
from served import free_port, wait_ready

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
MODEL = "simple"
TOKEN = "hostile-load-test-token"  # the well-behaved clients' (and some hostile ones')
INFER = "/inference.GRPCInferenceService/ModelInfer"
STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"
KINDS = ("slowloris", "abandoned_stream", "never_reading_stream", "gzip_bomb", "trailer_bomb", "head_bomb",
         "grpc_bomb", "length_bomb", "leaver_fin", "leaver_rst")
# what the server must answer each kind with: an HTTP status, a gRPC code, or "closed" (EOF, no
# answer). A client-side cancel ends the streams (CANCELLED, the server having ended none of them
# first; a never-reading stream's writes held for its last second), and an RST leaves nothing to
# observe ("reset sent")
EXPECTED = {"slowloris": {"408"}, "abandoned_stream": {"CANCELLED"},
            "never_reading_stream": {"CANCELLED, held", "cut short by the end of the run"},
            "gzip_bomb": {"413"}, "trailer_bomb": {"431"}, "head_bomb": {"431"}, "grpc_bomb": {"UNAUTHENTICATED"},
            "length_bomb": {"401"}, "leaver_fin": {"closed"}, "leaver_rst": {"reset sent"}}
BOMBS = ("gzip_bomb", "trailer_bomb", "head_bomb", "grpc_bomb", "length_bomb")


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("repository", nargs="?", help="model repository (default: the bundled examples)")
    ap.add_argument("--minutes", type=float, default=10.0, help="length of the mixed phase")
    ap.add_argument("--quiet-seconds", type=float, default=60.0,
                    help="well-behaved load alone before the mixed phase: its p99 is the baseline")
    ap.add_argument("--window-seconds", type=float, default=30.0, help="each measured window of the mixed phase")
    ap.add_argument("--rate", type=float, default=2000.0,
                    help="well-behaved requests/s at most: each connection waits connections/rate s after an answer")
    ap.add_argument("--connections", type=int, default=8, help="well-behaved keep-alive connections")
    ap.add_argument("--generator", choices=("auto", "wrk", "python"), default="auto",
                    help="the well-behaved load's generator (auto: wrk when installed)")
    ap.add_argument("--wrk-threads", type=int, default=1)
    ap.add_argument("--client-timeout", type=float, default=5.0,
                    help="seconds a well-behaved request may take before it counts as a socket error (wrk's --timeout)")
    ap.add_argument("--slowloris", type=int, default=200, help="slowloris connections held open (0: none)")
    ap.add_argument("--slowloris-interval", type=float, default=5.0,
                    help="seconds between a slowloris connection's header bytes (each +-50%%)")
    ap.add_argument("--abandon-rate", type=float, default=20.0, help="abandoned gRPC streams per second (0: none)")
    ap.add_argument("--never-read-seconds", type=float, default=150.0,
                    help="how long each never-reading stream writes before it is cancelled (0: none)")
    ap.add_argument("--never-read-rate", type=float, default=200.0,
                    help="requests per second a never-reading stream writes (0: as fast as gRPC lets it)")
    ap.add_argument("--bomb-rate", type=float, default=2.0, help="bombs per second, the kinds in rotation (0: none)")
    ap.add_argument("--grpc-bomb-seconds", type=float, default=10.0, help="at most one gRPC bomb this often")
    ap.add_argument("--gzip-bomb-mib", type=int, default=512, help="what the gzip bomb inflates to")
    ap.add_argument("--grpc-bomb-mib", type=int, default=48, help="the unauthenticated gRPC message's size")
    ap.add_argument("--leaver-rate", type=float, default=50.0,
                    help="clients that leave mid-body, per second (0: none)")
    ap.add_argument("--leaver-pause", type=float, default=0.05,
                    help="seconds a leaver waits after its half body before it leaves")
    ap.add_argument("--answer-timeout", type=float, default=30.0,
                    help="seconds a hostile client waits for its answer before it counts a timeout")
    ap.add_argument("--sample-seconds", type=float, default=5.0, help="the server's RSS and descriptors, this often")
    ap.add_argument("--after-seconds", type=float, default=5.0,
                    help="one more sample this long after the hostile clients have gone")
    ap.add_argument("--settle-minutes", type=float, default=1.0,
                    help="growth is measured from this far into the mixed phase (at most half of it)")
    ap.add_argument("--growth-tolerance", type=float, default=0.05, help="largest RSS and descriptor growth")
    ap.add_argument("--p99-ratio", type=float, default=2.0,
                    help="largest ratio of a mixed window's p99 to the quiet phase's")
    ap.add_argument("--serve-args", default="", help='more arguments for `aserve serve` (e.g. "--request-timeout 5")')
    ap.add_argument("--ready-timeout", type=float, default=300.0)
    ap.add_argument("--stop-timeout", type=float, default=120.0, help="seconds the server may take to exit")
    ap.add_argument("--out", type=pathlib.Path, help="folder for hostile.json and hostile.png")
    args = ap.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    for name in ("minutes", "window_seconds", "rate", "sample_seconds"):
        if getattr(args, name) <= 0:
            ap.error(f"--{name.replace('_', '-')} must be positive")
    if args.connections < 1:
        ap.error("--connections must be at least 1")
    return args


# ---- requests ----


def infer_body() -> bytes:
    inputs = [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": list(range(16))},
              {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [1] * 16}]
    return json.dumps({"inputs": inputs}, separators=(",", ":")).encode()


def infer_head(port: int, length: int, *, token: bool = True, extra: str = "") -> bytes:
    auth = f"Authorization: Bearer {TOKEN}\r\n" if token else ""
    return (f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{auth}"
            f"Content-Type: application/json\r\n{extra}Content-Length: {length}\r\n\r\n").encode()


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def grpc_infer(request_id: str) -> bytes:
    """A serialized inference.ModelInferRequest for `simple` (raw INT32 contents)."""
    message = _field(1, MODEL.encode()) + _field(3, request_id.encode())
    for name in ("INPUT0", "INPUT1"):
        shape = _varint(1) + _varint(16)  # packed repeated int64
        message += _field(5, _field(1, name.encode()) + _field(2, b"INT32") + _field(3, shape))
    message += _field(7, struct.pack("<16i", *range(16))) + _field(7, struct.pack("<16i", *[1] * 16))
    return message


def grpc_bomb(mib: int) -> bytes:
    """A ModelInferRequest for `simple` holding one raw input of `mib` MiB."""
    return _field(1, MODEL.encode()) + _field(7, bytes(mib << 20))


def gzip_bomb(mib: int) -> bytes:
    """`mib` MiB of zeros, gzipped (512 MiB: about 520 KB)."""
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = bytes(1 << 20)
    return b"".join([z.compress(block) for _ in range(mib)] + [z.flush()])


def bombs(port: int, gzip_mib: int) -> dict[str, bytes]:
    """The HTTP bombs as they go on the wire."""
    gz = gzip_bomb(gzip_mib)
    host = f"Host: 127.0.0.1:{port}\r\n"
    return {
        "gzip_bomb": infer_head(port, len(gz), extra="Content-Encoding: gzip\r\n") + gz,
        "trailer_bomb": (f"GET /v2/health/live HTTP/1.1\r\n{host}Transfer-Encoding: chunked\r\n\r\n0\r\n".encode()
                         + b"a:\r\n" * (1 << 18) + b"\r\n"),
        "head_bomb": f"GET /v2/health/live HTTP/1.1\r\n{host}".encode() + b"a:\r\n" * (62_000 // 4) + b"\r\n",
        "length_bomb": infer_head(port, 50331648, token=False),
    }


# ---- the well-behaved load ----


def _loadgen() -> ModuleType:
    """benchmarks/loadgen.py (how the project drives wrk and reads its report), by path."""
    spec = importlib.util.spec_from_file_location("aserve_benchmarks_loadgen", ROOT / "benchmarks" / "loadgen.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def wrk_script(body_file: pathlib.Path, pause_s: float) -> str:
    """wrk's Lua: every request the token's `simple` infer POST; each connection waits
    `pause_s` after an answer (wrk's delay(), whole milliseconds)."""
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"}
    return str(_loadgen().lua_script(body_file, headers)) + f"function delay()\n  return {round(pause_s * 1e3)}\nend\n"


def pct(values: list[float], q: float) -> float | None:
    """The nearest-rank q-th percentile of sorted `values`, in ms (seconds in)."""
    return round(1e3 * values[max(0, math.ceil(q / 100 * len(values)) - 1)], 3) if values else None


class PacedClient:
    """The fallback generator: `connections` keep-alive connections, each sending its next
    request `pause` seconds after its answer, as wrk's delay() paces them."""

    def __init__(self, port: int, connections: int, pause: float, timeout: float = 5.0) -> None:
        self.port, self.pause, self.timeout = port, pause, timeout
        self.conns: list[KeepAlive | None] = [None] * connections
        body = infer_body()
        self.request = infer_head(port, len(body)) + body

    async def _connect(self) -> KeepAlive:
        _, conn = await asyncio.get_running_loop().create_connection(lambda: KeepAlive(_kept), "127.0.0.1",
                                                                     self.port)
        return conn

    async def window(self, seconds: float) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        latencies: list[float] = []
        counts = {"non_2xx": 0, "socket_errors": 0}
        begin = loop.time()
        end = begin + seconds

        async def one(i: int) -> None:
            while loop.time() < end:
                conn = self.conns[i]
                try:
                    if conn is None or conn.transport is None or conn.transport.is_closing():
                        conn = await asyncio.wait_for(self._connect(), self.timeout)
                        self.conns[i] = conn
                    t0 = time.perf_counter()  # not loop.time(): uvloop's counts whole milliseconds
                    status = (await asyncio.wait_for(conn.send(self.request), self.timeout)).status
                    latencies.append(time.perf_counter() - t0)
                    if not 200 <= status < 300:
                        counts["non_2xx"] += 1
                except (OSError, TimeoutError):
                    counts["socket_errors"] += 1
                    _close(self.conns[i])
                    self.conns[i] = None  # a fresh connection for the next request
                await asyncio.sleep(min(self.pause, max(0.0, end - loop.time())))

        await asyncio.gather(*(one(i) for i in range(len(self.conns))))
        wall = loop.time() - begin
        latencies.sort()
        return {"requests": len(latencies), "wall_s": round(wall, 2), **counts,
                "requests_per_s": round(len(latencies) / wall, 1), "p50_ms": pct(latencies, 50),
                "p99_ms": pct(latencies, 99)}

    def close(self) -> None:
        for conn in self.conns:
            _close(conn)


def _kept(conn: KeepAlive) -> None:
    """A connection's end: the client opens a fresh one for its next request."""


def _close(conn: KeepAlive | None) -> None:
    if conn is not None and conn.transport is not None:
        conn.transport.close()


async def wrk_window(url: str, args: argparse.Namespace, seconds: float) -> dict[str, Any]:
    """One wrk run of whole `seconds` (at least 1) with `--latency`, read as benchmarks/loadgen.py reads it."""
    loadgen = _loadgen()
    pause = args.connections / args.rate
    with tempfile.TemporaryDirectory(prefix="aserve-hostile-wrk-") as tmp:
        body_file = pathlib.Path(tmp) / "body"
        body_file.write_bytes(infer_body())
        script = pathlib.Path(tmp) / "paced.lua"
        script.write_text(wrk_script(body_file, pause))
        argv = ["wrk", "-t", str(min(args.wrk_threads, args.connections)), "-c", str(args.connections),
                "-d", f"{max(1, round(seconds))}s", "--timeout", f"{max(1, round(args.client_timeout))}s", "--latency", "-s", str(script),
                f"{url}/v2/models/{MODEL}/infer"]
        proc = await asyncio.to_thread(subprocess.run, argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"wrk exited with {proc.returncode}: {proc.stderr.strip() or proc.stdout.strip()}")
    figures = loadgen.parse_wrk(proc.stdout)
    return {"requests": figures["requests"], "wall_s": round(figures["wall_s"], 2), "non_2xx": figures["non_2xx"],
            "socket_errors": figures["socket_errors"], "requests_per_s": round(figures["requests_per_s"], 1),
            "p50_ms": round(figures["p50_ms"], 3), "p99_ms": round(figures["p99_ms"], 3)}


# ---- the hostile clients (their own process) ----


class Kind:
    """What one hostile kind sent and what the server answered."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.sent = 0
        self.answers: collections.Counter[str] = collections.Counter()
        self.extra: dict[str, Any] = {}

    def report(self) -> dict[str, Any]:
        unexpected = {k: v for k, v in self.answers.items() if k not in EXPECTED[self.name]}
        return {"sent": self.sent, "answered": dict(self.answers), "expected": sorted(EXPECTED[self.name]),
                "unexpected": sum(unexpected.values()), "unexpected_answers": unexpected, **self.extra}


def _consume(task: asyncio.Future[Any]) -> None:
    """A done callback: retrieve a dropped task's exception (no 'never retrieved' noise)."""
    if not task.cancelled():
        task.exception()


async def _first_line(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> str:
    """The status of the server's first answer on `sock` ("408"), or "closed" at EOF before one."""
    buf = b""
    while b"\r\n" not in buf:
        data = await loop.sock_recv(sock, 65536)
        if not data:
            return "closed" if not buf else f"cut: {buf[:40]!r}"
        buf += data
    parts = buf.split(b"\r\n", 1)[0].split(b" ")
    return parts[1].decode("latin-1") if len(parts) > 1 and parts[0].startswith(b"HTTP/") else f"not HTTP: {buf[:40]!r}"


def _os_outcome(e: BaseException) -> str:
    if isinstance(e, TimeoutError):
        return "timeout"
    if isinstance(e, ConnectionResetError):
        return "reset"
    return f"error: {type(e).__name__}"


def _connect_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    return sock


async def http_bomb(port: int, data: bytes, timeout: float) -> str:
    """Send `data` while reading the answer's status: the server may answer before it is all sent."""
    loop = asyncio.get_running_loop()
    sock = _connect_socket()
    try:
        await asyncio.wait_for(loop.sock_connect(sock, ("127.0.0.1", port)), timeout)
        sender = asyncio.ensure_future(loop.sock_sendall(sock, data))
        sender.add_done_callback(_consume)
        try:
            return await asyncio.wait_for(_first_line(loop, sock), timeout)
        finally:
            sender.cancel()
    except (OSError, TimeoutError) as e:
        return _os_outcome(e)
    finally:
        sock.close()


async def leaver(port: int, data: bytes, rst: bool, pause: float, timeout: float) -> str:
    """Send a head and half its body, then leave: a FIN (and the server must close without an
    answer) or an RST."""
    loop = asyncio.get_running_loop()
    sock = _connect_socket()
    try:
        await asyncio.wait_for(loop.sock_connect(sock, ("127.0.0.1", port)), timeout)
        await loop.sock_sendall(sock, data)
        await asyncio.sleep(pause)
        if rst:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return "reset sent"
        sock.shutdown(socket.SHUT_WR)
        return await asyncio.wait_for(_first_line(loop, sock), timeout)
    except (OSError, TimeoutError) as e:
        return _os_outcome(e)
    finally:
        sock.close()


async def slowloris(port: int, kind: Kind, interval: float, stopping: asyncio.Event, start_after: float,
                    waits: list[float]) -> None:
    """One slowloris slot: a partial head, a header byte every `interval` (+-50%); when the
    server answers and closes, the next connection."""
    loop = asyncio.get_running_loop()
    head = f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Slow: a".encode()
    rng = random.Random()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stopping.wait(), start_after)
    while not stopping.is_set():
        sock = _connect_socket()
        opened = loop.time()
        reader: asyncio.Future[str] | None = None
        try:
            await loop.sock_connect(sock, ("127.0.0.1", port))
            await loop.sock_sendall(sock, head)
            kind.sent += 1
            reader = asyncio.ensure_future(_first_line(loop, sock))
            while not stopping.is_set():
                done, _ = await asyncio.wait({reader}, timeout=interval * rng.uniform(0.5, 1.5))
                if done:
                    break
                with contextlib.suppress(OSError):  # the server closed it: the reader says how
                    await loop.sock_sendall(sock, b"a")
            if not reader.done():
                kind.extra["open_at_end"] += 1
            else:
                try:
                    answer = reader.result()
                except OSError as e:
                    answer = _os_outcome(e)
                kind.answers[answer] += 1
                waits.append(loop.time() - opened)
        except OSError as e:
            kind.answers[f"connect {_os_outcome(e)}"] += 1
            await asyncio.sleep(interval)
        finally:
            if reader is not None:
                if not reader.done():
                    reader.cancel()
                reader.add_done_callback(_consume)
            sock.close()


async def abandoned_stream(channel: grpc.aio.Channel, request: bytes, timeout: float) -> str:
    call = channel.stream_stream(STREAM)(metadata=(("authorization", f"Bearer {TOKEN}"),))
    try:
        await asyncio.wait_for(call.write(request), timeout)
    except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError, TimeoutError):
        pass  # the server ended it first: its code says how
    call.cancel()
    return str(cast(grpc.StatusCode, await call.code()).name)


async def never_reading(channel: grpc.aio.Channel, request: bytes, seconds: float, rate: float,
                        stopping: asyncio.Event, kind: Kind) -> None:
    """Streams in turn, each writing `rate` requests a second (0: as fast as gRPC lets it) and
    reading nothing for `seconds`, then cancelled. Its writes must be held: none completes in
    its last second."""
    loop = asyncio.get_running_loop()
    while seconds > 0 and not stopping.is_set():
        call = channel.stream_stream(STREAM)(metadata=(("authorization", f"Bearer {TOKEN}"),))
        kind.sent += 1
        written = 0
        last = loop.time()

        async def write(call: grpc.aio.StreamStreamCall) -> None:
            nonlocal written, last
            due = loop.time()
            while True:
                if rate > 0:
                    due += 1 / rate
                    await asyncio.sleep(max(0.0, due - loop.time()))
                await call.write(request)
                written += 1
                last = loop.time()

        writer = asyncio.ensure_future(write(call))
        writer.add_done_callback(_consume)
        began = loop.time()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), seconds)
        ended = loop.time()
        early = writer.done()  # the writes failed: the server ended the stream
        call.cancel()
        writer.cancel()
        code = cast(grpc.StatusCode, await call.code()).name
        if early:
            answer = code
        elif ended - last >= 1.0:
            answer = f"{code}, held"
        elif ended - began < seconds:
            answer = "cut short by the end of the run"
        else:
            answer = f"{code}, writes not held"
        kind.answers[answer] += 1
        kind.extra["writes"].append(written)


async def at_rate(rate: float, stopping: asyncio.Event, launch: Callable[[], Awaitable[None]],
                  cap: int = 1000) -> int:
    """Launch `launch()` `rate` times a second (without waiting for it: at most `cap` at once)
    until `stopping`; the launches skipped because `cap` were running."""
    if rate <= 0:
        return 0
    loop = asyncio.get_running_loop()
    running: set[asyncio.Future[None]] = set()
    skipped = 0
    due = loop.time()
    while not stopping.is_set():
        if len(running) < cap:
            task = asyncio.ensure_future(launch())
            running.add(task)
            task.add_done_callback(running.discard)
        else:
            skipped += 1
        due = max(due + 1 / rate, loop.time() - 1.0)  # a late loop catches up at most a second
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), max(0.0, due - loop.time()))
    if running:  # those in flight get to finish
        await asyncio.wait(running, timeout=10)
        for late in running:
            late.cancel()
            late.add_done_callback(_consume)
    return skipped


async def _hostile(config: dict[str, Any], pipe: Pipe, go: Event, stop: Event) -> dict[str, Any]:
    port, grpc_target = config["port"], f"127.0.0.1:{config['grpc_port']}"
    t0 = time.monotonic()
    http_bombs = bombs(port, config["gzip_bomb_mib"])
    grpc_message = grpc_bomb(config["grpc_bomb_mib"])
    body = infer_body()
    leaving = infer_head(port, len(body)) + body[:len(body) // 2]
    request = grpc_infer("hostile")
    pipe.send({"ready": round(time.monotonic() - t0, 2), "gzip_bomb_bytes": len(http_bombs["gzip_bomb"])})
    await asyncio.to_thread(go.wait)
    kinds = {name: Kind(name) for name in KINDS}
    kinds["slowloris"].extra = {"open_at_end": 0}
    kinds["never_reading_stream"].extra = {"writes": []}
    stopping = asyncio.Event()
    timeout = config["answer_timeout"]
    slow_waits: list[float] = []
    began = time.monotonic()
    # the never-reading stream's channel keeps HTTP/2's first window (no BDP probe): it takes in no
    # more than 64 KiB of answers, so what the server answers past that waits on the server's side
    channels = [grpc.aio.insecure_channel(grpc_target, options=options)
                for options in ([], [("grpc.http2.bdp_probe", 0)], [])]  # abandoned, never-reading, bombs
    abandon_channel, never_channel, bomb_channel = channels
    bomb_call = bomb_channel.unary_unary(INFER)

    async def one(name: str, outcome: Awaitable[str]) -> None:
        kinds[name].sent += 1
        try:
            kinds[name].answers[await outcome] += 1
        except grpc.aio.AioRpcError as e:
            kinds[name].answers[e.code().name] += 1
        except Exception as e:  # noqa: BLE001 - an outcome like any other, reported
            kinds[name].answers[f"error: {type(e).__name__}: {e}"] += 1

    async def grpc_bomb_call() -> str:
        await bomb_call(grpc_message, timeout=timeout)
        return "OK"

    turn = {"next": 0}
    grpc_at = {"last": -math.inf}

    async def bomb() -> None:
        now = time.monotonic()
        name = BOMBS[turn["next"] % len(BOMBS)]
        turn["next"] += 1
        if name == "grpc_bomb":
            if now - grpc_at["last"] < config["grpc_bomb_seconds"]:
                name = BOMBS[turn["next"] % len(BOMBS)]  # not yet: the next in the rotation
                turn["next"] += 1
            else:
                grpc_at["last"] = now
                await one(name, grpc_bomb_call())
                return
        await one(name, http_bomb(port, http_bombs[name], timeout))

    leavers = {"n": 0}

    async def leave() -> None:
        leavers["n"] += 1
        rst = leavers["n"] % 2 == 0
        await one("leaver_rst" if rst else "leaver_fin", leaver(port, leaving, rst, config["leaver_pause"], timeout))

    async def abandon() -> None:
        await one("abandoned_stream", abandoned_stream(abandon_channel, request, timeout))

    n_slow = config["slowloris"]
    interval = config["slowloris_interval"]
    tasks = [asyncio.ensure_future(slowloris(port, kinds["slowloris"], interval, stopping, interval * i / n_slow,
                                             slow_waits)) for i in range(n_slow)]
    tasks.append(asyncio.ensure_future(never_reading(never_channel, request, config["never_read_seconds"],
                                                     config["never_read_rate"], stopping,
                                                     kinds["never_reading_stream"])))
    rated = {"abandoned_stream": asyncio.ensure_future(at_rate(config["abandon_rate"], stopping, abandon)),
             "bombs": asyncio.ensure_future(at_rate(config["bomb_rate"], stopping, bomb, cap=50)),
             "leavers": asyncio.ensure_future(at_rate(config["leaver_rate"], stopping, leave))}
    await asyncio.to_thread(stop.wait)
    stopping.set()
    skipped = dict(zip(rated, await asyncio.gather(*rated.values()), strict=True))
    await asyncio.wait(tasks, timeout=30)
    for task in tasks:
        task.cancel()
        task.add_done_callback(_consume)
    for channel in channels:
        await channel.close()
    if slow_waits:
        kinds["slowloris"].extra["seconds_to_answer_median"] = round(statistics.median(slow_waits), 2)
    cpu = os.times()
    return {"seconds": round(time.monotonic() - began, 1), "kinds": {n: k.report() for n, k in kinds.items()},
            "skipped_at_cap": {k: v for k, v in skipped.items() if v}, "cpu_s": round(cpu.user + cpu.system, 1)}


def hostile_process(config: dict[str, Any], pipe: Pipe, go: Event, stop: Event) -> None:
    """The hostile clients' process: prepares the bombs, says so, starts at `go`, ends at
    `stop` and sends what every kind was answered."""
    try:
        result = uvloop.run(_hostile(config, pipe, go, stop))
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which fails the verdict
        result = {"error": f"{type(e).__name__}: {e}"}
    pipe.send(result)
    pipe.close()


class Hostile:
    """The hostile clients' process, seen from the run."""

    def __init__(self, config: dict[str, Any]) -> None:
        if str(HERE) not in sys.path:
            sys.path.insert(0, str(HERE))
        # spawned, it unpickles its target by module name: this file as `hostile`, however it was loaded here
        target = importlib.import_module("hostile").hostile_process
        ctx = multiprocessing.get_context("spawn")
        self.go, self.stop = ctx.Event(), ctx.Event()
        self.pipe, child = ctx.Pipe(duplex=False)
        self.process = ctx.Process(target=target, args=(config, child, self.go, self.stop), name="aserve-hostile",
                                   daemon=True)
        self.process.start()
        child.close()

    async def receive(self, timeout: float) -> dict[str, Any]:
        if not await asyncio.to_thread(self.pipe.poll, timeout):
            raise RuntimeError(f"the hostile clients' process sent nothing within {timeout} s")
        return cast(dict[str, Any], self.pipe.recv())

    def close(self) -> None:
        self.stop.set()
        self.process.join(10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.pipe.close()


# ---- the server ----


class Server:
    """`aserve serve` in a child process of its own session."""

    def __init__(self, args: argparse.Namespace, port: int, grpc_port: int) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.command = [sys.executable, "-m", "aserve.cli", "serve", *([args.repository] if args.repository else []),
                        "--port", str(port), "--grpc-port", str(grpc_port), "--api-token", TOKEN,
                        *shlex.split(args.serve_args)]
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - the server's output, closed in stop()
        env = {**os.environ, "ASERVE_LOG_LEVEL": "warning"}
        self.proc = subprocess.Popen(self.command, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        self.process = psutil.Process(self.proc.pid)

    def sample(self) -> dict[str, float]:
        """RSS (MiB), open descriptors and threads now (the CLI re-executes itself: the same pid)."""
        with self.process.oneshot():
            return {"rss_mb": round(self.process.memory_info().rss / 2**20, 1), "fds": self.process.num_fds(),
                    "threads": self.process.num_threads()}

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def stop(self, timeout: float) -> tuple[int | None, float]:
        """SIGTERM; (the exit status, seconds to it). None: it had to be killed."""
        t0 = time.monotonic()
        status: int | None = self.proc.poll()
        if status is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                status = self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
                status = None
        return status, round(time.monotonic() - t0, 2)


# ---- the run ----


def windows(seconds: float, size: float) -> list[float]:
    """`seconds` cut into windows of `size` (the last one the rest, when over a fifth of `size`)."""
    n = max(1, math.floor(seconds / size + 1e-9))
    cuts = [size] * n
    rest = seconds - size * n
    if rest > size / 5:
        cuts.append(rest)
    else:
        cuts[-1] += rest
    return [round(c, 3) for c in cuts]


def growth(samples: list[dict[str, Any]], mixed_from: float, settle_s: float) -> dict[str, Any]:
    """RSS, descriptors and threads: the median of the three samples around `settle_s` into the
    mixed phase against the median of its last three."""
    mixed = [s for s in samples if s["t"] >= mixed_from]
    if len(mixed) < 2:
        return {"mark_s": settle_s, "samples": len(mixed)}
    mark = mixed_from + settle_s
    i = min(range(len(mixed)), key=lambda k: abs(mixed[k]["t"] - mark))
    around = mixed[max(0, i - 1):i + 2]
    last = mixed[-3:]
    out: dict[str, Any] = {"mark_s": round(settle_s, 1), "around_mark_t": [s["t"] for s in around],
                           "last_t": [s["t"] for s in last]}
    for key in ("rss_mb", "fds", "threads"):
        at, end = statistics.median(s[key] for s in around), statistics.median(s[key] for s in last)
        out[key] = {"at_mark": at, "end": end, "growth": round((end - at) / at, 4) if at else None}
    return out


def plot(result: dict[str, Any], path: pathlib.Path) -> bool:
    """RSS and descriptors over time, each window's p99 against the quiet baseline; False
    without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples, mixed_from = result["samples"], result["mixed_from_s"]
    t = [s["t"] / 60 for s in samples]
    fig, (rss, p99) = plt.subplots(2, 1, sharex=True, figsize=(9, 6.5), constrained_layout=True)
    rss.plot(t, [s["rss_mb"] for s in samples], marker=".", color="tab:blue", label="server RSS (MiB)")
    rss.set_ylabel("RSS, MiB")
    fds = rss.twinx()
    fds.plot(t, [s["fds"] for s in samples], marker=".", color="tab:orange", label="open descriptors")
    fds.set_ylabel("descriptors")
    for ax in (rss, p99):
        ax.axvline(mixed_from / 60, color="grey", linestyle=":", label="hostile clients start")
        ax.grid(alpha=0.3)
    lines = rss.get_legend_handles_labels()[0] + fds.get_legend_handles_labels()[0]
    rss.legend(lines, [str(line.get_label()) for line in lines], loc="lower right")
    quiet = result["quiet"]["p99_ms"] or 0.0
    spans = [(w["start_s"], w["start_s"] + w["wall_s"], w["p99_ms"] or 0.0)
             for w in [result["quiet"], *result["windows"]] if w is not None]
    p99.hlines([p for _, _, p in spans], [a / 60 for a, _, _ in spans], [b / 60 for _, b, _ in spans],
               color="tab:red", linewidth=2, label="well-behaved p99 per window")
    p99.axhline(quiet, color="tab:green", linestyle="--", label=f"quiet p99 {quiet:.2f} ms")
    p99.axhline(quiet * result["p99"]["limit_ratio"], color="tab:red", linestyle=":",
                label=f"{result['p99']['limit_ratio']:g}x the quiet p99")
    p99.set_ylabel("p99, ms")
    p99.set_ylim(0, 1.15 * max([quiet * result["p99"]["limit_ratio"], *(p for _, _, p in spans)]) or 1.0)
    p99.set_xlabel("minutes")
    p99.legend(loc="lower right")
    fig.suptitle(f"aserve under hostile clients: well-behaved {result['settings']['rate']:g} req/s at most "
                 f"({result['generator']}), {result['settings']['slowloris']} slowloris")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


async def run(args: argparse.Namespace) -> dict[str, Any]:
    generator = args.generator
    if generator == "auto":
        generator = "wrk" if shutil.which("wrk") else "python"
    port, grpc_port = free_port(), free_port()
    settings = {k: v for k, v in vars(args).items() if k not in ("argv", "out", "repository")}
    result: dict[str, Any] = {
        "command": shlex.join([sys.executable, str(pathlib.Path(__file__).resolve()), *args.argv]),
        "generator": generator, "repository": args.repository or "examples (bundled)", "settings": settings,
        "cpus": len(os.sched_getaffinity(0)), "loadavg_1m_start": os.getloadavg()[0]}
    config = {"port": port, "grpc_port": grpc_port, **{k: getattr(args, k) for k in (
        "slowloris", "slowloris_interval", "abandon_rate", "never_read_seconds", "never_read_rate", "bomb_rate", "grpc_bomb_seconds",
        "gzip_bomb_mib", "grpc_bomb_mib", "leaver_rate", "leaver_pause", "answer_timeout")}}
    hostile = Hostile(config)  # it prepares its bombs while the server loads
    server = Server(args, port, grpc_port)
    result["server_command"] = shlex.join(server.command)
    samples: list[dict[str, Any]] = []
    client: PacedClient | None = None
    sampler: asyncio.Future[None] | None = None
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            await wait_ready(session, f"{server.url}/v2/health/ready", server.proc.poll, timeout=args.ready_timeout,
                             every=0.25, output=lambda: server.output()[-4000:])
        prepared = await hostile.receive(args.ready_timeout)
        if "error" in prepared:
            raise RuntimeError(f"the hostile clients failed to prepare: {prepared['error']}")
        result["hostile_prepared_s"], result["gzip_bomb_bytes"] = prepared["ready"], prepared["gzip_bomb_bytes"]
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        phase = {"name": "quiet"}

        async def sample_every() -> None:
            while True:
                samples.append({"t": round(loop.time() - t0, 1), "phase": phase["name"], **server.sample()})
                await asyncio.sleep(args.sample_seconds - (loop.time() - t0) % args.sample_seconds)

        sampler = asyncio.ensure_future(sample_every())
        if generator == "python":
            client = PacedClient(port, args.connections, args.connections / args.rate, args.client_timeout)

        async def window(seconds: float) -> dict[str, Any]:
            start = loop.time() - t0
            if client is not None:
                w = await client.window(seconds)
            else:
                w = await wrk_window(server.url, args, seconds)
            w["errors"] = w["non_2xx"] + w["socket_errors"]
            return {"start_s": round(start, 1), **w}

        result["quiet"] = await window(args.quiet_seconds) if args.quiet_seconds > 0 else None
        if server.proc.poll() is not None:
            raise RuntimeError(f"the server exited with {server.proc.returncode} in the quiet phase")
        phase["name"] = "mixed"
        result["mixed_from_s"] = round(loop.time() - t0, 1)
        hostile.go.set()
        result["windows"] = []
        for seconds in windows(args.minutes * 60, args.window_seconds):
            result["windows"].append(await window(seconds))
            print(f"# window {len(result['windows'])}: {json.dumps(result['windows'][-1])}", file=sys.stderr,
                  flush=True)
            if server.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {server.proc.returncode} in the mixed phase")
        result["mixed_to_s"] = round(loop.time() - t0, 1)
        sampler.cancel()
        samples.append({"t": result["mixed_to_s"], "phase": "mixed", **server.sample()})
        hostile.stop.set()
        result["hostile"] = await hostile.receive(120)
        await asyncio.sleep(args.after_seconds)
        result["after_hostile"] = {"t": round(loop.time() - t0, 1), **server.sample()}
    finally:
        if sampler is not None:
            sampler.cancel()
            await asyncio.wait({sampler})
        if client is not None:
            client.close()
        hostile.close()
        result["server_exit_status"], result["server_exit_s"] = server.stop(args.stop_timeout)
        log = server.output().strip().splitlines()
        server.log.close()
        result["server_log_lines"] = len(log)
        # records at ERROR or above (the server logs at warning): no verdict, but each is worth a look
        result["server_log_errors"] = sum(1 for line in log if " ERROR " in line or " CRITICAL " in line)
        result["server_log_tail"] = log[-20:]
    result["loadavg_1m_end"] = os.getloadavg()[0]
    result["samples"] = samples
    return judge(result, args)


def enabled(args: argparse.Namespace) -> list[str]:
    """The hostile kinds the settings run (a rate or count of 0 turns its kind off)."""
    on = {"slowloris": args.slowloris > 0, "abandoned_stream": args.abandon_rate > 0,
          "never_reading_stream": args.never_read_seconds > 0, "leaver_fin": args.leaver_rate > 0,
          "leaver_rst": args.leaver_rate > 0, **{name: args.bomb_rate > 0 for name in BOMBS}}
    return [k for k in KINDS if on[k]]


def judge(result: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """The verdicts, from the windows, the hostile kinds' answers, the samples and the exit status."""
    mixed_seconds = result["mixed_to_s"] - result["mixed_from_s"]
    settle = min(args.settle_minutes * 60, mixed_seconds / 2)
    result["growth"] = grown = growth(result["samples"], result["mixed_from_s"], settle)
    flat = all(grown.get(k, {}).get("growth") is not None and grown[k]["growth"] <= args.growth_tolerance
               for k in ("rss_mb", "fds"))
    quiet = (result["quiet"] or {}).get("p99_ms")
    ratios = [w["p99_ms"] / quiet if quiet and w["p99_ms"] is not None else math.inf for w in result["windows"]]
    result["p99"] = {"quiet_ms": quiet, "limit_ratio": args.p99_ratio,
                     "worst_window_ratio": round(max(ratios), 3) if ratios else None,
                     "median_window_ratio": round(statistics.median(ratios), 3) if ratios else None,
                     "window_ratios": [round(r, 3) for r in ratios]}
    phases = [w for w in [result["quiet"], *result["windows"]] if w is not None]
    result["well_behaved"] = {"requests": sum(w["requests"] for w in phases), "errors": sum(w["errors"] for w in phases)}
    hostile = result["hostile"]
    kinds = hostile.get("kinds", {})
    result["hostile_unexpected"] = {k: r["unexpected_answers"] for k, r in kinds.items() if r["unexpected"]}
    result["hostile_not_run"] = [k for k in enabled(args) if not kinds.get(k, {}).get("sent")]
    result["verdicts"] = {
        "rss_and_fds_flat": flat,
        "p99_within_ratio": bool(ratios) and max(ratios) <= args.p99_ratio,
        "no_well_behaved_errors": result["well_behaved"]["errors"] == 0 and result["well_behaved"]["requests"] > 0,
        "hostile_answered_as_expected": ("error" not in hostile and not result["hostile_unexpected"]
                                         and not result["hostile_not_run"]),
        "server_exit_0": result["server_exit_status"] == 0,
    }
    result["ok"] = all(result["verdicts"].values())
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    result = uvloop.run(run(args))  # the fallback generator's loop, as cheap as the server's
    if args.out is not None:
        out = args.out.resolve()
        out.mkdir(parents=True, exist_ok=True)
        result["plot"] = str(out / "hostile.png") if plot(result, out / "hostile.png") else None
        (out / "hostile.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    for name, passed in result["verdicts"].items():
        if not passed:
            print(f"# failed: {name}", file=sys.stderr)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
