"""`http_segments`: one byte stream gets one set of answers, however it is cut into reads.

The stream is fed to the HTTP front's connection (`aserve.server.connection`) in one read,
on a loop alone: the reference. Then it is cut into reads (every cut of a short stream in
two; random cuts of a longer one, and cuts at every request's start and head's end, seeded
by the stream) and fed to a second loop's connection. What the client reads (100 Continue
left out: it is owed only to a body not yet sent; the Date left out) must be the
reference's, byte for byte.

Each loop keeps its memos of heads met before (`HttpServer.heads`, server/heads.py) from one
stream to the next, as a server does: a read of a head known byte for byte takes the path
without llhttp, and must mean what llhttp reads.

The routes (a stub dispatcher; the answers depend on the request alone): a path with
`refuse` is answered 404
from its head (the body dropped where it can be), one with `deny` 401 (the connection
closes); anything else is answered 200 with the request's method, target and a digest of
its body.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import re
import types
from collections.abc import Iterator
from typing import Any

from aserve.server.app import HttpStats
from aserve.server.connection import Connection, HttpServer, Limits
from aserve.server.errors import ErrorPolicy
from aserve.server.http import CONTINUE, Response

SHORT = 48  # a stream this long or shorter is fed cut in two at every byte
RANDOM_CUTS = 6  # segmentations of random cuts of a longer stream
DRAIN_TURNS = 200  # loop turns a connection may take to answer what it read


class Failure(AssertionError):
    """The stream was answered otherwise for some segmentation."""


class _Socket:
    """What a connection asks of its socket: options (ignored) and a descriptor."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def setsockopt(self, *args: Any) -> None:
        pass

    def fileno(self) -> int:
        return self.fd


class Wire(asyncio.Transport):
    """A connection's transport: what it writes goes to `writes` (the client's view, in order);
    closing it ends the connection."""

    def __init__(self, protocol: Any, writes: list[bytes], sock: _Socket | None = None) -> None:
        super().__init__()
        self.protocol = protocol
        self.writes = writes
        self.sock = sock
        self.closed = False
        self.eof = False

    def write(self, data: Any) -> None:
        if self.closed or self.eof:
            raise Failure("the connection wrote after closing")
        self.writes.append(bytes(data))

    def writelines(self, chunks: Any) -> None:
        self.write(b"".join(chunks))

    def write_eof(self) -> None:
        self.eof = True

    def can_write_eof(self) -> bool:
        return True

    def is_closing(self) -> bool:
        return self.closed or self.eof

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.protocol.connection_lost(None)

    def abort(self) -> None:
        self.close()

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "peername":
            return ("127.0.0.1", 1)
        return self.sock if name == "socket" else default


class _Routes:
    """The stub dispatcher (see the module's docstring)."""

    def __init__(self) -> None:
        self.app = types.SimpleNamespace(stats=HttpStats(), policy=ErrorPolicy(), draining=False, cors=None)

    def head(self, request: Any, length: int | None) -> Response | None:
        path = request.path
        if "deny" in path:
            return Response(401, b'{"error":"denied"}', content_type="application/json")
        if "refuse" in path:
            return Response(404, b'{"error":"refused"}', content_type="application/json")
        return None

    def again(self, request: Any) -> Response | None:
        return self.head(request, None)

    async def respond(self, request: Any) -> Response:
        digest = hashlib.sha1(bytes(request.body)).hexdigest()[:12]
        return Response(200, f"{request.method} {request.target} {len(request.body)} {digest}".encode(),
                        content_type="text/plain")

    def finish(self, request: Any, response: Any) -> Any:
        return response

    def failed(self, request: Any, exc: BaseException) -> Any:
        raise Failure(f"the stub's handler cannot fail: {exc!r}")


_LIMITS = Limits(max_connections=0, max_header_bytes=512, max_body_bytes=1 << 14, request_timeout_s=5.0,
                 keepalive_timeout_s=5.0)


class _Loops:
    """The loop that reads each stream whole (the reference), and the one that reads it cut."""

    def __init__(self) -> None:
        self.alone = HttpServer(_Routes(), _LIMITS)  # type: ignore[arg-type]
        self.cut = HttpServer(_Routes(), _LIMITS)  # type: ignore[arg-type]
        self.sock = _Socket(os.open(os.devnull, os.O_RDONLY))
        self.loop = asyncio.new_event_loop()


_STATE: list[_Loops] = []


def _loops() -> _Loops:
    if not _STATE:
        _STATE.append(_Loops())
    return _STATE[0]


async def _drain(conn: Connection) -> None:
    for _ in range(DRAIN_TURNS):
        if not conn.busy:
            return
        await asyncio.sleep(0)


async def _serve(data: bytes, cuts: list[int], *, reference: bool) -> list[bytes]:
    """What the client reads when `data` arrives in reads ending at `cuts` (then its end),
    then the client half-closes."""
    loops = _loops()
    client: list[bytes] = []
    conn = (loops.alone if reference else loops.cut)()
    conn.connection_made(Wire(conn, client, loops.sock))
    start = 0
    for end in [*cuts, len(data)]:
        if conn.transport is None:
            break
        conn.data_received(data[start:end])
        start = end
        await _drain(conn)
    if conn.transport is not None:
        conn.eof_received()
        await _drain(conn)
    if conn.transport is not None:
        conn.transport.close()
    return client


_DATE = re.compile(rb"\r\nDate: [^\r]*")


def _read(writes: list[bytes]) -> bytes:
    """The answers as the client compares them: 100 Continue and the Date left out."""
    return _DATE.sub(b"", b"".join(w for w in writes if w != CONTINUE))


def segmentations(data: bytes) -> Iterator[list[int]]:
    """Cuts of `data` into reads: at every byte in two for a short stream; else at every
    request's start and head's end at once, then at each of them alone (and a byte either
    side), then random cuts, seeded by the stream."""
    n = len(data)
    if n <= 1:
        return
    if n <= SHORT:
        for cut in range(1, n):
            yield [cut]
        return
    marks = {m.start() for m in re.finditer(rb"(?:GET|POST|PUT|HEAD|DELETE|OPTIONS|PATCH) ", data)}
    marks |= {m.end() for m in re.finditer(rb"\r\n\r\n", data)}
    at = sorted(marks & set(range(1, n)))
    if at:
        yield at  # each request's head a read, its body another: where a known head is read without llhttp
    points = sorted({p + d for p in marks for d in (-1, 0, 1)} & set(range(1, n)))
    for p in points:
        yield [p]
    rng = random.Random(hashlib.sha1(data).digest())
    for _ in range(RANDOM_CUTS):
        yield sorted(rng.sample(range(1, n), min(n - 1, rng.randint(1, 8))))


def answers(data: bytes, cuts: list[int], *, reference: bool = False) -> bytes:
    """What the client reads for `data` cut at `cuts` (see `_read`)."""
    loops = _loops()
    return _read(loops.loop.run_until_complete(_serve(data, cuts, reference=reference)))


def http_segments(data: bytes) -> None:
    """The target: every segmentation is answered as the stream in one read."""
    reference = answers(data, [], reference=True)
    for cuts in [[], *segmentations(data)]:
        got = answers(data, cuts)
        if got != reference:
            raise Failure(f"cut at {cuts}, the stream was answered otherwise:\n"
                          f"{got[:600]!r}\nin one read:\n{reference[:600]!r}")
