"""Connection limits: slow clients get 408, oversized headers 431, connections beyond the cap
503, idle keep-alive connections are closed; each error names its limit and setting."""

from __future__ import annotations

import asyncio
import json
import pathlib

import aiohttp

from ..conftest import until
from .conftest import open_connections
from .hardened_models import add_body

ADD_JSON = json.dumps(add_body()).encode()


async def raw_request(port: int, data: bytes, *, trickle: bytes = b"", every: float = 0.05,
                      timeout: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    """Send `data`, then `trickle` one byte every `every` seconds (until the server answers),
    and read the response: (status, headers, body). The server must close the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)

    async def dribble() -> None:
        for byte in trickle:
            await asyncio.sleep(every)
            if writer.is_closing():
                return
            writer.write(bytes([byte]))

    task = asyncio.ensure_future(dribble())
    try:
        raw = await asyncio.wait_for(reader.read(), timeout)  # to EOF: the server closes
    finally:
        task.cancel()
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, body


def request_head(path: str, length: int, extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{extra}"
            f"Content-Length: {length}\r\n\r\n").encode()


async def test_slow_body_gets_408(start_server, repository: pathlib.Path, http: aiohttp.ClientSession) -> None:
    server, url = await start_server(repository, request_timeout_s=0.4)
    for path in ("/v2/models/add/infer", "/v1/models/add:predict", "/v2/repository/index"):
        status, headers, body = await raw_request(server.port, request_head(path, len(ADD_JSON)) + ADD_JSON[:5],
                                                  trickle=ADD_JSON[5:], every=0.1)
        assert status == 408, (path, body)
        assert headers["Connection"] == "close" and headers["Server"] == "aserve"
        assert json.loads(body)["error"] == ("the request was not received within the server's limit of 0.4 s "
                                             "(--request-timeout)")
    async with http.post(f"{url}/v2/models/add/infer", json=add_body()) as r:  # others are served
        assert r.status == 200


async def test_slow_header_gets_408(start_server, repository: pathlib.Path) -> None:
    server, _ = await start_server(repository, request_timeout_s=0.3)
    head = request_head("/v2/models/add/infer", len(ADD_JSON))
    status, headers, body = await raw_request(server.port, head[:10], trickle=head[10:], every=0.1)
    assert status == 408 and headers["Server"] == "aserve"
    assert json.loads(body)["error"] == ("the request header was not received within the server's limit of 0.3 s "
                                         "(--request-timeout)")


async def test_a_request_in_pieces_within_the_limit_is_served(start_server, repository: pathlib.Path) -> None:
    server, _ = await start_server(repository, request_timeout_s=5.0)
    data = request_head("/v2/models/add/infer", len(ADD_JSON), "Connection: close\r\n") + ADD_JSON
    status, _, body = await raw_request(server.port, data[:20], trickle=data[20:], every=0.001)
    assert status == 200 and json.loads(body)["outputs"][0]["data"] == [2, 3, 4, 5]


async def test_oversized_header_gets_431(start_server, repository: pathlib.Path,
                                         http: aiohttp.ClientSession) -> None:
    _, url = await start_server(repository, max_header_bytes=1024)
    async with http.post(f"{url}/v2/models/add/infer", json=add_body(), headers={"X-Big": "a" * 2000}) as r:
        assert r.status == 431 and r.headers["Server"] == "aserve"
        message = (await r.json())["error"]
    assert "limit of 1024 bytes (--max-header-bytes)" in message
    async with http.get(f"{url}/v2/models/{'m' * 2000}") as r:  # the request line too
        assert r.status == 431
    async with http.post(f"{url}/v2/models/add/infer", json=add_body(), headers={"X-Fits": "a" * 900}) as r:
        assert r.status == 200


async def test_connections_beyond_the_cap_get_503(start_server, repository: pathlib.Path) -> None:
    server, url = await start_server(repository, max_connections=2)
    held = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(2)]
    await until(lambda: open_connections(server) == 2, what="two connections counted")
    status, headers, body = await raw_request(server.port, request_head("/v2/models/add/infer", len(ADD_JSON))
                                              + ADD_JSON)
    assert status == 503 and headers["Retry-After"] == "1" and headers["Connection"] == "close"
    assert json.loads(body)["error"] == ("the server is at its limit of 2 open connections (--max-connections); "
                                         "retry later")
    # the held connections are served
    reader, writer = held[0]
    writer.write(request_head("/v2/models/add/infer", len(ADD_JSON), "Connection: close\r\n") + ADD_JSON)
    assert (await asyncio.wait_for(reader.read(), 10)).startswith(b"HTTP/1.1 200")
    writer.close()
    await until(lambda: open_connections(server) == 1, what="the closed connection uncounted")
    async with aiohttp.ClientSession() as http, http.post(f"{url}/v2/models/add/infer", json=add_body()) as r:
        assert r.status == 200
    held[1][1].close()


async def test_idle_keepalive_connection_is_closed(start_server, repository: pathlib.Path) -> None:
    server, _ = await start_server(repository, keepalive_timeout_s=0.3)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert head.startswith(b"HTTP/1.1 200") and b"Connection: close" not in head
    await asyncio.wait_for(reader.readexactly(int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])), 10)
    assert await asyncio.wait_for(reader.read(), 10) == b""  # the server closed the idle connection
    writer.close()


def test_limit_settings_from_flags_and_environment() -> None:
    from aserve.cli import build_parser, settings_from_args
    from aserve.config import load_settings

    args = build_parser().parse_args(["serve", "--max-header-bytes", "4096", "--max-connections", "100",
                                      "--keepalive-timeout", "5", "--request-timeout", "30"])
    s = settings_from_args(args)
    assert (s.max_header_bytes, s.max_connections, s.keepalive_timeout_s, s.request_timeout_s) == (4096, 100, 5.0, 30)
    s = load_settings(environ={"ASERVE_MAX_CONNECTIONS": "7", "ASERVE_REQUEST_TIMEOUT_S": "0"})
    assert s.max_connections == 7 and s.request_timeout_s == 0
