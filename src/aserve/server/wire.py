"""The wire front: aserve's own HTTP/1.1 connection protocol for the infer routes.

aiohttp spends about 35 µs of the loop's CPU on each request before and after the
handler (its parser, request and response objects, the per-connection task's
bookkeeping, the writer); a plain request parsed here, in a few slices of the buffer,
costs about 10. Each connection starts on `WireProtocol`. A request it can take whole
is answered by the same `Front.answer` as under aiohttp:

- `POST` to a V2 infer or TF-Serving predict target (`front.hot_route`), HTTP/1.1;
- a `Content-Length` body within `--max-body-bytes`; no `Transfer-Encoding`,
  `Content-Encoding`, `Expect` or `Upgrade`, and `Connection` absent, `keep-alive` or
  `close`;
- a header block of well-formed fields (token names, no control characters in values,
  no line folding) within `--max-header-bytes`, with a `Host` and no field aiohttp
  allows once (`Host`, `Content-Type`, ...) given twice.

A request to another route whose extent is known (a `Content-Length` or no body, the same
well-formed head) is lent to aiohttp: the connection goes to an aiohttp handler with exactly
that request's bytes, and comes back once it has answered (`limits.LimitedHandler.lend`);
what arrives meanwhile waits here. Anything else (a chunked or compressed body, `Expect`,
HTTP/1.0, a header over the limit, a malformed request) hands the connection to aiohttp for
good, from that request on, with the bytes not yet answered: aiohttp parses them as if it
had read them itself and answers as it always has (routes, 4xx, 431). So the wire front
never answers what it does not fully understand, and the server's behaviour for those
requests is aiohttp's.

It keeps what aiohttp's connections keep: the connection limit, the keep-alive timeout,
the request timeout (408), requests pipelined on one connection answered in order,
back-pressure (a client that does not read its answers stops being read), and a
graceful shutdown that answers every request already read; with the access log on, it
writes the same line for its requests as aiohttp does for the others.
"""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import time
from email.utils import formatdate
from typing import Any, ClassVar, cast

from aiohttp import web
from aiohttp.http import HttpVersion11
from multidict import CIMultiDict, CIMultiDictProxy

from .errors import SERVER_NAME, body_timeout, close_gracefully, from_exception
from .front import Front, hot_route
from .handlers import Answer
from .limits import LimitedHandler, LimitedServer, header_timeout_body

log = logging.getLogger("aserve.server")

# one header field, from the start of a line: a token name, optional whitespace, a value
# without control characters, CRLF. A block is well formed when every line is one (as many
# matches as line feeds: a line that does not match from its start, a bare CR or LF, or a
# folded continuation leaves a line feed uncounted).
_FIELD = re.compile(r"^([!#$%&'*+.^_`|~0-9A-Za-z-]+):[ \t]*([^\x00-\x08\x0a-\x1f\x7f]*?)[ \t]*\r\n", re.MULTILINE)
# fields that change how the body or the connection is read: any of them but a plain
# Content-Length (or Connection: keep-alive / close) sends the request to aiohttp
_FRAMING = frozenset({"content-length", "transfer-encoding", "content-encoding", "expect", "upgrade", "connection"})
# fields aiohttp refuses to see twice (its parser's SINGLETON_HEADERS): a request with two goes to aiohttp (400)
_SINGLE = frozenset({"content-length", "content-location", "content-range", "content-type", "etag", "host",
                     "max-forwards", "server", "transfer-encoding", "user-agent"})
_CHECKED = _FRAMING | _SINGLE
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH"})  # what the routes answer
MAX_FIELDS = 128  # aiohttp's limit on header fields (more: its 431)
HEAD_LIMIT = 1 << 16  # a header block not ended within this many bytes goes to aiohttp (its 431)
PIPELINE_LIMIT = 1 << 20  # buffered bytes behind a request in progress before the connection stops being read
# request heads remembered once parsed (a shared, read-only header mapping each): at most this many,
# each at most this long; a head met again is looked up, not parsed (then all are forgotten at once)
MAX_KNOWN_HEADS = 256
MAX_KNOWN_HEAD = 1024

