"""One HTTP/1.1 connection: llhttp (`httptools`) parses every request, and one set of rules applies.

Each connection is an `asyncio.Protocol` fed by llhttp's callbacks. A request's head
goes to the router as soon as it has arrived (`Dispatcher.head`); what the head alone
decides (unknown route, method, missing token, a body over the limit, an unreadable
Content-Type or Content-Encoding, an unknown model) is answered at once; whether the
model's queue refuses it is asked once the read that brought the head is parsed, and only
if the body is still on the way (`Request.ahead`: a body that came with its head is judged
in full when the request is served). If its body is still on the way, the body is read and dropped as it
comes (nothing kept or decoded) and the connection goes on with the next request; it
closes after the answer instead when the body cannot be skipped that way (chunked, or
over the limit: 413), the client waits on an `Expect` before sending it, or the answer
refuses access (401, 403: a client without the token has no body read).
A request that passes has its body gathered (decoded from gzip or deflate, within
`--max-body-bytes`) and is then answered by its handler.

Requests pipelined on a connection are answered in order, one at a time. The
connection stops reading when its answers are not read (the transport's write buffer
is full) or when too many requests wait behind the one in progress. Limits:
`--max-header-bytes` and MAX_FIELDS (431, as the fields arrive; a chunked body's trailer
fields and framing are held to the same limits), `--request-timeout` from a request's
first byte (408; its head is also bounded by the keep-alive timeout when that limit is
off), `--keepalive-timeout` between requests, `--max-connections` (503). A malformed request
gets 400 and the connection closes (505 for an HTTP version other than 1.1 and 1.0, 501
for a transfer coding other than chunked); so does an upgrade request, once answered (the
server speaks no other protocol on the connection). At the client's EOF, a request it cut
short is not waited for: the connection closes.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import re
import socket
import time
import zlib
from collections.abc import Callable
from typing import Any, cast

import httptools
import msgspec

from ..bounded import Bounded
from ..config import ServerSettings
from ..dataplane.plane import Pending
from ..errors import BodyTimeout, InvalidInput, Overloaded, PayloadTooLarge
from ..inference import Answer
from .errors import error_response, from_exception
from .heads import KnownHeads, Parsed
from .http import CONTINUE, Request, Response, encode
from .infer import judged_again
from .pacing import Pacing
from .router import Dispatcher, too_large

log = logging.getLogger("aserve.server")

MAX_FIELDS = 128  # header fields in one request (more: 431)
# an answer of at most this many bytes in several buffers (a binary tensor's, after its head and
# JSON header) is joined and written as one: uvloop writes one buffer at once, and queues
# several as a write request with a completion to run; a larger one goes as it is, uncopied
JOINED_ANSWER_BYTES = 16384
PIPELINE_LIMIT = 1 << 20  # body bytes waiting behind the request in progress before reading stops
MAX_WAITING = 32  # requests waiting behind the one in progress before reading stops
INFLATE_STEP = 1 << 18  # bytes a gzip or deflate body is inflated by at a time, its ratio checked after each
INFLATE_FREE = 1 << 20  # inflated bytes that --max-inflate-ratio does not count (small, very regular bodies)
OVER_LIMIT_WAIT_S = 1.0  # longest a connection over --max-connections waits for the request its 503 answers
CLOSE_GRACE_S = 1.0  # after a closing answer, how long the client may go on sending before the close
READS_BEGAN_STALE_S = 1.0  # no iteration of a serving loop reads for that long
# answers from the head after which the connection closes rather than read the body on the way
_CLOSING = frozenset({401, 403, 413})
_METHODS = {m.encode(): m for m in ("GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH")}
# header names as they arrive -> lower-case: clients send the same few names on every request
_NAMES: Bounded[bytes, str] = Bounded(512)
# fields a request may not repeat (RFC 9110 singletons; a repeated one is 400)
SINGLETONS = frozenset({"content-length", "content-location", "content-range", "content-type", "etag", "host",
                        "max-forwards", "server", "transfer-encoding", "user-agent"})


class Limits(msgspec.Struct, frozen=True, kw_only=True):
    """What a connection enforces: the ServerSettings fields of the same names."""

    max_connections: int  # 0: no limit
    request_timeout_s: float  # 0: no limit
    keepalive_timeout_s: float
    max_header_bytes: int
    max_body_bytes: int
    max_inflate_ratio: int = 0  # 0: no limit

    @classmethod
    def of(cls, settings: ServerSettings) -> Limits:
        limits = {name: getattr(settings, name) for name in cls.__struct_fields__}
        limits["max_connections"] = settings.connection_limit
        return cls(**limits)

    @property
    def head_bytes(self) -> int:
        """Bytes a request head may take in all: every field at its limit is not a real request."""
        return max(1 << 16, 4 * self.max_header_bytes)


def _none() -> int:
    return 0


_VERSIONS = "HTTP version not supported: this server speaks HTTP/1.1 and HTTP/1.0"
_ABSOLUTE = re.compile(r"https?://[^/?#]*", re.IGNORECASE)


def origin_form(target: str) -> str:
    """A request target in absolute form (`http://host:port/path?query`, which a server must
    take: RFC 9112 3.2.2) as the origin form the routes match: its path and query. Any other
    target comes back as it is (no route matches it)."""
    scheme = _ABSOLUTE.match(target)
    if scheme is None:
        return target
    rest = target[scheme.end():]
    return rest if rest[:1] == "/" else "/" + rest


def _framing(version: str, headers: dict[str, str]) -> tuple[int, str] | None:
    """What a new head's version and framing fields refuse: 505 for an HTTP version other
    than 1.1 and 1.0, 501 for a transfer coding other than chunked alone (RFC 9112 6.1),
    400 for an HTTP/1.1 request without Host."""
    if version != "1.1" and version != "1.0":
        return 505, f"{_VERSIONS}; the request line says HTTP/{version}"
    coding = headers.get("transfer-encoding")
    if coding is not None and [c.strip().lower() for c in coding.split(",")] != ["chunked"]:
        return 501, (f"Transfer-Encoding: this server decodes the chunked transfer coding alone, got {coding!r} "
                     f"(send a compressed body with Content-Encoding)")
    if version == "1.1" and "host" not in headers:
        return 400, "malformed HTTP request: an HTTP/1.1 request needs a Host header"
    return None


class _Overrun(Exception):
    """Raised in llhttp's callback that found a limit passed (`Connection._overrun` says which):
    llhttp stops there, before it gathers more of what is too long already."""


class HttpServer:
    """The connections of one listening socket, and what they share."""

    def __init__(self, dispatcher: Dispatcher, limits: Limits, *, access_log: Any = None) -> None:
        self.dispatcher = dispatcher
        self.limits = limits
        self.stats = dispatcher.app.stats
        self.access_log = access_log  # logs.AccessLogger, when --access-log is on
        self.connections: set[Connection] = set()
        # connections open on other loops (`--loops`: the fronts'), which max_connections counts too
        self.elsewhere: Callable[[], int] = _none
        self.heads = KnownHeads()  # request heads met before, parsed and byte for byte
        self.held = 0  # connections held after a refusal for overload (`Pacing.hold`)
        self.closing = False
        self._reads_began = 0.0  # time.monotonic() of the loop's first read of this iteration (0: none yet)

    def reads_began(self, loop: asyncio.AbstractEventLoop) -> float:
        """When the loop's iteration under way began reading: the sockets it reads were ready
        then, so a request read late in a long run of ready connections (hundreds of refusals
        can take tens of milliseconds) waited in its socket since then at least."""
        now = time.monotonic()
        began = self._reads_began
        if not began or now - began > READS_BEGAN_STALE_S:  # stale: a loop stopped before the reset ran
            began = self._reads_began = now
            loop.call_soon(self._reads_ended)  # runs once this iteration's callbacks have
        return began

    def _reads_ended(self) -> None:
        self._reads_began = 0.0

    @property
    def full(self) -> bool:
        """At --max-connections, counting every loop's connections: a new one is answered 503."""
        limit = self.limits.max_connections
        return bool(limit) and self.stats.connections + self.elsewhere() >= limit

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
        self._max_field = server.limits.max_header_bytes
        self.dispatcher = server.dispatcher
        self._cors = server.dispatcher.app.cors is not None
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.remote: str | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.queue: collections.deque[Request] = collections.deque()  # heads parsed, answers owed, in order
        self.busy = False  # the first in line is being answered
        self.paused = False  # the transport's write buffer is full
        self.reading = True
        self.closing = False
        self.counted = False
        self._current: Request | None = None  # the request whose body is being parsed
        self._url = b""
        self._fields: list[tuple[bytes, bytes]] = []  # the head's header fields as llhttp reads them
        self._refusal: tuple[int, str] | None = None  # found while the head was read (status, message)
        self._head = False  # a head is being read
        self._head_bytes = 0
        self._head_began = 0.0  # loop time its first byte arrived
        self._received = 0.0  # time.monotonic() then
        self._now = 0.0  # loop time of the data being parsed
        self._free_since = 0.0  # loop time the connection last finished an answer (or opened)
        self._eof = False
        self._discard = False  # nothing more is read on this connection: its last answers are owed
        # holds after refusals for overload of a client that does not wait as told (pacing.py)
        self.pacing = Pacing(server, self.loop, pause=lambda: self._read(False), resume=self._held_ended,
                             transport=lambda: self.transport)
        self._held_over = False  # the request being read waited out a hold: Request.held
        self._task: asyncio.Future[Any] | Pending | None = None  # the answer of the request being served
        self._serving: Request | None = None
        self._began = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._done: asyncio.Future[None] | None = None  # a shutdown waits for the request in progress
        self._heads_read = 0  # requests begun (on_message_begin): whether a read held exactly one request
        self._again: Request | None = None  # the last request, refused for overload, whose bytes came in one read
        self._known: Parsed | None = None  # the last head read: its `KnownHeads.parsed` entry, if plain
        self._whole: bytes | None = None  # the read being parsed, when it began with a request and nothing was owed
        self._heads_before = 0  # `_heads_read` before the read being parsed
        self._progress = False  # llhttp reached a request's start, head, body or end in the read being parsed
        self._stalled = 0  # bytes read in a body's framing (chunk sizes, trailer fields) since the last progress
        self._trailers = 0  # trailer fields of the request being read
        self._overrun: tuple[int, str] | None = None  # a limit a callback found passed: parsing stops

    # ---- asyncio.Protocol ----

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not its subclasses
        server = self.server
        peer = transport.get_extra_info("peername")
        self.remote = str(peer[0]) if isinstance(peer, (tuple, list)) and peer else None
        if not server.full:
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
        again = self._again
        if again is not None:
            self._again = None
            if data == again.raw and self._refuse_again(again):
                return
        heads = self._heads_before = self._heads_read
        idle = not self.queue and not self.busy and self._current is None
        whole = idle and not self._head  # llhttp is between requests, none begun
        self._whole = data if whole else None
        if whole and self.counted:
            found = self.server.heads.read(data)
            if found is not None:
                self._read_known(found[0], data, found[1])
                return
        self._known = None
        self._progress = False
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._upgraded()
        except httptools.HttpParserError as exc:
            overrun, self._overrun = self._overrun, None
            if overrun is not None:
                self._refuse_head(*overrun)
            else:
                self._malformed(exc)
        if self._head:
            if not self.closing:
                self._head_bytes += len(data)
                if self._head_bytes > self.limits.head_bytes:
                    self._refuse_head(431, self._header_message())
        elif self._current is not None and not self.closing:
            # a chunked body's framing and trailer fields: llhttp hands over no body byte for
            # them, and httptools gathers a trailer field whole before it calls on_header
            if self._progress:
                self._stalled = 0
            else:
                self._stalled += len(data)
                if self._stalled > self.limits.head_bytes:
                    self._refuse_head(431, self._trailer_message())
        current = self._current  # a request whose body is still on the way after this read
        if current is not None and current.ahead is not None and current.answer is None and not self.closing:
            answer = self.dispatcher.ahead(current)
            if answer is not None:
                self.answer_early(current, answer)
        if whole and self._heads_read == heads + 1 and len(self.queue) == 1 and self._current is None \
                and not self._head and not self.closing:
            request = self.queue[0]
            request.raw = data  # the read held this request and nothing else
            if self._known is not None and request.answer is None:
                self.server.heads.learn(data, request.size, self._known, request.version, request.keep_alive)
        self._advance()

    def _read_known(self, known: tuple[Parsed, str, bool, int], data: bytes, start: int) -> None:
        """A read of one request whose head, byte for byte, a read held before with a body of
        the same length and nothing else (`KnownHeads.read`): what llhttp's callbacks make of it,
        made without llhttp (which stays between requests), then answered as any request."""
        (headers, method_name, target, route, params, _, _), version, keep_alive, _ = known
        self._heads_read += 1
        received, held = self.pacing.sent()
        self.pacing.took()
        request = Request(method_name, target, version, headers, keep_alive=keep_alive, received=received,
                          remote=self.remote)
        request.held = held
        request.connection = self
        request.began = self._head_began = self._now
        request.route, request.params = route, params
        self.queue.append(request)
        answer = request.answer = self.dispatcher.again(request)
        if answer is not None:
            self._decided(request, answer)
        else:
            body = data[start:]
            request.size = request.kept = len(body)
            request.parts = [body]
        request.complete = True
        request.raw = data
        self._advance()

    def eof_received(self) -> bool | None:
        """The client sends no more: what it sent whole is still answered (the connection
        closes after the last of it); a request it cut short (its head or body unfinished, or
        a body being dropped) never will be, and the connection closes now rather than wait for
        its timeout."""
        self._eof = True
        if not self.busy and not self._answerable():
            self.close()
        return True

    def _answerable(self) -> bool:
        """Whether the next request in line can be answered: it is whole, or its head decided."""
        queue = self.queue
        return bool(queue) and (queue[0].complete or queue[0].answer is not None)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.closing = True
        self.pacing.lost()
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
        """A request begins (llhttp has its method's first byte): its head is read from here,
        so a read that ends inside the method is not mistaken for a gap between requests."""
        self._progress = True
        self._url = b""
        self._heads_read += 1
        self._fields = []
        self._trailers = 0
        self._refusal = None
        self._head = True
        self._head_bytes = 0
        self._head_began = self._now
        self._received, self._held_over = self.pacing.sent()
        self.pacing.took()

    def on_url(self, url: bytes) -> None:
        """The request target, or a piece of it."""
        self._url += url
        if len(self._url) > self._max_field:
            self._overrun = (431, self._header_message())
            raise _Overrun

    def on_header(self, name: bytes, value: bytes) -> None:
        """A header field (read in on_headers_complete), or after a chunked body a trailer
        field: counted against the head's limits, and not kept."""
        if self._head:
            fields = self._fields
            if len(fields) >= MAX_FIELDS:
                self._overrun = (431, self._header_message())
                raise _Overrun
            fields.append((name, value))
            return
        self._trailers += 1
        if self._trailers > MAX_FIELDS or len(name) + len(value) > self._max_field:
            self._overrun = (431, self._trailer_message())
            raise _Overrun

    def _headers(self) -> dict[str, str]:
        """The head's fields by lower-case name (a repeated field's values joined with ", ");
        a field over `--max-header-bytes`, too many fields, or a repeated singleton is the
        request's refusal."""
        headers: dict[str, str] = {}
        fields = self._fields
        limit = self._max_field
        for name, value in fields:
            key = _NAMES.get(name)
            if key is None:
                key = _NAMES.remember(name, name.decode("latin-1").lower())
            if len(name) + len(value) > limit:
                self._refusal = self._refusal or (431, self._header_message())
            elif key not in headers:
                headers[key] = value.decode("latin-1")
            elif key in SINGLETONS:
                duplicate = f"malformed HTTP request: duplicate {name.decode('latin-1')} header"
                self._refusal = self._refusal or (400, duplicate)
            else:
                headers[key] += ", " + value.decode("latin-1")
        return headers

    def on_headers_complete(self) -> None:
        self._head = False
        self._progress = True
        parser = self.parser
        method = parser.get_method()
        version = parser.get_http_version()
        # a head met before, byte for byte (clients repeat theirs), passed the checks that depend on
        # nothing else: its header mapping, route and body framing are looked up, not made again
        key = (method, self._url, version, tuple(self._fields))
        known = self.server.heads.parsed.get(key) if self._refusal is None else None
        if known is not None:
            headers, method_name, target, route, params, encoding, expect = known
        else:
            headers = self._headers()
            method_name, target = _METHODS.get(method) or method.decode("ascii"), self._url.decode("latin-1")
            if target[:1] != "/":
                target = origin_form(target)
        # an HTTP/1.0 message with Transfer-Encoding has faulty framing: answered, then closed (RFC 9112 6.1)
        keep_alive = parser.should_keep_alive() and not (version == "1.0" and "transfer-encoding" in headers)
        request = Request(method_name, target, version, headers, keep_alive=keep_alive, received=self._received,
                          remote=self.remote)
        request.connection = self
        if self._held_over:
            request.held, self._held_over = True, False
        queue = self.queue
        if not queue and not self.busy:
            request.began = self._head_began
        queue.append(request)
        self._current = request
        if not self.counted:
            self._count("connection_limit")
            request.answer = error_response(
                request, 503, f"the server is at its limit of {self.limits.max_connections} open connections "
                              f"(--max-connections); retry later", {"Retry-After": "1"}, close=True)
            return
        if known is not None:
            request.route, request.params = route, params
            answer = request.answer = self.dispatcher.again(request)
            if answer is not None:
                self._decided(request, answer)
            elif encoding == "identity" and not expect and "transfer-encoding" not in headers:
                self._known = known
        else:
            if self._refusal is None:
                self._refusal = _framing(version, headers)
            if self._refusal is not None:
                status, text = self._refusal
                self._count("header_size" if status == 431 else "malformed")
                request.answer = error_response(request, status, text, close=True)
                return
            length = None if "transfer-encoding" in headers else int(headers.get("content-length", "0"))
            answer = request.answer = self.dispatcher.head(request, length)
            if answer is not None:
                if answer.status == 413:
                    self._count("body_size")
                self._decided(request, answer)
                return
            encoding = headers.get("content-encoding", "identity").strip().lower()
            expect = "expect" in headers
            self.server.heads.parsed.remember(key, (headers, method_name, target, request.route, request.params,
                                                    encoding, expect))
        if encoding != "identity" and request.answer is None:
            request.decoder = zlib.decompressobj(31 if encoding == "gzip" else 15)
        if expect:
            request.expect = True

    def answer_early(self, request: Request, answer: Response) -> bool:
        """An answer decided after the request's head, before its body is whole (a front loop's
        refusal from the host's head checks): sent as a head's answer is, the body dropped as it
        comes (or the connection closed). False when the body is whole already (the handler
        answers) or the request was answered."""
        if request.answer is not None or request.complete or self.closing:
            return False
        request.answer = answer
        self._decided(request, answer)
        self._advance()
        return True

    def _decided(self, request: Request, answer: Response) -> None:
        """An answer its head decided: the connection stays open after it, the body read and
        dropped as it comes (`request.drop`), when the body's length is known and within the
        limit, the client does not wait on an `Expect` (it might never send the body), and
        the answer neither closes nor refuses access (401, 403, 413); else it closes after
        the answer. Whether the body came with the head changes neither: the same bytes get
        the same answers, however they are read."""
        headers = request.headers
        if (answer.status in _CLOSING or "transfer-encoding" in headers or "expect" in headers
                or int(headers.get("content-length", "0")) > self.limits.max_body_bytes):
            answer.close = True
        request.drop = not answer.close

    def on_body(self, body: bytes) -> None:
        self._progress = True
        request = self._current
        if request is None or request.answer is not None:
            return  # answered from its head: the body is not kept
        request.size += len(body)
        limit = self.limits.max_body_bytes
        try:
            if request.size > limit:
                raise too_large(limit)
            if request.decoder is not None:
                self._inflate(request, body)
                return
            if request.kept + len(body) > limit:
                raise too_large(limit)
        except (zlib.error, PayloadTooLarge) as exc:
            self._refuse_body(request, exc)
            return
        if request.parts is None:
            request.parts = [body]
        else:
            request.parts.append(body)
        request.kept += len(body)

    def _inflate(self, request: Request, data: bytes) -> None:
        """Decode a piece of a gzip or deflate body, INFLATE_STEP bytes out at a time: past
        --max-body-bytes, or past INFLATE_FREE and more than --max-inflate-ratio times the
        compressed bytes it came from, it is refused (PayloadTooLarge) as soon as it is, with
        no more inflated than that step (a bomb's gigabytes are never made)."""
        decoder, limit, ratio = request.decoder, self.limits.max_body_bytes, self.limits.max_inflate_ratio
        while data:
            out = decoder.decompress(data, INFLATE_STEP)
            tail = decoder.unconsumed_tail
            request.consumed += len(data) - len(tail)
            kept = request.kept + len(out)
            if kept > limit:
                raise too_large(limit)
            if ratio and kept > INFLATE_FREE and kept > ratio * request.consumed:
                raise PayloadTooLarge(
                    f"Content-Encoding: the body inflates to more than {ratio} times its compressed size, the "
                    f"server's limit (--max-inflate-ratio; its first {INFLATE_FREE} bytes inflated are not "
                    f"counted); send it less compressed, or uncompressed")
            if out:
                if request.parts is None:
                    request.parts = [out]
                else:
                    request.parts.append(out)
                request.kept = kept
            elif len(tail) == len(data):
                break  # no progress: what is left is past the compressed stream's end
            data = tail

    def on_message_complete(self) -> None:
        self._progress = True
        request = self._current
        self._current = None
        if request is None:
            return
        if request.answer is None and request.decoder is not None:
            try:
                rest = request.decoder.flush()
                if not request.decoder.eof:
                    raise zlib.error("the compressed data ends early")
            except zlib.error as exc:
                self._refuse_body(request, exc)
            else:
                if request.parts is None:
                    request.parts = [rest]
                else:
                    request.parts.append(rest)
                request.kept += len(rest)
        request.complete = True

    # ---- answers, in order ----

    def _advance(self) -> None:
        """Answer the first in line when it can be: at once if its head decided the answer,
        else once its body is whole; then the next. Reading stops while too much waits."""
        queue = self.queue
        while queue and not self.busy and not self.closing and not self.paused:
            request = queue[0]
            if request.began is None:
                request.began = self.loop.time()
            answer = request.answer
            if answer is not None:
                if request.complete:
                    queue.popleft()
                    self._send(request, answer, 0.0)
                    continue
                if request.drop:
                    # the body is on the way: answer now, and read on, dropping it (on_body), to the
                    # next request; it stays `_current` until its end
                    queue.popleft()
                    self._send(request, answer, 0.0)
                    self._free_since = self.loop.time()
                    continue
                # the body is on the way: answer without it, and close rather than read it
                answer.close = True
                self._send(request, answer, 0.0)
                return
            if not request.complete:
                if request.expect and not request.continued and self.transport is not None:
                    request.continued = True
                    self.transport.write(CONTINUE)
                break
            queue.popleft()
            parts = request.parts
            if parts is not None:
                request.body = parts[0] if len(parts) == 1 else b"".join(parts)
            self._serve(request)
        if self.closing:
            return
        if queue:
            if self._eof and not self.busy and not (queue[0].complete or queue[0].answer is not None):
                self.close()  # the client sends no more, and what it sent is answered
                return
            waiting = sum(r.kept for r in queue) - (0 if self.busy else queue[0].kept)
            self._read(not self.paused and not self._discard and not self.pacing.held and len(queue) <= MAX_WAITING
                       and waiting <= PIPELINE_LIMIT)
        elif self._eof and not self.busy:
            self.close()
            return
        elif not self.reading and not self.paused and not self._discard and not self.pacing.held:
            self._read(True)
        if self._timer is None or self._head or self._current is not None or (queue and not queue[0].complete):
            self._arm()  # an idle connection's timer is armed already, and checks again when it fires

    def _serve(self, request: Request) -> None:
        """Run the request's handler; `_answered` sends what it answers. A handler that returns a
        future (the infer routes: the data plane's answer) costs no task; a coroutine gets one."""
        self.busy = True
        self._serving = request
        self._began = time.perf_counter() if self.server.access_log is not None else 0.0
        try:
            pending = self.dispatcher.respond(request)
        except Exception as exc:  # noqa: BLE001 - every failure gets an answer; the server goes on
            if type(exc) is Overloaded and request.raw is not None and judged_again(request):
                self._again = request  # refused by its model's admission: the same bytes are judged again cheaply
            self._answer(request, self.dispatcher.failed(request, exc))
            return
        if isinstance(pending, Pending):
            self._task = pending
            pending.then(self._told)
            return
        future = self._task = asyncio.ensure_future(pending)  # a future as it is; a coroutine in a task
        future.add_done_callback(self._answered)

    def _refuse_again(self, refused: Request) -> bool:
        """A read that holds the same bytes as the last request, which its model's admission
        refused (a client that does not wait as told sends it again): judged by the admission
        alone (`DataPlane.refuse_again`), with no parsing, routing or decoding, and refused
        again as it was, counted and held as any refusal is. False when the admission would
        admit it now, or the connection or model is not as it was: the read is then parsed as
        any other."""
        if self.queue or self.busy or self._current is not None or self._head or not self.counted \
                or self.server.closing or self.dispatcher.app.draining:
            return False
        began = time.perf_counter() if self.server.access_log is not None else 0.0
        handle, call = refused.state
        received, held = self.pacing.sent()
        refusal = self.dispatcher.app.plane.refuse_again(call, handle, received=received, held=held)
        if refusal is None:
            return False
        self.pacing.took()
        request = Request(refused.method, refused.target, refused.version, refused.headers,
                          keep_alive=refused.keep_alive, received=received, remote=self.remote)
        request.route, request.params, request.state, request.raw = refused.route, refused.params, refused.state, \
            refused.raw
        request.held = held
        request.began = self._head_began = self._now
        self._send(request, self.dispatcher.failed(request, refusal), began)
        if not self.closing:
            self._again = request
        self._free_since = self.loop.time()
        self._advance()
        return True

    def _told(self, answer: Answer | None, error: BaseException | None) -> None:
        """The data plane's answer to the request being served (`Pending.then`)."""
        request = self._serving
        assert request is not None
        if error is not None:
            self._answer(request, self.dispatcher.failed(request, error))
        elif self._cors:
            self._answer(request, self.dispatcher.finish(request, answer))  # type: ignore[arg-type]
        else:
            self._answer(request, answer)  # type: ignore[arg-type]

    def _answered(self, pending: asyncio.Future[Any]) -> None:
        """A handler's task or future is done."""
        if pending.cancelled():  # a shutdown that ran out of time
            self._serving = self._task = None
            self.busy = False
            self.close()
            self._finished()
            return
        error = pending.exception()
        self._told(None if error is not None else pending.result(), error)

    def _answer(self, request: Request, response: Response | Answer) -> None:
        self._serving = self._task = None
        self.busy = False
        try:
            self._send(request, response, self._began)
        except Exception as exc:  # this connection ends; the server goes on
            log.error("answering %s %s failed", request.method, request.path, exc_info=exc)
            self.close()
        if self._done is not None:
            self._finished()
        self._free_since = self.loop.time()
        self._advance()

    def _send(self, request: Request, response: Response | Answer, began: float, *, logged: bool = True) -> None:
        server = self.server
        server.stats.requests += 1
        close = (response.close or not request.keep_alive or server.closing or self.dispatcher.app.draining
                 or (self._eof and not self._answerable()))
        transport = self.transport
        if transport is not None and not transport.is_closing():
            data = encode(response, close=close, head_only=request.method == "HEAD")
            if len(data) == 1:
                transport.write(data[0])
            elif sum(map(len, data)) <= JOINED_ANSWER_BYTES:
                transport.write(b"".join(data))
            else:
                transport.writelines(data)
            if logged and server.access_log is not None:
                sent = sum(map(len, data))
                server.access_log.log(request, response.status, sent, time.perf_counter() - began if began else 0.0)
        if close:
            self._close_gracefully()
        else:
            self.pacing.answered(request, response)

    def _held_ended(self) -> None:
        """A hold of the connection ended (pacing.py): it reads again."""
        if not self.closing:
            self._advance()

    # ---- refusals ----

    def _count(self, reason: str) -> None:
        self.server.stats.refused[reason] += 1

    def _trailer_message(self) -> str:
        return (f"request trailer section too large: after a chunked body's last byte, its framing and trailer "
                f"fields must fit in {self.limits.head_bytes} bytes, each trailer field in the server's limit of "
                f"{self.limits.max_header_bytes} bytes (--max-header-bytes), and there may be at most {MAX_FIELDS} "
                f"trailer fields")

    def _header_message(self) -> str:
        return (f"request header too large: the request line and every header field must fit in the server's "
                f"limit of {self.limits.max_header_bytes} bytes (--max-header-bytes), and at most {MAX_FIELDS} "
                f"header fields")

    def _refuse_head(self, status: int, text: str) -> None:
        """A request that cannot be read to its end: answered (after those before it), then the
        connection closes; nothing more is read. One broken inside its body (chunked framing,
        trailers) keeps the answer its head decided, if it had one: that answer may have gone
        out before the broken bytes came, and the same bytes get the same answer."""
        self._head = False
        self._discard = True
        current = self._current
        if current is not None and not current.complete:
            current.parts = None
            current.drop = False
            if current.answer is not None:
                current.answer.close = True
                return
            self._count("header_size" if status == 431 else "malformed")
            current.answer = error_response(current, status, text, close=True)
            return
        self._count("header_size" if status == 431 else "malformed")
        request = Request("GET", "/", "1.1", {}, received=self._received, remote=self.remote)
        request.answer = error_response(request, status, text, close=True)
        self.queue.append(request)

    def _malformed(self, exc: Exception) -> None:
        text = str(exc).strip() or type(exc).__name__
        log.info("malformed request from %s: %s", self.remote, text)
        if text == "Invalid HTTP version":  # llhttp knows 0.9, 1.0, 1.1 and 2.0 alone
            self._refuse_head(505, _VERSIONS)
        else:
            self._refuse_head(400, f"malformed HTTP request: {text}")

    def _upgraded(self) -> None:
        """An Upgrade request: the server speaks only HTTP/1.1 here; what was parsed is answered,
        then the connection closes."""
        self._head = False
        self._discard = True
        if self.queue:
            self.queue[-1].keep_alive = False

    def _refuse_body(self, request: Request, exc: Exception) -> None:
        if isinstance(exc, PayloadTooLarge):
            self._count("body_size")
            request.answer = from_exception(request, exc, self.dispatcher.app.policy)
        else:
            encoding = request.headers.get("content-encoding", "")
            request.answer = from_exception(request, InvalidInput(
                f"Content-Encoding: the body is not valid {encoding} data: {exc}"), self.dispatcher.app.policy)
        request.answer.close = True
        request.parts = None

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
        if self._current is not None and limits.request_timeout_s > 0:
            # nothing in line, yet a body arrives: a request answered from its head, its body dropped
            return (self._current.began or self._now) + limits.request_timeout_s, "dropped"
        if not self.counted:  # over --max-connections: its 503 is owed within a second, or it closes
            wait = min(limits.keepalive_timeout_s, OVER_LIMIT_WAIT_S)
        elif self._head:
            wait = limits.request_timeout_s if limits.request_timeout_s > 0 else limits.keepalive_timeout_s
        else:
            wait = limits.keepalive_timeout_s
        if self._head:
            return max(self._head_began, self._free_since) + wait, "head"
        return self._free_since + wait, "idle"

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
        if what == "dropped":  # its answer went out already: the connection just ends
            log.info("closed a connection whose answered request's body took longer than %g s "
                     "(--request-timeout)", self.limits.request_timeout_s)
            self.close()
            return
        self._count("timeout")
        limit = self.limits.request_timeout_s
        if what == "head":
            bound = f"{limit:g} s (--request-timeout)" if limit > 0 else \
                f"{self.limits.keepalive_timeout_s:g} s (--keepalive-timeout)"
            text = f"the request header was not received within the server's limit of {bound}"
            log.info("closed a connection whose request header took longer than %s", bound)
            request = Request("GET", "/", "1.1", {}, remote=self.remote)
            self._head = False
            self._send(request, error_response(request, 408, text, close=True), 0.0, logged=False)
            return
        first = self.queue[0]
        first.answer = from_exception(first, BodyTimeout(
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
                task = self._task
                if isinstance(task, Pending):  # given up: withdrawn if it has not run, and not answered
                    task.drop()
                    self._serving = self._task = None
                    self.busy = False
                elif task is not None:
                    task.cancel()
        self.close()
