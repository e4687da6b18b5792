"""gRPC over HTTP/2 on an asyncio event loop: each connection's HTTP/2 is `_native.H2`
(libnghttp2, in C), and the calls are served by grpc's own handler objects
(`grpc.GenericRpcHandler`, `grpc.RpcMethodHandler`), so the services written for grpc.aio
(the inference service, health, reflection) run here unchanged, with a `Call` as their
ServicerContext.

It replaces grpc.aio's server: grpc's core runs threads and a completion queue of its
own beside the loop, and hands each call to the loop across them, which costs several
times the CPU of an HTTP request per call. Here a call's bytes are read, answered and
written on the loop that reads its connection, as the HTTP front's are, with no thread.

A connection's bounds are the `grpc_*` settings, as gRPC's servers apply them: calls open
at once (SETTINGS_MAX_CONCURRENT_STREAMS), metadata and message sizes (RESOURCE_EXHAUSTED;
the unfinished messages of all its calls together hold at most one message's worth, as an
HTTP connection's one body at a time does),
idle time and age (GOAWAY; after the age's grace, the calls still open end UNAVAILABLE),
the server's keepalive pings (no answer within the timeout: the connection is closed), and
the client's pings (too many: GOAWAY ENHANCE_YOUR_CALM, "too_many_pings"). A message sent
gzip- or deflate-compressed is inflated within the HTTP body's bounds; answers go uncompressed.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import inspect
import logging
import socket
import zlib
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Any, NamedTuple

import grpc

from ... import _native
from ...config import ServerSettings
from ..connection import INFLATE_FREE

log = logging.getLogger("aserve.server")

CALL, MESSAGE, END, RESET, OVERSIZE, PING = range(1, 7)  # native/host/h2.c's events
NO_ERROR, CANCEL, ENHANCE_YOUR_CALM = 0x0, 0x8, 0xB  # HTTP/2 error codes
TIMEOUT_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}
WRITE_HIGH = 64 * 1024  # a stream's answers not yet sent past this: written out now, and its writer waits
INFLATE_WBITS = {"gzip": 31, "deflate": 15}  # grpc-encoding -> zlib's wbits (gRPC's deflate is zlib's format)
LINGER_S = 2.0  # a connection whose write side closed waits this long for the client to close its own
NO_PING_WITHOUT_CALLS_S = 7200.0  # gRPC's: a client's pings on a connection with no call, unless permitted


class CallDetails(NamedTuple):
    """grpc.HandlerCallDetails: what a GenericRpcHandler is asked with."""

    method: str
    invocation_metadata: tuple[tuple[str, str | bytes], ...]


class Refusal(Exception):
    """A call refused with `code` (its message the details)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code


class Aborted(Exception):
    """Raised by `Call.abort`: the handler ends, and the call with the status it set."""


def timeout_of(value: str) -> float | None:
    """The seconds of a grpc-timeout header (at most 8 digits and a unit), None when it is not one."""
    unit = TIMEOUT_UNITS.get(value[-1:])
    digits = value[:-1]
    if unit is None or not digits.isdigit() or len(digits) > 8:
        return None
    return int(digits) * unit


def percent(text: str) -> str:
    """grpc-message's encoding: bytes outside printable ASCII, '%', and a space at either end
    (a field value may not begin or end with one), as %XX."""
    if text.isascii() and text.isprintable() and "%" not in text and text.strip(" ") == text:
        return text
    data = text.encode()
    last = len(data) - 1
    return "".join(chr(b) if 0x20 <= b < 0x7F and b != 0x25 and not (b == 0x20 and i in (0, last)) else f"%{b:02X}"
                   for i, b in enumerate(data))


