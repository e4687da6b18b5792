"""Connection-level limits aiohttp does not have, and clear answers for those it has.

- `max_connections`: a connection beyond the limit is accepted, and its request is
  answered 503 (`Retry-After`), after which it closes; the others are not slowed.
- `request_timeout_s` (slow clients): a request whose headers do not arrive within the
  limit of its first byte gets 408 and its connection closes. The body's share of the
  same limit is enforced where handlers read bodies (`handlers.read_body`), from the
  time stamped here. Requests whose headers arrive in one read (nearly all) start no
  timer.
- Header size (aiohttp's `max_line_size` / `max_field_size`): 431 naming the limit,
  as JSON, instead of aiohttp's plain-text 400; a Content-Encoding aiohttp cannot
  decode at all gets 415 naming those the server reads.

Every response says `Server: aserve` (no versions).
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any, Protocol

import msgspec
from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage, ContentEncodingError, HttpProcessingError, LineTooLong
from aiohttp.web_protocol import RequestHandler

from ..protocol.formats import ENCODINGS
from .errors import SERVER_NAME, ClosingResponse, close_gracefully, error_response
from .request import HttpRequest

log = logging.getLogger("aserve.server")


class Request(web.Request):
    """aiohttp's request, whose responses all say `Server: aserve`."""

    __slots__ = ()

    async def _prepare_hook(self, response: web.StreamResponse) -> None:
        response.headers["Server"] = SERVER_NAME
        await super()._prepare_hook(response)


class Limits(msgspec.Struct, frozen=True, kw_only=True):
    """The limits a server enforces per connection (from ServerSettings)."""

    max_connections: int = 0  # 0: no limit
    request_timeout_s: float = 0.0  # 0: no limit
    max_header_bytes: int = 8190


class LimitedServer(web.Server):
    """aiohttp's low-level server with a connection limit and slow-client timeouts."""

    def __init__(self, handler: Any, *, limits: Limits, **kwargs: Any) -> None:
        super().__init__(handler, **kwargs)
        self.limits = limits
        self.open = 0  # connections served (refused ones not counted)
        self.refused = 0

    def __call__(self) -> LimitedHandler:
        cls = TimedHandler if self.limits.request_timeout_s > 0 else LimitedHandler
        return cls(self, loop=self._loop, **self._kwargs)

    async def refuse(self, request: web.BaseRequest) -> web.StreamResponse:
        """The answer on a connection over the limit: 503, then the connection closes."""
        return error_response(
            request, 503,
            f"the server is at its limit of {self.limits.max_connections} open connections (--max-connections); "
            f"retry later", {"Retry-After": "1"}, close=True,
        )


class Lender(Protocol):
    """What lends a connection to aiohttp for one request (`wire.WireProtocol`)."""

    def stash(self, data: bytes) -> None: ...

    def take_back(self, transport: asyncio.Transport, paused: bool) -> bool: ...

    def give_up(self) -> bytes: ...


