"""`grpc_front` and `grpc_segments`: the gRPC front's connection (`aserve.server.grpc.h2`,
HTTP/2 on libnghttp2) fed the bytes a client sends on one connection, on a real event loop
over a fake transport, with a `GrpcServer` whose generic handler serves `Unary` (answers its
request) and `Stream` (answers each request as it comes); a request that begins with
`ABORT` is answered INVALID_ARGUMENT with `DETAILS` instead.

`grpc_front` takes one byte, how the rest is cut into reads (`reads`), then the client's
bytes. Properties:

- nothing escapes the connection (`data_received`, its callbacks and tasks, the handlers'
  log), and it writes nothing after its write side closed;
- what it writes is a well-formed sequence of HTTP/2 frames: its SETTINGS first, then what h2
  (python-hyper, as a client that opened the streams the client's bytes open) reads without
  error, nothing on a stream it reset, no answer past a GOAWAY's last stream. h2 ends its
  connection at a GOAWAY, so GOAWAY frames are read here and not given to it;
- every response starts `:status 200` with a gRPC content-type, and every stream the server
  ends, it ends with trailers that carry a valid `grpc-status` (and a percent-encoded
  `grpc-message`), after whole gRPC messages: the handler's echo (all of it when OK, all but
  the aborting message when aborted, a prefix otherwise). A stream answered but not ended must
  have been reset, open when the write side closed, reset by its client, held by the client's
  flow-control windows, or cut off by a GOAWAY for an error;
- every call the handlers received is one h2 reads in the same bytes as a server (the
  reference, fed one frame at a time): same stream, `POST` to the same path, the same
  metadata, and its messages a prefix of the whole messages h2's DATA holds. A call the
  client ended, unanswered when the client closes, is a hang.

h2 and nghttp2 differ where the protocol leaves room (h2 ends the connection on errors
nghttp2 answers on the stream alone, on a client's GOAWAY, on more streams than it allows).
So the reference stops at the first frame h2 refuses, and the rule is: where the connection
read nothing of that frame, its calls must be h2's (messages a prefix); where it read on, a
call on a stream whose header block ends before that frame must be h2's, and messages agree
as far as both go. Where nghttp2 stops first (a GOAWAY), its calls are fewer: a prefix again.
The hang and flow-control rules apply only where h2 read every frame.

`grpc_segments` takes one valid client stream and feeds it cut into reads in many ways
(`segmentations`), draining the loop after each read: the calls the handlers see and the
answers (per stream: headers, data, trailers, as h2 reads them, since HPACK state and frame
boundaries may differ), and the PING answers, must be those of the whole stream in one read.
That holds where the stream's meaning does not depend on when the server answers: no protocol
error (h2 reads it all, and the server sends no GOAWAY nor a reset other than NO_ERROR), no
client RST_STREAM, GOAWAY only last, no more PINGs than the strikes allowed, no more streams
than may be open at once, no grpc-timeout under a minute, no streaming call refused once its
handler started (a message too large or compressed) (`steady`). Other streams are only
checked for what escapes and for well-formed answers, cut every way.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import hashlib
import logging
import random
import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import grpc
import hpack
from h2 import events as h2events
from h2.config import H2Configuration
from h2.connection import H2Connection

from aserve.config import ServerSettings
from aserve.server.grpc.h2 import Connection, GrpcServer, timeout_of

from .segments import Wire

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY_FLAG = 0x4, 0x8, 0x20

SERVICE = "echo.Echo"
UNARY, STREAM = f"/{SERVICE}/Unary", f"/{SERVICE}/Stream"
ABORT = b"abort"  # a request that begins so is answered INVALID_ARGUMENT
DETAILS = 'refusé à 100% "abort"\n'  # its grpc-message: non-ASCII, '%' and a control, all percent-encoded
LIMITS = ServerSettings(grpc_max_concurrent_streams=8, max_header_bytes=512, max_body_bytes=1024)
TURNS = 2  # loop turns between two reads (grpc_front)
DRAIN_TURNS = 200  # loop turns a connection may take to answer what it read
STILL_TURNS = 3  # ... and it is done when nothing changed for this many
SHORT = 160  # grpc_segments: a stream this long or shorter is fed cut in two at every byte
POINTS = 24  # ... a longer one at this many frame boundaries (or a byte either side) at most
RANDOM_CUTS = 6  # ... and in this many random ways
STEADY_TIMEOUT_S = 60.0  # a shorter grpc-timeout may expire between two reads


class Failure(AssertionError):
    """The gRPC front broke its contract on this input."""


# ---- frames ----


class Frame(NamedTuple):
    start: int  # where it begins in its stream
    kind: int
    flags: int
    stream: int
    payload: bytes

    @property
    def end(self) -> int:
        return self.start + 9 + len(self.payload)

    def __repr__(self) -> str:
        return f"Frame(at {self.start}, type {self.kind}, flags {self.flags:#x}, stream {self.stream}, " \
               f"{self.payload[:40]!r}{'...' if len(self.payload) > 40 else ''})"


def frames(data: bytes, start: int = 0) -> tuple[list[Frame], int]:
    """The whole frames of data[start:], and where the first one cut short begins (len(data): none)."""
    out = []
    i = start
    while len(data) - i >= 9:
        length = int.from_bytes(data[i:i + 3], "big")
        if len(data) - i - 9 < length:
            break
        out.append(Frame(i, data[i + 3], data[i + 4], int.from_bytes(data[i + 5:i + 9], "big") & 0x7FFFFFFF,
                         data[i + 9:i + 9 + length]))
        i += 9 + length
    return out, i


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


def message(data: bytes, *, compressed: bool = False) -> bytes:
    """One gRPC message: its flag, its length, its bytes."""
    return bytes([compressed]) + len(data).to_bytes(4, "big") + data


def deframe(data: bytes) -> tuple[list[tuple[int, bytes]], bytes]:
    """The whole gRPC messages at the front of `data` as (flag, bytes), and what is left."""
    out = []
    i = 0
    while len(data) - i >= 5:
        size = int.from_bytes(data[i + 1:i + 5], "big")
        if len(data) - i - 5 < size:
            break
        out.append((data[i], data[i + 5:i + 5 + size]))
        i += 5 + size
    return out, data[i:]


@dataclass
class Sent:
    """What the client's bytes say by themselves, frame by frame."""

    preface: bool
    frames: list[Frame]
    tail: Frame | None  # the last frame, cut short (its payload: what of it came)
    opened: set[int]  # streams a HEADERS frame names (the last, cut short, included: nghttp2 may answer it)
    heads: dict[int, int]  # stream: where its first header block ends (its END_HEADERS frame's end)
    pings: list[bytes]  # PING payloads (not acks)
    resets: set[int]  # streams the client resets
    goaways: list[int]  # where its GOAWAY frames begin


