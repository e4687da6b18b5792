"""The one place where exceptions become HTTP error responses.

aserve errors carry their status; the body is `{"error": message}` in JSON or msgpack,
as the client accepts, with the message passed through the redactor (paths under the
repository made relative, other absolute paths shortened, tracebacks cut: the log has
them). aiohttp's own HTTP exceptions (no such route, body too large) and its payload
errors (a body that is not what its Content-Encoding says) get the same body.

A model's failure answers 500 with an `error_id` that its log line carries too; the
model's own message reaches the client only with `expose_model_errors` (by default on
loopback). Anything unexpected is logged with its traceback and answered
`{"error": "internal error", "error_id": ...}`; the server goes on.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import ContentEncodingError, HttpProcessingError

from ..errors import (
    AserveError,
    BodyTimeout,
    ModelError,
    Overloaded,
    PayloadTooLarge,
    Unauthorized,
    UnsupportedMediaType,
)
from ..protocol import encode_error
from ..redact import Redactor
from .request import HttpRequest

log = logging.getLogger("aserve.server")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

SERVER_NAME = "aserve"  # the Server header: no versions
WWW_AUTHENTICATE = 'Bearer realm="aserve"'


def retry_after(seconds: float) -> str:
    """A Retry-After header value: whole seconds, at least 1, and one more for half of the
    requests at random: clients refused together (in a burst) come back over two seconds."""
    return str(max(1, math.ceil(seconds)) + (os.urandom(1)[0] & 1))


def new_error_id() -> str:
    """An id that ties an error response to its log line."""
    return os.urandom(6).hex()


class ErrorPolicy:
    """What error responses may say, set once per server: the limits they name, whether
    a model's own message is sent, and how paths are made relative (the registry's
    repository and model folders, read when a message needs it)."""

    __slots__ = ("_key", "_redactor", "expose_model_errors", "max_body_bytes", "registry", "request_timeout_s")

    def __init__(self, *, max_body_bytes: int, request_timeout_s: float = 0.0, expose_model_errors: bool = True,
                 registry: Any = None) -> None:
        self.max_body_bytes = max_body_bytes
        self.request_timeout_s = request_timeout_s
        self.expose_model_errors = expose_model_errors
        self.registry = registry  # aserve.dataplane.ModelRegistry, or None
        self._redactor = Redactor()
        self._key: object = None

    def redactor(self) -> Redactor:
        """The redactor for the registry's repository and model folders as they are now."""
        registry = self.registry
        if registry is None:
            return self._redactor
        records = registry.records
        key = tuple((name, id(r.source)) for name, r in records.items())
        if key != self._key:
            redactor = Redactor(registry.repository)
            for name, record in records.items():
                source = record.source
                if source is None:
                    continue
                redactor.add(source.directory, name)
                for v, vs in source.versions.items():
                    if vs.directory != source.directory:
                        redactor.add(vs.directory, f"{name}/{v}")
            self._redactor, self._key = redactor, key
        return self._redactor

    def redact(self, text: str) -> str:
        return self.redactor().text(text)


POLICY_KEY: web.AppKey[ErrorPolicy] = web.AppKey("error_policy", ErrorPolicy)


CLOSE_GRACE_S = 1.0  # after a closing response, how long the client may go on sending before the close


def close_gracefully(protocol: Any) -> None:
    """End a connection whose request will not be read to its end: the response is sent and
    followed by a FIN (the client reads it whole), what the client still sends is dropped,
    and the connection closes at the latest CLOSE_GRACE_S later (closing at once, with
    unread data, would reset it and could lose the response)."""
    transport = protocol.transport
    if transport is None or transport.is_closing():
        return
    if not transport.can_write_eof():
        protocol.force_close()
        return
    transport.write_eof()
    asyncio.get_running_loop().call_later(CLOSE_GRACE_S, protocol.force_close)


