"""The head's admission question (`Request.ahead`, `Dispatcher.ahead`) is asked only for a
request whose body is still on the way once the read that brought its head is parsed, and
at most once: a body that came with its head is judged in full by the handler, so a request
(and above all a refusal) is not judged twice.

A real connection on 127.0.0.1, behind a dispatcher whose head check leaves the question for
later as the infer routes do, counts each time it is asked and, when told to, refuses.
"""

from __future__ import annotations

import asyncio
import types
from typing import Any

from aserve.server.app import HttpStats
from aserve.server.errors import ErrorPolicy
from aserve.server.http import Response

from .test_holds import close, serve

BODY = b'{"inputs": []}'


def head(length: int = len(BODY)) -> bytes:
    return f"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n".encode()


class Asking:
    """Every head passes and leaves its admission question for later; `refuse`: the question
    refuses (503, Retry-After). The handler answers 200 with the body's length."""

    def __init__(self, refuse: bool = False) -> None:
        self.app = types.SimpleNamespace(stats=HttpStats(), policy=ErrorPolicy(), draining=False, cors=None)
        self.refuse = refuse
        self.asked = 0
        self.served: list[int] = []

    def head(self, request: Any, length: int | None) -> None:
        request.ahead = self._check

    def again(self, request: Any) -> None:
        request.ahead = self._check

    def _check(self, app: Any, request: Any) -> None:
        self.asked += 1

    def ahead(self, request: Any) -> Response | None:
        assert request.ahead is not None and not request.complete, "asked with the body whole"
        request.ahead(self.app, request)
        request.ahead = None
        if self.refuse:
            return Response(503, b'{"error": "overloaded"}', {"Retry-After": "1"}, content_type="application/json")
        return None

    async def respond(self, request: Any) -> Response:
        self.served.append(len(request.body))
        return Response(200, str(len(request.body)).encode(), content_type="text/plain")

    def finish(self, request: Any, response: Any) -> Any:
        return response

    def failed(self, request: Any, exc: BaseException) -> Any:
        raise AssertionError(f"the handler cannot fail: {exc!r}")


async def asked(dispatcher: Asking, times: int) -> None:
    """Until the dispatcher was asked `times` times (the server has parsed what was sent)."""
    async with asyncio.timeout(10):
        while dispatcher.asked < times:
            await asyncio.sleep(0.001)


async def answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    return int(head.split(b" ")[1]), await reader.readexactly(length)


async def test_a_body_that_came_with_its_head_is_not_asked_about_from_the_head() -> None:
    dispatcher = Asking()
    http, listener, port = await serve(dispatcher)  # type: ignore[arg-type]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for _ in range(3):  # the first head is checked in full, the next two are met again
            writer.write(head() + BODY)
            assert await answer(reader) == (200, str(len(BODY)).encode())
        # two requests in one write, pipelined: neither is asked about
        writer.write(head() + BODY + head() + BODY)
        assert await answer(reader) == (200, str(len(BODY)).encode())
        assert await answer(reader) == (200, str(len(BODY)).encode())
        assert dispatcher.asked == 0 and dispatcher.served == [len(BODY)] * 5
    finally:
        await close(http, listener, writer)


async def test_a_body_still_on_the_way_is_asked_about_once() -> None:
    dispatcher = Asking()
    http, listener, port = await serve(dispatcher)  # type: ignore[arg-type]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head())  # the head alone
        await asked(dispatcher, 1)  # once the read that brought the head is parsed
        writer.write(BODY[:5])  # part of the body, in reads of its own: not asked again
        await writer.drain()
        writer.write(BODY[5:])
        assert await answer(reader) == (200, str(len(BODY)).encode())
        # a head with part of its body in one write: the rest is still on the way
        writer.write(head() + BODY[:5])
        await asked(dispatcher, 2)
        writer.write(BODY[5:])
        assert await answer(reader) == (200, str(len(BODY)).encode())
        assert dispatcher.asked == 2 and dispatcher.served == [len(BODY)] * 2
    finally:
        await close(http, listener, writer)


async def test_a_refusal_from_the_head_is_answered_before_the_body_and_the_connection_goes_on() -> None:
    dispatcher = Asking(refuse=True)
    http, listener, port = await serve(dispatcher)  # type: ignore[arg-type]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        big = 1 << 16
        writer.write(head(big))
        status, _ = await answer(reader)  # before any of the body was sent
        assert status == 503 and dispatcher.asked == 1
        writer.write(b"x" * big)  # read and dropped
        dispatcher.refuse = False
        writer.write(head() + BODY)  # whole: judged by its handler, not asked about
        assert await answer(reader) == (200, str(len(BODY)).encode())
        assert dispatcher.asked == 1 and dispatcher.served == [len(BODY)]
    finally:
        await close(http, listener, writer)
