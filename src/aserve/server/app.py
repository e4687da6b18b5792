"""The aiohttp application: routes, typed state, error middleware."""

from __future__ import annotations

from aiohttp import web

from ..config import ServerSettings
from .errors import MAX_BODY_KEY, error_middleware
from .handlers import METRICS_KEY, REGISTRY_KEY, add_routes
from .metrics import Metrics
from .models import ModelRegistry


def build_app(registry: ModelRegistry, settings: ServerSettings) -> web.Application:
    """An application serving `registry`'s models; it does not start or stop them."""
    app = web.Application(client_max_size=settings.max_body_bytes, middlewares=[error_middleware])
    app[REGISTRY_KEY] = registry
    app[METRICS_KEY] = Metrics()
    app[MAX_BODY_KEY] = settings.max_body_bytes
    add_routes(app)
    return app
