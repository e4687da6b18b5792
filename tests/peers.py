"""Small real peers the tests run on the host: an OTLP/HTTP trace receiver, and any aiohttp
handler served on a free port."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@asynccontextmanager
async def serving(routes: list[tuple[str, str, Handler]], host: str = "127.0.0.1") -> AsyncIterator[int]:
    """Serve (method, path, handler) routes on `host` at a free port, which it yields."""
    app = web.Application()
    for method, path, handler in routes:
        app.router.add_route(method, path, handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, 0)
    await site.start()
    try:
        yield site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    finally:
        await runner.cleanup()


class Receiver:
    """An OTLP/HTTP trace receiver: every span it is sent (`named` finds them by name), and
    the resources they came with."""

    def __init__(self) -> None:
        self.spans: list[Any] = []
        self.resources: list[dict[str, Any]] = []

    async def traces(self, request: web.Request) -> web.Response:
        message = trace_service_pb2.ExportTraceServiceRequest()
        message.ParseFromString(await request.read())
        for rs in message.resource_spans:
            self.resources.append({a.key: a.value.string_value for a in rs.resource.attributes})
            for ss in rs.scope_spans:
                self.spans.extend(ss.spans)
        answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=answer, content_type="application/x-protobuf")

    def named(self, name: str) -> list[Any]:
        return [s for s in self.spans if s.name == name]

    def serving(self, host: str = "127.0.0.1") -> Any:
        """Listen for traces at /v1/traces on `host` (an async context manager of the port)."""
        return serving([("POST", "/v1/traces", self.traces)], host)