def sent(data: bytes) -> Sent:
    preface = data.startswith(PREFACE)
    whole, end = frames(data, len(PREFACE)) if preface else ([], len(data))
    tail = None
    if len(data) - end >= 9:
        tail = Frame(end, data[end + 3], data[end + 4], int.from_bytes(data[end + 5:end + 9], "big") & 0x7FFFFFFF,
                     data[end + 9:])
    out = Sent(preface, whole, tail, set(), {}, [], set(), [])
    if tail is not None and tail.kind == HEADERS:
        out.opened.add(tail.stream)
    block: int | None = None  # the stream whose header block is open
    for f in whole:
        if f.kind == HEADERS:
            out.opened.add(f.stream)
            block = f.stream if f.stream not in out.heads else None
        if f.kind in (HEADERS, CONTINUATION) and block is not None and f.flags & END_HEADERS:
            out.heads[block] = f.end
            block = None
        if f.kind not in (HEADERS, CONTINUATION):
            block = None
        if f.kind == PING and not f.flags & ACK:
            out.pings.append(f.payload)
        elif f.kind == RST_STREAM:
            out.resets.add(f.stream)
        elif f.kind == GOAWAY:
            out.goaways.append(f.start)
    return out


# ---- the server ----


@dataclass
class Received:
    """A call as its handler received it."""

    path: str
    metadata: list[tuple[bytes, bytes]]
    messages: list[bytes] = field(default_factory=list)


def _raw(value: str | bytes) -> bytes:
    return value if isinstance(value, bytes) else value.encode("latin-1")


class Echo:
    """The handlers (see the module's docstring); each call is recorded by its stream."""

    def __init__(self) -> None:
        self.calls: dict[int, Received] = {}

    def handler(self) -> Any:
        return grpc.method_handlers_generic_handler(SERVICE, {
            "Unary": grpc.unary_unary_rpc_method_handler(self.unary),
            "Stream": grpc.stream_stream_rpc_method_handler(self.stream),
        })

    def record(self, path: str, context: Any) -> Received:
        call = Received(path, [(_raw(k), _raw(v)) for k, v in context.invocation_metadata()])
        self.calls[context.stream] = call
        return call

    async def unary(self, request: bytes, context: Any) -> bytes:
        self.record(UNARY, context).messages.append(request)
        if request.startswith(ABORT):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, DETAILS)
        return request

    async def stream(self, requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        call = self.record(STREAM, context)
        async for request in requests:
            call.messages.append(request)
            if request.startswith(ABORT):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, DETAILS)
            yield request


class _Wire(Wire):
    """The transport, noting the calls open when its write side first closed."""

    def __init__(self, conn: Connection) -> None:
        super().__init__(conn, [])
        self.open_calls: set[int] | None = None

    def _note(self) -> None:
        if self.open_calls is None:
            self.open_calls = set(self.protocol.calls)

    def write_eof(self) -> None:
        self._note()
        super().write_eof()

    def close(self) -> None:
        self._note()
        super().close()


@dataclass
class Served:
    """What one connection did with the client's bytes."""

    writes: list[bytes]
    calls: dict[int, Received]
    read: int  # the bytes given to data_received before the server closed its write side (all: len)
    open_calls: set[int]  # the calls open when the write side closed
    shut: bool  # the server closed its write side before the client closed


class _Loop:
    """The event loop the targets run on, with what escapes its callbacks and tasks."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.errors: list[str] = []
        self.tasks: list[asyncio.Task[Any]] = []
        self.loop.set_exception_handler(lambda loop, context: self.errors.append(
            f"{context.get('message')}: {context.get('exception')!r}"))
        self.loop.set_task_factory(self.task)
        logging.getLogger("aserve.server").addHandler(_Errors(self.errors))

    def task(self, loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        task = asyncio.Task(coro, loop=loop, **kwargs)
        self.tasks.append(task)
        return task


class _Errors(logging.Handler):
    """Records the connection's log records of errors (a handler that raised)."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__(logging.ERROR)
        self.errors = errors

    def emit(self, record: logging.LogRecord) -> None:
        self.errors.append(f"logged: {record.getMessage()} {record.exc_info[1] if record.exc_info else ''!r}")


_STATE: list[_Loop] = []


def _loop() -> _Loop:
    if not _STATE:
        _STATE.append(_Loop())
    return _STATE[0]


