"""The wire front: aserve's own HTTP/1.1 parser for plain infer and predict requests.

What a client sees must not depend on which front answered: every test here talks raw
HTTP over a socket (or aiohttp's client) to a real server and checks the answers
against values computed in the test; the parity test asks both fronts the same
questions and compares the answers byte for byte, bar the Date header.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import pathlib
import re
import socket
import struct

import aiohttp
import pytest

from aserve.server.handlers import Answer
from aserve.server.wire import MAX_KNOWN_HEAD, MAX_KNOWN_HEADS, WireServer, encode_response, parse_head

from ..conftest import until
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


def wire_server(server) -> WireServer:
    low = server._runner.server
    assert isinstance(low, WireServer)
    return low


async def test_pipelined_requests_are_answered_in_order(start_server, repository: pathlib.Path) -> None:
    server, _ = await start_server(repository)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    firsts = [10, 20, 30, 40, 50]
    # five infer requests and a metadata request (aiohttp's) behind them, in one write
    writer.write(b"".join(add_request(f) for f in firsts) + b"GET /v2/models/add HTTP/1.1\r\nHost: x\r\n\r\n")
    for first in firsts:
        status, headers, body = await read_response(reader)
        assert status == 200 and headers["server"] == "aserve" and "date" in headers
        outputs = {o["name"]: o["data"] for o in json.loads(body)["outputs"]}
        assert outputs["SUM"] == expected_sum(first)
    status, _, body = await read_response(reader)
    assert status == 200 and json.loads(body)["name"] == "add"
    # aiohttp answered the GET on a lent connection: the next infer request is the wire front's again
    low = wire_server(server)
    answered = low.front.stats.wire
    writer.write(add_request(7) + b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n" + add_request(8))
    for first in (7, None, 8):
        status, _, body = await read_response(reader)
        assert status == 200
        if first is not None:
            assert json.loads(body)["outputs"][0]["data"] == expected_sum(first)
    assert low.front.stats.wire == answered + 2
    writer.close()


async def test_other_routes_are_lent_and_the_connection_comes_back(start_server, repository: pathlib.Path) -> None:
    server, _ = await start_server(repository)
    low = wire_server(server)
    wire, lent = low.front.stats.wire, low.front.stats.lent
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 2\r\n\r\n{}" + add_request(11) + b"GET /v2/models/add/ready HTTP/1.1\r\nHost: x\r\n\r\n"
                 + add_request(12))
    status, _, body = await read_response(reader)
    assert status == 200 and {m["name"] for m in json.loads(body)} >= {"add", "slow", "upper"}
    for expected in (expected_sum(11), None, expected_sum(12)):
        status, _, body = await read_response(reader)
        assert status == 200
        if expected is not None:
            assert json.loads(body)["outputs"][0]["data"] == expected
    assert (low.front.stats.wire - wire, low.front.stats.lent - lent) == (2, 2)
    assert len(low.wired) == 1  # the connection is the wire front's again, counted once
    assert low.open == 1
    writer.write(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    status, headers, _ = await read_response(reader)
    assert status == 200 and headers["connection"] == "close"
    assert await asyncio.wait_for(reader.read(), 10) == b""  # aiohttp closed it, as asked
    writer.close()
    await until(lambda: low.open == 0 and not low.wired, what="the closed connection uncounted")


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


@pytest.mark.parametrize("case", ["chunked", "gzip", "expect", "http10", "folded", "two-lengths"])
async def test_requests_it_does_not_take_are_aiohttp_s(start_server, repository: pathlib.Path, case: str) -> None:
    """Anything but a plain request is handed to aiohttp with its bytes, and answered as aiohttp does."""
    server, _ = await start_server(repository)
    body = json.dumps(add_body(5)).encode()
    head = f"POST {ADD_PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    if case == "chunked":
        data = (head + "Transfer-Encoding: chunked\r\n\r\n").encode() + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    elif case == "gzip":
        packed = gzip.compress(body)
        data = (head + f"Content-Encoding: gzip\r\nContent-Length: {len(packed)}\r\n\r\n").encode() + packed
    elif case == "expect":
        data = (head + f"Expect: 100-continue\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
    elif case == "http10":
        data = (head.replace("HTTP/1.1", "HTTP/1.0") + f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    elif case == "folded":
        data = (head + f"X-A: 1\r\n  folded\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
    else:
        data = (head + f"Content-Length: {len(body)}\r\nContent-Length: {len(body) + 1}\r\n\r\n").encode() + body
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(data)
    status, _, answer = await read_response(reader)
    if case in ("folded", "two-lengths"):
        assert status == 400, answer  # aiohttp refuses what is malformed
    else:
        assert status == 200, answer
        assert json.loads(answer)["outputs"][0]["data"] == expected_sum(5)
    writer.close()


async def test_both_fronts_answer_alike(start_server, repository: pathlib.Path) -> None:
    """The same requests to a server with the wire front and one without: the same answers."""
    wired, _ = await start_server(repository)
    plain, _ = await start_server(repository, wire_front=False)
    assert isinstance(wired._runner.server, WireServer) and not isinstance(plain._runner.server, WireServer)
    binary_header = json.dumps({"inputs": [
        {"name": "A", "datatype": "INT32", "shape": [1, 4], "parameters": {"binary_data_size": 16}},
        {"name": "B", "datatype": "INT32", "shape": [1, 4], "parameters": {"binary_data_size": 16}}],
        "outputs": [{"name": "SUM", "parameters": {"binary_data": True}}]}).encode()
    binary = binary_header + struct.pack("<8i", 1, 2, 3, 4, 5, 6, 7, 8)
    requests = [
        add_request(1),
        add_request(-999),  # the model raises: 500 with its message
        add_request(1, path="/v2/models/nope/infer"),  # 404
        add_request(1, path="/v2/models/add/versions/1/infer"),
        add_request(1, path="/v2/models/add/versions/9/infer"),
        (f"POST {ADD_PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
         f"Inference-Header-Content-Length: {len(binary_header)}\r\nContent-Length: {len(binary)}\r\n\r\n").encode()
        + binary,
        f"POST {ADD_PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 9\r\n\r\n{{\"inputs\"".encode(),
        f"POST {ADD_PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{{}}".encode(),
        f"POST {ADD_PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: text/csv\r\nContent-Length: 2\r\n\r\n{{}}".encode(),
        f"POST /v1/models/add:predict HTTP/1.1\r\nHost: x\r\nContent-Length: {len(PREDICT)}\r\n\r\n".encode() + PREDICT,
        f"POST {ADD_PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAccept: application/msgpack\r\n"
        f"Content-Length: 2\r\n\r\n{{}}".encode(),
    ]
    answers = []
    for server in (wired, plain):
        got = []
        for data in requests:  # a connection each: a 415 closes its connection
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(data)
            status, headers, body = await read_response(reader)
            headers.pop("date")
            got.append((status, headers, body))
            writer.close()
            await writer.wait_closed()
        answers.append(got)
    for request, a, b in zip(requests, *answers, strict=True):
        a_body, b_body = (re.sub(rb"[0-9a-f]{12}", b"ID", x[2]) for x in (a, b))  # error ids differ
        assert (a[0], a[1], a_body) == (b[0], b[1], b_body), request
    assert [a[0] for a in answers[0]] == [200, 500, 404, 200, 404, 200, 400, 400, 415, 200, 400]


async def test_connection_close_and_keepalive(start_server, repository: pathlib.Path) -> None:
    server, _ = await start_server(repository, keepalive_timeout_s=0.3)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(add_request(2, extra="Connection: close\r\n"))
    status, headers, _ = await read_response(reader)
    assert status == 200 and headers["connection"] == "close"
    assert await asyncio.wait_for(reader.read(), 10) == b""  # closed after the answer
    writer.close()
    # an idle keep-alive connection that only sent infer requests is closed after the timeout
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(add_request(2, extra="Connection: keep-alive\r\n"))
    status, headers, _ = await read_response(reader)
    assert status == 200 and "connection" not in headers
    assert await asyncio.wait_for(reader.read(), 10) == b""
    writer.close()


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
    low = wire_server(server)
    await until(lambda: len(low.wired) == 1 and next(iter(low.wired))._paused, what="the server's writes paused")
    assert not next(iter(low.wired))._reading
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
    writer.write(f"POST /v2/models/slow/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    idle_reader, idle_writer = await asyncio.open_connection("127.0.0.1", server.port)
    low = wire_server(server)
    await until(lambda: len(low.wired) == 2 and any(c._busy for c in low.wired), what="the request in progress")
    closing = asyncio.ensure_future(server.close())
    status, headers, answer = await read_response(reader)
    assert status == 200 and json.loads(answer)["outputs"][0]["data"] == [300.0]
    assert headers["connection"] == "close"
    assert await asyncio.wait_for(idle_reader.read(), 10) == b""  # the idle one is closed
    await closing
    writer.close()
    idle_writer.close()


async def test_access_log_lines_for_both_fronts(start_server, repository: pathlib.Path,
                                               http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture) -> None:
    from aserve.cli import build_parser, settings_from_args

    assert settings_from_args(build_parser().parse_args(["serve"])).wire_front is True
    assert settings_from_args(build_parser().parse_args(["serve", "--no-wire-front"])).wire_front is False
    server, url = await start_server(repository, access_log=True)
    low = wire_server(server)
    caplog.set_level("INFO", logger="aiohttp.access")
    async with http.post(f"{url}{ADD_PATH}", json=add_body(4)) as r:
        assert r.status == 200 and (await r.json())["outputs"][0]["data"] == expected_sum(4)
        size = len(await r.read())
    async with http.get(f"{url}/v2/models/add") as r:  # lent to aiohttp
        assert r.status == 200
    assert low.front.stats.wire == 1 and low.front.stats.lent == 1
    lines = [r for r in caplog.records if r.name == "aiohttp.access"]
    assert [(r.request, r.status) for r in lines] == [  # type: ignore[attr-defined]
        (f"POST {ADD_PATH} HTTP/1.1", 200), ("GET /v2/models/add HTTP/1.1", 200)]
    assert lines[0].bytes > size and lines[0].remote == "127.0.0.1"  # type: ignore[attr-defined]
    assert f'"POST {ADD_PATH} HTTP/1.1" 200 {lines[0].bytes}' in lines[0].getMessage()  # type: ignore[attr-defined]


def _triton_infers(url: str, n: int, *, check_live_first: bool) -> list[list[int]]:
    import numpy as np
    import tritonclient.http as triton

    client = triton.InferenceServerClient(url.removeprefix("http://"))  # one keep-alive connection
    try:
        if check_live_first:
            assert client.is_server_live()
        sums = []
        for i in range(n):
            inputs = [triton.InferInput("A", [1, 4], "INT32"), triton.InferInput("B", [1, 4], "INT32")]
            inputs[0].set_data_from_numpy(np.array([[i, 2, 3, 4]], np.int32), binary_data=True)
            inputs[1].set_data_from_numpy(np.array([[1, 1, 1, 1]], np.int32), binary_data=True)
            result = client.infer("add", inputs, outputs=[triton.InferRequestedOutput("SUM", binary_data=True)])
            sums.append(result.as_numpy("SUM").tolist()[0])
        return sums
    finally:
        client.close()


async def scrape(http: aiohttp.ClientSession, url: str) -> dict[tuple[str, str], float]:
    from prometheus_client.parser import text_string_to_metric_families

    async with http.get(f"{url}/metrics") as r:
        text = await r.text()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in ("aserve_http_requests_total", "aserve_http_handoffs_total", "aserve_http_lent_total"):
                out[sample.name, next(iter(sample.labels.values()), "")] = sample.value
    return out


async def test_metrics_count_what_each_front_answered(start_server, repository: pathlib.Path,
                                                      http: aiohttp.ClientSession) -> None:
    """tritonclient's infer requests are the wire front's, also on a connection that asked
    something else first (is_server_live: lent to aiohttp, then back); /metrics says so."""
    _, url = await start_server(repository)
    before = await scrape(http, url)
    sums = await asyncio.to_thread(_triton_infers, url, 3, check_live_first=False)
    assert sums == [expected_sum(i) for i in range(3)]
    middle = await scrape(http, url)
    assert middle["aserve_http_requests_total", "wire"] - before["aserve_http_requests_total", "wire"] == 3
    sums = await asyncio.to_thread(_triton_infers, url, 2, check_live_first=True)
    assert sums == [expected_sum(i) for i in range(2)]
    after = await scrape(http, url)
    assert after["aserve_http_requests_total", "wire"] - middle["aserve_http_requests_total", "wire"] == 2
    # the live probe, plus this scrape
    assert after["aserve_http_requests_total", "aiohttp"] - middle["aserve_http_requests_total", "aiohttp"] == 2
    assert after["aserve_http_lent_total", ""] - middle["aserve_http_lent_total", ""] == 2
    reader, writer = await asyncio.open_connection("127.0.0.1", int(url.rsplit(":", 1)[1]))
    writer.write(add_request(1).replace(b"HTTP/1.1", b"HTTP/1.0"))
    status, _, _ = await read_response(reader)
    assert status == 200
    writer.close()
    last = await scrape(http, url)
    assert last["aserve_http_handoffs_total", "head"] - after["aserve_http_handoffs_total", "head"] == 1


async def test_a_head_met_again_is_looked_up_and_each_request_keeps_its_own_body(
        start_server, repository: pathlib.Path) -> None:
    server, _ = await start_server(repository)
    low = wire_server(server)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    firsts = [10, 20, 30, 41, 52]  # one Content-Length: one head, sent five times
    requests = [add_request(f) for f in firsts]
    heads = {r.partition(b"\r\n\r\n")[0] for r in requests}
    assert len(heads) == 1
    writer.write(requests[0])  # met once: parsed and remembered
    status, _, body = await read_response(reader)
    assert status == 200 and json.loads(body)["outputs"][0]["data"] == expected_sum(firsts[0])
    head = heads.pop()
    assert head in low.heads
    known = low.heads[head]
    writer.write(b"".join(requests[1:]))  # met again: looked up, and each body is its own
    for first in firsts[1:]:
        status, _, body = await read_response(reader)
        assert status == 200 and json.loads(body)["outputs"][0]["data"] == expected_sum(first)
    assert low.heads[head] is known
    # the same head but Connection: close is another head: its answer closes the connection
    writer.write(add_request(10, extra="Connection: close\r\n"))
    status, headers, body = await read_response(reader)
    assert status == 200 and headers["connection"] == "close"
    assert json.loads(body)["outputs"][0]["data"] == expected_sum(10)
    assert await asyncio.wait_for(reader.read(), 30) == b""
    writer.close()
    # a long head is answered but not remembered; the table forgets everything once full
    long_head = add_request(5, extra=f"X-Pad: {'p' * MAX_KNOWN_HEAD}\r\n")
    status, _, body = await raw_exchange(server.port, long_head)
    assert status == 200 and json.loads(body)["outputs"][0]["data"] == expected_sum(5)
    assert all(len(h) <= MAX_KNOWN_HEAD for h in low.heads)
    for i in range(MAX_KNOWN_HEADS + 10):
        assert low.learn(f"POST {ADD_PATH} HTTP/1.1\r\nHost: x\r\nX-N: {i}\r\nContent-Length: 3".encode())
        assert len(low.heads) <= MAX_KNOWN_HEADS
    assert low.learn(b"POST /a HTTP/1.0\r\nHost: a\r\nContent-Length: 0") is None  # aiohttp's to read


async def raw_exchange(port: int, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """One request on a new connection, and its answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        return await read_response(reader)
    finally:
        writer.close()


