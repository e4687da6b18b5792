"""The server fixtures of tests/server, for servers traced here, and a real OTLP/HTTP receiver."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from ..server.conftest import repository  # noqa: F401 - fixtures


class Receiver:
    """An OTLP/HTTP trace receiver: every span it is sent, by name."""

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


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[Receiver, str]]:
    r = Receiver()
    app = web.Application()
    app.router.add_post("/v1/traces", r.traces)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield r, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def attrs(span: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for a in span.attributes:
        v = a.value
        out[a.key] = getattr(v, v.WhichOneof("value"))
    return out