async def _settle(conn: Connection, wire: _Wire, turns: int | None) -> None:
    """`turns` loop turns, or (None) until the connection is done with what it read."""
    if turns is not None:
        for _ in range(turns):
            await asyncio.sleep(0)
        return
    tasks = _loop().tasks
    last: tuple[int, ...] = ()
    still = 0
    for _ in range(DRAIN_TURNS):
        await asyncio.sleep(0)
        state = (len(wire.writes), len(conn.calls), sum(t.done() for t in tasks), conn.flushing)
        still = still + 1 if state == last else 0
        last = state
        if still >= STILL_TURNS:
            return


async def _serve(data: bytes, cuts: list[int], turns: int | None) -> Served:
    echo = Echo()
    server = GrpcServer(LIMITS)
    server.add_generic_rpc_handlers([echo.handler()])
    conn = Connection(server)
    wire = _Wire(conn)
    conn.connection_made(wire)
    start = 0
    for end in [*cuts, len(data)]:
        if wire.is_closing():
            break
        if end > start:
            conn.data_received(data[start:end])
            start = end
            await _settle(conn, wire, turns)
    shut = wire.is_closing()
    if not shut:
        await _settle(conn, wire, None)  # the answers to all it read
    if not wire.closed:
        conn.eof_received()
        wire.close()
    await _settle(conn, wire, None)  # the handlers cancelled with the connection
    if server.connections:
        raise Failure("the connection outlived its transport")
    return Served(wire.writes, echo.calls, start, wire.open_calls or set(), shut)


def serve(data: bytes, cuts: list[int], *, turns: int | None = None) -> Served:
    """`data` fed to a new connection in reads ending at `cuts` (then its end), with `turns` loop
    turns after each (None: until the connection is done), then the client closes."""
    state = _loop()
    state.errors.clear()
    state.tasks.clear()
    served = state.loop.run_until_complete(_serve(data, cuts, turns))
    tasks, state.tasks = state.tasks[1:], []  # the first is run_until_complete's own
    pending = [t for t in tasks if not t.done()]
    if pending:  # cancelled here, lest they end (and raise) while the next input runs
        what = repr(pending[0])
        for task in pending:
            task.cancel()
        state.loop.run_until_complete(asyncio.wait(pending, timeout=1.0))
        raise Failure(f"a task outlived its connection: {what}")
    for task in tasks:
        if not task.cancelled() and task.exception() is not None:
            state.errors.append(f"a task raised: {task.exception()!r}")
    if state.errors:
        raise Failure(f"something escaped the connection: {state.errors[:3]}")
    return served


# ---- the answers, as h2 reads them ----


REQUEST = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", UNARY.encode()), (b":authority", b"a"),
           (b"content-type", b"application/grpc"), (b"te", b"trailers")]


@dataclass
class Answer:
    """One stream's answer."""

    headers: list[tuple[bytes, bytes]] | None = None
    data: bytearray = field(default_factory=bytearray)
    sent: int = 0  # its flow-controlled bytes
    trailers: list[tuple[bytes, bytes]] | None = None
    ended: bool = False
    reset: int | None = None  # the server's RST_STREAM code


@dataclass
class Answers:
    streams: dict[int, Answer]
    pings: list[bytes]  # the payloads of the server's PING acks
    goaways: list[tuple[int, int, bytes]]  # (last stream, code, debug data)
    sent: int  # DATA's flow-controlled bytes, on all streams


def _pairs(headers: Any) -> list[tuple[bytes, bytes]]:
    return [(bytes(k), bytes(v)) for k, v in headers]


def read_answers(writes: list[bytes], client: Sent) -> Answers:
    """The server's bytes read by h2 as the client; Failure where they are not well-formed HTTP/2."""
    out = b"".join(writes)
    whole, end = frames(out)
    if end != len(out):
        raise Failure(f"the server wrote a frame cut short: {out[end:end + 60]!r}")
    if not whole or whole[0].kind != SETTINGS or whole[0].flags & ACK:
        raise Failure(f"the server's first frame is not its SETTINGS: {whole[:1]}")
    touched = sorted({f.stream for f in whole if f.stream})
    for stream in touched:
        if stream not in client.opened:
            raise Failure(f"the server wrote on stream {stream}, which the client never opened")
    h2 = H2Connection(H2Configuration(client_side=True, header_encoding=None))
    h2.initiate_connection()
    for stream in touched:
        h2.send_headers(stream, REQUEST)
    h2.clear_outbound_data_buffer()
    answers = Answers({}, [], [], 0)
    for f in whole:
        if answers.goaways and f.kind in (HEADERS, DATA) and f.stream > answers.goaways[-1][0]:
            raise Failure(f"the server wrote {f!r} past its GOAWAY's last stream {answers.goaways[-1]}")
        if f.kind == GOAWAY:
            if f.stream or len(f.payload) < 8:
                raise Failure(f"a malformed GOAWAY: {f!r}")
            answers.goaways.append((int.from_bytes(f.payload[:4], "big") & 0x7FFFFFFF,
                                    int.from_bytes(f.payload[4:8], "big"), f.payload[8:]))
            continue
        answer = answers.streams.setdefault(f.stream, Answer()) if f.stream else None
        if answer is not None and answer.reset is not None and f.kind in (HEADERS, DATA, CONTINUATION):
            raise Failure(f"the server wrote {f!r} on a stream it reset")
        try:
            events = h2.receive_data(out[f.start:f.end])
        except Exception as exc:  # whatever h2 refuses is the server's fault
            raise Failure(f"h2 refuses what the server wrote ({type(exc).__name__}: {exc}) at {f!r}") from exc
        h2.clear_outbound_data_buffer()
        for e in events:
            if isinstance(e, h2events.PingAckReceived):
                answers.pings.append(e.ping_data)
                continue
            if isinstance(e, (h2events.InformationalResponseReceived, h2events.PushedStreamReceived)):
                raise Failure(f"the server sent {e!r}")
            a = answers.streams.get(getattr(e, "stream_id", 0) or 0)
            if a is None:
                continue
            if isinstance(e, h2events.ResponseReceived):
                a.headers = _pairs(e.headers)
            elif isinstance(e, h2events.TrailersReceived):
                a.trailers = _pairs(e.headers)
            elif isinstance(e, h2events.DataReceived):
                a.data += e.data or b""
                a.sent += e.flow_controlled_length or 0
                answers.sent += e.flow_controlled_length or 0
                h2.acknowledge_received_data(e.flow_controlled_length or 0, e.stream_id or 0)
                h2.clear_outbound_data_buffer()
            elif isinstance(e, h2events.StreamEnded):
                a.ended = True
            elif isinstance(e, h2events.StreamReset):
                a.reset = int(e.error_code or 0)
    return answers


