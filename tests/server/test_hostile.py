"""The HTTP front under hostile and clumsy clients, through real sockets.

Trailer fields are held to the head's limits while they arrive; header fields too many are
refused before the head ends; a client that leaves mid-request is closed at its EOF; one
byte stream gets one set of answers however its reads fall (a method split over reads, a
head read before byte for byte behind a partial one; a front loop handing the connection
to the host's loop with every read of its request is `test_loops.py`'s); HTTP/1.0 framing, transfer codings, versions and absolute-form targets are read as
RFC 9112 says; and by default the server holds no more connections than its descriptor
limit leaves room for.
"""

from __future__ import annotations

import asyncio
import functools
import gzip
import json
import os
import pathlib
import socket
import sys
import zlib

import aiohttp
import pytest

from ..conftest import free_port, spawns, until, wait_ready
from .conftest import open_connections, write_repository
from .test_http_front import add_request, expected_sum, read_response
from .wire import answers, send_read, statuses

LIVE = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
CHUNKED_LIVE = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"


async def connect(server: object) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", server.port)  # type: ignore[attr-defined]


# ---- B, G: trailers and header fields held to the head's limits as they arrive ----


async def test_trailer_fields_are_held_to_the_heads_limits_while_they_arrive(start_server,
                                                                            repository: pathlib.Path) -> None:
    """On an open route (no token needed), a chunked body's trailer section that passes the
    head's limits (field count, field size, bytes) is refused with 431 before it ends, and the
    connection closes; trailers within them are read and the connection goes on."""
    server, _ = await start_server(repository, api_token="secret", max_header_bytes=1024)
    endless = (
        b"a:\r\n" * 200,  # more fields than a head may hold
        b"X: " + b"b" * 2000 + b"\r\nY: z\r\n",  # one field over --max-header-bytes
        b"X: " + b"b" * (200 << 10),  # one value without end, past the head's bytes
    )
    for trailers in endless:
        reader, writer = await connect(server)
        try:
            writer.write(CHUNKED_LIVE + b"0\r\n" + trailers)  # the trailer section never ends
            status, headers, body = await read_response(reader)
            assert status == 431 and headers["connection"] == "close", body
            assert "trailer" in json.loads(body)["error"]
            assert await asyncio.wait_for(reader.read(), 10) == b""
        finally:
            writer.close()
    reader, writer = await connect(server)
    try:
        writer.write(CHUNKED_LIVE + b"0\r\nA: 1\r\nB: 2\r\n\r\n" + LIVE)
        for _ in range(2):
            status, headers, body = await read_response(reader)
            assert status == 200 and json.loads(body) == {"live": True} and "connection" not in headers
    finally:
        writer.close()
    await until(lambda: open_connections(server) == 0, what="every connection closed")


