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

from collections.abc import Awaitable, Callable

from aiohttp import web

from ..dataplane import DataPlane
from .errors import from_exception
from .handlers import infer, predict

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
    """Answers the infer routes of `plane` itself and hands every other request to `fallback`."""

    def __init__(self, plane: DataPlane, *, max_body_bytes: int) -> None:
        self.plane = plane
        self.max_body_bytes = max_body_bytes
        self.fallback: Handler | None = None

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        if request.method == "POST":
            route = hot_route(request.raw_path)
            if route is not None:
                kind, model, version = route
                try:
                    if kind == V2:
                        return await infer(self.plane, request, model, version, max_body_bytes=self.max_body_bytes)
                    return await predict(self.plane, request, model, version, max_body_bytes=self.max_body_bytes)
                except Exception as exc:  # noqa: BLE001 - every failure gets an answer; the server goes on
                    return from_exception(request, exc, max_body_bytes=self.max_body_bytes)
        assert self.fallback is not None, "FrontRunner sets the fallback"
        return await self.fallback(request)


class FrontRunner(web.AppRunner):
    """An AppRunner whose server asks `front` first, then the application."""

    def __init__(self, app: web.Application, front: Front, **kwargs: object) -> None:
        super().__init__(app, **kwargs)  # type: ignore[arg-type]
        self._front = front

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        self._front.fallback = server.request_handler
        server.request_handler = self._front.handle
        return server
