"""One byte stream, one set of answers, however its reads fall: a real server on 127.0.0.1, on
the host's loop alone and with front loops (where a request for a model only the host serves
takes its connection to the host's loop), fed the same streams in one read and cut into
reads (`wire.send_read`: each piece a read of its own). The fuzz target `http_segments`
(tests/fuzz/segments.py) does the same on a stub route table, over many more streams.
"""

from __future__ import annotations

import asyncio
import pathlib
import re

import pytest

from .test_loops import _raw
from .test_metrics import adaptive_repository
from .wire import answers, send_read

READY = b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n"
ROWS, OTHER = [[1, 2, 3, 4]], [[4, 3, 2, 1]]
STREAMS = {
    # a model only the host serves, then one the fronts serve: the connection goes to the host
    "host_then_front": _raw("fast", ROWS, OTHER) + _raw("add", [[5, 5, 5, 5]], OTHER),
    # a head read before byte for byte, behind a method cut short
    "known_head": READY * 3 + b"G" + READY + b"ET /v2/models/nosuch/ready HTTP/1.1\r\nHost: x\r\n\r\n",
    # a chunked body with trailer fields, a refusal from the head with a body to drop, then more
    "chunked_refused": (b"POST /v2/models/add/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        b"Transfer-Encoding: chunked\r\n\r\n" + b"%x\r\n" % len(_raw("add", ROWS, OTHER).split(
                            b"\r\n\r\n", 1)[1]) + _raw("add", ROWS, OTHER).split(b"\r\n\r\n", 1)[1]
                        + b"\r\n0\r\nA: 1\r\nB: 2\r\n\r\n"
                        + b"POST /v2/models/nosuch/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 7\r\n\r\nignored"
                        + READY),
}
_DATE = re.compile(rb"\r\nDate: [^\r]*")


def _cuts(data: bytes) -> list[list[int]]:
    """Each request's start and head's end at once, then each of them alone and a byte either
    side, and every 9th byte alone: the reads a client's segments may make."""
    marks = {m.start() for m in re.finditer(rb"(?:GET|POST) ", data)} | {m.end() for m in re.finditer(rb"\r\n\r\n", data)}
    marks &= set(range(1, len(data)))
    single = sorted(({p + d for p in marks for d in (-1, 0, 1)} | set(range(1, len(data), 9))) & set(range(1, len(data))))
    return [sorted(marks)] + [[p] for p in single]


async def _answers(port: int, data: bytes, cuts: list[int]) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]
        await send_read(writer, pieces, port)
        writer.write_eof()  # the client is done: the server answers what it sent whole, then closes
        data = _DATE.sub(b"", await answers(reader, timeout=30.0))
    finally:
        writer.close()
    # the last answer says `Connection: close` when the client's EOF came before it was sent
    last = data.rfind(b"HTTP/1.1 ")
    return data[:last] + data[last:].replace(b"\r\nConnection: close", b"", 1)


@pytest.mark.parametrize("stream", sorted(STREAMS))
async def test_a_stream_is_answered_the_same_however_its_reads_fall(start_server, tmp_path: pathlib.Path,
                                                                   stream: str) -> None:
    server, _ = await start_server(adaptive_repository(tmp_path / "repo"))
    data = STREAMS[stream]
    whole = await _answers(server.port, data, [])
    assert whole.count(b"HTTP/1.1 ") >= 2 and b" 200 OK" in whole, whole[:300]
    for cuts in _cuts(data):
        assert await _answers(server.port, data, cuts) == whole, cuts
