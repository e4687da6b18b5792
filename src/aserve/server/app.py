"""The aiohttp application: routes, typed state, middlewares (CORS, errors, access)."""

from __future__ import annotations

import logging

from aiohttp import web

from ..config import ServerSettings, is_loopback
from ..dataplane import DataPlane
from .access import ACCESS_KEY, CORS_KEY, LEVELS_KEY, Access, Cors, auth_middleware, cors_middleware
from .errors import POLICY_KEY, ErrorPolicy, error_middleware
from .handlers import PLANE_KEY, add_routes

log = logging.getLogger("aserve.server")


def build_app(plane: DataPlane, settings: ServerSettings) -> web.Application:
    """An application serving `plane`'s models; it does not start or stop them.

    Middlewares, outermost first: CORS (when origins are set: preflights, and headers on
    every response, errors included), errors (exceptions to responses), access (when a
    token is set: the route's kind decides which token it takes)."""
    access = Access(admin_token=settings.admin_token, api_token=settings.api_token)
    if not access.guards_anything and not is_loopback(settings.host):
        log.warning("listening on %s with no --admin-token: anyone who reaches it can load and unload models "
                    "(and, with no --api-token, run them)", settings.host)
    middlewares = [error_middleware]
    if settings.cors_origins:
        middlewares.insert(0, cors_middleware)
    if access.guards_anything:
        middlewares.append(auth_middleware)
    app = web.Application(client_max_size=settings.max_body_bytes, middlewares=middlewares)
    app[PLANE_KEY] = plane
    app[POLICY_KEY] = ErrorPolicy(max_body_bytes=settings.max_body_bytes,
                                  request_timeout_s=settings.request_timeout_s,
                                  expose_model_errors=settings.model_errors_exposed, registry=plane.registry)
    app[ACCESS_KEY] = access
    app[CORS_KEY] = Cors(settings.cors_origins)
    app[LEVELS_KEY] = add_routes(app)
    return app