Route = tuple[int, str, str | None]  # front.hot_route's (kind, model, version)
# a parsed head: route (None: not an infer or predict POST), target, headers, Content-Length, Connection: close
Head = tuple[Route | None, str, CIMultiDictProxy[str], int, bool]


class _Body:
    """A body that has fully arrived, read as aiohttp's `StreamReader` is read."""

    __slots__ = ("_data",)

    def __init__(self, data: bytes) -> None:
        self._data = data

    def is_eof(self) -> bool:
        return True

    def read_nowait(self, n: int = -1) -> bytes:
        data = self._data
        self._data = b""
        return data


class WireRequest:
    """A request the wire front parsed: the members of `request.HttpRequest`."""

    __slots__ = ("close", "content", "headers", "method", "protocol", "raw_path", "received")
    version = HttpVersion11

    def __init__(self, target: str, headers: CIMultiDictProxy[str], body: bytes, protocol: WireProtocol,
                 close: bool, received: float | None = None) -> None:
        self.received = received  # time.monotonic() when its first bytes were read (None: unknown)
        self.method = "POST"
        self.raw_path = target
        self.headers = headers
        self.content = _Body(body)
        self.protocol = protocol
        self.close = close  # the client sent Connection: close

    @property
    def path(self) -> str:
        return self.raw_path.partition("?")[0]

    @property
    def path_qs(self) -> str:
        return self.raw_path

    @property
    def remote(self) -> str | None:
        transport = self.protocol.transport
        peer = transport.get_extra_info("peername") if transport is not None else None
        return str(peer[0]) if isinstance(peer, (tuple, list)) and peer else None

    async def read(self) -> bytes:
        return self.content.read_nowait()


def parse_head(head: str) -> tuple[str, str, list[tuple[str, str]], int, bool] | None:
    """(method, target, fields, Content-Length (0 when absent), close) of an HTTP/1.1 request
    head whose extent the wire front knows (without its final CRLF CRLF), or None when
    aiohttp must read the connection from here on."""
    line, _, block = head.partition("\r\n")
    parts = line.split(" ")
    if len(parts) != 3 or parts[2] != "HTTP/1.1":
        return None
    method, target = parts[0], parts[1]
    if method not in _METHODS:
        return None
    if not target.startswith("/") or not target.isascii() or not target.isprintable():
        return None  # origin-form only
    if block:
        block += "\r\n"
        fields: list[tuple[str, str]] = _FIELD.findall(block)
        if len(fields) != block.count("\n") or len(fields) > MAX_FIELDS:
            return None
    else:
        fields = []
    length = 0
    close = False
    seen: set[str] = set()
    for name, value in fields:
        lower = name.lower()
        if lower in _CHECKED:
            if lower in seen:
                return None
            seen.add(lower)
            if lower == "content-length":
                if not value.isdigit() or not value.isascii() or len(value) > 18:
                    return None  # aiohttp refuses a length past 2**63 - 1
                length = int(value)
            elif lower == "connection":
                token = value.lower()
                if token == "close":
                    close = True
                elif token != "keep-alive":
                    return None
            elif lower in _FRAMING:
                return None
    if "host" not in seen:  # HTTP/1.1 requires Host (aiohttp answers 400 without it)
        return None
    return method, target, fields, length, close


class _Date:
    """The Date header, formatted once a second, and the heads of this second's 200 answers."""

    second = -1
    value = b""
    # (body size, Connection: close, header fields...) -> the head: answers to one client repeat it
    heads: ClassVar[dict[tuple[Any, ...], bytes]] = {}

    @classmethod
    def now(cls) -> bytes:
        second = int(time.time())
        if second != cls.second:
            cls.value = formatdate(second, usegmt=True).encode()
            cls.second = second
            cls.heads = {}
        return cls.value


