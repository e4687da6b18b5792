"""Bytes on a loopback connection, cut into the reads a test chooses.

A client's writes reach the server as TCP segments, and the server's reads need not follow
them: two writes in quick succession are often one read. `send_read` writes a piece and
waits until the server's end of the connection holds none of it unread (the kernel's
receive queue, `/proc/net/tcp`), so the next piece is another read. `answers` reads what
the server sends back until it closes or stops answering.
"""

from __future__ import annotations

import asyncio

from ..conftest import until


def _queues(local_port: int, remote_port: int) -> tuple[int, int] | None:
    """(send queue, receive queue) of this machine's TCP socket from `local_port` to
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
                return int(tx, 16), int(rx, 16)
    return None


def _read_by_server(client_port: int, server_port: int) -> bool:
    ours, theirs = _queues(client_port, server_port), _queues(server_port, client_port)
    # all we sent is acknowledged (so in the server's queue, or read), and its queue is empty
    return ours is not None and ours[0] == 0 and (theirs is None or theirs[1] == 0)


async def send_read(writer: asyncio.StreamWriter, pieces: list[bytes], server_port: int) -> None:
    """Write each of `pieces`, each once the server has read all before it: one read each
    (a piece may still be read in parts; it is never read together with the next)."""
    client_port = writer.get_extra_info("sockname")[1]
    for piece in pieces:
        writer.write(piece)
        await writer.drain()
        await until(lambda: _read_by_server(client_port, server_port), timeout=10.0,
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