class ClosingResponse(web.Response):
    """A response after which the connection closes without reading what is left of the
    request body (a client too slow to send it, one over the connection limit, a body
    refused unread)."""

    def __init__(self, request: HttpRequest, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._request = request
        self.force_close()

    async def write_eof(self, data: bytes = b"") -> None:
        await super().write_eof(data)
        if self._request.protocol is not None:
            close_gracefully(self._request.protocol)


def error_response(request: HttpRequest, status: int, message: str, headers: dict[str, str] | None = None, *,
                   error_id: str | None = None, close: bool = False) -> web.Response:
    """`{"error": message}` in the format the client accepts (else its request's, unless
    that format was what was refused: 415 answers JSON)."""
    body, content_type = encode_error(
        message, accept=request.headers.get("Accept"),
        content_type=request.headers.get("Content-Type") if status != 415 else None, error_id=error_id,
    )
    if close:
        response: web.Response = ClosingResponse(request, status=status, body=body, headers=headers)
    else:
        response = web.Response(status=status, body=body, headers=headers)
    response.content_type = content_type
    return response


def from_exception(request: HttpRequest, exc: BaseException, policy: ErrorPolicy) -> web.Response:
    """The response for an exception raised while answering `request`."""
    if isinstance(exc, AserveError):
        if isinstance(exc, ModelError):
            return _model_failed(request, exc, policy)
        if exc.status >= 500 and not isinstance(exc, Overloaded) and exc.status not in (501, 503, 504):
            return _internal(request, exc)
        headers = None
        if isinstance(exc, Overloaded):
            headers = {"Retry-After": retry_after(exc.retry_after)}
        elif isinstance(exc, Unauthorized):
            headers = {"WWW-Authenticate": WWW_AUTHENTICATE}
        # a body refused unread (415) or not sent in time (408): the connection closes rather than read it
        return error_response(request, exc.status, policy.redact(str(exc)), headers,
                              close=isinstance(exc, (BodyTimeout, UnsupportedMediaType)))
    if isinstance(exc, web.HTTPRequestEntityTooLarge):
        return error_response(request, 413, str(PayloadTooLarge(
            f"request body exceeds the server's limit of {policy.max_body_bytes} bytes (--max-body-bytes)"
        )))
    if isinstance(exc, web.HTTPException):
        if exc.status < 400:
            raise exc
        message = exc.text if exc.text and exc.status != 404 else f"{exc.reason}: {request.method} {request.path}"
        headers = {k: v for k, v in exc.headers.items() if k.lower() == "allow"}
        return error_response(request, exc.status, message, headers or None)
    if isinstance(exc, web.RequestPayloadError):
        return error_response(request, 400, _payload_error(request, exc), close=True)
    return _internal(request, exc)


def _model_failed(request: HttpRequest, exc: ModelError, policy: ErrorPolicy) -> web.Response:
    error_id = new_error_id()
    what = f"model {exc.model!r} version {exc.version}" if exc.model else "the model"
    log.info("model error on %s (error id %s): %s failed: %s", request.path, error_id, what,
             (exc.traceback or str(exc)).strip())
    message = policy.redact(str(exc)) if policy.expose_model_errors else f"{what} failed (error id {error_id})"
    return error_response(request, 500, message, error_id=error_id)


def _internal(request: HttpRequest, exc: BaseException) -> web.Response:
    error_id = new_error_id()
    log.error("internal error (error id %s) answering %s %s", error_id, request.method, request.path, exc_info=exc)
    return error_response(request, 500, "internal error", error_id=error_id)


def _payload_error(request: HttpRequest, exc: BaseException) -> str:
    """A 400 message for a body aiohttp could not read: which encoding failed and why."""
    cause = exc.__cause__ or exc.__context__
    detail = cause.message if isinstance(cause, HttpProcessingError) else str(exc)
    inner = cause.__cause__ or cause.__context__ if cause is not None else None
    if inner is not None:
        detail = f"{detail.strip()} ({inner})"
    if isinstance(cause, ContentEncodingError) or "content-encoding" in detail.lower():
        encoding = request.headers.get("Content-Encoding", "")
        return f"Content-Encoding: the body is not valid {encoding} data: {detail.strip()}"
    return f"request body: {detail.strip()}"


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - every failure gets an answer; the server goes on
        return from_exception(request, exc, request.app[POLICY_KEY])


def body_timeout(limit_s: float) -> BodyTimeout:
    return BodyTimeout(f"the request was not received within the server's limit of {limit_s:g} s "
                       f"(--request-timeout)")
