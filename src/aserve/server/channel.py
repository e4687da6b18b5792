"""Messages between the host's event loop and a front's: msgpack frames over a Unix socket.

Each frame is a 4-byte little-endian length and one message: a msgspec Struct tagged by its
`op`. Each end decodes what the other sends as one tagged union (`ToHost`, `ToFront`),
typed and checked once, and `match`es on the message's class. Both ends are asyncio streams
on their own loop, in their own interpreter; nothing else crosses but the bytes (and
descriptor numbers, which the process shares).

A message that asks for an answer carries an `id` (the asking side numbers it when it
sends it); the answer carries the same `id`.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from typing import Any, Generic, TypeVar

import msgspec

_LENGTH = struct.Struct("<I")
_encode = msgspec.msgpack.Encoder().encode


class Message(msgspec.Struct, tag_field="op", kw_only=True):
    """One frame's message."""


class Asking(Message, kw_only=True):
    """A message the other side answers, by its `id` (set when it is sent)."""

    id: int = 0


# ---- a front's messages to the host ----


class Log(Message, tag="log"):
    """A log record of the front's, for the host's handlers."""

    name: str
    level: int
    message: str
    extra: dict[str, str | int | float | bool]


class RequestHead(Asking, kw_only=True):
    """What a front read of a request's head (`loops._request` makes the request of it)."""

    method: str
    target: str
    version: str
    headers: dict[str, str]
    remote: str | None
    received: float


class Head(RequestHead, tag="head"):
    """An infer request's head, its body still on the way: the host's head checks (`Answer`:
    a refusal, or status None)."""

    length: int | None


class Forward(RequestHead, tag="forward"):
    """A whole request for the host's router and handlers (`Answer`)."""

    body: bytes
    whole: float  # time.perf_counter() when the front had all of it: its duration counts the hop


class GrpcCall(Asking, tag="grpc"):
    """A gRPC method the front does not answer itself (`Relayed`)."""

    name: str
    raw: bytes
    metadata: dict[str, str]


class Spans(Asking, tag="spans"):
    """Trace records the front's tracer made, for the host's exporter (`Exported`)."""

    payload: bytes


class Took(Message, tag="took"):
    """The front took the connection the host handed it (`Conn`)."""

    fd: int


class Cancelled(Message, tag="cancelled"):
    """A running batch of the front's was cancelled: the host watches its interpreter."""

    pool: int
    job: int


class Ready(Message, tag="ready"):
    """The front serves."""

    index: int


class Counts(Message, tag="counts"):
    """The answer to `AskCounts`: what the front counted (`Front.stats`)."""

    id: int
    data: dict[str, Any]


class Retired(Message, tag="retired"):
    """The answer to `Retire`: the front answered what it queued of the load."""

    id: int


class Gone(Message, tag="gone"):
    """One of the front's connections closed."""


ToHost = Log | Head | Forward | GrpcCall | Spans | Took | Cancelled | Ready | Counts | Retired | Gone


# ---- the host's messages to a front ----


class Conn(Message, tag="conn"):
    """A connection for the front to serve."""

    fd: int


class Models(Message, tag="models"):
    """What the front serves (`loops.front_model` each), and what it needs of the host's state."""

    models: list[dict[str, Any]]
    labels: dict[str, dict[str, int]]
    tracing: dict[str, Any] | None  # `Tracer.settings()`, None: off
    roots: list[tuple[str, str]]  # (path, name) model errors name as the host's do (ErrorPolicy.use_roots)


class Answer(Message, tag="answer"):
    """The host's answer to a `Forward` or a `Head` (status None: the head may go on)."""

    id: int
    status: int | None = None
    headers: dict[str, str] = {}
    body: bytes = b""
    close: bool = False
    hold: float = 0.0
    budget: float | None = None
    rate: float | None = None


class Exported(Message, tag="exported"):
    """The answer to `Spans`: how many went, or why none did."""

    id: int
    exported: int = 0
    error: str | None = None


class Relayed(Message, tag="relayed"):
    """The answer to `GrpcCall`: `GrpcFront.answer`'s reply."""

    id: int
    reply: dict[str, Any]


class Retire(Asking, tag="retire"):
    """Answer what was queued of load `key` (`Retired`): it is about to be unloaded."""

    key: str


class AskCounts(Asking, tag="stats"):
    """What did the front count (`Counts`)?"""


class State(Message, tag="state"):
    """The server's readiness as the host decides it (`App.readiness`), sent when it changes:
    what the front answers readiness from, over HTTP and gRPC alike."""

    ready: bool
    reason: str
    waiting: list[dict[str, str]]


class Drain(Message, tag="drain"):
    """The server drains: readiness says no."""


class Close(Message, tag="close"):
    """Answer what was accepted, within `timeout` seconds, and stop."""

    timeout: float


ToFront = Conn | Models | State | Answer | Exported | Relayed | Retire | AskCounts | Drain | Close

R = TypeVar("R")


class Channel(Generic[R]):
    """One end of a host-front pair, receiving messages of type R (`ToHost` or `ToFront`)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, receives: Any) -> None:
        self.reader = reader
        self.writer = writer
        self._decode = msgspec.msgpack.Decoder(receives).decode

    @classmethod
    async def open(cls, sock: socket.socket, receives: Any) -> Channel[R]:
        reader, writer = await asyncio.open_unix_connection(sock=sock)
        return cls(reader, writer, receives)

    def send(self, message: Message) -> None:
        """Queue one message (the transport writes it as the peer reads)."""
        body = _encode(message)
        self.writer.write(_LENGTH.pack(len(body)) + body)

    async def receive(self) -> R | None:
        """The next message, or None once the other end is gone. A frame that is not one of
        the messages R names raises msgspec.ValidationError (the sides disagree: a fault)."""
        try:
            head = await self.reader.readexactly(_LENGTH.size)
            frame = await self.reader.readexactly(_LENGTH.unpack(head)[0])
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        message: R = self._decode(frame)
        return message

    def close(self) -> None:
        self.writer.close()
