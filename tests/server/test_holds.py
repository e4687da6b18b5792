"""How long a connection is held after a refusal for overload, and what the request its client
sent meanwhile counts as waited (`Connection._refused`, `_hold`, `_unhold`).

A real connection on 127.0.0.1, behind a dispatcher that refuses every infer request as
a model's batcher does when it is overloaded (503, Retry-After, the server's expected
wait as `hold`, and the latency budget the refusal was judged by) and keeps each request
it is asked, with `received`: the arrival the budget counts from. The client sends again
at once after each refusal, as a client that ignores Retry-After does.
"""

from __future__ import annotations

import asyncio
import time
import types
from typing import Any

import pytest

from aserve.server import pacing as pacing_module
from aserve.server.app import HttpStats
from aserve.server.connection import HttpServer, Limits
from aserve.server.errors import ErrorPolicy
from aserve.server.http import Response

pytestmark = pytest.mark.serial  # timed against the CPU it gets: run alone (pyproject's markers)

REQUEST = b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"


class Refusing:
    """Every request passes its head; its handler refuses it for overload."""

    def __init__(self, hold: float, budget: float | None, rate: float | None = None) -> None:
        self.app = types.SimpleNamespace(stats=HttpStats(), policy=ErrorPolicy(), draining=False, cors=None)
        self.hold = hold
        self.budget = budget
        self.rate = rate  # requests/s the model admits while overloaded, as an adaptive policy's refusal says
        self.received: list[float] = []  # each request's arrival, as the connection tells it

    def head(self, request: Any, length: int | None) -> None:
        return None

    def again(self, request: Any) -> None:
        return None

    async def respond(self, request: Any) -> Response:
        self.received.append(request.received)
        response = Response(503, b"{}", {"Retry-After": "1"}, content_type="application/json")
        response.hold = self.hold
        response.budget = self.budget
        response.rate = self.rate
        return response

    def finish(self, request: Any, response: Any) -> Any:
        return response

    def failed(self, request: Any, exc: BaseException) -> Any:
        raise AssertionError(f"the handler cannot fail: {exc!r}")


async def serve(dispatcher: Refusing) -> tuple[HttpServer, asyncio.AbstractServer, int]:
    http = HttpServer(dispatcher, Limits(max_connections=0, max_header_bytes=8192,  # type: ignore[arg-type]
                                         max_body_bytes=1 << 20, request_timeout_s=30.0, keepalive_timeout_s=30.0))
    listener = await asyncio.get_running_loop().create_server(http, "127.0.0.1", 0)
    return http, listener, listener.sockets[0].getsockname()[1]


async def close(http: HttpServer, listener: asyncio.AbstractServer, *writers: asyncio.StreamWriter) -> None:
    for writer in writers:
        writer.close()
        await writer.wait_closed()
    await http.shutdown(1.0)
    listener.close()
    await listener.wait_closed()


async def refused(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> float:
    """Send one request; when (time.monotonic()) its 503 was read."""
    writer.write(REQUEST)
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503 "), head
    await reader.readexactly(2)
    return time.monotonic()


async def hold_two(conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]) -> None:
    """The first two connections each refused twice, the second time early: both held."""
    for conn in conns[:2]:
        await refused(*conn)
        await refused(*conn)  # early: held


async def test_a_refusal_for_a_budget_holds_half_the_budget_at_most() -> None:
    # the server expects to admit one in 0.4 s: a refusal without a budget holds up to that,
    # doubling with each early refusal; one judged by a 20 ms budget holds 10 ms at most
    took = {}
    for budget in (None, 0.02):
        dispatcher = Refusing(hold=0.4, budget=budget)
        http, listener, port = await serve(dispatcher)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            first = await refused(reader, writer)  # not early: holds nothing
            for _ in range(4):
                last = await refused(reader, writer)  # each early: each held
            took[budget] = last - first
        finally:
            await close(http, listener, writer)
    assert took[None] >= 4 * 0.4 * 0.5, took  # each hold at least half of its length
    assert took[0.02] < 0.3, took  # four holds of 10 ms at most, and the answers


async def test_the_request_sent_during_a_hold_within_the_budget_counts_the_hold_as_waited() -> None:
    for budget in (None, 0.2):
        dispatcher = Refusing(hold=0.08, budget=budget)
        http, listener, port = await serve(dispatcher)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            await refused(reader, writer)
            answered = await refused(reader, writer)  # early: the connection holds 40-80 ms
            sent = time.monotonic()
            third = await refused(reader, writer)  # sent at once, read after the hold
            if budget is None:
                # read after the hold: its arrival is when it was read
                assert dispatcher.received[2] >= sent + 0.03, (dispatcher.received, sent)
            else:
                # the hold counts: it arrived no later than the refusal before it was answered
                assert dispatcher.received[2] <= answered, (dispatcher.received, answered)
            # sent early again, as every one before it: held again (a hold within half the
            # budget holds a refusal of what waited it out as any early one)
            assert await refused(reader, writer) - third >= 0.04
        finally:
            await close(http, listener, writer)


