"""Bytes on a loopback connection, cut into the reads a test chooses.

A client's writes reach the server as TCP segments, and the server's reads need not follow
them: two writes in quick succession are often one read. `send_read` writes a piece and
waits until the server's end of the connection holds none of it unread (the kernel's
receive queue: an ioctl on its descriptor where the server runs in this process, as the
tests' servers do, else `/proc/net/tcp`), so the next piece is another read. `answers` reads what
the server sends back until it closes or stops answering.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import struct
import termios

from ..conftest import until


def _socket_of(local_port: int, remote_port: int) -> tuple[int, int, int] | None:
    """(send queue, receive queue, inode) of this machine's TCP socket from `local_port` to
    `remote_port` (any address), or None when there is none."""
    want = (f"{local_port:04X}", f"{remote_port:04X}")
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                lines = f.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if (fields[1].rsplit(":", 1)[1], fields[2].rsplit(":", 1)[1]) == want:
                tx, rx = fields[4].split(":")
                return int(tx, 16), int(rx, 16), int(fields[9])
    return None


class _ServerEnd:
    """The server's end of a loopback connection, as this process sees it: its descriptor here
    when the server runs in this process (the receive queue is then one ioctl away, and a
    descriptor handed to another loop is found again by its inode), else /proc/net/tcp."""

    def __init__(self, client_port: int, server_port: int) -> None:
        self.ports = (server_port, client_port)
        self.inode = 0
        self.fd: int | None = None

    def _find(self) -> int | None:
        found = _socket_of(*self.ports)
        if found is None or not found[2]:
            return None  # not accepted yet
        self.inode = found[2]
        link = f"socket:[{self.inode}]"
        for name in os.listdir("/proc/self/fd"):
            try:
                if os.readlink(f"/proc/self/fd/{name}") == link:
                    return int(name)
            except OSError:
                continue
        return None

    def unread(self) -> int | None:
        """Bytes it holds unread (None: not known yet)."""
        fd = self.fd
        if fd is not None:
            try:
                if os.readlink(f"/proc/self/fd/{fd}") == f"socket:[{self.inode}]":
                    return int(struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0" * 4))[0])
            except OSError:
                pass
        self.fd = self._find()
        if self.fd is None:
            found = _socket_of(*self.ports)  # in another process, or not accepted yet
            return None if found is None else found[1]
        return self.unread()


def _unsent(writer: asyncio.StreamWriter) -> int:
    """Bytes the client's socket has not had acknowledged yet."""
    sock = writer.get_extra_info("socket")
    return int(struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0])


async def send_read(writer: asyncio.StreamWriter, pieces: list[bytes], server_port: int) -> None:
    """Write each of `pieces`, each once the server has read all before it: one read each
    (a piece may still be read in parts; it is never read together with the next)."""
    end = _ServerEnd(writer.get_extra_info("sockname")[1], server_port)
    for piece in pieces:
        writer.write(piece)
        await writer.drain()
        # all we sent is acknowledged (so in the server's queue, or read), and its queue is empty
        await until(lambda: _unsent(writer) == 0 and end.unread() == 0, timeout=10.0,
                    what="the server to read what was sent")


def statuses(data: bytes) -> list[int]:
    """The status of each answer in `data` (answers with a Content-Length, as the server writes them)."""
    out = []
    while data:
        head, sep, rest = data.partition(b"\r\n\r\n")
        if not sep:
            break
        lines = head.split(b"\r\n")
        out.append(int(lines[0].split()[1]))
        length = next((int(line.split(b":", 1)[1]) for line in lines[1:]
                       if line.lower().startswith(b"content-length:")), 0)
        data = rest[length:]
    return out


async def answers(reader: asyncio.StreamReader, *, count: int | None = None, timeout: float = 10.0) -> bytes:
    """What the server sends until it closes the connection, or until `count` answers came."""
    data = b""
    async with asyncio.timeout(timeout):
        while count is None or len(statuses(data)) < count:
            more = await reader.read(65536)
            if not more:
                break
            data += more
    return data