_OWN = frozenset({"content-length", "server", "date", "connection", "transfer-encoding"})
SERVER_NAME_BYTES = SERVER_NAME.encode()


def encode_response(response: Answer | web.Response, *, close: bool) -> list[Any]:
    """The bytes of `response` on the wire: its head, then its body's buffers as they are."""
    date = _Date.now()
    key: tuple[Any, ...] = ()
    if isinstance(response, Answer):
        chunks = response.chunks
        size = len(chunks[0]) if len(chunks) == 1 else sum(map(len, chunks))
        key = (size, close, *response.headers.items())
        known = _Date.heads.get(key)
        if known is not None:
            return [known, *chunks]
    head = [b"", b"\r\nServer: ", SERVER_NAME_BYTES, b"\r\nDate: ", date, b"\r\nContent-Length: ", b""]
    if isinstance(response, Answer):
        head[0] = b"HTTP/1.1 200 OK"
        for name, value in response.headers.items():
            head += (b"\r\n", name.encode(), b": ", value.encode())
    else:
        body = response.body
        if body is None:
            chunks, size = [], 0
        elif isinstance(body, (bytes, bytearray, memoryview)):
            chunks, size = [body], len(body)
        else:
            raise TypeError(f"the wire front cannot send a {type(body).__name__} body")
        head[0] = f"HTTP/1.1 {response.status} {response.reason}".encode()
        for name, value in response.headers.items():
            if name.lower() not in _OWN:
                head += (b"\r\n", name.encode(), b": ", value.encode())
        if body is not None and "Content-Type" not in response.headers:
            head.append(b"\r\nContent-Type: application/octet-stream")
    head[6] = str(size).encode()
    if close:
        head.append(b"\r\nConnection: close")
    head.append(b"\r\n\r\n")
    encoded = b"".join(head)
    if key and len(_Date.heads) < MAX_KNOWN_HEADS:
        _Date.heads[key] = encoded
    return [encoded, *chunks]


class _Sent:
    """What the access log reads of an answer the wire front wrote."""

    __slots__ = ("body_length", "status")

    def __init__(self, status: int, body_length: int) -> None:
        self.status = status
        self.body_length = body_length  # bytes on the wire, head included, as aiohttp counts them


