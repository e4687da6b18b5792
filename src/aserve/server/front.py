"""The hot routes, answered before aiohttp's router and middlewares.

Every request first meets `Front.handle`. A POST to a V2 infer or TF-Serving predict
path is parsed from the raw request target (no URL object, no router walk, no
middleware chain) and handed straight to its handler; its errors are answered by
the same mapping the middleware uses. Everything else (metadata, health, metrics,
repository, unknown paths, and paths with percent-escapes, which only the router
decodes) goes to the application as usual.

`FrontRunner` is an `aiohttp.web.AppRunner` whose low-level server calls the front
first; the application keeps its routes, startup and cleanup.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from ..dataplane import DataPlane
from .access import API, Access, Cors
from .errors import ErrorPolicy, from_exception
from .handlers import Answer, infer, predict, respond
from .httpstats import HttpStats
from .limits import LimitedServer, Limits, Request
from .request import HttpRequest

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]

V2, TF = 1, 2


def hot_route(target: str) -> tuple[int, str, str | None] | None:
    """(kind, model, version) of an infer or predict request target, or None.

    Only plain targets are taken: a path with a percent-escape, an empty segment or
    anything else the router would treat differently goes to the router."""
    path = target.partition("?")[0]
    if "%" in path:
        return None
    parts = path.split("/")
    n = len(parts)
    if n < 4 or parts[0] != "" or parts[2] != "models":
        return None
    if parts[1] == "v2":
        if n == 5 and parts[4] == "infer" and parts[3]:
            return V2, parts[3], None
        if n == 7 and parts[4] == "versions" and parts[6] == "infer" and parts[3] and parts[5]:
            return V2, parts[3], parts[5]
        return None
    if parts[1] == "v1":
        last, colon, verb = parts[n - 1].rpartition(":")
        if not colon or verb != "predict" or not last:
            return None
        if n == 4:
            return TF, last, None
        if n == 6 and parts[4] in ("versions", "labels") and parts[3]:
            return TF, parts[3], last  # a version number or a label: the registry tells them apart
    return None


class Front:
    """Answers the infer routes of `plane` itself and hands every other request to `fallback`.

    With an api token set it checks the request's bearer token first; with CORS origins,
    it adds the CORS headers to what it answers (one attribute test each when off)."""

    def __init__(self, plane: DataPlane, *, max_body_bytes: int) -> None:
        settings = plane.settings
        self.plane = plane
        self.max_body_bytes = max_body_bytes
        self.timeout_s = settings.request_timeout_s
        self.policy = ErrorPolicy(max_body_bytes=max_body_bytes, request_timeout_s=settings.request_timeout_s,
                                  expose_model_errors=settings.model_errors_exposed, registry=plane.registry)
        access = Access(admin_token=settings.admin_token, api_token=settings.api_token)
        self.access: Access | None = access if access.guards_api else None
        self.cors: Cors | None = Cors(settings.cors_origins) if settings.cors_origins else None
        self.fallback: Handler | None = None
        self.draining = False  # every answer closes its connection (set by the server's drain)
        self.stats = HttpStats()

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        self.stats.aiohttp += 1
        if request.method == "POST":
            route = hot_route(request.raw_path)
            if route is not None:
                return respond(await self.answer(request, *route))
        assert self.fallback is not None, "FrontRunner sets the fallback"
        return await self.fallback(request)

    async def answer(self, request: HttpRequest, kind: int, model: str, version: str | None) -> Answer | web.Response:
        """The answer to an infer (`V2`) or predict (`TF`) request, from either HTTP front:
        an `Answer` when it succeeded, else the error's response."""
        response: Answer | web.Response
        try:
            if self.access is not None:
                self.access.check(request, API)
            if kind == V2:
                response = await infer(self.plane, request, model, version,
                                       max_body_bytes=self.max_body_bytes, timeout_s=self.timeout_s)
            else:
                response = await predict(self.plane, request, model, version,
                                         max_body_bytes=self.max_body_bytes, timeout_s=self.timeout_s)
        except Exception as exc:  # noqa: BLE001 - every failure gets an answer; the server goes on
            response = from_exception(request, exc, self.policy)
        if self.cors is not None:
            response = respond(response)
            self.cors.add(request, response)
        return response


class FrontRunner(web.AppRunner):
    """An AppRunner whose server asks `front` first, then the application, and enforces the
    connection limits of the plane's settings (header size, idle keep-alive, connections,
    request time). With `wire`, connections start on the wire front (`wire.WireProtocol`),
    which hands them to aiohttp for anything but a plain infer or predict request."""

    def __init__(self, app: web.Application, front: Front, *, wire: bool = False, **kwargs: Any) -> None:
        settings = front.plane.settings
        kwargs.setdefault("keepalive_timeout", settings.keepalive_timeout_s)
        kwargs.setdefault("max_line_size", settings.max_header_bytes)
        kwargs.setdefault("max_field_size", settings.max_header_bytes)
        super().__init__(app, **kwargs)
        self._front = front
        self._wire = wire
        self._limits = Limits(max_connections=settings.max_connections,
                              request_timeout_s=settings.request_timeout_s,
                              max_header_bytes=settings.max_header_bytes)

    async def _make_server(self) -> web.Server:
        made = await super()._make_server()
        kwargs = dict(limits=self._limits, loop=made._loop,
                      request_factory=functools.partial(self.app._make_request, _cls=Request),
                      handler_cancellation=made.handler_cancellation, **made._kwargs)
        server: LimitedServer
        if self._wire:
            from .wire import WireServer

            server = WireServer(made.request_handler, front=self._front,
                                keepalive_s=self._front.plane.settings.keepalive_timeout_s, **kwargs)
        else:
            server = LimitedServer(made.request_handler, **kwargs)
        self._front.fallback = server.request_handler
        server.request_handler = self._front.handle
        return server
