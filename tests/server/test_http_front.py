"""The HTTP front: one llhttp parser and one set of rules for every request on every connection.

Every test here talks raw HTTP over a socket (or aiohttp's client) to a real server and
checks the answers against values computed in the test.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import pathlib
import re
import shutil
import socket
import struct
import time

import aiohttp
import pytest

from aserve.server.http import Response, encode

from ..conftest import until
from .conftest import logged, open_connections
from .hardened_models import add_body

ADD_PATH = "/v2/models/add/infer"
ECHO_MODEL = '''
from aserve.runtime import Model, TensorSpec

class Echo(Model):
    inputs = [TensorSpec("X", "FP32", (-1,))]
    outputs = [TensorSpec("Y", "FP32", (-1,))]

    def __call__(self, inputs):
        return {"Y": inputs["X"]}
'''
ECHO_CONFIG = ('max_batch_size = 0\n[[inputs]]\nname = "X"\ndatatype = "FP32"\nshape = [-1]\n'
               '[[outputs]]\nname = "Y"\ndatatype = "FP32"\nshape = [-1]\n')
PREDICT = b'{"inputs": {"A": [[1, 2, 3, 4]], "B": [[0, 0, 0, 1]]}}'
TEN_MB = 10 * 1024 * 1024


def add_request(first: int, *, path: str = ADD_PATH, extra: str = "") -> bytes:
    body = json.dumps(add_body(first)).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{extra}"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def echo_request(values: bytes) -> bytes:
    """A binary V2 request to the echo model, asking for its output in binary."""
    header = json.dumps({"inputs": [{"name": "X", "datatype": "FP32", "shape": [len(values) // 4],
                                     "parameters": {"binary_data_size": len(values)}}],
                         "outputs": [{"name": "Y", "parameters": {"binary_data": True}}]}).encode()
    return (f"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
            f"Inference-Header-Content-Length: {len(header)}\r\nContent-Length: {len(header) + len(values)}\r\n"
            f"\r\n").encode() + header + values


def expected_sum(first: int) -> list[int]:
    return [first + 1, 3, 4, 5]


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One response off a keep-alive connection: (status, headers, body)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
    lines = head.decode().rstrip("\r\n").split("\r\n")
    headers = {k.lower(): v for k, v in (line.split(": ", 1) for line in lines[1:])}
    body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), 30)
    return int(lines[0].split()[1]), headers, body


async def exchange(port: int, data: bytes) -> tuple[int, dict[str, str], bytes]:
    """`data` on a new connection, and the first answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        return await read_response(reader)
    finally:
        writer.close()


