"""How a connection paces a client that does not wait as a refusal for overload told it.

A refusal for overload (503 with Retry-After) tells the client when to come back. One that
sends again before then has its connection held: its next request is read only after the
wait the server predicted, twice as long for each such refusal in a row, one step less for
each answer since (`Pacing.answered`). The connection owns one `Pacing`; it asks it whether
it is held (then it reads nothing), and when the request being read was sent (`sent`), which
a hold can move back to the hold's start, so that the time the request waited unread counts
against its budget.
"""

from __future__ import annotations

import asyncio
import fcntl
import random
import struct
import termios
import time
from collections.abc import Callable
from typing import Any, Protocol

from .http import Request, Response

HOLD_MAX_S = 1.0  # longest a connection refused for overload reads nothing (Retry-After says at least 1 s)
HELD_REFUSALS_PER_S = 800.0  # refusals a loop's held connections may take together per second (holds lengthen to keep to it)
# ... and at most this many times the requests per second the refused model admits, where its policy measures that
HELD_PER_ADMITTED = 2.0


class Loop(Protocol):
    """What pacing needs of the loop's HTTP server (`connection.HttpServer`)."""

    held: int  # connections of the loop held now

    def reads_began(self, loop: asyncio.AbstractEventLoop) -> float: ...


class Pacing:
    """One connection's pacing. `pause` stops its reads, `resume` lets it go on (the hold
    ended), `transport` is its socket's transport (None once it is gone)."""

    __slots__ = ("_counts", "_from", "_refusals", "_sent_by", "_spends", "_told_until", "_until", "held", "loop",
                 "pause", "resume", "server", "transport")

    def __init__(self, server: Loop, loop: asyncio.AbstractEventLoop, *, pause: Callable[[], None],
                 resume: Callable[[], None], transport: Callable[[], Any]) -> None:
        self.server = server
        self.loop = loop
        self.pause = pause
        self.resume = resume
        self.transport = transport
        self.held = False  # reads nothing for a while after a refusal for overload (Response.hold)
        self._until = 0.0  # loop time the hold ends
        self._from = 0.0  # time.monotonic() the hold began
        self._counts = False  # the request read after the hold counts the hold as waited
        self._spends = False  # the hold is longer than half the budget of the refusal that set it
        self._sent_by = 0.0  # time.monotonic() the next request was sent by, at the latest (0: unknown)
        self._refusals = 0  # early refusals that held the connection, less one per answer since
        self._told_until = 0.0  # time.monotonic() before which the last refusal asked the client not to retry

    def sent(self) -> tuple[float, bool]:
        """When the request now read was sent, at the latest, and whether it waited out a hold of
        the connection unread: then the hold's start, which counts against its budget; else when
        the loop's iteration began reading (`HttpServer.reads_began`). `took` consumes it."""
        sent_by = self._sent_by
        return (sent_by, True) if sent_by else (self.server.reads_began(self.loop), False)

    def took(self) -> None:
        """The request `sent` was asked about is made: the next one is judged afresh."""
        self._sent_by = 0.0

    def answered(self, request: Request, response: Response | Any) -> None:
        """An answer went out (and the connection stays open)."""
        if type(response) is Response and response.hold > 0:
            self._refused(request, response)
        elif self._refusals:
            self._refusals -= 1  # one admitted does not mean the next will be: the hold shrinks a step

    def _refused(self, request: Request, response: Response) -> None:
        """A refusal for overload was sent. If the client sent this request before the last
        refusal's Retry-After had passed, it does not wait as told: the connection reads
        nothing for the time the server expects to need before it can admit one, twice as
        long for each such refusal, one step less for each answer since (to HOLD_MAX_S),
        less a random part: many such clients come back spread out, about as fast as the
        server admits them, and refusing them does not take the CPU the batches need. A
        client that waits as told is never held.

        A hold is at least as long as keeps the refusals of every held connection of the loop
        within HELD_REFUSALS_PER_S together, and, where the refusal says how many requests a
        second the model admits while overloaded (`Response.rate`, the adaptive policy's), within
        HELD_PER_ADMITTED times that: held clients together come back about as often as the
        model can take one, the rest of their sending being refusals that take the CPU the
        batches need. A refusal for a latency budget holds at most
        half that budget where that rate allows, and the request the client sent meanwhile
        then counts the hold as time it waited (`_unhold`): admitted, it is answered within
        its budget as its client sees it. Where so many clients send early that the rate
        needs holds past half the budget, the hold counts too: what waited it out is refused
        for that wait unless the queue is short enough, and that refusal holds nothing (its
        client did not send it early: the hold kept it), so the client's next request is
        judged as it comes. Such holds are twice as long, the two refusals of each within the
        rate. What is admitted is answered within its budget as its client sees it either way."""
        early = request.received < self._told_until
        self._told_until = time.monotonic() + int(response.headers.get("Retry-After", "1"))
        if not early:
            self._refusals = 0
            return
        if self._spends and request.held:
            return  # it waited out a hold longer than half its budget (`_unhold` counted it): not sent early
        self._refusals += 1
        # the held connections' refusals together stay within HELD_REFUSALS_PER_S, and within
        # HELD_PER_ADMITTED x the requests the model admits per second where the refusal says that
        rate = HELD_REFUSALS_PER_S if response.rate is None else \
            min(HELD_REFUSALS_PER_S, max(HELD_PER_ADMITTED * response.rate, 1.0))
        shortest = min(HOLD_MAX_S, (self.server.held + 1) / rate)
        budget = response.budget
        longest = HOLD_MAX_S if budget is None else min(HOLD_MAX_S, max(budget / 2, shortest))
        hold = min(longest, max(shortest, response.hold * (1 << min(self._refusals - 1, 16))))
        self._spends = budget is not None and hold > budget / 2
        if self._spends:
            # what the client sends meanwhile is likely refused for its wait, then its next comes at once
            hold = min(HOLD_MAX_S, max(hold, 2 * shortest))
        self.hold(hold * (0.5 + 0.5 * random.random()), counts=budget is not None)

    def hold(self, seconds: float, *, counts: bool = False) -> None:
        """Read nothing for `seconds` (what was read already is still answered in order).
        `counts`: a request sent meanwhile counts the hold as time it waited."""
        until = self.loop.time() + seconds
        if self.held and until <= self._until:
            return
        self._until = until
        if not self.held:
            self.held = True
            self.server.held += 1
            self._from = time.monotonic()
            self.pause()
        self._counts = counts
        self.loop.call_at(until, self._unhold)

    def _unhold(self) -> None:
        if not self.held or self.loop.time() < self._until - 0.001:
            return  # a later hold goes on: its own call ends it
        self.held = False
        self.server.held -= 1
        if self._counts and self._unread():
            self._sent_by = self._from  # sent during the hold (no earlier than the refusal)
        self.resume()

    def lost(self) -> None:
        """The connection is gone: a hold of it holds nothing any more."""
        if self.held:
            self.held = False
            self.server.held -= 1

    def _unread(self) -> bool:
        """Whether bytes the client sent wait in the socket, not yet read."""
        transport = self.transport()
        sock = transport.get_extra_info("socket") if transport is not None else None
        if sock is None:
            return False
        try:
            pending = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
        except (OSError, ValueError):
            return False
        return bool(struct.unpack("i", pending)[0])