def _field(block: list[tuple[bytes, bytes]], name: bytes) -> list[bytes]:
    return [v for k, v in block if k == name]


def _status(stream: int, block: list[tuple[bytes, bytes]]) -> tuple[int, str]:
    """The grpc-status and grpc-message (decoded) of a stream's trailers; Failure unless valid."""
    status = _field(block, b"grpc-status")
    if len(status) != 1 or not status[0].isdigit() or int(status[0]) > 16:
        raise Failure(f"stream {stream} ended without one valid grpc-status: {block}")
    text = _field(block, b"grpc-message")
    if len(text) > 1:
        raise Failure(f"stream {stream}: grpc-message twice: {block}")
    details = ""
    if text:
        raw = text[0]
        if not (raw.isascii() and all(0x20 <= b < 0x7F for b in raw)) or re.search(rb"%(?![0-9A-F]{2})", raw):
            raise Failure(f"stream {stream}: grpc-message is not percent-encoded: {raw!r}")
        try:
            details = re.sub(rb"%([0-9A-F]{2})", lambda m: bytes.fromhex(m[1].decode()), raw).decode()
        except UnicodeDecodeError as exc:
            raise Failure(f"stream {stream}: grpc-message is not UTF-8 once decoded: {raw!r}") from exc
    return int(status[0]), details


def _held(stream: int, answers: Answers, reference: Reading) -> bool:
    """Whether the client's windows (as the reference reads them) hold the rest of the stream's answer."""
    if reference.refused is not None:
        return True  # the reference did not read the client's windows to the end
    try:
        window = reference.h2.local_flow_control_window(stream)
    except Exception:  # noqa: BLE001 - a stream h2 closed: the client reset it
        return True
    return answers.sent >= reference.h2.outbound_flow_control_window or answers.streams[stream].sent >= window


def check_answers(served: Served, answers: Answers, client: Sent, reference: Reading) -> None:
    """The answers' properties (see the module's docstring)."""
    acked = collections.Counter(answers.pings)
    if acked - collections.Counter(client.pings):
        raise Failure(f"PING answers {answers.pings} to the client's {client.pings}")
    error = any(code for _, code, _ in answers.goaways)
    for stream, a in sorted(answers.streams.items()):
        if a.headers is not None and ((b":status", b"200") not in a.headers or not any(
                v.startswith(b"application/grpc") for v in _field(a.headers, b"content-type"))):
            raise Failure(f"stream {stream}: response headers {a.headers}")
        messages, rest = deframe(bytes(a.data))
        if any(flag for flag, _ in messages):
            raise Failure(f"stream {stream}: a compressed answer")
        echoed = [m for _, m in messages]
        call = served.calls.get(stream)
        asked = call.messages if call is not None else []
        if echoed != asked[:len(echoed)]:
            raise Failure(f"stream {stream}: answered {echoed[:4]} to {asked[:4]}")
        if a.ended:
            block = a.trailers if a.trailers is not None else a.headers
            if a.trailers is None and a.data:
                raise Failure(f"stream {stream} ended on DATA, without trailers")
            status, details = _status(stream, block or [])
            if rest:
                raise Failure(f"stream {stream} ended inside a message: {rest[:20]!r}")
            if status == 0 and (call is None or echoed != asked):
                raise Failure(f"stream {stream} answered OK {echoed[:4]} to {asked[:4]} (a call: {call is not None})")
            if details == DETAILS and (not asked or not asked[-1].startswith(ABORT) or echoed != asked[:-1]):
                raise Failure(f"stream {stream} aborted having answered {echoed[:4]} to {asked[:4]}")
        elif (a.headers is not None or a.data) and not (
                a.reset is not None or stream in served.open_calls or stream in client.resets or error
                or _held(stream, answers, reference)):
            raise Failure(f"stream {stream} was answered and left open: {a}")
    if reference.refused is None and not served.shut and not answers.goaways:
        for stream in sorted(served.open_calls):
            request = reference.requests.get(stream)
            if request is not None and request.ended and not request.reset:
                raise Failure(f"the client ended its call on stream {stream}, which is still unanswered")


# ---- the reference: h2 as the server ----


@dataclass
class Request:
    method: bytes | None
    path: bytes | None
    metadata: list[tuple[bytes, bytes]]
    data: bytearray = field(default_factory=bytearray)
    ended: bool = False
    reset: bool = False


@dataclass
class Reading:
    h2: H2Connection
    requests: dict[int, Request]
    refused: int | None  # where the frame h2 refused begins (None: it read every whole frame)
    why: str = ""