async def test_pipelined_requests_are_answered_in_order(start_server, repository: pathlib.Path) -> None:
    server, _ = await start_server(repository)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    firsts = [10, 20, 30, 40, 50]
    # five infer requests, a metadata request, a repository index and two more infer requests in one write
    writer.write(b"".join(add_request(f) for f in firsts) + b"GET /v2/models/add HTTP/1.1\r\nHost: x\r\n\r\n"
                 + b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   b"Content-Length: 2\r\n\r\n{}" + add_request(7) + add_request(8))
    for first in firsts:
        status, headers, body = await read_response(reader)
        assert status == 200 and headers["server"] == "aserve" and "date" in headers
        outputs = {o["name"]: o["data"] for o in json.loads(body)["outputs"]}
        assert outputs["SUM"] == expected_sum(first)
    status, _, body = await read_response(reader)
    assert status == 200 and json.loads(body)["name"] == "add"
    status, _, body = await read_response(reader)
    assert status == 200 and {m["name"] for m in json.loads(body)} >= {"add", "slow", "upper"}
    for first in (7, 8):
        status, _, body = await read_response(reader)
        assert status == 200 and json.loads(body)["outputs"][0]["data"] == expected_sum(first)
    assert open_connections(server) == 1
    writer.write(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    status, headers, _ = await read_response(reader)
    assert status == 200 and headers["connection"] == "close"
    assert await asyncio.wait_for(reader.read(), 10) == b""  # closed, as asked
    writer.close()
    await until(lambda: open_connections(server) == 0, what="the closed connection uncounted")


async def test_a_request_split_anywhere_is_served(start_server, repository: pathlib.Path) -> None:
    server, _ = await start_server(repository)
    data = add_request(3)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    for cut in (1, 20, data.index(b"\r\n\r\n") + 2, data.index(b"\r\n\r\n") + 4, len(data) - 1):
        writer.write(data[:cut])
        await writer.drain()
        await asyncio.sleep(0)  # let the first part be read on its own where it can
        writer.write(data[cut:])
        status, _, body = await read_response(reader)
        assert status == 200 and json.loads(body)["outputs"][0]["data"] == expected_sum(3), cut
    writer.close()


async def test_large_binary_body_in_many_reads(start_server, model_dir) -> None:
    repo = model_dir(ECHO_MODEL, ECHO_CONFIG, name="echo").parent
    server, _ = await start_server(repo)
    values = struct.pack("<300000f", *range(300_000))
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    data = echo_request(values)
    for i in range(0, len(data), 65536):
        writer.write(data[i:i + 65536])
        await writer.drain()
    status, headers, answer = await read_response(reader)
    assert status == 200
    out_header = int(headers["inference-header-content-length"])
    assert answer[out_header:] == values
    writer.close()


@pytest.mark.parametrize("case", ["chunked", "gzip", "deflate", "expect", "http10"])
async def test_every_framing_of_a_body_is_read(start_server, repository: pathlib.Path, case: str) -> None:
    server, _ = await start_server(repository)
    body = json.dumps(add_body(5)).encode()
    head = f"POST {ADD_PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    if case == "chunked":
        writer.write((head + "Transfer-Encoding: chunked\r\n\r\n").encode()
                     + b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (10, body[:10], len(body) - 10, body[10:]))
    elif case in ("gzip", "deflate"):
        packed = gzip.compress(body) if case == "gzip" else __import__("zlib").compress(body)
        writer.write((head + f"Content-Encoding: {case}\r\nContent-Length: {len(packed)}\r\n\r\n").encode() + packed)
    elif case == "expect":  # the client waits for 100 Continue before it sends the body
        writer.write((head + f"Expect: 100-continue\r\nContent-Length: {len(body)}\r\n\r\n").encode())
        assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10) == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(body)
    else:
        writer.write((head.replace("HTTP/1.1", "HTTP/1.0") + f"Content-Length: {len(body)}\r\n\r\n").encode() + body)
    status, headers, answer = await read_response(reader)
    assert status == 200, answer
    assert json.loads(answer)["outputs"][0]["data"] == expected_sum(5)
    if case == "http10":  # HTTP/1.0 without keep-alive: the connection closes after the answer
        assert headers["connection"] == "close" and await asyncio.wait_for(reader.read(), 10) == b""
    writer.close()


LIVE = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"


