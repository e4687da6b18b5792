"""Running the server: listen, load the models, serve until told to stop, shut down gracefully."""

from __future__ import annotations

import asyncio
import logging
import os
import pathlib
import signal
import socket
import sys
from typing import TYPE_CHECKING

import msgspec

from ..config import ServerSettings
from ..dataplane import DataPlane
from ..engine.pool import describe_key
from ..logs import AccessLogger
from ..tracing import Tracing
from .app import App
from .connection import HttpServer, Limits
from .loops import Loops
from .openapi import document
from .router import Dispatcher, Router
from .routes import ROUTES

if TYPE_CHECKING:
    from .grpc import GrpcFront

READY_PATH = "/v2/health/ready"
LOOPS_START_S = 60.0  # longest the start waits for every front loop to serve

log = logging.getLogger("aserve.server")


class Server:
    """The HTTP front (and the gRPC front, unless `grpc` is off) over a data plane.

    `start()` listens at once (live) and loads the models in the background (ready
    when all are loaded); `drain()` makes it unready while it serves on (so that load
    balancers take it out before it stops listening); `close()` stops accepting, answers
    every request already accepted, then closes the pools."""

    def __init__(self, settings: ServerSettings, *, repository: str | pathlib.Path) -> None:
        self.settings = settings
        self.plane = DataPlane(repository, settings)
        self.app = App(self.plane, settings)
        self.app.openapi = msgspec.json.encode(document(ROUTES))
        access_log = AccessLogger(logging.getLogger("aserve.access")) if settings.access_log else None
        self.http = HttpServer(Dispatcher(self.app, Router(ROUTES)), Limits.of(settings), access_log=access_log)
        self.grpc: GrpcFront | None = None
        if settings.grpc:  # imported only when it serves: a server with --no-grpc loads no grpc
            from .grpc import GrpcFront

            self.grpc = GrpcFront(self.app, access_log=access_log)
        self.tracing = Tracing(settings.tracing)
        count = settings.loop_count
        self.loops = Loops(self, count) if count > 0 else None
        self.app.loops = self.loops
        self._listener: asyncio.Server | None = None
        self._socket: socket.socket | None = None  # with loops: the listening socket the host accepts on
        self._loading: asyncio.Task[None] | None = None
        self._polling: asyncio.Task[None] | None = None
        self._rescans: set[asyncio.Task[None]] = set()
        self._drain_began: float | None = None  # loop time the drain began

    async def start(self) -> None:
        self.plane.scan()
        loop = asyncio.get_running_loop()
        if self.loops is None:
            self._listener = await loop.create_server(self.http, self.settings.host, self.settings.port,
                                                      reuse_address=True, backlog=self.settings.backlog)
        else:
            # the host accepts, and hands each connection to a front (Loops.hand) or serves it
            sock = self._socket = socket.create_server((self.settings.host, self.settings.port),
                                                       family=_family(self.settings.host),
                                                       backlog=self.settings.backlog)
            sock.setblocking(False)
            loop.add_reader(sock.fileno(), self._accept)
            registry, loops = self.plane.registry, self.loops
            registry.on_publish = loops.publish
            registry.before_unload = loops.retire
            registry.queue_fronts = loops.count
            self.http.elsewhere = lambda: loops.connections
        if self.grpc is not None:
            try:
                if self.loops is None:
                    await self.grpc.start(self.settings.host, self.settings.grpc_port)
                else:  # every front loop serves gRPC on it (front.py), the host answers what they relay
                    self.grpc.reserve(self.settings.host, self.settings.grpc_port)
            except OSError:  # the HTTP port is given back too
                if self._listener is not None:
                    self._listener.close()
                if self._socket is not None:
                    loop.remove_reader(self._socket.fileno())
                    self._socket.close()
                raise
        self._loading = loop.create_task(self._load())

    def _accept(self) -> None:
        """The listening socket is readable: accept what waits, and hand it on."""
        assert self._socket is not None and self.loops is not None
        for _ in range(64):
            try:
                conn, _ = self._socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # out of descriptors: the kernel keeps the rest queued
                log.error("accepting a connection failed: %s", e)
                return
            conn.setblocking(False)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.adopt(conn)

    def adopt(self, conn: socket.socket) -> None:
        """Serve an accepted connection: on a front loop, or on the host's when none serves."""
        assert self.loops is not None
        # at the limit, the host's loop serves it: its connection answers 503 and closes
        if self.http.full or not self.loops.hand(conn):
            self.serve_here(conn)

    def serve_here(self, conn: socket.socket) -> None:
        """Serve a connection on the host's loop."""
        asyncio.get_running_loop().create_task(self._serve_here(conn))

    async def _serve_here(self, conn: socket.socket) -> None:
        try:
            await asyncio.get_running_loop().connect_accepted_socket(self.http, conn)
        except OSError:  # the client left before it was served
            conn.close()

    async def _load(self) -> None:
        """Start the front loops and tracing (its exporter's interpreter), then load the models."""
        if self.loops is not None:
            await self.loops.start()
        try:
            self.plane.set_tracer(await self.tracing.start())
        except Exception as e:  # noqa: BLE001 - a server without traces still serves
            log.error("tracing is off: %s", e)
        if self.loops is not None:
            self.loops.publish()  # whether the host traces, and how it samples
            if self.plane.tracer is not None:
                self.plane.tracer.changed = self.loops.publish  # trace settings the admin routes change
        await self.plane.start()
        if self.loops is not None and not await self.loops.serving_all(LOOPS_START_S):
            if self.loops.closing:  # shut down while a front was starting
                return
            log.error("%d of %d event loops serve %.0f s after the start", self.loops.serving, self.loops.count,
                      LOOPS_START_S)
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

    # ---- draining: unready while serving on, before the listener closes ----

    def drain(self) -> None:
        """Begin draining (once; later calls change nothing): /v2/health/ready answers 503 and
        every answer closes its connection (`Connection: close`), so that keep-alive clients and
        proxies reconnect elsewhere before the listener closes; requests are still served."""
        if self._drain_began is None:
            self._drain_began = asyncio.get_running_loop().time()
            self.app.draining = True
            if self.loops is not None:
                self.loops.drain()
            log.info("draining: %s answers 503 while requests are still served", READY_PATH)

    @property
    def draining(self) -> bool:
        return self._drain_began is not None

    async def drained(self, seconds: float) -> None:
        """Drain until `seconds` have passed since the drain began (beginning it now if it
        has not): the step between a stop signal and `close()`."""
        if seconds <= 0:
            return
        self.drain()
        assert self._drain_began is not None
        left = self._drain_began + seconds - asyncio.get_running_loop().time()
        if left > 0:
            await asyncio.sleep(left)

    async def loaded(self) -> None:
        """Wait until every model has loaded (or failed to)."""
        if self._loading is not None:
            await asyncio.shield(self._loading)

    @property
    def port(self) -> int:
        """The port actually bound (useful with port 0)."""
        if self._socket is not None:
            bound: int = self._socket.getsockname()[1]
            return bound
        assert self._listener is not None
        port: int = self._listener.sockets[0].getsockname()[1]
        return port

    @property
    def grpc_port(self) -> int | None:
        """The gRPC front's port actually bound (None: gRPC is off)."""
        return self.grpc.port if self.grpc is not None and self.grpc.port else None

    async def close(self) -> None:
        """Stop listening, finish the requests in flight, close the models' pools."""
        if self._polling is not None:
            self._polling.cancel()
        try:
            if self._socket is not None and self._socket.fileno() >= 0:
                asyncio.get_running_loop().remove_reader(self._socket.fileno())
                self._socket.close()
            if self._listener is not None:
                self._listener.close()
            timeout = self.settings.shutdown_timeout_s
            fronts = []
            if self.loops is not None:  # every loop answers what it accepted, the host's too
                fronts += [self.loops.close(timeout), self.http.shutdown(timeout)]
            elif self._listener is not None:
                fronts.append(self.http.shutdown(timeout))
            if self.grpc is not None:
                fronts.append(self.grpc.stop(timeout))
            await asyncio.gather(*fronts)
        finally:
            if self._loading is not None and not self._loading.done():
                try:
                    await self._loading
                except Exception as e:  # noqa: BLE001 - close must go on to the pools
                    log.error("model loading failed: %s", e)
            await self.plane.close(timeout=self.settings.shutdown_timeout_s)
            await self.tracing.close()


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