def read_reference(data: bytes, client: Sent) -> Reading:
    """The requests h2, as the server, reads in the client's bytes, fed one frame at a time up to
    the first it refuses. GOAWAY frames are left out: h2 ends its connection at one, where the
    client only says it takes no more pushed streams."""
    h2 = H2Connection(H2Configuration(client_side=False, header_encoding=None, normalize_inbound_headers=False))
    h2.initiate_connection()
    reading = Reading(h2, {}, None)
    if not client.preface:
        reading.refused, reading.why = 0, "no client preface"
        return reading
    try:
        h2.receive_data(PREFACE)
    except Exception as exc:  # noqa: BLE001 - the reference's refusal, whatever it raises
        reading.refused, reading.why = 0, repr(exc)
        return reading
    for f in client.frames:
        if f.kind == GOAWAY:
            continue
        try:
            events = h2.receive_data(data[f.start:f.end])
        except Exception as exc:  # noqa: BLE001 - the reference's refusal, whatever it raises
            reading.refused, reading.why = f.start, f"{type(exc).__name__}: {exc}"
            return reading
        for e in events:
            stream = getattr(e, "stream_id", None)
            if isinstance(e, h2events.RequestReceived) and stream:
                headers = _pairs(e.headers)
                method, path = _field(headers, b":method"), _field(headers, b":path")
                reading.requests[stream] = Request(method[0] if method else None, path[0] if path else None,
                                                   [(k, v) for k, v in headers if not k.startswith(b":")])
                continue
            request = reading.requests.get(stream or 0)
            if request is None:
                continue
            if isinstance(e, h2events.DataReceived):
                request.data += e.data or b""
                h2.acknowledge_received_data(e.flow_controlled_length or 0, stream or 0)
            elif isinstance(e, h2events.StreamEnded):
                request.ended = True
            elif isinstance(e, h2events.StreamReset):
                request.reset = True
        h2.clear_outbound_data_buffer()
    tail = client.tail
    request = reading.requests.get(tail.stream) if tail is not None and tail.kind == DATA else None
    if tail is not None and request is not None and not (request.ended or request.reset):
        # nghttp2 hands on a DATA frame's bytes as they come, h2 the whole frame: what came of the last
        # one, cut short, counts as read (its padding left out)
        declared = int.from_bytes(data[tail.start:tail.start + 3], "big")
        payload = tail.payload
        if tail.flags & PADDED and payload:
            payload = payload[1:max(declared - payload[0], 1)]
        request.data += payload
    return reading


def as_handed(metadata: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes] | tuple[bytes, str]]:
    """Metadata as a handler gets them: a `-bin` value base64-decoded (its padding optional), as
    grpc's servers hand it over; one that is not base64 is a call the front refuses, so a
    handler that saw it is a failure."""
    out: list[tuple[bytes, bytes] | tuple[bytes, str]] = []
    for key, value in metadata:
        if key.endswith(b"-bin"):
            try:
                value = base64.b64decode(value + b"=" * (-len(value) % 4), validate=True)
            except ValueError:
                out.append((key, "<not base64: the front refuses the call>"))
                continue
        out.append((key, value))
    return out


def check_calls(served: Served, client: Sent, reference: Reading) -> None:
    """Every call the handlers received is h2's (see the module's docstring for the rule)."""
    refused = reference.refused
    before = refused is None or served.read <= refused  # the connection read nothing h2 refused
    for stream, call in sorted(served.calls.items()):
        request = reference.requests.get(stream)
        if request is None:
            if before or client.heads.get(stream, len(PREFACE)) <= (refused or 0):
                raise Failure(f"a call on stream {stream} to {call.path} that h2 never read "
                              f"(h2 stopped at {refused}: {reference.why})")
            continue
        if (request.method, request.path) != (b"POST", call.path.encode()):
            raise Failure(f"stream {stream}: the handler of {call.path} got a call h2 reads as "
                          f"{request.method!r} {request.path!r}")
        handed = as_handed(request.metadata)
        if call.metadata != handed:
            raise Failure(f"stream {stream}: metadata {call.metadata} where h2 reads {request.metadata} "
                          f"(handed over as {handed})")
        theirs = [m for _, m in deframe(bytes(request.data))[0]]
        n = len(call.messages) if before else min(len(call.messages), len(theirs))
        if call.messages[:n] != theirs[:n] or n > len(theirs):
            raise Failure(f"stream {stream}: the handler got {call.messages[:4]} where h2 reads {theirs[:4]} "
                          f"(h2 stopped at {refused}: {reference.why})")


# ---- the targets ----


def reads(selector: int, data: bytes) -> list[int]:
    """Where the reads of `data` end, as the selector byte says: in one read, a frame a read,
    reads of one size, or random cuts."""
    n = len(data)
    mode, k = selector & 3, selector >> 2
    if mode == 0 or n <= 1:
        return []
    if mode == 1:
        return [len(PREFACE), *(f.end for f in frames(data, len(PREFACE))[0])] if data.startswith(PREFACE) else []
    if mode == 2:
        return list(range(1 + 3 * k, n, 1 + 3 * k))
    rng = random.Random(selector)
    return sorted(rng.sample(range(1, n), min(n - 1, 1 + k % 16)))


def grpc_front(data: bytes) -> None:
    """The target: a selector byte, then the client's bytes (see the module's docstring)."""
    if not data:
        return
    stream = data[1:]
    served = serve(stream, reads(data[0], stream), turns=TURNS)
    client = sent(stream)
    reference = read_reference(stream, client)
    check_answers(served, read_answers(served.writes, client), client, reference)
    check_calls(served, client, reference)