class LimitedHandler(RequestHandler):
    """One connection: counted against `max_connections`; parse errors answered in JSON.

    `lend`: a connection lent by the wire front for one request; after its answer the
    connection goes back to the lender (unless it closes), and what arrived meanwhile,
    kept by the lender, is read there."""

    _counted = False
    _lender: Lender | None = None
    _fed = False

    def adopt(self, transport: asyncio.Transport, data: bytes) -> None:
        """Take over a connection another protocol read `data` from (unanswered bytes)."""
        transport.set_protocol(self)
        self.connection_made(transport)
        if data:
            self.data_received(data)

    def lend(self, lender: Lender, transport: asyncio.Transport, data: bytes) -> None:
        """Answer the one whole request in `data` on `transport`, then give it back to `lender`."""
        self._lender = lender
        self.adopt(transport, data)
        self._fed = True

    def data_received(self, data: bytes) -> None:
        if self._fed and self._lender is not None:
            self._lender.stash(data)  # the next request: the lender reads it once the connection is back
            return
        self._received(data)

    def _received(self, data: bytes) -> None:
        super().data_received(data)

    async def _handle_request(self, request: web.BaseRequest, start_time: float | None,
                              request_handler: Any) -> tuple[web.StreamResponse, bool]:
        resp, reset = await super()._handle_request(request, start_time, request_handler)
        lender = self._lender
        if lender is None:
            return resp, reset
        self._lender = None
        transport = self.transport
        if (not reset and resp is not None and resp.keep_alive is not False and not self._close
                and not self._force_close and transport is not None and not transport.is_closing()
                and lender.take_back(transport, self._paused)):
            self._close = True  # start() ends after this request ...
            self.transport = None  # ... and leaves the connection open: it is the lender's again
            if self._keepalive_handle is not None:
                self._keepalive_handle.cancel()
                self._keepalive_handle = None
            if self._counted and isinstance(self._manager, LimitedServer):
                self._manager.open -= 1
                self._counted = False
            if self._manager is not None:
                self._manager.connection_lost(self, None)
        else:
            rest = lender.give_up()  # the connection stays here: what arrived meanwhile is read here
            if rest:
                self._received(rest)
        return resp, reset

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        manager = self._manager
        assert isinstance(manager, LimitedServer)
        limit = manager.limits.max_connections
        if limit and manager.open >= limit:
            manager.refused += 1
            self._request_handler = manager.refuse  # this connection's requests only
        else:
            manager.open += 1
            self._counted = True
        super().connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._counted and isinstance(self._manager, LimitedServer):
            self._manager.open -= 1
            self._counted = False
        super().connection_lost(exc)

    def handle_error(self, request: web.BaseRequest, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        """Requests aiohttp could not parse: JSON bodies naming the limit or the problem."""
        manager = self._manager
        if not isinstance(exc, HttpProcessingError) or not isinstance(manager, LimitedServer):
            return super().handle_error(request, status, exc, message)
        if isinstance(exc, LineTooLong) or (isinstance(exc, BadHttpMessage) and "many headers" in exc.message):
            limit = manager.limits.max_header_bytes
            log.info("request from %s refused: header too large: %s", request.remote, exc.message)
            text = (f"request header too large: the request line and every header field must fit in the server's "
                    f"limit of {limit} bytes (--max-header-bytes), and at most {self.max_headers} header fields")
            return error_response(request, 431, text, close=True)
        if isinstance(exc, ContentEncodingError):
            found = re.search(r"content-encoding: [^(]*\((\w+)\)|content-encoding: (\S+)", exc.message, re.IGNORECASE)
            encoding = next((g for g in found.groups() if g), "") if found else ""
            return error_response(request, 415, f"Content-Encoding: expected one of {', '.join(ENCODINGS)}, "
                                                f"got {encoding!r}", close=True)
        log.info("malformed request from %s: %s", request.remote, exc.message)
        return error_response(request, 400, f"malformed HTTP request: {exc.message.strip()}", close=True)


class TimedHandler(LimitedHandler):
    """A connection whose requests must arrive within `request_timeout_s` of their first byte.

    `request_started` is the loop time the current request's first byte arrived (its
    body's deadline is counted from it); a header that does not arrive in the read that
    began it starts a timer, cancelled when the header is complete."""

    request_started = 0.0
    _header_timer: asyncio.TimerHandle | None = None
    _header_began = 0.0

    def _received(self, data: bytes) -> None:
        waiter = self._waiter
        if self._header_timer is None and waiter is not None and not waiter.done():
            began = self._loop.time()  # between requests (start() waits for one): a new request begins
            super()._received(data)
            if self._messages:
                self.request_started = began  # its header came whole
            elif data and not self._force_close and not self._close:
                manager = self._manager
                assert isinstance(manager, LimitedServer)
                self._header_began = began
                self._header_timer = self._loop.call_at(began + manager.limits.request_timeout_s, self._too_slow)
            return
        super()._received(data)
        if self._messages:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None
                self.request_started = self._header_began
            else:
                self.request_started = self._loop.time()  # a request that arrived behind another

    def _too_slow(self) -> None:
        """The header did not arrive in time: 408, and the connection closes."""
        self._header_timer = None
        transport = self.transport
        manager = self._manager
        if self._messages or transport is None or transport.is_closing() or not isinstance(manager, LimitedServer):
            return
        limit = manager.limits.request_timeout_s
        transport.write(header_timeout_body(limit))
        log.info("closed a connection whose request header took longer than %g s", limit)
        self._close = True  # what else arrives is dropped
        close_gracefully(self)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        super().connection_lost(exc)


def header_timeout_body(limit: float) -> bytes:
    """The whole 408 response to a request whose header did not arrive within `limit` s."""
    body = msgspec.json.encode({"error": f"the request header was not received within the server's limit of "
                                         f"{limit:g} s (--request-timeout)"})
    return (b"HTTP/1.1 408 Request Timeout\r\nServer: " + SERVER_NAME.encode()
            + b"\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body)


def request_started(request: HttpRequest) -> float | None:
    """Loop time the request's first byte arrived, when the connection times requests."""
    protocol = request.protocol
    return protocol.request_started if isinstance(protocol, TimedHandler) else None


__all__ = ["ClosingResponse", "LimitedHandler", "LimitedServer", "Limits", "Request", "TimedHandler",
           "request_started"]