class Call:
    """One call: the ServicerContext its handler gets, and its state on the connection."""

    __slots__ = ("code", "conn", "deadline", "details", "ended", "expired", "handler", "metadata", "method",
                 "on_cancel", "request", "requests", "started", "stream", "task", "timer", "trailing", "writable")

    def __init__(self, conn: Connection, stream: int, method: str, metadata: list[tuple[str, Any]],
                 handler: grpc.RpcMethodHandler) -> None:
        self.conn = conn
        self.stream = stream
        self.method = method
        self.metadata = metadata
        self.handler = handler
        self.deadline: float | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.task: asyncio.Task[None] | None = None
        self.requests: asyncio.Queue[Any] | None = None  # a request-streaming call's messages, None at the end
        self.request: Any = None  # a unary call's message, once it came
        self.code = grpc.StatusCode.OK
        self.details = ""
        self.trailing: tuple[tuple[str, str], ...] = ()
        self.ended = False  # finished, or reset: nothing more is sent
        self.started = False
        self.expired = False
        self.writable: asyncio.Event | None = None  # set while its answers may be written
        self.on_cancel: Callable[[], None] | None = None  # a call answered without a task: what stops its work

    # ---- grpc.aio.ServicerContext, the part the services use ----

    def invocation_metadata(self) -> tuple[tuple[str, Any], ...]:
        return tuple(self.metadata)

    def peer(self) -> str:
        return self.conn.peer

    def time_remaining(self) -> float | None:
        return None if self.deadline is None else max(self.deadline - self.conn.loop.time(), 0.0)

    def set_trailing_metadata(self, trailing_metadata: Iterable[tuple[str, str]]) -> None:
        self.trailing = tuple(trailing_metadata)

    def set_code(self, code: grpc.StatusCode) -> None:
        self.code = code

    def set_details(self, details: str) -> None:
        self.details = details

    def cancelled(self) -> bool:
        return self.ended and self.code == grpc.StatusCode.CANCELLED

    def done(self) -> bool:
        return self.ended

    async def abort(self, code: grpc.StatusCode, details: str = "",
                    trailing_metadata: Iterable[tuple[str, str]] = ()) -> None:
        if code == grpc.StatusCode.OK:
            raise ValueError("abort: expected a status other than OK")
        self.code, self.details = code, details
        if trailing_metadata:
            self.trailing = tuple(trailing_metadata)
        raise Aborted(details)

    async def write(self, message: Any) -> None:
        """One answer of a response-streaming call; waits while the client does not read."""
        if self.ended:
            raise asyncio.CancelledError  # the client left: the handler ends
        self.send(message)
        conn = self.conn
        if conn.h2.backlog(self.stream) >= WRITE_HIGH:
            conn.flush()
        while not self.ended and (conn.paused or conn.h2.backlog(self.stream) >= WRITE_HIGH):
            if self.writable is None:
                self.writable = asyncio.Event()
            self.writable.clear()
            conn.waiting.add(self)
            await self.writable.wait()
        if self.ended:
            raise asyncio.CancelledError

    async def read(self) -> Any:
        assert self.requests is not None
        item = await self.requests.get()
        return item

    # ---- a unary call answered without a task (a handler's `submit`) ----

    def answer(self, message: Any) -> None:
        """The call's one answer, and its end."""
        if not self.ended:
            self.send(message)
            self.finish()

    def fail(self, code: grpc.StatusCode, details: str, trailing: Iterable[tuple[str, str]] = ()) -> None:
        """The call ends with `code`."""
        if not self.ended:
            self.code, self.details, self.trailing = code, details, tuple(trailing)
            self.finish()

    def _cancelled(self) -> None:
        hook, self.on_cancel = self.on_cancel, None
        if hook is not None:
            hook()

    # ---- serving ----

    def send(self, message: Any) -> None:
        serialize = self.handler.response_serializer
        if self.conn.h2.send(self.stream, message if serialize is None else serialize(message)):
            self.conn.dirty()
        else:  # the stream is gone: the client no longer waits for its answers
            self.reset()

    def finish(self) -> None:
        """The call's status, its trailers, and its end."""
        if self.ended:
            return
        self.ended = True
        if self.timer is not None:
            self.timer.cancel()
        trailers = [("grpc-status", str(self.code.value[0]))]
        if self.details:
            trailers.append(("grpc-message", percent(self.details)))
        trailers.extend((k, v) for k, v in self.trailing if isinstance(v, str))
        conn = self.conn
        conn.end(self)
        conn.h2.finish(self.stream, trailers)
        if conn.calls or conn.flushing:
            conn.dirty()  # written with the other calls' answers, once this loop iteration is done
        else:
            conn.flush()  # the connection's last open call: nothing to wait for

    def reset(self) -> None:
        """The client ended the stream (or the connection went): the handler is cancelled."""
        if self.ended:
            return
        self.ended = True
        self.code = grpc.StatusCode.CANCELLED
        if self.timer is not None:
            self.timer.cancel()
        self.conn.end(self)
        if self.task is not None:
            self.task.cancel()
        self._cancelled()
        if self.writable is not None:
            self.writable.set()

    def expire(self) -> None:
        """The client's deadline passed: DEADLINE_EXCEEDED, and the handler is cancelled."""
        self.timer = None
        if self.ended:
            return
        self.expired = True
        self.code, self.details = grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"
        task = self.task
        self.finish()
        if task is not None:
            task.cancel()
        self._cancelled()

    def start(self) -> None:
        """Serve the call: a unary call whose handler has a `submit` (the request's bytes and
        this call: it answers through `answer` or `fail`, now or later, and returns False to
        leave the call to the handler itself) without a task; any other in a task of its own."""
        self.started = True
        h = self.handler
        submit = None if h.request_streaming or h.response_streaming or h.request_deserializer is not None else \
            getattr(h.unary_unary, "submit", None)
        if submit is not None:
            try:
                if submit(self.request, self):
                    return
            except Exception:
                log.exception("aserve: the gRPC handler of %s raised", self.method)
                return self.fail(grpc.StatusCode.UNKNOWN, "Unexpected error in the server's handler")
        self.task = self.conn.loop.create_task(self.run())

    async def run(self) -> None:
        h = self.handler
        try:
            if h.request_streaming:
                request: Any = self.iterate()
            else:
                deserialize = h.request_deserializer
                request = self.request if deserialize is None else deserialize(self.request)
            behavior = (h.stream_stream if h.response_streaming else h.stream_unary) if h.request_streaming else \
                (h.unary_stream if h.response_streaming else h.unary_unary)
            result = behavior(request, self)
            if h.response_streaming:
                if inspect.isasyncgen(result):
                    async for answer in result:
                        await self.write(answer)
                else:
                    await result
            else:
                answer = await result
                if not self.ended and self.code == grpc.StatusCode.OK:
                    self.send(answer)
        except Aborted:
            pass
        except asyncio.CancelledError:
            if not self.ended:  # the server's shutdown cancelled it
                self.code, self.details = grpc.StatusCode.CANCELLED, "Cancelled"
        except Exception:
            log.exception("aserve: the gRPC handler of %s raised", self.method)
            self.code, self.details = grpc.StatusCode.UNKNOWN, "Unexpected error in the server's handler"
        finally:
            self.finish()

    async def iterate(self) -> AsyncIterator[Any]:
        deserialize = self.handler.request_deserializer
        assert self.requests is not None
        while True:
            item = await self.requests.get()
            if item is None:
                return
            yield item if deserialize is None else deserialize(item)