def segmentations(data: bytes) -> Iterator[list[int]]:
    """Cuts of `data` into reads: at every byte in two for a short stream; else each frame's head
    and payload reads of their own, then cuts at frame boundaries (or a byte either side) one at a
    time, then random cuts, seeded by the stream."""
    n = len(data)
    if n <= 1:
        return
    if n <= SHORT:
        for cut in range(1, n):
            yield [cut]
        return
    rng = random.Random(hashlib.sha1(data).digest())
    if data.startswith(PREFACE):
        marks = {len(PREFACE)} | {p for f in frames(data, len(PREFACE))[0] for p in (f.start + 9, f.end)}
        at = sorted(marks & set(range(1, n)))
        if at:
            yield at
        points = sorted({p + d for p in marks for d in (-1, 0, 1)} & set(range(1, n)))
        for p in sorted(rng.sample(points, min(len(points), POINTS))):
            yield [p]
    for _ in range(RANDOM_CUTS):
        yield sorted(rng.sample(range(1, n), min(n - 1, rng.randint(1, 8))))


def steady(client: Sent, reference: Reading, answers: Answers) -> bool:
    """Whether the stream's calls and answers cannot depend on when the server answers (see the
    module's docstring)."""
    if reference.refused is not None or not client.preface or client.resets or answers.goaways:
        return False
    if any(start != client.frames[-1].start for start in client.goaways):
        return False
    if len(client.pings) > LIMITS.grpc_max_ping_strikes + 1 or len(client.opened) > LIMITS.grpc_max_concurrent_streams:
        return False
    if any(a.reset not in (None, 0) for a in answers.streams.values()):
        return False
    for stream, request in reference.requests.items():
        a = answers.streams.get(stream)
        if request.path == STREAM.encode() and a is not None and a.ended and _field(
                a.trailers or a.headers or [], b"grpc-status") in ([b"8"], [b"12"], [b"13"]):
            return False  # a streaming call refused mid-call: its handler saw as much as it had read by then
        for key, value in request.metadata:
            if key == b"grpc-timeout":
                seconds = timeout_of(value.decode("latin-1"))
                if seconds is not None and seconds < STEADY_TIMEOUT_S:
                    return False
    return True


def outcome(served: Served, answers: Answers) -> tuple[Any, ...]:
    """What the client and the handlers saw, for comparing two segmentations."""
    calls = sorted((s, c.path, tuple(c.metadata), tuple(c.messages)) for s, c in served.calls.items())
    streams = sorted((s, tuple(a.headers or ()), bytes(a.data), tuple(a.trailers or ()))
                     for s, a in answers.streams.items() if a.headers is not None or a.data)
    return calls, streams, tuple(answers.pings)


def grpc_segments(data: bytes) -> None:
    """The target: every segmentation of a steady stream is answered as the stream in one read."""
    client = sent(data)
    whole = serve(data, [])
    answers = read_answers(whole.writes, client)
    compare = steady(client, read_reference(data, client), answers)
    reference = outcome(whole, answers)
    for cuts in segmentations(data):
        served = serve(data, cuts)
        got = outcome(served, read_answers(served.writes, client))
        if compare and got != reference:
            raise Failure(f"cut at {cuts}, the stream was answered otherwise:\n{got!r}\nin one read:\n{reference!r}")


# ---- seeds and mutations ----


GRPC_HEADERS = [(":scheme", "http"), (":method", "POST"), (":authority", "localhost:8001"), (":path", ""),
                ("te", "trailers"), ("content-type", "application/grpc"),
                ("user-agent", "grpc-python/1.85.4 grpc-c/51.0.0 (linux; chttp2)"),
                ("grpc-accept-encoding", "identity, deflate, gzip")]
BARE_HEADERS = GRPC_HEADERS[:4]  # the pseudo-headers alone


class Client:
    """What a gRPC client sends on one connection, built call by call (the seeds)."""

    def __init__(self, *, settings: tuple[tuple[int, int], ...] = ((2, 0), (4, 4194304), (6, 16384))) -> None:
        self.encoder = hpack.Encoder()
        payload = b"".join(k.to_bytes(2, "big") + v.to_bytes(4, "big") for k, v in settings)
        self.out = bytearray(PREFACE + frame(SETTINGS, 0, 0, payload) + frame(WINDOW_UPDATE, 0, 0,
                                                                             (4128769).to_bytes(4, "big")))

    def call(self, stream: int, path: str, *, metadata: tuple[tuple[str, str | bytes], ...] = (),
             end: bool = False, split: int = 0, method: str = "POST", bare: bool = False) -> Client:
        """A call's HEADERS (cut into CONTINUATION frames of `split` bytes, when given; `bare`: the
        pseudo-headers alone)."""
        headers = [(k, path if k == ":path" else method if k == ":method" else v)
                   for k, v in (BARE_HEADERS if bare else GRPC_HEADERS)]
        block = self.encoder.encode([*headers, *metadata])
        pieces = [block[i:i + split] for i in range(0, len(block), split)] if split else [block]
        for i, piece in enumerate(pieces):
            flags = (END_HEADERS if i == len(pieces) - 1 else 0) | (END_STREAM if end and i == 0 else 0)
            self.out += frame(HEADERS if i == 0 else CONTINUATION, flags, stream, piece)
        return self

    def send(self, stream: int, *messages: bytes, end: bool = False, chunk: int = 0, pad: int = 0,
             compressed: bool = False) -> Client:
        """Messages in DATA frames (`chunk` bytes each, when given; padded with `pad` bytes)."""
        body = b"".join(message(m, compressed=compressed) for m in messages)
        pieces = [body[i:i + chunk] for i in range(0, len(body), chunk)] if chunk and body else [body]
        for i, piece in enumerate(pieces):
            flags = END_STREAM if end and i == len(pieces) - 1 else 0
            if pad:
                self.out += frame(DATA, flags | PADDED, stream, bytes([pad]) + piece + bytes(pad))
            else:
                self.out += frame(DATA, flags, stream, piece)
        return self

    def end(self, stream: int) -> Client:
        """The client's half-close: an empty DATA frame that ends the stream."""
        self.out += frame(DATA, END_STREAM, stream)
        return self

    def control(self, kind: int, flags: int = 0, stream: int = 0, payload: bytes = b"") -> Client:
        self.out += frame(kind, flags, stream, payload)
        return self

    def ping(self, payload: bytes = b"aserve!!") -> Client:
        return self.control(PING, 0, 0, payload)

    def reset(self, stream: int, code: int = 0x8) -> Client:
        return self.control(RST_STREAM, 0, stream, code.to_bytes(4, "big"))

    def window(self, stream: int, increment: int) -> Client:
        return self.control(WINDOW_UPDATE, 0, stream, increment.to_bytes(4, "big"))

    def bytes(self) -> bytes:
        return bytes(self.out)