async def refused_at_once(port: int, head: bytes, *,
                          closes: bool = True) -> tuple[int, dict[str, str], bytes, float]:
    """Send only `head`, announcing a body not sent yet; the answer, and how long it took.
    `closes`: the connection must close after it (the body is not read); else it stays
    open: the body, sent after the answer, is dropped, and the next request is answered."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    began = time.monotonic()
    try:
        writer.write(head)
        status, headers, body = await read_response(reader)
        took = time.monotonic() - began
        if closes:
            assert headers["connection"] == "close"
            assert await asyncio.wait_for(reader.read(), 10) == b""
        else:
            assert "connection" not in headers  # kept alive
            length = int(re.search(rb"Content-Length: (\d+)", head)[1])  # type: ignore[index]
            writer.write(b"{" * length + LIVE)  # not JSON: it is never decoded
            live, _, answer = await read_response(reader)
            assert live == 200 and json.loads(answer) == {"live": True}
        return status, headers, body, took
    finally:
        writer.close()


async def test_refusals_the_head_decides_are_answered_before_the_body(start_server, repository: pathlib.Path) -> None:
    """Each refusal a request's head already decides is answered at once, without its body
    (announced at 2.5 or 10 MB); the request timeout is a minute, so an answer that waited for
    the body would not come within the test. A body over the limit (413), an `Expect` and a
    refusal of access close the connection rather than read the body; after the others the
    body is read and dropped, and the connection serves the next request."""
    server, url = await start_server(repository, api_token="secret", max_body_bytes=TEN_MB // 2,
                                     request_timeout_s=60.0)
    token = "Authorization: Bearer secret\r\n"

    def head(path: str = ADD_PATH, extra: str = token, method: str = "POST", length: int = TEN_MB // 4) -> bytes:
        return f"{method} {path} HTTP/1.1\r\nHost: x\r\n{extra}Content-Length: {length}\r\n\r\n".encode()

    cases = {  # status: (request head, the connection closes)
        401: (head(extra=""), True),
        403: (head(extra="Authorization: Bearer wrong\r\n"), True),
        404: (head(path="/v2/models/nope/infer"), False),
        405: (head(path="/v2/health/live"), False),
        413: (head(length=TEN_MB), True),
        415: (head(extra=token + "Content-Type: image/png\r\n"), False),
        417: (head(extra=token + "Expect: something-else\r\n"), True),
    }
    for status, (data, closes) in cases.items():
        got, headers, body, took = await refused_at_once(server.port, data, closes=closes)
        assert got == status, (status, body)
        assert took < 5.0 and headers["server"] == "aserve"
        assert json.loads(body)["error"]
    # an unknown Content-Encoding, and a route that does not exist, also from the head
    got, _, body, _ = await refused_at_once(server.port, head(extra=token + "Content-Encoding: br\r\n"),
                                            closes=False)
    assert got == 415 and json.loads(body)["error"].startswith("Content-Encoding: expected one of gzip")
    got, _, _, _ = await refused_at_once(server.port, head(path="/nowhere"), closes=False)
    assert got == 404
    # waiting for 100 Continue, the client may never send the body: the connection closes
    expecting = head(path="/nowhere", extra=token + "Expect: 100-continue\r\n")
    got, _, _, _ = await refused_at_once(server.port, expecting)
    assert got == 404
    # a chunked body is not skipped: the connection closes
    chunked = f"POST /nowhere HTTP/1.1\r\nHost: x\r\n{token}Transfer-Encoding: chunked\r\n\r\n".encode()
    got, _, _, _ = await refused_at_once(server.port, chunked)
    assert got == 404
    async with aiohttp.ClientSession(headers={"Authorization": "Bearer secret"}) as http:
        assert (await scrape(http, url))["aserve_http_refused_total", "body_size"] >= 1


async def test_a_dropped_body_that_stops_coming_ends_the_connection(start_server, repository: pathlib.Path) -> None:
    """A body read and dropped after its request was answered from the head is still bound by
    the request timeout: when it stops coming, the connection closes (its answer went out)."""
    server, _ = await start_server(repository, request_timeout_s=0.5)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(b"POST /nowhere HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + b"x" * 10)
        status, headers, _ = await read_response(reader)
        assert status == 404 and "connection" not in headers
        assert await asyncio.wait_for(reader.read(), 10) == b""  # closed by the request timeout, not the idle one
    finally:
        writer.close()


async def test_a_malformed_head_gets_400_at_once(start_server, repository: pathlib.Path) -> None:
    server, _ = await start_server(repository, request_timeout_s=60.0)
    for data in (
        b"GET /v2/health/live HTTP/1.1\nHost: x\n\n",  # bare LF line ends
        b"GET /v2/health/live HTTP/1.1\r\nHost: x\rY: 1\r\n\r\n",  # a bare CR
        b"BREW /v2/health/live HTTP/1.1\r\n",  # an unknown method (the rest never comes)
        b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",  # CL and TE
        b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello",  # two lengths
        b"GET /a HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n  folded\r\n\r\n",  # obs-fold
        b"GET /a HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n",  # a field that may not repeat
        b"GET /v2/health/live HTTP/1.1\r\n\r\n",  # HTTP/1.1 without Host
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",  # the HTTP/2 preface
    ):
        status, _, body, took = await refused_at_once(server.port, data)
        assert status == 400 and took < 5.0, (data, body)
        assert json.loads(body)["error"].startswith("malformed HTTP request"), body


async def test_nothing_pipelined_after_a_closing_request_is_answered(start_server, repository: pathlib.Path) -> None:
    server, _ = await start_server(repository)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(add_request(2, extra="Connection: close\r\n") + add_request(3))
    status, headers, body = await read_response(reader)
    assert status == 200 and headers["connection"] == "close"
    assert json.loads(body)["outputs"][0]["data"] == expected_sum(2)
    assert await asyncio.wait_for(reader.read(), 10) == b""  # the second was not answered
    writer.close()
    # llhttp reads the old Proxy-Connection as Connection (as Node.js does), and so does every request
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(add_request(4, extra="Proxy-Connection: close\r\n") + add_request(5))
        status, headers, body = await read_response(reader)
        assert status == 200 and headers["connection"] == "close"
        assert json.loads(body)["outputs"][0]["data"] == expected_sum(4)
        assert await asyncio.wait_for(reader.read(), 10) == b""
    finally:
        writer.close()


async def test_an_upgrade_request_is_answered_then_the_connection_closes(start_server,
                                                                         repository: pathlib.Path) -> None:
    server, _ = await start_server(repository)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
                 b"\x81\x05hello")
    status, headers, body = await read_response(reader)
    assert status == 200 and json.loads(body) == {"live": True} and headers["connection"] == "close"
    assert await asyncio.wait_for(reader.read(), 10) == b""
    writer.close()


async def test_head_and_options(start_server, repository: pathlib.Path, http: aiohttp.ClientSession) -> None:
    _, url = await start_server(repository)
    async with http.head(f"{url}/v2/health/ready") as r:
        assert r.status == 200 and int(r.headers["Content-Length"]) == len(b'{"ready":true}')
        assert await r.read() == b""
    async with http.options(f"{url}/v2/health/ready") as r:  # no CORS: not a route
        assert r.status == 405 and r.headers["Allow"] == "GET"


async def test_connection_close_and_keepalive(start_server, repository: pathlib.Path) -> None:
    server, _ = await start_server(repository, keepalive_timeout_s=0.3)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(add_request(2, extra="Connection: close\r\n"))
    status, headers, _ = await read_response(reader)
    assert status == 200 and headers["connection"] == "close"
    assert await asyncio.wait_for(reader.read(), 10) == b""  # closed after the answer
    writer.close()
    # an idle keep-alive connection is closed after the timeout
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(add_request(2, extra="Connection: keep-alive\r\n"))
    status, headers, _ = await read_response(reader)
    assert status == 200 and "connection" not in headers
    assert await asyncio.wait_for(reader.read(), 10) == b""
    writer.close()


async def test_a_partial_head_is_closed_even_with_no_request_timeout(start_server, repository: pathlib.Path) -> None:
    """`--request-timeout 0` turns the request limit off, but a half-sent head is still bounded
    by the keep-alive timeout: the connection gets 408 and closes."""
    server, _ = await start_server(repository, request_timeout_s=0.0, keepalive_timeout_s=0.5)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n")  # no blank line: the head never ends
    began = time.monotonic()
    raw = await asyncio.wait_for(reader.read(), 10)
    assert raw.startswith(b"HTTP/1.1 408 ") and time.monotonic() - began < 5.0
    assert b"--keepalive-timeout" in raw
    writer.close()


@pytest.mark.host_loop  # the host's connection's flow control
async def test_a_client_that_does_not_read_is_not_read(start_server, model_dir) -> None:
    """Back-pressure: pipelined requests whose answers (13 MB) are not read; the server
    stops reading, then answers every one, in order, once the client reads."""
    server, _ = await start_server(model_dir(ECHO_MODEL, ECHO_CONFIG, name="echo").parent)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", server.port))
    sock.setblocking(False)
    reader, writer = await asyncio.open_connection(sock=sock, limit=1 << 16)
    payloads = [struct.pack("<16384f", *range(i, i + 16384)) for i in range(200)]
    writer.write(b"".join(echo_request(p) for p in payloads))
    connections = server.http.connections
    await until(lambda: len(connections) == 1 and next(iter(connections)).paused, what="the server's writes paused")
    assert not next(iter(connections)).reading
    for values in payloads:
        status, headers, answer = await read_response(reader)
        assert status == 200 and answer[int(headers["inference-header-content-length"]):] == values
    writer.close()


async def test_a_request_behind_a_slow_one_has_its_own_time(start_server, repository: pathlib.Path) -> None:
    """The request timeout of a pipelined request runs from when the server takes it up, not
    from when its first bytes arrived behind a request that took longer than the limit."""
    server, _ = await start_server(repository, request_timeout_s=0.5)
    body = json.dumps({"inputs": [{"name": "MS", "datatype": "FP32", "shape": [1], "data": [800]}]}).encode()
    slow = f"POST /v2/models/slow/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
    follow = add_request(6)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(slow + follow[:30])  # the second request's first bytes wait behind the slow one
    status, _, answer = await read_response(reader)
    assert status == 200 and json.loads(answer)["outputs"][0]["data"] == [800.0]
    writer.write(follow[30:])
    status, _, answer = await read_response(reader)
    assert status == 200 and json.loads(answer)["outputs"][0]["data"] == expected_sum(6)
    writer.close()


async def test_shutdown_answers_the_request_in_progress(start_server, repository: pathlib.Path) -> None:
    server, _ = await start_server(repository)
    body = json.dumps({"inputs": [{"name": "MS", "datatype": "FP32", "shape": [1], "data": [300]}]}).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(f"POST /v2/models/slow/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                 + body)
    idle_reader, idle_writer = await asyncio.open_connection("127.0.0.1", server.port)
    pool = server.plane.registry.pools["main"]  # every loop's batches run in it
    await until(lambda: open_connections(server) == 2 and pool.stats()["busy"] == 1, what="the request in progress")
    closing = asyncio.ensure_future(server.close())
    status, headers, answer = await read_response(reader)
    assert status == 200 and json.loads(answer)["outputs"][0]["data"] == [300.0]
    assert headers["connection"] == "close"
    assert await asyncio.wait_for(idle_reader.read(), 10) == b""  # the idle one is closed
    await closing
    writer.close()
    idle_writer.close()


async def test_access_log_lines(start_server, repository: pathlib.Path, http: aiohttp.ClientSession,
                                caplog: pytest.LogCaptureFixture) -> None:
    _, url = await start_server(repository, access_log=True, log_level="info")
    caplog.set_level("INFO", logger="aserve.access")
    async with http.post(f"{url}{ADD_PATH}", json=add_body(4)) as r:
        assert r.status == 200 and (await r.json())["outputs"][0]["data"] == expected_sum(4)
        size = len(await r.read())
    async with http.get(f"{url}/v2/models/add?x=1") as r:
        assert r.status == 200
    async with http.get(f"{url}/v2/models/nope") as r:
        assert r.status == 404
    lines = await logged(caplog, 3, lambda r: r.name == "aserve.access", "three access log lines")
    assert [(r.request, r.status) for r in lines] == [  # type: ignore[attr-defined]
        (f"POST {ADD_PATH} HTTP/1.1", 200), ("GET /v2/models/add?x=1 HTTP/1.1", 200),
        ("GET /v2/models/nope HTTP/1.1", 404)]
    assert lines[0].bytes > size and lines[0].remote == "127.0.0.1"  # type: ignore[attr-defined]
    assert f'"POST {ADD_PATH} HTTP/1.1" 200 {lines[0].bytes}' in lines[0].getMessage()  # type: ignore[attr-defined]


async def scrape(http: aiohttp.ClientSession, url: str) -> dict[tuple[str, str], float]:
    from prometheus_client.parser import text_string_to_metric_families

    async with http.get(f"{url}/metrics") as r:
        text = await r.text()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("aserve_http_"):
                out[sample.name, next(iter(sample.labels.values()), "")] = sample.value
    return out


async def test_metrics_count_requests_refusals_and_connections(start_server, repository: pathlib.Path,
                                                               http: aiohttp.ClientSession) -> None:
    server, url = await start_server(repository, max_header_bytes=1024)
    before = await scrape(http, url)
    for first in range(3):
        async with http.post(f"{url}{ADD_PATH}", json=add_body(first)) as r:
            assert r.status == 200
    await exchange(server.port, b"GET /a HTTP/1.1\nHost: x\n\n")  # malformed
    await exchange(server.port, f"GET /{'a' * 2000} HTTP/1.1\r\nHost: x\r\n\r\n".encode())  # header size
    after = await scrape(http, url)
    assert after["aserve_http_requests_total", ""] - before["aserve_http_requests_total", ""] == 3 + 2 + 1
    assert after["aserve_http_refused_total", "malformed"] - before["aserve_http_refused_total", "malformed"] == 1
    assert after["aserve_http_refused_total", "header_size"] - before["aserve_http_refused_total", "header_size"] == 1
    assert after["aserve_http_connections", ""] >= 1  # the scraping client's own


def test_answer_heads_are_remembered_by_what_they_say() -> None:
    def head(response: Response, close: bool) -> bytes:
        data = encode(response, close=close)
        assert b"".join(data[1:]) == b"".join(response.chunks)
        return bytes(data[0])

    json_type = {"Content-Type": "application/json"}
    first = head(Response(200, [b"x" * 10], dict(json_type)), False)
    same = head(Response(200, [b"y" * 10], dict(json_type)), False)  # the same head (looked up)
    assert re.sub(rb"Date: [^\r]*", b"", same) == re.sub(rb"Date: [^\r]*", b"", first)
    assert b"\r\nContent-Length: 10\r\n" in first and b"Connection" not in first
    other = head(Response(200, [b"x" * 4, b"y" * 7], dict(json_type)), False)
    assert b"\r\nContent-Length: 11\r\n" in other
    closing = head(Response(200, [b"x" * 10], dict(json_type)), True)
    assert closing.endswith(b"\r\nConnection: close\r\n\r\n")
    binary = head(Response(200, [b"x" * 10], {"Content-Type": "application/octet-stream",
                                              "Inference-Header-Content-Length": "4"}), False)
    assert b"\r\nInference-Header-Content-Length: 4\r\n" in binary and b"octet-stream" in binary
    for h in (first, other, closing, binary):
        assert h.startswith(b"HTTP/1.1 200 OK\r\nServer: aserve\r\nDate: ") and h.endswith(b"\r\n\r\n")
    assert encode(Response(404, b"{}"), close=False, head_only=True)[0].startswith(b"HTTP/1.1 404 Not Found\r\n")


async def test_a_head_read_before_byte_for_byte_is_read_without_the_parser(start_server, repository: pathlib.Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A read that holds one request whose head, byte for byte, a read held before with a body
    of the same length and nothing else, is read without llhttp (on the host's loop, where the
    test sees it): each such request is still answered on its own body, and the model it names
    is looked up again (gone: 404, the connection open). Another length, and two requests in
    one read, go through the parser."""
    from aserve.server.connection import Connection

    known_reads: list[int] = []
    read_known = Connection._read_known

    def counting(self: Connection, known: tuple[object, ...], data: bytes, start: int) -> None:
        known_reads.append(len(data) - start)
        read_known(self, known, data, start)

    monkeypatch.setattr(Connection, "_read_known", counting)
    server, _ = await start_server(repository)
    on_host = server.loops is None
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)

    async def answered(data: bytes, *firsts: int) -> None:
        writer.write(data)
        for first in firsts:
            status, headers, body = await read_response(reader)
            assert status == 200 and json.loads(body)["outputs"][0]["data"] == expected_sum(first)
            assert "connection" not in headers

    firsts = [10, 20, 30, 41]  # one Content-Length: one head; the second read of it is learned
    for first in firsts:
        await answered(add_request(first), first)
    assert not on_host or len(known_reads) == 2
    await answered(add_request(1000), 1000)  # a longer body: another head
    await answered(add_request(11) + add_request(12), 11, 12)  # two in one read
    assert not on_host or len(known_reads) == 2
    await answered(add_request(13), 13)
    assert not on_host or known_reads == [len(add_body_bytes(10))] * 3
    if not on_host:  # a front learns of the model's unload a moment after the host
        writer.close()
        return
    shutil.rmtree(repository / "add")
    await server.plane.rescan()
    await until(lambda: "add" not in server.plane.registry.routes, what="the model to leave the routes")
    writer.write(add_request(14))
    status, headers, body = await read_response(reader)
    assert status == 404 and "connection" not in headers
    assert json.loads(body)["error"].startswith("unknown model 'add'")
    assert len(known_reads) == 4
    writer.write(LIVE)
    status, _, body = await read_response(reader)
    assert status == 200 and json.loads(body) == {"live": True}
    writer.close()


