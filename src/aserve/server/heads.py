"""Request heads met before, remembered by a loop's HTTP server for its connections.

Clients repeat their heads byte for byte. Two memos, both bounded (`Bounded`):

- parsed heads: (method, target, version, raw fields) as llhttp handed them over -> what the
  checks that depend on nothing else made of them (the header mapping, the method's and
  target's text, the route and its parameters, the Content-Encoding, whether it expects
  100 Continue). A head found there is looked up, not made again; the model it names is still
  looked up again (`Dispatcher.again`).
- raw heads: a head's bytes, when a read held it and its body alone (Content-Length framing,
  no Content-Encoding or Expect) -> (its parsed entry, HTTP version, keep-alive, body length).
  A read that begins with those bytes and holds a body of that length is that request, read
  without llhttp (`Connection._read_known`).
"""

from __future__ import annotations

from typing import Any

from ..bounded import Bounded

KNOWN_HEAD_BYTES = 2048  # longest head kept byte for byte

Parsed = tuple[Any, ...]  # (headers, method name, target, route, params, encoding, expect)


class KnownHeads:
    """The two memos of one loop's server (see the module's docstring)."""

    __slots__ = ("parsed", "raw")

    def __init__(self, size: int = 256) -> None:
        self.parsed: Bounded[tuple[Any, ...], Parsed] = Bounded(size)
        self.raw: Bounded[bytes, tuple[Parsed, str, bool, int]] = Bounded(size)

    def read(self, data: bytes) -> tuple[tuple[Parsed, str, bool, int], int] | None:
        """A read that is one request whose head is known byte for byte with a body of the
        length it had then: (what `raw` holds of it, where its body begins); else None."""
        end = data.find(b"\r\n\r\n", 0, KNOWN_HEAD_BYTES)
        if end <= 0:
            return None
        known = self.raw.get(data[:end + 4])
        if known is None or len(data) - end - 4 != known[3]:
            return None
        return known, end + 4

    def learn(self, data: bytes, size: int, parsed: Parsed, version: str, keep_alive: bool) -> None:
        """Keep the head of a read that held one request, head and a body of `size` bytes: the
        head ends where the body begins (then it ends at the read's first blank line), so the
        same bytes are the same request head."""
        start = len(data) - size
        if start <= KNOWN_HEAD_BYTES and data.find(b"\r\n\r\n", 0, start) == start - 4:
            self.raw.remember(data[:start], (parsed, version, keep_alive, size))