async def serve(settings: ServerSettings, *, repository: str | pathlib.Path) -> None:
    """Serve until SIGINT/SIGTERM, then shut down gracefully: drain for `drain_s` (readiness
    503, requests still served; SIGUSR1 begins the drain early, e.g. from a preStop hook),
    stop listening, answer the accepted requests."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    server = Server(settings, repository=repository)
    loop.add_signal_handler(signal.SIGHUP, server.rescan_soon)
    loop.add_signal_handler(signal.SIGUSR1, server.drain)
    try:
        await server.start()
        log.info("aserve listening on http://%s:%d (repository %s)", settings.host, server.port, repository)
        if server.grpc_port is not None:
            if server.loops is not None:  # the front loops serve gRPC: it listens once they do
                await server.loops.serving_all(LOOPS_START_S)
            log.info("aserve listening for gRPC on %s:%d", settings.host, server.grpc_port)
        await stop.wait()
        await server.drained(settings.drain_s)
        log.info("shutting down: finishing accepted requests")
    finally:
        await close_within(server, settings.shutdown_timeout_s)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1):
            loop.remove_signal_handler(sig)


# ---- leaving with interpreters stuck in model code ----

def _running(server: Server, *, stuck_only: bool) -> list[str]:
    """The jobs running in the server's pools (only those given up on: `stuck_only`), described."""
    jobs = []
    for engine, pool in server.plane.registry.pools.items():
        for index, key, seconds in pool.stuck() if stuck_only else pool.running_jobs():
            jobs.append(f"interpreter {index} of the {engine} pool: {describe_key(key)} ({seconds:.1f} s)")
    return jobs


async def close_within(server: Server, seconds: float) -> None:
    """Close the server within `seconds` (--shutdown-timeout). An interpreter stuck in model
    code (native code that does not return) cannot be stopped from inside the process and
    would keep it from exiting: if close does not finish in time, or leaves interpreters
    stuck, the process ends here, with os._exit once the logs are flushed (status 1 and 0)."""
    closing = asyncio.ensure_future(server.close())
    try:
        await asyncio.wait_for(asyncio.shield(closing), seconds)
    except TimeoutError:
        _exit_now(f"shutdown did not finish within --shutdown-timeout {seconds:g} s",
                  _running(server, stuck_only=False), 1)
    stuck = _running(server, stuck_only=True)
    if stuck:
        _exit_now("interpreters are stuck in model code that did not return after it was cancelled", stuck, 0)


def _exit_now(why: str, jobs: list[str], status: int) -> None:
    log.error("exiting now (status %d): %s; %s", status, why,
              "still running: " + "; ".join(jobs) if jobs else "no job was running")
    logging.shutdown()  # flush every handler
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status)
