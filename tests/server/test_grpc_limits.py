"""The gRPC front's bounds, through real channels against a real server: a call without its
token refused before its message is read, a malformed message answered INVALID_ARGUMENT, a
stream whose client reads no answers reading no more requests, the connection settings
(calls at once, idle time, age, the ping policy, the SETTINGS they make), and abandoned
streams leaving nothing behind.

gRPC is served on the host's loop whatever the front loops, so the tests that move many
bytes or calls run on it alone (`loops` 0)."""

from __future__ import annotations

import asyncio
import logging
import os
import pathlib
import re
import threading

import aiohttp
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from aserve.server.connection import MAX_WAITING

from ..conftest import until
from .test_grpc import code_of, target
from .test_metrics import scrape, value


async def grpc_calls(url: str, method: str, code: str) -> float:
    """gRPC calls answered so far with `code`, as /metrics counts them over every loop."""
    async with aiohttp.ClientSession() as http:
        return value(await scrape(http, url), "aserve_grpc_requests_total", method=method, code=code)

SERVICE = "/inference.GRPCInferenceService"
INFER = f"{SERVICE}/ModelInfer"
STREAM = f"{SERVICE}/ModelStreamInfer"
MALFORMED = b"\x0a\xff\xff\xff"  # field 1, length-delimited, its length a varint that never ends
API = [("authorization", "Bearer api-secret")]
ADMIN = [("authorization", "Bearer admin-secret")]
UNARY = {  # method: the token it takes (None: open)
    "ServerLive": None, "ServerReady": None, "ModelReady": None, "ServerMetadata": API, "ModelMetadata": API,
    "ModelInfer": API, "ModelConfig": API, "ModelStatistics": API, "RepositoryIndex": ADMIN,
    "RepositoryModelLoad": ADMIN, "RepositoryModelUnload": ADMIN, "TraceSetting": ADMIN,
}
on_the_host_loop = pytest.mark.parametrize("loops", [0])


def raw_message(size: int) -> bytes:
    """A ModelInferRequest holding one `size`-byte raw_input_contents entry (field 7)."""
    length = bytearray()
    n = size
    while True:
        length.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            break
    return b"\x3a" + bytes(length) + bytes(size)


def add_request(request_id: str) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="add", id=request_id)
    for name in "AB":
        request.inputs.add(name=name, datatype="INT32", shape=[1, 4]).contents.int_contents.extend([1, 2, 3, 4])
    return request


def errors_logged(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]


@on_the_host_loop
async def test_a_call_without_its_token_is_refused_before_its_message_is_read(start_server,
                                                                                repository: pathlib.Path) -> None:
    server, _ = await start_server(repository, grpc=True, api_token="api-secret")
    calls = server.app.grpc_stats.calls
    async with grpc.aio.insecure_channel(target(server)) as channel:
        # ModelInfer's path called as a client stream that sends no message and keeps its side
        # open: the server can answer it from its metadata alone, and does
        for path, name in ((INFER, "ModelInfer"), (STREAM, "ModelStreamInfer")):
            call = channel.stream_unary(path)()
            await until(call.done, what=f"the refusal of a {name} call that sent no message", timeout=20)
            assert await call.code() == grpc.StatusCode.UNAUTHENTICATED, await call.details()
            assert calls[(name, "UNAUTHENTICATED")] == 1
        # a large message without the token is refused the same, and the connection serves on
        infer = channel.unary_unary(INFER)
        error = await code_of(infer(raw_message(16 << 20)))
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED and "--api-token" in error.details()
        assert calls[("ModelInfer", "UNAUTHENTICATED")] == 2
        error = await code_of(infer(raw_message(16 << 20), metadata=[("authorization", "Bearer wrong")]))
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        assert (await stub.ModelInfer(add_request("ok"), metadata=API)).id == "ok"


