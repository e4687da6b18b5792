"""Running the server: listen, load the models, serve until told to stop, shut down gracefully."""

from __future__ import annotations

import asyncio
import logging
import pathlib
import signal
from typing import Any

from aiohttp import web

from ..config import ServerSettings
from ..dataplane import DataPlane
from ..logs import AccessLogger
from ..tracing import Tracing
from .app import build_app
from .front import Front, FrontRunner

log = logging.getLogger("aserve.server")


class Server:
    """The HTTP front over a data plane.

    `start()` listens at once (live) and loads the models in the background (ready
    when all are loaded); `close()` stops accepting, answers every request already
    accepted, then closes the pools."""

    def __init__(self, settings: ServerSettings, *, repository: str | pathlib.Path) -> None:
        self.settings = settings
        self.plane = DataPlane(repository, settings)
        self.app = build_app(self.plane, settings)
        self._front = Front(self.plane, max_body_bytes=settings.max_body_bytes)
        self.tracing = Tracing(settings.tracing)
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._loading: asyncio.Task[None] | None = None
        self._polling: asyncio.Task[None] | None = None
        self._rescans: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self.plane.scan()
        runner = FrontRunner(
            self.app, self._front, handle_signals=False, shutdown_timeout=self.settings.shutdown_timeout_s,
            access_log=logging.getLogger("aiohttp.access") if self.settings.access_log else None,
            access_log_class=AccessLogger,
        )
        await runner.setup()
        self._runner = runner
        site = web.TCPSite(runner, self.settings.host, self.settings.port, reuse_address=True,
                           backlog=self.settings.backlog)
        await site.start()
        self._site = site
        self._loading = asyncio.get_running_loop().create_task(self._load())

    async def _load(self) -> None:
        """Start tracing (its exporter's interpreter), then load the models."""
        try:
            self.plane.set_tracer(await self.tracing.start())
        except Exception as e:  # noqa: BLE001 - a server without traces still serves
            log.error("tracing is off: %s", e)
        await self.plane.start()
        if self.settings.repository_poll_s > 0:
            self._polling = asyncio.get_running_loop().create_task(self._poll(self.settings.repository_poll_s))

    async def _poll(self, seconds: float) -> None:
        """TF-Serving's file-system source: rescan the repository every `seconds`."""
        while True:
            await asyncio.sleep(seconds)
            try:
                await self.plane.rescan()
            except Exception:  # a failed rescan is logged; polling goes on
                log.exception("repository rescan failed")

    def rescan_soon(self) -> None:
        """Rescan the repository in the background (SIGHUP); rescans run one after another."""
        log.info("rescanning the repository %s", self.plane.registry.repository)

        async def rescan() -> None:
            if self._loading is not None:
                await asyncio.shield(self._loading)  # the first load finishes first
            await self.plane.rescan()

        task = asyncio.get_running_loop().create_task(rescan())
        self._rescans.add(task)
        task.add_done_callback(self._rescan_done)

    def _rescan_done(self, task: asyncio.Task[None]) -> None:
        self._rescans.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("repository rescan failed: %s", task.exception())

    async def loaded(self) -> None:
        """Wait until every model has loaded (or failed to)."""
        if self._loading is not None:
            await asyncio.shield(self._loading)

    @property
    def port(self) -> int:
        """The port actually bound (useful with port 0)."""
        assert self._site is not None and self._site._server is not None
        server: Any = self._site._server
        sockets: Any = server.sockets
        port: int = sockets[0].getsockname()[1]
        return port

    async def close(self) -> None:
        """Stop listening, finish the requests in flight, close the models' pools."""
        if self._polling is not None:
            self._polling.cancel()
        try:
            if self._runner is not None:
                await self._runner.cleanup()
        finally:
            if self._loading is not None and not self._loading.done():
                try:
                    await self._loading
                except Exception as e:  # noqa: BLE001 - close must go on to the pools
                    log.error("model loading failed: %s", e)
            await self.plane.close(timeout=self.settings.shutdown_timeout_s)
            await self.tracing.close()


async def serve(settings: ServerSettings, *, repository: str | pathlib.Path) -> None:
    """Serve until SIGINT/SIGTERM, then shut down gracefully."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    server = Server(settings, repository=repository)
    loop.add_signal_handler(signal.SIGHUP, server.rescan_soon)
    try:
        await server.start()
        log.info("aserve listening on http://%s:%d (repository %s)", settings.host, server.port, repository)
        await stop.wait()
        log.info("shutting down: finishing accepted requests")
    finally:
        await server.close()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.remove_signal_handler(sig)