def add_body_bytes(first: int) -> bytes:
    return json.dumps(add_body(first)).encode()


@pytest.mark.host_loop  # the host's cache of request heads
async def test_a_head_met_again_is_checked_again_where_the_model_may_have_changed(start_server,
                                                                                  repository: pathlib.Path) -> None:
    """Clients repeat their heads byte for byte: a head met before keeps its route and header
    mapping, while each request keeps its own body and the model it names is looked up again
    (gone from the repository meanwhile: 404 from the head, at once, and the body that follows
    is dropped on a connection that stays open)."""
    server, _ = await start_server(repository)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    firsts = [10, 20, 30, 41, 52]  # one Content-Length: one head, sent five times
    requests = [add_request(f) for f in firsts]
    assert len({r.partition(b"\r\n\r\n")[0] for r in requests}) == 1
    writer.write(b"".join(requests))
    for first in firsts:
        status, _, body = await read_response(reader)
        assert status == 200 and json.loads(body)["outputs"][0]["data"] == expected_sum(first)
    heads = server.http.heads.parsed
    assert len(heads) == 1
    (headers, *_), = heads.values()
    assert headers["content-type"] == "application/json"
    shutil.rmtree(repository / "add")
    await server.plane.rescan()
    await until(lambda: "add" not in server.plane.registry.routes, what="the model to leave the routes")
    cut = requests[0].index(b"\r\n\r\n") + 4
    writer.write(requests[0][:cut])  # the same head, and no body yet
    status, headers, body = await read_response(reader)
    assert status == 404 and "connection" not in headers
    assert json.loads(body)["error"].startswith("unknown model 'add'")
    writer.write(requests[0][cut:] + LIVE)
    status, _, body = await read_response(reader)
    assert status == 200 and json.loads(body) == {"live": True}
    writer.close()