class Connection(asyncio.Protocol):
    """One client's HTTP/2 connection and its calls."""

    def __init__(self, server: GrpcServer) -> None:
        self.server = server
        self.loop = server.loop
        s = server.settings
        self.h2 = _native.H2(s.grpc_max_concurrent_streams, s.max_header_bytes, s.max_body_bytes)
        self.transport: asyncio.Transport | None = None
        self.peer = ""
        self.calls: dict[int, Call] = {}
        self.waiting: set[Call] = set()  # writers waiting for the client to read
        self.flushing = False
        self.paused = False
        self.closing = False  # GOAWAY sent: no more calls; closed when the last ends
        self.shutting = False  # the write side is closed
        self.idle_timer: asyncio.TimerHandle | None = None
        self.timers: list[asyncio.TimerHandle] = []
        self.ping_sent: float | None = None  # our keepalive ping's time, until its answer
        self.last_ping: float | None = None  # the client's last ping
        self.strikes = 0

    # ---- the transport ----

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no asyncio.Transport
        address = transport.get_extra_info("peername")
        if isinstance(address, tuple):
            self.peer = f"ipv6:[{address[0]}]:{address[1]}" if ":" in address[0] else f"ipv4:{address[0]}:{address[1]}"
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.connections.add(self)
        s = self.server.settings
        if s.grpc_max_connection_age_s:
            self.timers.append(self.loop.call_later(s.grpc_max_connection_age_s, self.aged))
        self.timers.append(self.loop.call_later(s.grpc_keepalive_time_s, self.keepalive))
        self.idle()
        self.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        for timer in [*self.timers, self.idle_timer]:
            if timer is not None:
                timer.cancel()
        for call in list(self.calls.values()):
            call.reset()
        self.h2.close()
        self.transport = None
        self.server.lost(self)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self.wake()

    def data_received(self, data: bytes) -> None:
        if self.shutting:
            return
        try:
            events = self.h2.feed(data)
        except ConnectionError as e:  # a protocol error: nghttp2 answered it with GOAWAY
            log.debug("aserve: gRPC connection from %s: %s", self.peer, e)
            self.flush()
            self.shut()
            return
        self.dispatch(events)
        if self.waiting:
            self.wake()
        self.flush()

    def dispatch(self, events: list[tuple[Any, ...]]) -> None:
        for event in events:
            kind = event[0]
            if kind == MESSAGE:
                self.message(event[1], event[2], event[3])
            elif kind == CALL:
                self.begin(event[1], event[2], event[3], event[4])
            elif kind == END:
                call = self.calls.get(event[1])
                if call is not None and not call.ended:
                    if call.requests is not None:
                        call.requests.put_nowait(None)
                    elif not call.started:
                        if call.request is None:
                            self.refuse(call, grpc.StatusCode.INTERNAL, "Missing request message")
                        else:
                            call.start()
            elif kind == RESET:
                call = self.calls.get(event[1])
                if call is not None:
                    call.reset()
            elif kind == OVERSIZE:
                self.oversize(event[1], event[2], event[3])
            elif kind == PING:
                self.pinged(event[1])

    def dirty(self) -> None:
        """Something waits to be written: once, at the end of this loop iteration."""
        if not self.flushing:
            self.flushing = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        self.flushing = False
        if self.transport is None:
            return
        try:
            out = self.h2.output()
        except ConnectionError:
            self.close()
            return
        if out:
            self.transport.write(out)
        if self.h2.events:  # streams nghttp2 ended as it wrote (a protocol error on a stream)
            self.dispatch(self.h2.take())
        if (self.closing and not self.calls or not self.h2.want_read) and not self.h2.want_write:
            self.shut()

    def wake(self) -> None:
        waiting, self.waiting = self.waiting, set()
        for call in waiting:
            if call.writable is not None:
                call.writable.set()

    def shut(self) -> None:
        """Nothing more to say: the write side closes, and the connection once the client closes
        its own (or after LINGER_S). Closing at once would reset a connection whose client's
        last frames (a PING, a WINDOW_UPDATE) are unread, and the reset can take the answers
        the client has not read yet with it."""
        if self.transport is None or self.shutting:
            return
        self.shutting = True
        try:
            self.transport.write_eof()
        except (OSError, NotImplementedError):  # already gone, or a transport that cannot
            self.close()
        else:
            self.timers.append(self.loop.call_later(LINGER_S, self.close))

    def eof_received(self) -> bool:
        return False  # the transport closes

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    # ---- calls ----

    def begin(self, stream: int, method: str | None, path: str | None, metadata: list[tuple[str, Any]]) -> None:
        if self.idle_timer is not None:
            self.idle_timer.cancel()
            self.idle_timer = None
        self.last_ping = None  # data came: the client's next ping is no strike
        if self.closing or path is None:
            self.h2.reset(stream, 0x7)  # REFUSED_STREAM
            self.dirty()
            return
        handler = self.server.find(path, metadata)
        call = Call(self, stream, path, metadata, handler or UNIMPLEMENTED)
        self.calls[stream] = call
        if handler is None:
            return self.refuse(call, grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
        if method != "POST":
            return self.refuse(call, grpc.StatusCode.INTERNAL, f"expected the POST method, got {method!r}")
        for index, (key, value) in enumerate(metadata):
            if isinstance(value, bytes):  # a -bin value: base64 on the wire, its bytes to the handler
                try:
                    metadata[index] = (key, base64.b64decode(value + b"=" * (-len(value) % 4), validate=True))
                except ValueError:
                    return self.refuse(call, grpc.StatusCode.INTERNAL, f"metadata {key!r}: expected base64")
            elif key == "grpc-timeout":
                seconds = timeout_of(value)
                if seconds is not None:
                    call.deadline = self.loop.time() + seconds
                    call.timer = self.loop.call_at(call.deadline, call.expire)
            elif key == "content-type" and not value.startswith("application/grpc"):
                return self.refuse(call, grpc.StatusCode.INTERNAL, f"expected content-type application/grpc, "
                                                                   f"got {value!r}")
        if handler.request_streaming:
            call.requests = asyncio.Queue()
            call.start()

    def message(self, stream: int, data: bytes, compressed: bool) -> None:
        call = self.calls.get(stream)
        if call is None or call.ended:
            return
        if compressed:
            try:
                data = self.inflate(call, data)
            except Refusal as refusal:
                return self.refuse(call, refusal.code, str(refusal))
        if call.requests is not None:
            call.requests.put_nowait(data)
        elif call.request is None:
            call.request = data
        else:
            self.refuse(call, grpc.StatusCode.INTERNAL, "a unary call sent more than one message")

    def inflate(self, call: Call, data: bytes) -> bytes:
        """A compressed message's bytes (grpc-encoding gzip, or deflate: zlib's format), inflated
        no further than --max-body-bytes and --max-inflate-ratio allow (as an HTTP body's)."""
        encoding = next((v for k, v in call.metadata if k == "grpc-encoding"), "identity")
        wbits = INFLATE_WBITS.get(encoding)
        if wbits is None:
            raise Refusal(grpc.StatusCode.UNIMPLEMENTED if encoding != "identity" else grpc.StatusCode.INTERNAL,
                          f"a compressed message with grpc-encoding {encoding!r}: expected gzip or deflate")
        s = self.server.settings
        decoder = zlib.decompressobj(wbits)
        try:
            out = decoder.decompress(data, s.max_body_bytes + 1)
        except zlib.error as e:
            raise Refusal(grpc.StatusCode.INTERNAL, f"the message does not decompress ({encoding}: {e})") from None
        if len(out) > s.max_body_bytes or decoder.unconsumed_tail:
            raise Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED, f"Received message larger than max (more than "
                                                              f"{s.max_body_bytes} bytes once decompressed)")
        ratio = s.max_inflate_ratio
        if ratio and len(out) > INFLATE_FREE and len(out) > ratio * len(data):
            raise Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED, f"the message inflates to more than {ratio} times its "
                                                              f"compressed size (--max-inflate-ratio)")
        if not decoder.eof:
            raise Refusal(grpc.StatusCode.INTERNAL, f"the compressed message ends early ({encoding})")
        return out

    def oversize(self, stream: int, what: int, size: int) -> None:
        call = self.calls.get(stream)
        if call is None and what != 1 or call is not None and call.ended:
            return  # the stream's call was answered already: the rest of its message is dropped unread
        s = self.server.settings
        if what == 1:
            text = f"the call's metadata take {size} bytes; at most {s.max_header_bytes} are accepted"
        elif what == 2:
            text = f"Received message larger than max ({size} vs. {s.max_body_bytes})"
        else:
            text = (f"the unfinished messages of this connection's calls would hold {size} bytes; at most "
                    f"{s.max_body_bytes} (--max-body-bytes) are held at once: send large messages one at a time, "
                    f"or over more connections")
        if call is None:  # its metadata never made a call
            call = Call(self, stream, "", [], UNIMPLEMENTED)
            self.calls[stream] = call
        if call.task is not None:
            call.task.cancel()
        self.refuse(call, grpc.StatusCode.RESOURCE_EXHAUSTED, text)

    def refuse(self, call: Call, code: grpc.StatusCode, details: str) -> None:
        call.code, call.details = code, details
        task = call.task
        call.finish()
        if task is not None:
            task.cancel()

    def end(self, call: Call) -> None:
        """`call` ended: the connection forgets it."""
        self.calls.pop(call.stream, None)
        self.waiting.discard(call)
        if not self.calls:
            self.idle()
            self.server.idle(self)

    def idle(self) -> None:
        s = self.server.settings.grpc_max_connection_idle_s
        if s and self.idle_timer is None and not self.closing:
            self.idle_timer = self.loop.call_later(s, self.went_idle)

    def went_idle(self) -> None:
        self.idle_timer = None
        if not self.calls:
            self.goaway(NO_ERROR, b"max_idle")

    def goaway(self, code: int, debug: bytes) -> None:
        """No more calls on this connection; it closes once those open ended."""
        if not self.closing:
            self.closing = True
            self.h2.goaway(code, debug)
        self.dirty()

    # ---- age and pings ----

    def aged(self) -> None:
        self.goaway(NO_ERROR, b"max_age")
        self.timers.append(self.loop.call_later(self.server.settings.grpc_max_connection_age_grace_s, self.age_grace))

    def age_grace(self) -> None:
        self.end_calls("max connection age")

    def end_calls(self, why: str) -> None:
        """Every call open ends UNAVAILABLE (`why`), and the connection with them."""
        for call in list(self.calls.values()):
            self.refuse(call, grpc.StatusCode.UNAVAILABLE, why)
        self.flush()
        self.shut()

    def keepalive(self) -> None:
        s = self.server.settings
        if self.transport is None:
            return
        if self.calls or s.grpc_keepalive_permit_without_calls:
            self.h2.ping()
            self.ping_sent = self.loop.time()
            self.timers.append(self.loop.call_later(s.grpc_keepalive_timeout_s, self.ping_timeout, self.ping_sent))
            self.flush()
        self.timers.append(self.loop.call_later(s.grpc_keepalive_time_s, self.keepalive))

    def ping_timeout(self, sent: float) -> None:
        if self.ping_sent == sent:  # not answered
            self.goaway(NO_ERROR, b"keepalive_timeout")
            self.flush()
            self.shut()

    def pinged(self, ack: bool) -> None:
        if ack:
            self.ping_sent = None
            return
        s = self.server.settings
        now = self.loop.time()
        allowed = s.grpc_min_ping_interval_s if self.calls or s.grpc_keepalive_permit_without_calls \
            else NO_PING_WITHOUT_CALLS_S
        if self.last_ping is not None and now - self.last_ping < allowed:
            self.strikes += 1
            if s.grpc_max_ping_strikes and self.strikes > s.grpc_max_ping_strikes:
                self.goaway(ENHANCE_YOUR_CALM, b"too_many_pings")
                self.end_calls("Too many pings")
        self.last_ping = now