async def test_a_malformed_message_is_invalid_argument_after_the_token(start_server, repository: pathlib.Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    """Every unary method: a message protobuf cannot parse is INVALID_ARGUMENT naming the message
    type, with no traceback in the log; without its token the call is UNAUTHENTICATED first."""
    server, url = await start_server(repository, grpc=True, api_token="api-secret", admin_token="admin-secret")
    caplog.set_level(logging.INFO)
    async with grpc.aio.insecure_channel(target(server)) as channel:
        for name, token in UNARY.items():
            call = channel.unary_unary(f"{SERVICE}/{name}")
            error = await code_of(call(MALFORMED, metadata=token))
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (name, error)
            assert f"the request is not a valid inference.{name}Request message (protobuf: " in error.details(), (
                name, error.details())
            if token is not None:
                error = await code_of(call(MALFORMED))
                assert error.code() == grpc.StatusCode.UNAUTHENTICATED, (name, error)
    assert await grpc_calls(url, "ModelInfer", "INVALID_ARGUMENT") == 1
    assert errors_logged(caplog) == []


async def test_a_malformed_message_in_a_stream_fails_alone(start_server, repository: pathlib.Path,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    server, url = await start_server(repository, grpc=True)
    caplog.set_level(logging.INFO)
    async with grpc.aio.insecure_channel(target(server)) as channel:
        stream = channel.stream_stream(STREAM, response_deserializer=service_pb2.ModelStreamInferResponse.FromString)
        messages = [add_request("first").SerializeToString(), MALFORMED, add_request("last").SerializeToString()]
        call = stream(iter(messages))
        answers = [answer async for answer in call]
        assert await call.code() == grpc.StatusCode.OK
    by_id = {a.infer_response.id: a for a in answers}
    assert sorted(by_id) == ["", "first", "last"]
    assert by_id["first"].error_message == "" and by_id["last"].error_message == ""
    assert by_id[""].error_message.startswith(
        "the request is not a valid inference.ModelInferRequest message (protobuf: ")
    assert await grpc_calls(url, "ModelStreamInfer", "INVALID_ARGUMENT") == 1
    assert errors_logged(caplog) == []


def upper_request(n: int, size: int) -> service_pb2.ModelInferRequest:
    """A request to `upper` of about `size` bytes, whose answer is as large."""
    request = service_pb2.ModelInferRequest(model_name="upper", id=f"r{n}")
    request.inputs.add(name="TEXT", datatype="BYTES", shape=[1, 2])
    request.raw_input_contents.append(size.to_bytes(4, "little") + b"a" * size + (1).to_bytes(4, "little") + b"b")
    return request


async def streams_held(http: aiohttp.ClientSession, url: str) -> int:
    async with http.get(f"{url}/metrics") as r:
        found = re.search(r"^aserve_grpc_streams_held (\d+)", await r.text(), re.MULTILINE)
    return int(found.group(1)) if found else 0


@on_the_host_loop
async def test_a_stream_reads_no_more_while_its_answers_wait(start_server, repository: pathlib.Path,
                                                             http: aiohttp.ClientSession) -> None:
    """A client that writes requests and reads no answers: once MAX_WAITING of its requests wait
    for their answers to be written, the server reads no more (the client's writes are held);
    when the client reads, every request is answered."""
    server, url = await start_server(repository, grpc=True)
    total = 300
    # the client's window stays at HTTP/2's 64 KiB: answers of 64 KiB back up at once
    options = [("grpc.http2.bdp_probe", 0)]
    async with grpc.aio.insecure_channel(target(server), options=options) as channel:
        call = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer()
        written = 0

        async def write() -> None:
            nonlocal written
            for n in range(total):
                await call.write(upper_request(n, 64 * 1024))
                written += 1
            await call.done_writing()

        writer = asyncio.ensure_future(write())
        await until(lambda: writer.done() or streams_held(http, url), what="the stream to hold", every=0.01)
        assert not writer.done(), "the server read every request while none of their answers could be written"
        read = server.plane.model("upper").batcher.stats()["requests"]
        answered = server.app.grpc_stats.calls.get(("ModelStreamInfer", "OK"), 0)
        assert read - answered <= MAX_WAITING and written < total
        ids = [answer.infer_response.id async for answer in call if not answer.error_message]
        await writer
        assert await call.code() == grpc.StatusCode.OK
    assert sorted(ids) == sorted(f"r{n}" for n in range(total))
    assert await streams_held(http, url) == 0


@on_the_host_loop
async def test_a_client_that_cancels_a_held_stream_ends_it_without_an_error(start_server, repository: pathlib.Path,
                                                                           http: aiohttp.ClientSession,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    """A client that stops reading, then cancels its stream while answers wait to be written:
    the stream ends as cancelled, its requests are dropped, and nothing is logged as an error
    (a client's leaving is no server failure)."""
    server, url = await start_server(repository, grpc=True)
    caplog.set_level(logging.INFO)
    async with grpc.aio.insecure_channel(target(server), options=[("grpc.http2.bdp_probe", 0)]) as channel:
        call = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer()

        async def write() -> None:
            for n in range(300):
                await call.write(upper_request(n, 64 * 1024))

        writer = asyncio.ensure_future(write())
        await until(lambda: streams_held(http, url), what="the stream to hold", every=0.01)
        call.cancel()
        writer.cancel()  # its write held, or refused now that the call is over
        await asyncio.gather(writer, return_exceptions=True)
    await until(lambda: server.grpc.methods.readers == set(), what="the stream's end on the server")
    assert await streams_held(http, url) == 0
    assert errors_logged(caplog) == []


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def tasks() -> int:
    return len(os.listdir("/proc/self/task"))


@on_the_host_loop
async def test_abandoned_streams_leave_fds_and_threads_as_they_were(start_server, repository: pathlib.Path) -> None:
    """Streams opened, one request written, then cancelled by their client: the server's fds and
    threads (this process's: the server runs in it) come back to what they were."""
    server, _ = await start_server(repository, grpc=True)

    async def abandon(count: int) -> None:
        async with grpc.aio.insecure_channel(target(server)) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            for n in range(count):
                call = stub.ModelStreamInfer()
                await call.write(add_request(f"r{n}"))
                call.cancel()
            live = await stub.ServerLive(service_pb2.ServerLiveRequest())  # the server went on serving
            assert live.live

    await abandon(10)  # grpc's threads and fds of a first connection
    before = (fds(), tasks(), threading.active_count())
    await abandon(200)
    await until(lambda: (fds(), tasks(), threading.active_count()) <= before and not server.grpc.methods.readers,
                what=f"fds, threads and stream readers back to {before}", timeout=30)
    assert server.plane.model("add").batcher.stats()["queued_requests"] == 0


@on_the_host_loop
async def test_calls_at_once_per_connection_are_bounded(start_server, repository: pathlib.Path) -> None:
    """With two streams at once per connection, a third call on the connection waits until one ends."""
    server, _ = await start_server(repository, grpc=True, grpc_max_concurrent_streams=2)
    async with grpc.aio.insecure_channel(target(server)) as channel:
        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""))
        assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        stream = stub.ModelStreamInfer()
        await stream.write(add_request("one"))
        assert (await stream.read()).infer_response.id == "one"
        third = asyncio.ensure_future(stub.ServerLive(service_pb2.ServerLiveRequest()))
        # a round trip on the stream after the third call began: the third has not gone through
        await stream.write(add_request("two"))
        assert (await stream.read()).infer_response.id == "two"
        assert not third.done() and ("ServerLive", "OK") not in server.app.grpc_stats.calls
        await stream.done_writing()
        assert await stream.read() == grpc.aio.EOF
        assert (await third).live
        watch.cancel()


@on_the_host_loop
async def test_an_idle_connection_is_sent_goaway(start_server, repository: pathlib.Path) -> None:
    server, _ = await start_server(repository, grpc=True, grpc_max_connection_idle_s=0.2)
    async with grpc.aio.insecure_channel(target(server)) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        assert (await stub.ServerLive(service_pb2.ServerLiveRequest())).live
        assert channel.get_state() == grpc.ChannelConnectivity.READY
        # no call open: the server says GOAWAY, and the channel goes idle until its next call
        await asyncio.wait_for(channel.wait_for_state_change(grpc.ChannelConnectivity.READY), 30)
        assert channel.get_state() == grpc.ChannelConnectivity.IDLE
        assert (await stub.ServerLive(service_pb2.ServerLiveRequest())).live


@on_the_host_loop
async def test_a_connection_past_its_age_is_closed_after_its_grace(start_server, repository: pathlib.Path) -> None:
    """A stream open when its connection reaches its age gets the grace, then the connection
    closes under it; the client's next call connects again."""
    server, _ = await start_server(repository, grpc=True, grpc_max_connection_age_s=0.2,
                                   grpc_max_connection_age_grace_s=0.2)
    async with grpc.aio.insecure_channel(target(server)) as channel:
        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""))
        assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
        error = await code_of(asyncio.wait_for(watch.read(), 30))
        assert error.code() == grpc.StatusCode.UNAVAILABLE and error.details() == "max connection age"
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        assert (await stub.ServerLive(service_pb2.ServerLiveRequest())).live


