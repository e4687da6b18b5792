"""HTTP/1.1 messages as the server sees them: a parsed request, a response, its bytes on the wire.

`connection.Connection` fills a `Request` from llhttp's callbacks (header names lower-case,
the body whole, decoded from its Content-Encoding); handlers answer a `Response`, whose
body is a list of buffers written as they are (a binary tensor goes out from the
interpreter's memory, never joined into a new buffer). `encode` writes the head.
"""

from __future__ import annotations

import time
from email.utils import formatdate
from http import HTTPStatus
from typing import Any

from ..bounded import Bounded
from ..inference import Answer
from ..protocol.formats import CONTENT_TYPES, encode_message, negotiate

SERVER_NAME = "aserve"  # the Server header: no versions
SERVER_NAME_BYTES = SERVER_NAME.encode()


class Request:
    """One request: its line, headers (names lower-case; a repeated field's values joined
    with ", "), body, and what the route table and the head checks found.

    `received`: time.monotonic() when its first byte was read. `params`: the route's path
    parameters (percent-decoded). `state`: what the route's head check prepared for its
    handler (an infer call). `ahead`: the part of the head check that only matters while the
    body is still on the way (`Dispatcher.ahead`). The other attributes are the connection's, while the request
    arrives: the answer its head decided, its body's parts as they come (decoded), and its
    timing. What most requests never set is a class default."""

    answer: Any = None  # decided from the head: sent without reading the body
    drop = False  # answered from its head, its body is read and dropped: the connection stays open
    parts: Any = None  # the body's pieces, decoded, as they arrive (a list once one has)
    size = 0  # body bytes as they arrived (encoded)
    kept = 0  # body bytes kept (decoded)
    consumed = 0  # compressed body bytes decoded so far
    decoder: Any = None  # a zlib decompressor for a gzip or deflate body
    complete = False  # the whole request has arrived
    expect = False  # the client waits for 100 Continue before it sends the body
    continued = False
    began: float | None = None  # loop time its request timeout counts from (None: once it is first in line)
    body: Any = b""
    route: Any = None  # routes.Route, once matched
    state: Any = None
    ahead: Any = None  # (app, request) -> None, raising the refusal: asked if the body did not come with the head
    held = False  # it waited out a hold of its connection unread, and `received` counts the hold
    connection: Any = None  # the Connection it arrived on (connection.py): for an answer decided later
    raw: Any = None  # the bytes of the read that held it and nothing else (a refusal may be judged again on them)
    whole: float | None = None  # time.perf_counter() when a front that handed it over had all of it (`--loops`)

    def __init__(self, method: str, target: str, version: str, headers: dict[str, str], *, keep_alive: bool = True,
                 received: float = 0.0, remote: str | None = None) -> None:
        self.method = method
        self.target = target
        self.path = target.partition("?")[0]
        self.version = version  # "1.1" or "1.0"
        self.headers = headers
        self.keep_alive = keep_alive
        self.received = received
        self.remote = remote
        self.params: dict[str, str] = {}

    @property
    def query(self) -> str:
        return self.target.partition("?")[2]


class Response:
    """What a handler answers: a status, headers (Content-Type among them) and a body of
    buffers; `close`: the connection closes after it; `hold`: for a refusal for overload,
    the seconds the server expects to wait before it can admit a request (the connection
    holds a client that does not wait as told: `Pacing._refused`, pacing.py), `budget`: the
    latency budget (seconds) it was refused for, when that was the reason, and `rate`: the
    requests per second the model admits while overloaded, where its policy measures it."""

    __slots__ = ("budget", "chunks", "close", "headers", "hold", "rate", "status")

    def __init__(self, status: int = 200, body: bytes | list[Any] = b"", headers: dict[str, str] | None = None, *,
                 content_type: str | None = None, close: bool = False) -> None:
        self.status = status
        self.chunks = body if isinstance(body, list) else [body] if body else []
        self.headers = headers if headers is not None else {}
        if content_type is not None:
            self.headers["Content-Type"] = content_type
        self.close = close
        self.hold = 0.0
        self.budget: float | None = None
        self.rate: float | None = None

    @property
    def body(self) -> bytes:
        """The body joined (tests, small answers)."""
        return b"".join(bytes(c) for c in self.chunks)


# ---- the wire ----

_STATUS_LINES: dict[int, bytes] = {}
# an answer's head, by (status, body size, close, header fields): clients repeat their requests, and the
# answers' heads repeat with them (refusals' too); the Date changes once a second and the table with it
_HEADS: Bounded[tuple[Any, ...], bytes] = Bounded(256)
_second = [0]  # the second the Date value below is of
_date = [b""]


def status_line(status: int) -> bytes:
    line = _STATUS_LINES.get(status)
    if line is None:
        try:
            reason = HTTPStatus(status).phrase
        except ValueError:
            reason = "Unknown"
        line = _STATUS_LINES[status] = f"HTTP/1.1 {status} {reason}".encode()
    return line


def http_date() -> bytes:
    second = int(time.time())
    if second != _second[0]:
        _second[0], _date[0] = second, formatdate(second, usegmt=True).encode()
        _HEADS.clear()
    return _date[0]


def encode(response: Response | Answer, *, close: bool, head_only: bool = False) -> list[Any]:
    """The response on the wire: its head, then its body's buffers as they are (none for HEAD)."""
    chunks = response.chunks
    size = len(chunks[0]) if len(chunks) == 1 else sum(map(len, chunks))
    date = _date[0] if int(time.time()) == _second[0] else http_date()
    status = response.status
    key = (status, size, close, *response.headers.items())
    known = _HEADS.get(key)
    if known is not None:
        return [known] if head_only else [known, *chunks]
    head = [status_line(status), b"\r\nServer: ", SERVER_NAME_BYTES, b"\r\nDate: ", date, b"\r\nContent-Length: ",
            str(size).encode()]
    for name, value in response.headers.items():
        head += (b"\r\n", name.encode("latin-1"), b": ", value.encode("latin-1"))
    if close:
        head.append(b"\r\nConnection: close")
    head.append(b"\r\n\r\n")
    encoded = b"".join(head)
    _HEADS.remember(key, encoded)
    return [encoded] if head_only else [encoded, *chunks]


CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


def message(request: Request, obj: Any, status: int = 200) -> Response:
    """`obj` (a Struct, dict or list) as JSON or msgpack, as the client's Accept header asks
    (else as its request came)."""
    h = request.headers
    fmt = negotiate(h.get("accept"), h.get("content-type"))
    return Response(status, encode_message(obj, fmt), content_type=CONTENT_TYPES[fmt])