def test_answer_heads_are_remembered_by_what_they_say() -> None:
    def head(answer: Answer, close: bool) -> bytes:
        data = encode_response(answer, close=close)
        assert b"".join(data[1:]) == b"".join(answer.chunks)
        return data[0]

    json_type = {"Content-Type": "application/json"}
    first = head(Answer([b"x" * 10], json_type), False)
    same = head(Answer([b"y" * 10], dict(json_type)), False)  # the same head (looked up)
    assert re.sub(rb"Date: [^\r]*", b"", same) == re.sub(rb"Date: [^\r]*", b"", first)
    assert b"\r\nContent-Length: 10\r\n" in first and b"Connection" not in first
    other = head(Answer([b"x" * 4, b"y" * 7], json_type), False)
    assert b"\r\nContent-Length: 11\r\n" in other
    closing = head(Answer([b"x" * 10], json_type), True)
    assert closing.endswith(b"\r\nConnection: close\r\n\r\n")
    binary = head(Answer([b"x" * 10], {"Content-Type": "application/octet-stream",
                                       "Inference-Header-Content-Length": "4"}), False)
    assert b"\r\nInference-Header-Content-Length: 4\r\n" in binary and b"octet-stream" in binary
    for h in (first, other, closing, binary):
        assert h.startswith(b"HTTP/1.1 200 OK\r\nServer: aserve\r\nDate: ") and h.endswith(b"\r\n\r\n")