async def test_a_request_sent_after_the_hold_ended_counts_no_hold() -> None:
    dispatcher = Refusing(hold=0.02, budget=0.2)
    http, listener, port = await serve(dispatcher)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        await refused(reader, writer)
        await refused(reader, writer)  # early: held 10-20 ms
        await asyncio.sleep(0.1)  # the hold ends with nothing unread
        sent = time.monotonic()
        await refused(reader, writer)
        assert dispatcher.received[2] >= sent, (dispatcher.received, sent)
    finally:
        await close(http, listener, writer)


async def test_many_held_connections_hold_longer_together(monkeypatch: pytest.MonkeyPatch) -> None:
    # at 20 refusals a second for every held connection together, the third connection held
    # waits at least 2 x 3 / 20 s (less the random half): longer than its 20 ms budget allows.
    # What its client sent meanwhile counts the hold as waited (refused for it, here), and
    # that refusal holds nothing: the request sent after it is read at once, as it comes
    monkeypatch.setattr(pacing_module, "HELD_REFUSALS_PER_S", 20.0)
    dispatcher = Refusing(hold=0.001, budget=0.02)
    http, listener, port = await serve(dispatcher)
    conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
    try:
        await hold_two(conns)
        assert http.held == 2
        await refused(*conns[2])
        before = await refused(*conns[2])  # held, the third at once: at least 0.15 s
        after = await refused(*conns[2])
        assert after - before >= 0.14, after - before
        assert dispatcher.received[-1] <= before  # counted from the hold's start
        sent = time.monotonic()
        again = await refused(*conns[2])  # after a refusal for a hold's wait: not held
        assert dispatcher.received[-1] >= sent and again - sent < 0.1, (dispatcher.received[-1], sent, again)
        for _ in range(100):
            if http.held == 0:
                break
            await asyncio.sleep(0.05)
        assert http.held == 0  # every hold ended
    finally:
        await close(http, listener, *(writer for _, writer in conns))


@pytest.mark.parametrize("rate", [None, 10.0])
async def test_held_connections_come_back_about_as_often_as_the_model_admits(rate: float | None) -> None:
    """Where the refusal says the model admits 10 requests a second, held connections together
    come back at most twice that: the third connection held waits at least 2 x 3 / 20 s (less
    the random half), past its 20 ms budget. Without it, the loop-wide rate (800 a second)
    leaves the hold at half the budget."""
    dispatcher = Refusing(hold=0.001, budget=0.02, rate=rate)
    http, listener, port = await serve(dispatcher)
    conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
    try:
        await hold_two(conns)
        await refused(*conns[2])
        before = await refused(*conns[2])  # held, the third at once
        after = await refused(*conns[2])
        if rate is None:
            assert after - before < 0.1, after - before
        else:
            assert after - before >= 0.14, after - before
    finally:
        await close(http, listener, *(writer for _, writer in conns))


async def test_a_held_connection_closed_by_the_server_is_held_no_more() -> None:
    dispatcher = Refusing(hold=5.0, budget=None)  # holds of seconds: they outlast the connection
    http, listener, port = await serve(dispatcher)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        await refused(reader, writer)
        await refused(reader, writer)  # early: held
        assert http.held == 1
        http.close_idle()  # shutting down: the held connection is closed
        assert await reader.read() == b""
        for _ in range(100):
            if not http.connections:
                break
            await asyncio.sleep(0.001)
        assert not http.connections and http.held == 0
    finally:
        await close(http, listener, writer)


class SlowFirstHead(Refusing):
    """The first request's head takes 30 ms of the loop (as a long run of refusals does)."""

    def head(self, request: Any, length: int | None) -> None:
        if not self.received and not getattr(self, "slowed", False):
            self.slowed = True
            time.sleep(0.03)


async def test_a_request_read_late_in_a_run_of_ready_connections_counts_from_the_runs_start() -> None:
    # two connections ready at once are read in one iteration of the loop; the second is read
    # after the first's 30 ms, but its bytes sat in its socket since the iteration began
    dispatcher = SlowFirstHead(hold=0.0, budget=None)
    http, listener, port = await serve(dispatcher)
    conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
    try:
        before = time.monotonic()
        for _, writer in conns:
            writer.write(REQUEST)  # both sent before the server's loop runs again
        for reader, _ in conns:
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 503 "), head
            await reader.readexactly(2)
        first, second = sorted(dispatcher.received)
        assert before <= first and second - first < 0.01, (before, dispatcher.received)
        await refused(*conns[1])  # read in an iteration of its own: counts from then
        assert dispatcher.received[2] >= first + 0.03, dispatcher.received
    finally:
        await close(http, listener, *(writer for _, writer in conns))


async def test_a_start_left_by_a_loop_that_stopped_is_not_taken_for_a_later_iterations() -> None:
    http, listener, _ = await serve(Refusing(hold=0.0, budget=None))
    try:
        http._reads_began = time.monotonic() - 5.0  # its loop stopped before the reset ran
        before = time.monotonic()
        assert http.reads_began(asyncio.get_running_loop()) >= before
    finally:
        await close(http, listener)
