"""The one place where exceptions become HTTP error responses.

aserve errors carry their status; the body is `{"error": message}` in JSON or msgpack,
as the client accepts, with the message passed through the redactor (paths under the
repository made relative, other absolute paths shortened, tracebacks cut: the log has
them).

A model's failure answers 500 with an `error_id` that its log line carries too; the
model's own message reaches the client only with `expose_model_errors` (by default on
loopback). Anything unexpected is logged with its traceback and answered
`{"error": "internal error", "error_id": ...}`; the server goes on.
"""

from __future__ import annotations

import logging
import math
import os
import random
from collections.abc import Iterable
from typing import Any, NamedTuple

from ..errors import AserveError, BodyTimeout, ModelError, Overloaded, Unauthorized
from ..protocol import encode_error
from ..redact import Redactor, cut_traceback
from .http import Request, Response

log = logging.getLogger("aserve.server")

WWW_AUTHENTICATE = 'Bearer realm="aserve"'


class RouteNotFound(AserveError):
    """No route has the request's path."""

    status = 404


class MethodNotAllowed(AserveError):
    """A route has the path, not with the request's method; `allow` lists the methods it has."""

    status = 405

    def __init__(self, message: str, allow: list[str]) -> None:
        super().__init__(message)
        self.allow = allow


class ExpectationFailed(AserveError):
    status = 417


def retry_after(seconds: float) -> str:
    """A Retry-After header value: whole seconds, at least 1, and one more for half of the
    requests at random: clients refused together (in a burst) come back over two seconds."""
    return str(max(1, math.ceil(seconds)) + random.getrandbits(1))


def new_error_id() -> str:
    """An id that ties an error response to its log line."""
    return os.urandom(6).hex()


class ErrorPolicy:
    """What error responses may say, set once per server: whether a model's own message is
    sent, and how paths are made relative (the registry's repository and model folders,
    read when a message needs it)."""

    __slots__ = ("_key", "_redactor", "expose_model_errors", "registry")

    def __init__(self, *, expose_model_errors: bool = True, registry: Any = None) -> None:
        self.expose_model_errors = expose_model_errors
        self.registry = registry  # aserve.dataplane.ModelRegistry, or None
        self._redactor = Redactor()
        self._key: object = None

    def use_roots(self, roots: Iterable[tuple[str, str]]) -> None:
        """Redact with these folders (another loop's `redactor().roots`), not the registry's."""
        self.registry = None
        self._redactor = Redactor()
        self._redactor.extend(roots)

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
        if "/" not in text:  # no path to rewrite (a refusal's message): only a traceback to cut
            return cut_traceback(text)
        return self.redactor().text(text)


def error_response(request: Request, status: int, message: str, headers: dict[str, str] | None = None, *,
                   error_id: str | None = None, close: bool = False) -> Response:
    """`{"error": message}` in the format the client accepts (else its request's, unless
    that format was what was refused: 415 answers JSON)."""
    h = request.headers
    body, content_type = encode_error(message, accept=h.get("accept"),
                                      content_type=h.get("content-type") if status != 415 else None, error_id=error_id)
    return Response(status, body, headers, content_type=content_type, close=close)


class Failure(NamedTuple):
    """What a client is told about an exception, in any protocol: the HTTP status its class
    carries, the message it may read, and the error id its log line carries (a model's
    failure and anything unexpected)."""

    status: int
    message: str
    error_id: str | None = None


def describe(exc: BaseException, policy: ErrorPolicy, where: str) -> Failure:
    """What every front tells a client about `exc`, raised answering `where` (the request
    as the log names it): a model's failure and anything unexpected are logged here, with
    the error id the client gets; other aserve errors keep their message, redacted."""
    if isinstance(exc, ModelError):
        error_id = new_error_id()
        what = f"model {exc.model!r} version {exc.version}" if exc.model else "the model"
        log.info("model error on %s (error id %s): %s failed: %s", where, error_id, what,
                 (exc.traceback or str(exc)).strip())
        message = policy.redact(str(exc)) if policy.expose_model_errors else f"{what} failed (error id {error_id})"
        return Failure(500, message, error_id)
    if not isinstance(exc, AserveError) or (
            exc.status >= 500 and not isinstance(exc, Overloaded) and exc.status not in (501, 503, 504)):
        error_id = new_error_id()
        log.error("internal error (error id %s) answering %s", error_id, where, exc_info=exc)
        return Failure(500, "internal error", error_id)
    return Failure(exc.status, policy.redact(str(exc)))


def from_exception(request: Request, exc: BaseException, policy: ErrorPolicy) -> Response:
    """The response for an exception raised while answering `request`."""
    failure = describe(exc, policy, f"{request.method} {request.path}")
    if failure.error_id is not None:
        return error_response(request, failure.status, failure.message, error_id=failure.error_id)
    headers = None
    if isinstance(exc, Overloaded):
        headers = {"Retry-After": retry_after(exc.retry_after)}
    elif isinstance(exc, Unauthorized):
        headers = {"WWW-Authenticate": WWW_AUTHENTICATE}
    elif isinstance(exc, MethodNotAllowed):
        headers = {"Allow": ", ".join(exc.allow)}
    # a body not sent in time: the connection closes rather than read the rest
    response = error_response(request, failure.status, failure.message, headers, close=isinstance(exc, BodyTimeout))
    if isinstance(exc, Overloaded):
        # a client that ignores Retry-After has its next request read no sooner than the
        # server expects to admit one: refusing it again would only take CPU from the batches
        response.hold = exc.retry_after
        response.budget = exc.budget
        response.rate = exc.rate
    return response