async def test_header_fields_past_the_count_are_refused_before_the_head_ends(start_server,
                                                                            repository: pathlib.Path) -> None:
    server, _ = await start_server(repository)
    reader, writer = await connect(server)
    try:
        writer.write(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n" + b"a:\r\n" * 15000)  # no end to the head
        status, headers, body = await read_response(reader)
        assert status == 431 and headers["connection"] == "close"
        assert "at most 128 header fields" in json.loads(body)["error"]
        assert await asyncio.wait_for(reader.read(), 10) == b""
    finally:
        writer.close()


# ---- bombs: a compressed body is refused with little inflated ----


@functools.cache
def gzip_bomb(mib: int) -> bytes:
    """`mib` MiB of zeros, gzipped a MiB at a time (never all in memory at once)."""
    packer = zlib.compressobj(1, zlib.DEFLATED, 31)
    zeros = bytes(1 << 20)
    return b"".join(packer.compress(zeros) for _ in range(mib)) + packer.flush()


def _gzipped_post(body: bytes) -> bytes:
    return (b"POST /v2/models/add/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(body)) + body


async def test_a_gzip_bomb_is_refused_by_its_inflation_ratio(start_server, repository: pathlib.Path) -> None:
    """512 MiB of zeros gzipped (about 520 KB) inflates more than 200 times its size: 413 naming
    --max-inflate-ratio, decided from the first MiBs. A body as regular but small (within the
    first MiB) is served; with the ratio off, the same bomb is refused by --max-body-bytes."""
    bomb = gzip_bomb(512)
    server, _ = await start_server(repository)
    reader, writer = await connect(server)
    try:
        writer.write(_gzipped_post(bomb))
        status, headers, body = await read_response(reader)
        assert status == 413 and headers["connection"] == "close"
        assert "--max-inflate-ratio" in json.loads(body)["error"]
    finally:
        writer.close()
    regular = json.dumps({"inputs": [{"name": n, "datatype": "INT32", "shape": [1, 4], "data": [0, 0, 0, 0]}
                                     for n in ("A", "B")], "id": " " * 200_000}).encode()
    assert len(regular) / len(gzip.compress(regular)) > 200
    reader, writer = await connect(server)
    try:
        writer.write(_gzipped_post(gzip.compress(regular)))
        status, _, body = await read_response(reader)
        assert status == 200 and json.loads(body)["outputs"][0]["data"] == [0, 0, 0, 0], body
    finally:
        writer.close()
    off, _ = await start_server(repository, max_inflate_ratio=0, max_body_bytes=8 << 20)
    reader, writer = await connect(off)
    try:
        writer.write(_gzipped_post(bomb))
        status, _, body = await read_response(reader)
        assert status == 413 and "--max-body-bytes" in json.loads(body)["error"]
    finally:
        writer.close()


# ---- C: a client that leaves mid-request ----


async def test_a_client_that_leaves_mid_request_is_closed_at_its_eof(start_server, repository: pathlib.Path) -> None:
    """A request the client cuts short (part of its head, part of its body, or part of a body
    the server drops after answering from the head) and then half-closes can never be whole:
    the server closes the connection at once, not at --request-timeout, and no longer counts
    it. A whole request sent before the half-close is still answered."""
    server, _ = await start_server(repository, request_timeout_s=120.0)
    whole = add_request(5)
    for sent, expected in (
        (whole[:30], []),  # part of a head
        (whole[:-10], []),  # the head and part of its body
        (b"POST /nowhere HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + b"x" * 10, [404]),  # dropped body
        (whole + whole[:-10], [200]),  # a whole request, then part of one
        (whole * 3, [200, 200, 200]),  # whole requests: all answered, then the connection closes
    ):
        reader, writer = await connect(server)
        try:
            writer.write(sent)
            await writer.drain()
            writer.transport.write_eof()
            assert statuses(await answers(reader)) == expected, sent[:40]
        finally:
            writer.close()
    await until(lambda: open_connections(server) == 0, timeout=10.0, what="the connections uncounted")


# ---- one byte stream, one set of answers, however its reads fall ----


async def test_a_head_read_before_behind_a_partial_method_is_not_taken_for_a_request(start_server,
                                                                                    repository: pathlib.Path) -> None:
    """`G`, then a head the server read before byte for byte (so it knows it), then the rest
    of a request line: as one read it is one request whose method is `GGET` (400); cut into
    three reads it must be the same, not the known head's answer and another request."""
    server, _ = await start_server(repository)
    head = b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n"
    rest = b"ET /v2/models/nosuch/ready HTTP/1.1\r\nHost: x\r\n\r\n"
    got = []
    for pieces in ([b"G" + head + rest], [b"G", head, rest]):
        reader, writer = await connect(server)
        try:
            for _ in range(3):  # the head, each in a read of its own: known byte for byte from then on
                await send_read(writer, [head], server.port)
                status, _, _ = await read_response(reader)
                assert status == 200
            await send_read(writer, pieces, server.port)
            got.append(statuses(await answers(reader)))
        finally:
            writer.close()
    assert got == [[400], [400]]


# ---- RFC 9112: HTTP/1.0 framing, transfer codings, versions, absolute-form targets ----


async def test_an_http10_request_with_transfer_encoding_is_answered_then_closed(start_server,
                                                                              repository: pathlib.Path) -> None:
    """RFC 9112 6.1: an HTTP/1.0 message with Transfer-Encoding has faulty framing; the server
    answers it and closes, even when it asked for keep-alive."""
    server, _ = await start_server(repository)
    reader, writer = await connect(server)
    try:
        writer.write(b"GET /v2/health/live HTTP/1.0\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n"
                     b"0\r\n\r\n" + LIVE)
        data = await answers(reader)
        assert statuses(data) == [200] and b"Connection: close\r\n" in data
    finally:
        writer.close()


@pytest.mark.parametrize("coding", ["gzip, chunked", "deflate,chunked", "x-custom , Chunked"])
async def test_a_transfer_coding_other_than_chunked_gets_501(start_server, repository: pathlib.Path,
                                                             coding: str) -> None:
    server, _ = await start_server(repository)
    reader, writer = await connect(server)
    try:
        writer.write(f"POST /v2/models/add/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     f"Transfer-Encoding: {coding}\r\n\r\n5\r\nhello\r\n0\r\n\r\n".encode())
        status, headers, body = await read_response(reader)
        assert status == 501 and headers["connection"] == "close"
        assert repr(coding) in json.loads(body)["error"]
        assert await asyncio.wait_for(reader.read(), 10) == b""
    finally:
        writer.close()


@pytest.mark.parametrize("version", ["2.0", "0.9", "1.2", "3.0"])
async def test_an_http_version_other_than_1x_gets_505(start_server, repository: pathlib.Path, version: str) -> None:
    server, _ = await start_server(repository)
    reader, writer = await connect(server)
    try:
        writer.write(f"GET /v2/health/live HTTP/{version}\r\nHost: x\r\n\r\n".encode())
        status, headers, body = await read_response(reader)
        assert status == 505 and headers["connection"] == "close"
        assert "HTTP/1.1 and HTTP/1.0" in json.loads(body)["error"]
        assert await asyncio.wait_for(reader.read(), 10) == b""
    finally:
        writer.close()


async def test_an_absolute_form_target_is_served(start_server, repository: pathlib.Path) -> None:
    """RFC 9112 3.2.2: a server takes a request target in absolute form, as a proxy sends it."""
    server, _ = await start_server(repository)
    reader, writer = await connect(server)
    try:
        writer.write(add_request(3, path=f"http://127.0.0.1:{server.port}/v2/models/add/infer")
                     + b"GET HTTPS://example.com/v2/health/live?probe=1 HTTP/1.1\r\nHost: x\r\n\r\n"
                     + b"GET http://example.com HTTP/1.1\r\nHost: x\r\n\r\n")
        status, _, body = await read_response(reader)
        assert status == 200 and json.loads(body)["outputs"][0]["data"] == expected_sum(3)
        status, _, body = await read_response(reader)
        assert status == 200 and json.loads(body) == {"live": True}
        status, _, body = await read_response(reader)
        assert status == 404 and json.loads(body)["error"] == "Not Found: GET /"
    finally:
        writer.close()


# ---- G: the default connection cap, from the descriptor limit ----


# `aserve serve` under a descriptor limit of its own, set by the child itself before it becomes the
# server (no preexec_fn: Python code run in a forked child crashes a process that holds PEP 684
# subinterpreters, as this test process may on 3.12+)
UNDER_LIMIT = ("import os, resource, sys; limit = int(sys.argv[1]); "
               "resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit)); "
               "os.execv(sys.executable, [sys.executable, '-m', 'aserve.cli', *sys.argv[2:]])")


@spawns
async def test_by_default_the_server_holds_no_more_connections_than_its_descriptors_allow(
        tmp_path: pathlib.Path) -> None:
    """A server whose descriptor limit is 300 serves 300 - 128 = 172 connections at once (the
    rest of its descriptors are its own); the next gets 503, and one that sends nothing is
    closed within a second rather than hold a descriptor for the keep-alive timeout. Once
    connections close, new ones are served again."""
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", UNDER_LIMIT, "300", "serve", str(write_repository(tmp_path / "repo")), "--port",
        str(port), "--no-grpc", "--interpreters", "1", env=dict(os.environ, ASERVE_LOG_LEVEL="warning"),
        stderr=asyncio.subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    held: list[socket.socket] = []
    try:
        async with aiohttp.ClientSession() as http:
            await wait_ready(http, url, proc)
        for _ in range(172):
            held.append(socket.create_connection(("127.0.0.1", port)))
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        idle_reader, idle_writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(LIVE)
            status, headers, body = await read_response(reader)
            assert status == 503 and headers["retry-after"] == "1" and headers["connection"] == "close"
            assert "limit of 172 open connections" in json.loads(body)["error"]
            assert await asyncio.wait_for(idle_reader.read(), 10) == b""  # closed without a request
        finally:
            writer.close()
            idle_writer.close()
        for sock in held[:10]:
            sock.close()
        async with aiohttp.ClientSession() as http:
            await until(lambda: _live(http, url), timeout=10.0, what="a connection served again")
    finally:
        for sock in held:
            sock.close()
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 60)


async def _live(http: aiohttp.ClientSession, url: str) -> bool:
    async with http.get(f"{url}/v2/health/live") as r:
        return r.status == 200
