"""The one place where exceptions become HTTP error responses.

aserve errors carry their status; the body is `{"error": message}` in JSON or
msgpack, as the client accepts. aiohttp's own HTTP exceptions (no such route, body
too large) get the same body. Anything unexpected is logged with its traceback and
answered 500; the server goes on.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable

from aiohttp import web

from ..errors import AserveError, ModelError, Overloaded, PayloadTooLarge
from ..protocol import encode_error

log = logging.getLogger("aserve.server")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def retry_after(seconds: float) -> str:
    """A Retry-After header value: whole seconds, at least 1."""
    return str(max(1, math.ceil(seconds)))


def error_response(request: web.BaseRequest, status: int, message: str,
                   headers: dict[str, str] | None = None) -> web.Response:
    body, content_type = encode_error(
        message, accept=request.headers.get("Accept"), content_type=request.headers.get("Content-Type")
    )
    response = web.Response(status=status, body=body, headers=headers)
    response.content_type = content_type
    return response


def from_exception(request: web.BaseRequest, exc: BaseException, *, max_body_bytes: int | None = None
                   ) -> web.Response:
    """The response for an exception raised while answering `request`; max_body_bytes:
    the limit a 413 names."""
    if isinstance(exc, AserveError):
        headers = None
        if isinstance(exc, Overloaded):
            headers = {"Retry-After": retry_after(exc.retry_after)}
        if isinstance(exc, ModelError) and exc.traceback:
            log.info("model error on %s: %s", request.path, exc.traceback.strip())
        return error_response(request, exc.status, str(exc), headers)
    if isinstance(exc, web.HTTPRequestEntityTooLarge):
        return error_response(request, 413, str(PayloadTooLarge(
            f"request body exceeds the server's limit of {max_body_bytes} bytes (--max-body-bytes)"
        )))
    if isinstance(exc, web.HTTPException):
        if exc.status < 400:
            raise exc
        message = exc.text if exc.text and exc.status != 404 else f"{exc.reason}: {request.method} {request.path}"
        headers = {k: v for k, v in exc.headers.items() if k.lower() == "allow"}
        return error_response(request, exc.status, message, headers or None)
    log.exception("unexpected error answering %s %s", request.method, request.path, exc_info=exc)
    return error_response(request, 500, f"internal server error: {type(exc).__name__}: {exc}")


MAX_BODY_KEY: web.AppKey[int] = web.AppKey("max_body_bytes", int)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - every failure gets an answer; the server goes on
        return from_exception(request, exc, max_body_bytes=request.app.get(MAX_BODY_KEY))