def test_parse_head() -> None:
    head = "POST /v2/models/m/infer HTTP/1.1\r\nHost: a\r\nContent-Length:  12 \r\nX-Y:\r\nConnection: Keep-Alive"
    assert parse_head(head) == ("POST", "/v2/models/m/infer", [("Host", "a"), ("Content-Length", "12"), ("X-Y", ""),
                                                               ("Connection", "Keep-Alive")], 12, False)
    assert parse_head("POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nConnection: close") == (
        "POST", "/a", [("Host", "a"), ("Content-Length", "0"), ("Connection", "close")], 0, True)
    assert parse_head("GET /v2/health/ready HTTP/1.1\r\nHost: a") == ("GET", "/v2/health/ready", [("Host", "a")],
                                                                         0, False)
    refused = [
        "BREW /a HTTP/1.1\r\nHost: a\r\nContent-Length: 0",  # a method no route answers
        "POST /a HTTP/1.0\r\nHost: a\r\nContent-Length: 0",  # not HTTP/1.1
        "POST /a  HTTP/1.1\r\nHost: a\r\nContent-Length: 0",  # two spaces
        "POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: +1",
        "POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: \u0661",  # a digit, not an ASCII one
        "POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 1",
        "POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nTransfer-Encoding: chunked",
        "POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nConnection: upgrade",
        "POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nBad Name: x",
        "POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nX: a\x00b",
        "POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n folded",
        "POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 1\nX: bare LF",
        "POST /\u00e9 HTTP/1.1\r\nHost: a\r\nContent-Length: 1",
        "POST /a HTTP/1.1\r\nContent-Length: 1",  # no Host
        "POST /a HTTP/1.1\r\nHost: a\r\nHost: b\r\nContent-Length: 1",
        "POST /a HTTP/1.1\r\nHost: a\r\nContent-Type: a\r\ncontent-type: b\r\nContent-Length: 1",
    ]
    for head in refused:
        assert parse_head(head) is None, head