def unary(stream: int, request: bytes, **kwargs: Any) -> Client:
    return Client().call(stream, UNARY, **kwargs).send(stream, request, end=True)


_NAMES = [":path", ":method", ":scheme", ":authority", "content-type", "te", "grpc-timeout", "grpc-encoding",
          "x-id", "x-bin", "X-Upper", "connection", "cookie", "host", "", "a b"]
_VALUES: list[str | bytes] = [UNARY, STREAM, "/echo.Echo/Nope", "", "*", "GET", "POST", "post",
                              "application/grpc", "application/grpc+proto", "text/plain", "trailers", "1n", "0S",
                              "99999999H", "100000000S", "5m", "1x", "identity", "gzip", " x", "x\x00y", "\xe9",
                              "y" * 600, b"\x00\xff\x80", b"abort"]
_CODES = [0, 1, 2, 7, 8, 0xB, 0xD, 0xFFFFFFFF]


def _blocks(data: bytes, sent_: Sent) -> list[tuple[int, list[tuple[bytes, bytes]], int]] | None:
    """The header blocks of the stream, in order, decoded as (index of the HEADERS frame, headers,
    END_STREAM flag); None when one does not decode or is padded or prioritised strangely."""
    decoder = hpack.Decoder()
    out = []
    i = 0
    fs = sent_.frames
    while i < len(fs):
        f = fs[i]
        if f.kind != HEADERS:
            i += 1
            continue
        payload = f.payload
        if f.flags & PADDED:
            if not payload or payload[0] > len(payload) - 1:
                return None
            payload = payload[1:len(payload) - payload[0]]
        if f.flags & PRIORITY_FLAG:
            payload = payload[5:]
        block = bytearray(payload)
        j = i
        while not fs[j].flags & END_HEADERS and j + 1 < len(fs) and fs[j + 1].kind == CONTINUATION:
            j += 1
            block += fs[j].payload
        try:
            headers = decoder.decode(bytes(block), raw=True)
        except Exception:  # noqa: BLE001 - not HPACK: no structured change of it
            return None
        out.append((i, [(bytes(k), bytes(v)) for k, v in headers], f.flags & END_STREAM))
        i = j + 1
    return out


def _change_headers(data: bytes, sent_: Sent, rng: random.Random) -> bytes | None:
    """One header block changed (a field added, dropped, duplicated, moved, or given another value),
    every block encoded again with one encoder, in order, each in one HEADERS frame."""
    blocks = _blocks(data, sent_)
    if not blocks:
        return None
    k = rng.randrange(len(blocks))
    headers = blocks[k][1]
    op = rng.randrange(4)
    value = rng.choice(_VALUES)
    new = (rng.choice(_NAMES).encode(), value if isinstance(value, bytes) else value.encode("latin-1"))
    if op == 0 or not headers:
        headers.insert(rng.randint(0, len(headers)), new)
    elif op == 1:
        del headers[rng.randrange(len(headers))]
    elif op == 2:
        i = rng.randrange(len(headers))
        headers.insert(rng.randint(0, len(headers)), headers[i])
    else:
        i = rng.randrange(len(headers))
        headers[i] = (headers[i][0], new[1])
    encoder = hpack.Encoder()
    replaced = {i: (h, end) for i, h, end in blocks}
    out = bytearray(data[:len(PREFACE)])
    skip = False
    for i, f in enumerate(sent_.frames):
        if i in replaced:
            h, end = replaced[i]
            out += frame(HEADERS, END_HEADERS | end, f.stream, encoder.encode(h))
            skip = not f.flags & END_HEADERS
            continue
        if skip and f.kind == CONTINUATION:
            skip = not f.flags & END_HEADERS
            continue
        skip = False
        out += data[f.start:f.end]
    return bytes(out + data[sent_.frames[-1].end:])


