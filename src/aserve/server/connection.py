"""One HTTP/1.1 connection: llhttp (`httptools`) parses every request, and one set of rules applies.

Each connection is an `asyncio.Protocol` fed by llhttp's callbacks. A request's head
goes to the router as soon as it has arrived (`Dispatcher.head`); what the head alone
decides (unknown route, method, missing token, a body over the limit, an unreadable
Content-Type or Content-Encoding, an unknown model) is answered at once, and if its
body is still on the way the connection closes after that answer instead of reading it.
A request that passes has its body gathered (decoded from gzip or deflate, within
`--max-body-bytes`) and is then answered by its handler.

Requests pipelined on a connection are answered in order, one at a time. The
connection stops reading when its answers are not read (the transport's write buffer
is full) or when too many requests wait behind the one in progress. Limits:
`--max-header-bytes` (431), `--request-timeout` from a request's first byte (408;
its head is also bounded by the keep-alive timeout when that limit is off),
`--keepalive-timeout` between requests, `--max-connections` (503). A malformed request
gets 400 and the connection closes; so does an upgrade request, once answered (the
server speaks no other protocol on the connection).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import socket
import time
import zlib
from typing import Any, cast

import httptools
import msgspec

from ..errors import BodyTimeout, InvalidInput, PayloadTooLarge
from .errors import error_response, from_exception
from .http import CONTINUE, Request, Response, encode
from .router import Dispatcher, too_large

log = logging.getLogger("aserve.server")

MAX_FIELDS = 128  # header fields in one request (more: 431)
PIPELINE_LIMIT = 1 << 20  # body bytes waiting behind the request in progress before reading stops
MAX_WAITING = 32  # requests waiting behind the one in progress before reading stops
CLOSE_GRACE_S = 1.0  # after a closing answer, how long the client may go on sending before the close
# fields a request may not repeat (RFC 9110 singletons; a repeated one is 400)
SINGLETONS = frozenset({"content-length", "content-location", "content-range", "content-type", "etag", "host",
                        "max-forwards", "server", "transfer-encoding", "user-agent"})


class Limits(msgspec.Struct, frozen=True, kw_only=True):
    """What a connection enforces (from ServerSettings)."""

    max_connections: int = 0  # 0: no limit
    request_timeout_s: float = 0.0  # 0: no limit
    keepalive_timeout_s: float = 75.0
    max_header_bytes: int = 8190
    max_body_bytes: int = 64 * 1024 * 1024

    @property
    def head_bytes(self) -> int:
        """Bytes a request head may take in all: every field at its limit is not a real request."""
        return max(1 << 16, 4 * self.max_header_bytes)


class Exchange:
    """One request on a connection, from its head to its answer."""

    __slots__ = ("answer", "began", "body", "complete", "continued", "decoder", "expect", "kept", "request", "size")

    def __init__(self, request: Request, began: float | None) -> None:
        self.request = request
        self.answer: Response | None = None  # decided from the head: sent without reading the body
        self.body: list[bytes] = []
        self.size = 0  # body bytes as they arrive (before decoding)
        self.kept = 0  # body bytes kept (decoded)
        self.decoder: Any = None  # a zlib decompressor for a gzip or deflate body
        self.complete = False
        self.expect = False  # the client waits for 100 Continue before it sends the body
        self.continued = False
        self.began = began  # loop time its request timeout counts from (None: once it is first in line)


class HttpServer:
    """The connections of one listening socket, and what they share."""

    def __init__(self, dispatcher: Dispatcher, limits: Limits, *, access_log: Any = None) -> None:
        self.dispatcher = dispatcher
        self.limits = limits
        self.stats = dispatcher.app.stats
        self.access_log = access_log  # logs.AccessLogger, when --access-log is on
        self.connections: set[Connection] = set()
        self.closing = False

    def __call__(self) -> Connection:
        return Connection(self)

    def close_idle(self) -> None:
        """Shutting down: close every connection that has no request in progress."""
        self.closing = True
        for conn in list(self.connections):
            if not conn.busy:
                conn.close()

    async def shutdown(self, timeout: float | None) -> None:
        """Answer the request in progress on every connection (within `timeout`), then close them."""
        self.close_idle()
        await asyncio.gather(*(conn.shutdown(timeout) for conn in list(self.connections)))


class Connection(asyncio.Protocol):
    """One client connection (see the module's docstring)."""

    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.limits = server.limits
        self.dispatcher = server.dispatcher
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.remote: str | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.queue: collections.deque[Exchange] = collections.deque()  # heads parsed, answers owed, in order
        self.busy = False  # the first in line is being answered
        self.paused = False  # the transport's write buffer is full
        self.reading = True
        self.closing = False
        self.counted = False
        self._current: Exchange | None = None  # the request whose body is being parsed
        self._url = b""
        self._headers: dict[str, str] = {}
        self._fields = 0
        self._refusal: tuple[int, str] | None = None  # found while the head was read (status, message)
        self._head = False  # a head is being read
        self._head_bytes = 0
        self._head_began = 0.0  # loop time its first byte arrived
        self._received = 0.0  # time.monotonic() then
        self._now = 0.0  # loop time of the data being parsed
        self._free_since = 0.0  # loop time the connection last finished an answer (or opened)
        self._eof = False
        self._discard = False  # nothing more is read on this connection: its last answers are owed
        self._task: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._done: asyncio.Future[None] | None = None  # a shutdown waits for the request in progress

    # ---- asyncio.Protocol ----

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not its subclasses
        server = self.server
        peer = transport.get_extra_info("peername")
        self.remote = str(peer[0]) if isinstance(peer, (tuple, list)) and peer else None
        limit = self.limits.max_connections
        if not (limit and server.stats.connections >= limit):
            server.stats.connections += 1
            self.counted = True
        server.connections.add(self)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            except OSError:
                pass
        self._free_since = self.loop.time()
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self.closing or self._discard:
            return  # a closing answer was sent or is owed: what the client still sends is dropped
        self._now = self.loop.time()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._upgraded()
        except httptools.HttpParserError as exc:
            self._malformed(exc)
        if self._head and not self.closing:
            self._head_bytes += len(data)
            if self._head_bytes > self.limits.head_bytes:
                self._refuse_head(431, self._header_message())
        self._advance()

    def eof_received(self) -> bool | None:
        self._eof = True  # the client sends no more: what it sent is still answered
        if not self.busy and not self.queue:
            self.close()
        return True

    def connection_lost(self, exc: BaseException | None) -> None:
        self.closing = True
        self.transport = None
        self._cancel_timer()
        if self.counted:
            self.server.stats.connections -= 1
            self.counted = False
        self.server.connections.discard(self)
        if not self.busy:
            self._finished()

    def pause_writing(self) -> None:
        self.paused = True
        self._read(False)

    def resume_writing(self) -> None:
        self.paused = False
        self._advance()

    # ---- llhttp's callbacks ----

    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = {}
        self._fields = 0
        self._refusal = None
        self._head = True
        self._head_bytes = 0
        self._head_began = self._now
        self._received = time.monotonic()

    def on_url(self, url: bytes) -> None:
        self._url += url
        if len(self._url) > self.limits.max_header_bytes and self._refusal is None:
            self._refusal = (431, self._header_message())

    def on_header(self, name: bytes, value: bytes) -> None:
        self._fields += 1
        if self._refusal is not None:
            return
        if len(name) + len(value) > self.limits.max_header_bytes or self._fields > MAX_FIELDS:
            self._refusal = (431, self._header_message())
            return
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        headers = self._headers
        if key in headers:
            if key in SINGLETONS:
                self._refusal = (400, f"malformed HTTP request: duplicate {name.decode('latin-1')} header")
                return
            headers[key] = f"{headers[key]}, {text}"
        else:
            headers[key] = text

    def on_headers_complete(self) -> None:
        self._head = False
        parser = self.parser
        request = Request(parser.get_method().decode("ascii"), self._url.decode("latin-1"),
                          parser.get_http_version(), self._headers, keep_alive=parser.should_keep_alive(),
                          received=self._received, remote=self.remote)
        first = not self.queue and not self.busy
        exchange = Exchange(request, self._head_began if first else None)
        self.queue.append(exchange)
        self._current = exchange
        headers = self._headers
        if self._refusal is None and "host" not in headers and request.version == "1.1":
            self._refusal = (400, "malformed HTTP request: an HTTP/1.1 request needs a Host header")
        if self._refusal is not None:
            status, text = self._refusal
            self._count("header_size" if status == 431 else "malformed")
            exchange.answer = error_response(request, status, text, close=True)
        elif not self.counted:
            self._count("connection_limit")
            exchange.answer = error_response(
                request, 503, f"the server is at its limit of {self.limits.max_connections} open connections "
                              f"(--max-connections); retry later", {"Retry-After": "1"}, close=True)
        else:
            if "transfer-encoding" in headers:
                length: int | None = None
            else:
                length = int(headers.get("content-length", "0"))
            exchange.answer = self.dispatcher.head(request, length)
            if exchange.answer is None:
                encoding = headers.get("content-encoding", "identity").strip().lower()
                if encoding != "identity":
                    exchange.decoder = zlib.decompressobj(31 if encoding == "gzip" else 15)
                exchange.expect = "expect" in headers
            elif exchange.answer.status == 413:
                self._count("body_size")

    def on_body(self, body: bytes) -> None:
        exchange = self._current
        if exchange is None or exchange.answer is not None:
            return  # refused from its head: the body is not kept
        exchange.size += len(body)
        limit = self.limits.max_body_bytes
        try:
            if exchange.decoder is not None:
                body = exchange.decoder.decompress(body, limit + 1 - exchange.kept)
                if exchange.decoder.unconsumed_tail:
                    raise too_large(limit)
            if exchange.size > limit or exchange.kept + len(body) > limit:
                raise too_large(limit)
        except (zlib.error, PayloadTooLarge) as exc:
            self._refuse_body(exchange, exc)
            return
        exchange.body.append(body)
        exchange.kept += len(body)

    def on_message_complete(self) -> None:
        exchange = self._current
        self._current = None
        if exchange is None:
            return
        if exchange.answer is None and exchange.decoder is not None:
            try:
                rest = exchange.decoder.flush()
                if not exchange.decoder.eof:
                    raise zlib.error("the compressed data ends early")
            except zlib.error as exc:
                self._refuse_body(exchange, exc)
            else:
                exchange.body.append(rest)
                exchange.kept += len(rest)
        exchange.complete = True

    # ---- answers, in order ----

    def _advance(self) -> None:
        """Answer the first in line when it can be: at once if its head decided the answer,
        else once its body is whole; then the next. Reading stops while too much waits."""
        queue = self.queue
        while queue and not self.busy and not self.closing and not self.paused:
            exchange = queue[0]
            if exchange.began is None:
                exchange.began = self.loop.time()
            answer = exchange.answer
            if answer is not None:
                if exchange.complete:
                    queue.popleft()
                    self._send(exchange.request, answer, 0.0)
                    continue
                # the body is on the way: answer without it, and close rather than read it
                answer.close = True
                self._send(exchange.request, answer, 0.0)
                return
            if not exchange.complete:
                if exchange.expect and not exchange.continued and self.transport is not None:
                    exchange.continued = True
                    self.transport.write(CONTINUE)
                break
            queue.popleft()
            request = exchange.request
            body = exchange.body
            request.body = body[0] if len(body) == 1 else b"".join(body)
            self.busy = True
            self._task = self.loop.create_task(self._serve(request))
        if self.closing:
            return
        if self._eof and not self.busy and not (queue and (queue[0].complete or queue[0].answer is not None)):
            self.close()  # the client sends no more, and what it sent is answered
            return
        waiting = sum(e.kept for e in queue) - (queue[0].kept if queue and not self.busy else 0)
        self._read(not self.paused and not self._discard and len(queue) <= MAX_WAITING and waiting <= PIPELINE_LIMIT)
        self._arm()

    async def _serve(self, request: Request) -> None:
        began = time.perf_counter()
        try:
            response = await self.dispatcher.respond(request)
        except asyncio.CancelledError:  # a shutdown that ran out of time
            self.busy = False
            self.close()
            self._finished()
            raise
        self.busy = False
        self._task = None
        try:
            self._send(request, response, began)
        except Exception as exc:
            log.error("answering %s %s failed", request.method, request.path, exc_info=exc)
            self.close()
        self._finished()
        self._free_since = self.loop.time()
        self._advance()

    def _send(self, request: Request, response: Response, began: float, *, logged: bool = True) -> None:
        server = self.server
        server.stats.requests += 1
        close = (response.close or not request.keep_alive or server.closing or self._eof
                 or self.dispatcher.app.draining)
        transport = self.transport
        if transport is not None and not transport.is_closing():
            data = encode(response, close=close, head_only=request.method == "HEAD")
            if len(data) == 1:
                transport.write(data[0])
            elif len(data) == 2 and len(data[1]) < 4096:
                transport.write(data[0] + data[1])
            else:
                transport.writelines(data)
            if logged and server.access_log is not None:
                sent = sum(map(len, data))
                server.access_log.log(request, response.status, sent, time.perf_counter() - began if began else 0.0)
        if close:
            self._close_gracefully()

    # ---- refusals ----

    def _count(self, reason: str) -> None:
        self.server.stats.refused[reason] += 1

    def _header_message(self) -> str:
        return (f"request header too large: the request line and every header field must fit in the server's "
                f"limit of {self.limits.max_header_bytes} bytes (--max-header-bytes), and at most {MAX_FIELDS} "
                f"header fields")

    def _refuse_head(self, status: int, text: str) -> None:
        """A request that cannot be read to its end: answered (after those before it), then the
        connection closes; nothing more is read."""
        self._head = False
        self._discard = True
        self._count("header_size" if status == 431 else "malformed")
        exchange = self._current
        if exchange is not None and not exchange.complete:  # broken inside its body (chunked framing)
            exchange.answer = error_response(exchange.request, status, text, close=True)
            exchange.body = []
            return
        request = Request("GET", "/", "1.1", self._headers, received=self._received, remote=self.remote)
        exchange = Exchange(request, None)
        exchange.answer = error_response(request, status, text, close=True)
        self.queue.append(exchange)

    def _malformed(self, exc: Exception) -> None:
        text = str(exc).strip() or type(exc).__name__
        log.info("malformed request from %s: %s", self.remote, text)
        self._refuse_head(400, f"malformed HTTP request: {text}")

    def _upgraded(self) -> None:
        """An Upgrade request: the server speaks only HTTP/1.1 here; what was parsed is answered,
        then the connection closes."""
        self._head = False
        self._discard = True
        if self.queue:
            self.queue[-1].request.keep_alive = False

    def _refuse_body(self, exchange: Exchange, exc: Exception) -> None:
        request = exchange.request
        if isinstance(exc, PayloadTooLarge):
            self._count("body_size")
            exchange.answer = from_exception(request, exc, self.dispatcher.app.policy)
        else:
            encoding = request.headers.get("content-encoding", "")
            exchange.answer = from_exception(request, InvalidInput(
                f"Content-Encoding: the body is not valid {encoding} data: {exc}"), self.dispatcher.app.policy)
        exchange.answer.close = True
        exchange.body = []

    # ---- timers: one per connection, re-armed lazily ----

    def _deadline(self) -> tuple[float, str]:
        """When the connection's current wait ends, and what that wait is."""
        limits = self.limits
        if self.busy or self.closing:
            return 0.0, ""
        if self.queue:
            first = self.queue[0]
            if first.complete or first.answer is not None or limits.request_timeout_s <= 0:
                return 0.0, ""
            return (first.began or self._now) + limits.request_timeout_s, "body"
        if self._head:
            wait = limits.request_timeout_s if limits.request_timeout_s > 0 else limits.keepalive_timeout_s
            return max(self._head_began, self._free_since) + wait, "head"
        return self._free_since + limits.keepalive_timeout_s, "idle"

    def _arm(self) -> None:
        due, _ = self._deadline()
        if not due:
            return
        timer = self._timer
        if timer is not None:
            if self._timer_at <= due:
                return  # it fires first and re-arms for the rest
            timer.cancel()
        self._timer_at = due
        self._timer = self.loop.call_at(due, self._expired)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        self._timer = None
        due, what = self._deadline()
        if not due or self.transport is None:
            return
        if due > self.loop.time():
            self._arm()
            return
        if what == "idle":
            self.close()
            return
        self._count("timeout")
        limit = self.limits.request_timeout_s
        if what == "head":
            text = (f"the request header was not received within the server's limit of "
                    f"{limit if limit > 0 else self.limits.keepalive_timeout_s:g} s "
                    f"({'--request-timeout' if limit > 0 else '--keepalive-timeout'})")
            log.info("closed a connection whose request header took longer than %s", text.rpartition("limit of ")[2])
            request = Request("GET", "/", "1.1", self._headers, remote=self.remote)
            self._head = False
            self._send(request, error_response(request, 408, text, close=True), 0.0, logged=False)
            return
        first = self.queue[0]
        first.answer = from_exception(first.request, BodyTimeout(
            f"the request was not received within the server's limit of {limit:g} s (--request-timeout)"),
            self.dispatcher.app.policy)
        self._advance()

    # ---- ends ----

    def _read(self, on: bool) -> None:
        transport = self.transport
        if transport is None or on == self.reading or self.closing:
            return
        self.reading = on
        if on:
            transport.resume_reading()
        else:
            transport.pause_reading()

    def _close_gracefully(self) -> None:
        """After a closing answer: send a FIN (the client reads the answer whole), drop what the
        client still sends, and close at the latest CLOSE_GRACE_S later (closing at once, with
        unread data, would reset the connection and could lose the answer)."""
        self._read(True)  # read on, and drop, so the client's writes do not stall
        self.closing = True
        self.queue.clear()
        self._cancel_timer()
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if not transport.can_write_eof():
            transport.close()
            return
        transport.write_eof()
        self.loop.call_later(CLOSE_GRACE_S, self.close)

    def close(self) -> None:
        self.closing = True
        self._cancel_timer()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def _finished(self) -> None:
        if self._done is not None and not self._done.done():
            self._done.set_result(None)

    async def shutdown(self, timeout: float | None) -> None:
        """Answer the request in progress (within `timeout`), then close."""
        if self.busy and self._task is not None:
            self._done = self.loop.create_future()
            try:
                async with asyncio.timeout(timeout):
                    await self._done
            except TimeoutError:
                self._task.cancel()
        self.close()
