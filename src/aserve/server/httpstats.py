"""Counters of the HTTP fronts, read by `/metrics`."""

from __future__ import annotations

from aiohttp import web

# why the wire front hands a connection to aiohttp for good (`aserve_http_handoffs_total{reason}`)
HANDOFF_REASONS = ("head", "header_size", "body_size", "connection_limit")


class HttpStats:
    """What the HTTP fronts answered: requests by front, and why connections left the wire
    front for aiohttp (`/metrics`: aserve_http_requests_total, aserve_http_handoffs_total)."""

    __slots__ = ("aiohttp", "handoffs", "lent", "wire")

    def __init__(self) -> None:
        self.wire = 0
        self.aiohttp = 0
        self.lent = 0  # requests to other routes the wire front lent its connection to aiohttp for
        self.handoffs: dict[str, int] = {}

    def handed_off(self, reason: str) -> None:
        self.handoffs[reason] = self.handoffs.get(reason, 0) + 1


HTTP_STATS_KEY: web.AppKey[HttpStats] = web.AppKey("http_stats", HttpStats)