@on_the_host_loop
async def test_a_client_pinging_more_often_than_allowed_is_told_to_go_away(start_server,
                                                                          repository: pathlib.Path) -> None:
    """A client that pings as often as grpc lets it (once a second) while its call is open, to a
    server that allows a ping every 5 minutes (the default) and here one strike: GOAWAY
    too_many_pings at its third ping, and the call ends UNAVAILABLE."""
    server, _ = await start_server(repository, grpc=True, grpc_max_ping_strikes=1)
    pinging = [("grpc.keepalive_time_ms", 50), ("grpc.http2.max_pings_without_data", 0)]
    async with grpc.aio.insecure_channel(target(server), options=pinging) as channel:
        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""))
        assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
        error = await code_of(asyncio.wait_for(watch.read(), 30))
        assert error.code() == grpc.StatusCode.UNAVAILABLE and error.details() == "Too many pings", error


def frame(kind: int, flags: int = 0, payload: bytes = b"", stream: int = 0) -> bytes:
    """An HTTP/2 frame."""
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


SETTINGS, PING, GOAWAY, ACK = 0x4, 0x6, 0x7, 0x1


@on_the_host_loop
async def test_a_client_that_answers_no_ping_is_dropped(start_server, repository: pathlib.Path) -> None:
    """A connection whose client stops answering (here: HTTP/2 by hand that never acknowledges a
    PING) is closed once the server's keepalive ping goes unanswered for the keepalive timeout."""
    server, _ = await start_server(repository, grpc=True, grpc_keepalive_time_s=0.1, grpc_keepalive_timeout_s=0.1,
                                   grpc_keepalive_permit_without_calls=True)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.grpc_port)
    writer.write(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(SETTINGS))
    seen: list[int] = []

    async def frames() -> None:
        while True:
            try:
                head = await reader.readexactly(9)
            except asyncio.IncompleteReadError:
                return  # the server closed the connection
            kind, flags = head[3], head[4]
            await reader.readexactly(int.from_bytes(head[:3], "big"))
            seen.append(kind)
            if kind == SETTINGS and not flags & ACK:
                writer.write(frame(SETTINGS, ACK))  # the settings are acknowledged; pings never are

    try:
        await asyncio.wait_for(frames(), 30)
    finally:
        writer.close()
    assert PING in seen and seen[-1] == GOAWAY, seen