class WireProtocol(asyncio.Protocol):
    """One connection, answered by the wire front until a request needs aiohttp."""

    def __init__(self, server: WireServer) -> None:
        self.server = server
        self.front = server.front
        self.loop = server.loop
        self.transport: asyncio.Transport | None = None
        self._buf = b""
        self._more: list[bytes] = []  # what arrived while a body was awaited (joined once it is whole)
        self._have = 0  # bytes in _buf and _more
        # a head whose body is awaited: route (None: another route), target, headers, Content-Length,
        # Connection: close, request size
        self._pending: tuple[Route | None, str, CIMultiDictProxy[str], int, bool, int] | None
        self._pending = None
        self._busy = False  # a request is being answered
        self._paused = False  # the transport's write buffer is full
        self._reading = True
        self._closing = False
        self._eof = False
        self._counted = False
        self._began = 0.0  # loop time the request being read began
        self._received = 0.0  # time.monotonic() then (loop time counts whole milliseconds on uvloop)
        self._timer: asyncio.TimerHandle | None = None  # the request timeout, while a request is incomplete
        self._idle_timer: asyncio.TimerHandle | None = None
        self._idle_since = 0.0
        self._task: asyncio.Task[None] | None = None
        self._done: asyncio.Future[None] | None = None  # set while a shutdown waits for the request in progress

    # ---- asyncio.Protocol ----

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not its subclasses
        server = self.server
        limit = server.limits.max_connections
        if limit and server.open >= limit:
            self._handoff("connection_limit")  # aiohttp's handler answers its request 503 and closes
            return
        server.open += 1
        self._counted = True
        server.wired.add(self)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            except OSError:
                pass
        self._idle()

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        if self._pending is not None:
            self._more.append(data)
            self._have += len(data)
            if self._have < self._pending[5]:
                return
            self._buf = b"".join([self._buf, *self._more])
            self._more = []
        elif self._buf:
            self._buf += data
            self._have = len(self._buf)
        else:
            self._buf = data
            self._have = len(data)
            if not self._busy:
                self._began = self.loop.time()
                self._received = time.monotonic()
        if self._busy or self._paused:
            if self._have > PIPELINE_LIMIT and self._reading and self.transport is not None:
                self.transport.pause_reading()
                self._reading = False
            return
        self._next()

    def eof_received(self) -> bool | None:
        self._eof = True  # the client sends no more: the answer in progress is its last
        if not self._busy:
            self._close()
        return True  # half-closed: the answer in progress is still sent

    def connection_lost(self, exc: BaseException | None) -> None:
        self._closing = True
        self._cancel_timers()
        self._release()
        if not self._busy:
            self._finished()
        self.transport = None

    def pause_writing(self) -> None:
        self._paused = True
        if self._reading and self.transport is not None:
            self.transport.pause_reading()
            self._reading = False

    def resume_writing(self) -> None:
        self._paused = False
        if not self._closing and self.transport is not None:
            self._read_on()
            if not self._busy:
                self._take_next()

    # ---- requests ----

    def _next(self) -> None:
        """Answer the request at the head of the buffer, wait for the rest of it, or hand over."""
        if self.server.closing:
            self._close()  # shutting down: requests not yet begun are not taken
            return
        if self._more:
            self._buf = b"".join([self._buf, *self._more])
            self._more = []
        buf = self._buf
        if not buf:
            self._idle()
            return
        pending = self._pending
        if pending is not None:
            if len(buf) < pending[5]:
                self._wait()
                return
        else:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > HEAD_LIMIT:
                    self._handoff("header_size")
                else:
                    self._wait()
                return
            if end > self.server.limits.max_header_bytes:
                self._handoff("header_size")
                return
            head = buf[:end]
            known = self.server.heads.get(head)
            if known is None:
                known = self.server.learn(head)
                if known is None:
                    self._handoff("head")
                    return
            route, target, headers, length, close = known
            if length > self.front.max_body_bytes:
                self._handoff("body_size")  # aiohttp's 413
                return
            pending = (route, target, headers, length, close, end + 4 + length)
            if len(buf) < pending[5]:
                self._pending = pending
                self._wait()
                return
        route, target, headers, length, close, total = pending
        self._pending = None
        if route is None:
            self._lend(total)  # another route: aiohttp answers it, and the connection comes back
            return
        body = buf[total - length:total]
        self._buf = rest = buf[total:]
        self._have = len(rest)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        request = WireRequest(target, headers, body, self, close, self._received)
        self.front.stats.wire += 1
        self._busy = True
        self._task = self.loop.create_task(self._serve(request, route))

    async def _serve(self, request: WireRequest, route: Route) -> None:
        access = self.server.access_logger
        began = time.perf_counter() if access is not None else 0.0  # uvloop's loop.time() counts whole ms
        try:
            response = await self.front.answer(request, *route)
        except asyncio.CancelledError:  # a shutdown that ran out of time
            self._abort()
            raise
        try:
            sent = self._respond(request, response, count=access is not None)
            if access is not None:
                status = 200 if isinstance(response, Answer) else response.status
                access.log(request, _Sent(status, sent), time.perf_counter() - began)
        except Exception as exc:  # this connection ends; the server goes on
            log.error("the wire front failed answering %s %s", request.method, request.path, exc_info=exc)
            self._abort()

    def _respond(self, request: WireRequest, response: Answer | web.Response, *, count: bool = False) -> int:
        """Write the answer (then read on, or close); with `count`, returns the bytes written."""
        closing = (request.close or (not isinstance(response, Answer) and response.keep_alive is False)
                   or self.front.draining or self.server.closing or self._closing or self._eof)
        transport = self.transport
        sent = 0
        if transport is not None and not transport.is_closing():
            data = encode_response(response, close=closing)
            if count:
                sent = sum(map(len, data))
            if len(data) == 1:
                transport.write(data[0])
            elif len(data) == 2 and len(data[1]) < 4096:
                transport.write(data[0] + data[1])
            else:
                transport.writelines(data)
        self._busy = False
        self._task = None
        self._finished()
        if closing or self._closing:
            self._closing = True
            self._cancel_timers()
            close_gracefully(self)
            return sent
        self._read_on()
        self._take_next()
        return sent

    def _read_on(self) -> None:
        """Read the connection again, unless answers wait to be sent or too much is buffered."""
        if not self._reading and not self._paused and self._have <= PIPELINE_LIMIT and self.transport is not None:
            self.transport.resume_reading()
            self._reading = True

    def _take_next(self) -> None:
        """Nothing in progress: take the next request (a request already waiting here has its
        time counted from now, not from when it arrived behind another)."""
        if self._paused:
            return
        if self._pending is None and (self._buf or self._more):
            self._began = self.loop.time()
            self._received = time.monotonic()
        self._next()

    # ---- timers ----

    def _wait(self) -> None:
        """A request is incomplete: it must be whole within the request timeout of its first byte."""
        limit = self.server.limits.request_timeout_s
        if limit > 0 and self._timer is None:
            self._timer = self.loop.call_at(self._began + limit, self._too_slow)

    def _too_slow(self) -> None:
        self._timer = None
        transport = self.transport
        if transport is None or transport.is_closing() or self._busy:
            return
        limit = self.server.limits.request_timeout_s
        pending = self._pending
        if pending is None:
            transport.write(header_timeout_body(limit))
            log.info("closed a connection whose request header took longer than %g s", limit)
        else:
            request = WireRequest(pending[1], pending[2], b"", self, True)
            response = from_exception(request, body_timeout(limit), self.front.policy)
            transport.writelines(encode_response(response, close=True))
        self._closing = True
        self._cancel_timers()
        close_gracefully(self)

    def _idle(self) -> None:
        """No request in progress: the connection closes after the keep-alive timeout."""
        self._idle_since = self.loop.time()
        if self._idle_timer is None and not self._closing:
            self._idle_timer = self.loop.call_at(self._idle_since + self.server.keepalive_s, self._idle_check)

    def _idle_check(self) -> None:
        self._idle_timer = None
        if self._closing or self._busy or self._buf or self._pending is not None:
            return  # in use again: the next idle time starts the timer anew
        due = self._idle_since + self.server.keepalive_s
        if self.loop.time() >= due:
            self._close()
        else:
            self._idle_timer = self.loop.call_at(due, self._idle_check)

    def _cancel_timers(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    # ---- ends ----

    def force_close(self) -> None:
        """Close now (`errors.close_gracefully` calls it after its grace time)."""
        self._close()

    def _close(self) -> None:
        self._closing = True
        self._cancel_timers()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def _release(self) -> None:
        if self._counted:
            self.server.open -= 1
            self._counted = False
        self.server.wired.discard(self)

    def _abort(self) -> None:
        """The request in progress ends without an answer: so does the connection."""
        self._busy = False
        self._close()
        self._finished()

    def _finished(self) -> None:
        if self._done is not None and not self._done.done():
            self._done.set_result(None)

    def _lend(self, total: int) -> None:
        """Lend the connection to aiohttp for the whole request at the head of the buffer."""
        transport = self.transport
        assert transport is not None
        data, self._buf = self._buf[:total], self._buf[total:]
        self._have = len(self._buf)
        self._cancel_timers()
        self._release()
        self.front.stats.lent += 1
        handler = self.server.aiohttp_handler()
        handler.lend(self, transport, data)

    def stash(self, data: bytes) -> None:
        """Bytes that arrived while the connection was lent: the next requests."""
        self._buf += data
        self._have = len(self._buf)
        if self._have > PIPELINE_LIMIT and self._reading and self.transport is not None:
            self.transport.pause_reading()
            self._reading = False

    def take_back(self, transport: asyncio.Transport, paused: bool) -> bool:
        """aiohttp answered the lent request and the connection stays open: it is ours again
        (False: the server is shutting down; aiohttp keeps it)."""
        if self.server.closing or self._closing:
            return False
        transport.set_protocol(self)
        self.server.open += 1
        self._counted = True
        self.server.wired.add(self)
        self._paused = paused
        self.loop.call_soon(self._resume)
        return True

    def give_up(self) -> bytes:
        """aiohttp keeps the lent connection: what arrived meanwhile is its to read."""
        self._closing = True
        data, self._buf, self._have = self._buf, b"", 0
        if not self._reading and self.transport is not None:
            self.transport.resume_reading()
            self._reading = True
        return data

    def _resume(self) -> None:
        transport = self.transport
        if self._closing or transport is None or transport.is_closing():
            return
        self._read_on()
        self._take_next()

    def _handoff(self, reason: str) -> None:
        """Give the connection, and what it has sent but not been answered, to aiohttp."""
        self.front.stats.handed_off(reason)
        transport = self.transport
        assert transport is not None
        self._cancel_timers()
        self._release()
        data = b"".join([self._buf, *self._more]) if self._more else self._buf
        self._buf, self._more, self._have, self._pending = b"", [], 0, None
        self._closing = True  # nothing more reaches this protocol
        self._finished()
        if not self._reading:
            transport.resume_reading()
        handler = self.server.aiohttp_handler()
        handler.adopt(transport, data)
        if self._paused:
            handler.pause_writing()

    async def shutdown(self, timeout: float | None) -> None:
        """Answer the request in progress (within `timeout`), then close."""
        self._closing = True
        if self._busy and self._task is not None:
            self._done = self.loop.create_future()
            try:
                async with asyncio.timeout(timeout):
                    await self._done
            except TimeoutError:
                self._task.cancel()
        self._close()


class WireServer(LimitedServer):
    """aiohttp's low-level server whose connections start on the wire front."""

    def __init__(self, handler: Any, *, front: Front, keepalive_s: float, **kwargs: Any) -> None:
        super().__init__(handler, **kwargs)
        self.front = front
        self.keepalive_s = keepalive_s
        self.loop = self._loop
        self.wired: set[WireProtocol] = set()
        self.heads: dict[bytes, Head] = {}  # request heads met before, and what they say (see `learn`)
        self.closing = False
        logger = kwargs.get("access_log")
        self.access_logger: Any = None  # the access log's writer, when it is on (aiohttp's access_log_class)
        if logger is not None and "access_log_class" in kwargs:
            self.access_logger = kwargs["access_log_class"](logger, kwargs.get("access_log_format", ""))

    def __call__(self) -> Any:
        return WireProtocol(self)

    def learn(self, head: bytes) -> Head | None:
        """What `WireProtocol` needs of a request head it has not met (None: aiohttp's to read),
        remembered when the head is short: a client sends the same head on every request
        (same target, Host, Content-Type, Content-Length), and the next one is looked up."""
        parsed = parse_head(head.decode("utf-8", "surrogateescape"))
        if parsed is None:
            return None
        method, target, fields, length, close = parsed
        route = hot_route(target) if method == "POST" else None
        known = (route, target, CIMultiDictProxy(CIMultiDict(fields)), length, close)
        if len(head) <= MAX_KNOWN_HEAD:
            if len(self.heads) >= MAX_KNOWN_HEADS:
                self.heads.clear()
            self.heads[head] = known
        return known

    def aiohttp_handler(self) -> LimitedHandler:
        return super().__call__()

    def pre_shutdown(self) -> None:
        self.closing = True
        for conn in list(self.wired):
            if not conn._busy:
                conn._close()
        super().pre_shutdown()

    async def shutdown(self, timeout: float | None = None) -> None:
        self.closing = True
        await asyncio.gather(*(conn.shutdown(timeout) for conn in list(self.wired)))
        await super().shutdown(timeout)
