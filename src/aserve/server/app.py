"""The aiohttp application: routes, typed state, error middleware."""

from __future__ import annotations

from aiohttp import web

from ..config import ServerSettings
from ..dataplane import DataPlane
from .errors import MAX_BODY_KEY, error_middleware
from .handlers import PLANE_KEY, add_routes


def build_app(plane: DataPlane, settings: ServerSettings) -> web.Application:
    """An application serving `plane`'s models; it does not start or stop them."""
    app = web.Application(client_max_size=settings.max_body_bytes, middlewares=[error_middleware])
    app[PLANE_KEY] = plane
    app[MAX_BODY_KEY] = settings.max_body_bytes
    add_routes(app)
    return app