async def test_the_connection_settings_are_the_servers(start_server, repository: pathlib.Path) -> None:
    """The server's first SETTINGS frame carries --grpc-max-concurrent-streams and
    --max-header-bytes, on every loop that serves gRPC."""
    server, _ = await start_server(repository, grpc=True, grpc_max_concurrent_streams=7, max_header_bytes=4096)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.grpc_port)
    try:
        writer.write(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(SETTINGS))
        head = await asyncio.wait_for(reader.readexactly(9), 30)
        payload = await reader.readexactly(int.from_bytes(head[:3], "big"))
    finally:
        writer.close()
    assert head[3] == SETTINGS and not head[4] & ACK
    values = {int.from_bytes(payload[i:i + 2], "big"): int.from_bytes(payload[i + 2:i + 6], "big")
              for i in range(0, len(payload), 6)}
    assert values[0x3] == 7 and values[0x6] == 4096, values  # MAX_CONCURRENT_STREAMS, MAX_HEADER_LIST_SIZE


async def test_a_connections_unfinished_messages_hold_at_most_one_messages_worth(start_server,
                                                                                 repository: pathlib.Path) -> None:
    """Two calls on one connection each send 600 bytes of a 900-byte message, under a 1000-byte
    --max-body-bytes: the second is answered RESOURCE_EXHAUSTED at once (a client cannot make
    the server hold one message's worth per call, a hundred calls at a time), and the first,
    completed, is read whole (and answered on its content)."""
    import h2.config
    import h2.connection
    import h2.events

    server, _ = await start_server(repository, grpc=True, max_body_bytes=1000)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.grpc_port)
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    head = [(":method", "POST"), (":scheme", "http"), (":path", INFER), (":authority", "aserve"),
            ("content-type", "application/grpc"), ("te", "trailers")]
    prefix = b"\0" + (900).to_bytes(4, "big")
    for stream in (1, 3):
        client.send_headers(stream, head)
        client.send_data(stream, prefix + bytes(600))
    writer.write(client.data_to_send())
    status: dict[int, dict[str, str]] = {}

    async def until_ended(stream: int) -> None:
        while stream not in status:
            data = await asyncio.wait_for(reader.read(65536), 30)
            assert data, "the server closed the connection"
            for event in client.receive_data(data):
                if isinstance(event, h2.events.TrailersReceived | h2.events.ResponseReceived):
                    fields = {k.decode(): v.decode() for k, v in event.headers}
                    if "grpc-status" in fields:
                        status[event.stream_id] = fields
            writer.write(client.data_to_send())

    try:
        await until_ended(3)
        assert status[3]["grpc-status"] == "8" and "unfinished messages" in status[3]["grpc-message"], status
        assert 1 not in status
        client.send_data(1, bytes(300), end_stream=True)  # the first call's message, whole
        writer.write(client.data_to_send())
        await until_ended(1)
        assert status[1]["grpc-status"] == "3", status  # INVALID_ARGUMENT: 900 zero bytes are no request
    finally:
        writer.close()