async def _unimplemented(request: Any, context: Any) -> None:
    raise AssertionError("never called: a call to an unknown method is refused first")

UNIMPLEMENTED = grpc.unary_unary_rpc_method_handler(_unimplemented)


class GrpcServer:
    """A gRPC server on the running loop, serving `grpc.GenericRpcHandler`s (as grpc.aio's
    `add_generic_rpc_handlers`)."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self.loop = asyncio.get_running_loop()
        self.handlers: list[Any] = []
        self.registered: dict[str, grpc.RpcMethodHandler] = {}
        self.connections: set[Connection] = set()
        self.server: asyncio.AbstractServer | None = None
        self.drained: asyncio.Event | None = None  # set when the last connection ended, while stopping

    def add_generic_rpc_handlers(self, handlers: Sequence[Any]) -> None:
        self.handlers.extend(handlers)

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        for name, handler in handlers.items():
            self.registered.setdefault(f"/{service}/{name}", handler)

    def find(self, path: str, metadata: list[tuple[str, Any]]) -> grpc.RpcMethodHandler | None:
        details = CallDetails(path, tuple(metadata))
        for generic in self.handlers:
            handler = generic.service(details)
            if handler is not None:
                return handler
        return self.registered.get(path)

    async def start(self, sock: socket.socket) -> None:
        """Serve the connections of a bound socket."""
        sock.listen(self.settings.backlog)
        self.server = await self.loop.create_server(lambda: Connection(self), sock=sock)

    def idle(self, conn: Connection) -> None:
        pass

    def lost(self, conn: Connection) -> None:
        if self.drained is not None and not self.connections:
            self.drained.set()

    async def stop(self, grace: float | None) -> None:
        """No new connection or call; the calls open get `grace` seconds, then are cancelled."""
        if self.server is not None:
            self.server.close()
        self.drained = asyncio.Event()
        for conn in list(self.connections):
            conn.goaway(NO_ERROR, b"server shutdown")
            if not conn.calls:
                conn.flush()
        if self.connections:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.drained.wait(), grace)
        for conn in list(self.connections):
            conn.end_calls("the server is shutting down")
        if self.server is not None:
            await self.server.wait_closed()


def bind(host: str, port: int, *, reuse_port: bool) -> socket.socket:
    """A TCP socket bound to host:port (port 0: a free one); OSError when it cannot be."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host.strip("[]"), port))
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock

