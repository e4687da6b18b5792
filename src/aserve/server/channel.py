"""Messages between the host's event loop and a front's: msgpack frames over a Unix socket.

Each frame is a 4-byte little-endian length and a msgpack map with an `op`. Both ends
are asyncio streams on their own loop, in their own interpreter; nothing else crosses
but the bytes (and descriptor numbers, which the process shares).
"""

from __future__ import annotations

import asyncio
import socket
import struct
from typing import Any

import msgspec

_LENGTH = struct.Struct("<I")
_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder().decode


class Channel:
    """One end of a host-front pair."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, sock: socket.socket) -> Channel:
        reader, writer = await asyncio.open_unix_connection(sock=sock)
        return cls(reader, writer)

    def send(self, message: dict[str, Any]) -> None:
        """Queue one message (the transport writes it as the peer reads)."""
        body = _encode(message)
        self.writer.write(_LENGTH.pack(len(body)) + body)

    async def receive(self) -> dict[str, Any] | None:
        """The next message, or None once the other end is gone."""
        try:
            head = await self.reader.readexactly(_LENGTH.size)
            message: dict[str, Any] = _decode(await self.reader.readexactly(_LENGTH.unpack(head)[0]))
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        return message

    def close(self) -> None:
        self.writer.close()
