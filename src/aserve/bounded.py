"""A dict of bounded size, for what the server remembers of what clients send."""

from __future__ import annotations

from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")


class Bounded(dict[K, V]):
    """Keeps at most `limit` entries: remembering one more forgets the oldest.

    Clients choose the keys (request heads, header values, model names), so every such
    table must be bounded; forgetting the oldest one entry at a time keeps the others,
    where clearing a full table would make every client pay again at once."""

    __slots__ = ("limit",)

    def __init__(self, limit: int) -> None:
        super().__init__()
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        self.limit = limit

    def remember(self, key: K, value: V) -> V:
        """Store `value` under `key` (forgetting the oldest entry when full) and return it."""
        if len(self) >= self.limit and key not in self:
            del self[next(iter(self))]
        self[key] = value
        return value