def _control(rng: random.Random, streams: list[int]) -> bytes:
    """A frame of another kind: the ones the server must take in any state."""
    stream = rng.choice([*streams, 0, 1, 2, 3, 2**31 - 1])
    kind = rng.randrange(12)
    if kind == 0:
        return frame(RST_STREAM, 0, stream, rng.choice(_CODES).to_bytes(4, "big"))
    if kind == 1:
        return frame(PING, rng.choice([0, ACK]), rng.choice([0, stream]), rng.randbytes(rng.choice([8, 8, 7, 9])))
    if kind == 2:
        increment = rng.choice([0, 1, 65535, 2**31 - 1, 2**32 - 1])
        return frame(WINDOW_UPDATE, 0, rng.choice([0, stream]), increment.to_bytes(4, "big"))
    if kind == 3:
        entries = b"".join(rng.randrange(10).to_bytes(2, "big") + rng.choice(
            [0, 1, 100, 16383, 16384, 65535, 2**24, 2**31 - 1, 2**32 - 1]).to_bytes(4, "big")
            for _ in range(rng.randint(0, 3)))
        return frame(SETTINGS, rng.choice([0, 0, ACK]), rng.choice([0, 0, stream]), entries + b"\x00" * rng.choice(
            [0, 0, 0, 1]))
    if kind == 4:
        return frame(GOAWAY, 0, rng.choice([0, 0, stream]), rng.choice([0, stream]).to_bytes(4, "big")
                     + rng.choice(_CODES).to_bytes(4, "big") + rng.choice([b"", b"bye"]))
    if kind == 5:
        return frame(PRIORITY, 0, stream, rng.choice([0, stream, 2**31 + stream]).to_bytes(4, "big") + b"\x10")
    if kind == 6:
        return frame(DATA, rng.choice([0, END_STREAM]), stream, message(rng.choice([b"", b"hi", ABORT, b"x" * 1100])))
    if kind == 7:
        return frame(DATA, END_STREAM, stream)
    if kind == 8:
        return frame(CONTINUATION, rng.choice([0, END_HEADERS]), stream, b"\x82")
    if kind == 9:
        return frame(PUSH_PROMISE, END_HEADERS, stream, (stream + 1).to_bytes(4, "big") + b"\x82")
    if kind == 10:
        return frame(rng.randrange(10, 256), rng.randrange(256), stream, rng.randbytes(rng.randint(0, 8)))
    return frame(HEADERS, END_HEADERS | rng.choice([0, END_STREAM]), stream, b"\x83\x86\x84")  # GET / http, indexed


def mutate_stream(data: bytes, rng: random.Random) -> bytes | None:
    """A client's stream changed frame by frame: a frame dropped, repeated, moved, its flags,
    stream, length or padding changed, a DATA frame's gRPC prefix or message bytes changed, a frame split, a
    header block changed (`_change_headers`), a control frame put in, or the stream cut short."""
    client = sent(data)
    if not client.frames:
        return None
    fs = client.frames
    pieces = [data[f.start:f.end] for f in fs]
    tail = data[fs[-1].end:]
    i = rng.randrange(len(fs))
    f = fs[i]
    op = rng.randrange(12)
    if op == 0:
        del pieces[i]
    elif op == 1:
        pieces.insert(rng.randint(0, len(pieces)), pieces[i])
    elif op == 2:
        pieces.insert(rng.randint(0, len(pieces) - 1), pieces.pop(i))
    elif op == 3:
        pieces[i] = frame(f.kind, f.flags ^ rng.choice([END_STREAM, END_HEADERS, PADDED, PRIORITY_FLAG]), f.stream,
                          f.payload)
    elif op == 4:
        pieces[i] = frame(f.kind, f.flags, rng.choice([0, 1, 2, f.stream + 2, max(f.stream - 2, 0), 2**31 - 1]),
                          f.payload)
    elif op == 5:  # a length that does not match: the rest of the stream framed otherwise
        length = max(0, len(f.payload) + rng.choice([-9, -1, 1, 9, 2**14, 2**24 - 1 - len(f.payload)]))
        pieces[i] = length.to_bytes(3, "big") + pieces[i][3:]
    elif op == 6 and f.kind in (DATA, HEADERS) and not f.flags & PADDED:
        pad = rng.choice([0, 1, 7, 255])
        pieces[i] = frame(f.kind, f.flags | PADDED, f.stream, bytes([pad]) + f.payload + bytes(pad
                                                                                               * rng.choice([0, 1])))
    elif op == 7 and f.kind == DATA and len(f.payload) >= 5:
        prefix, body = bytearray(f.payload[:5]), f.payload[5:]
        choice = rng.randrange(4)
        if choice == 0:
            prefix[0] = rng.choice([1, 2, 0x80])
        elif choice == 1:  # other bytes, as many: the call goes on
            body = (ABORT + rng.randbytes(len(body)))[:len(body)] if rng.random() < 0.3 else rng.randbytes(len(body))
        else:
            size = int.from_bytes(prefix[1:], "big")
            size = rng.choice([0, size - 1, size + 1, LIMITS.max_body_bytes, LIMITS.max_body_bytes + 1, 2**32 - 1])
            prefix[1:] = max(size, 0).to_bytes(4, "big")
        pieces[i] = frame(f.kind, f.flags, f.stream, bytes(prefix) + body)
    elif op == 8 and f.kind in (DATA, HEADERS) and len(f.payload) > 1 and not f.flags & (PADDED | PRIORITY_FLAG):
        cut = rng.randrange(1, len(f.payload))
        if f.kind == DATA:
            pieces[i] = frame(DATA, 0, f.stream, f.payload[:cut]) + frame(DATA, f.flags, f.stream, f.payload[cut:])
        else:
            pieces[i] = frame(HEADERS, f.flags & ~END_HEADERS, f.stream, f.payload[:cut]) + frame(
                CONTINUATION, f.flags & END_HEADERS, f.stream, f.payload[cut:])
    elif op == 9:
        return _change_headers(data, client, rng)
    elif op == 10:
        pieces.insert(rng.randint(0, len(pieces)), _control(rng, sorted(client.opened)))
    else:
        return data[:rng.randrange(len(data) + 1)]
    return data[:len(PREFACE)] + b"".join(pieces) + tail


def mutate_front(data: bytes, rng: random.Random) -> bytes | None:
    """`grpc_front`'s input: the selector byte kept (or changed), the stream mutated."""
    if not data:
        return None
    if rng.random() < 0.1:
        return bytes([rng.randrange(256)]) + data[1:]
    stream = mutate_stream(data[1:], rng)
    return None if stream is None else data[:1] + stream
