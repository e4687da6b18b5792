"""Errors that carry their HTTP status.

Domain code raises these; one place in the server maps them to responses. Nothing
here imports the web framework.
"""

from __future__ import annotations


class AserveError(Exception):
    """Base class; `status` is the HTTP status a request failing with it gets."""

    status: int = 500


class InvalidInput(AserveError):
    """The request is malformed: the message names the field, expected and received."""

    status = 400


class ModelNotFound(AserveError):
    status = 404


class PayloadTooLarge(AserveError):
    status = 413


class Overloaded(AserveError):
    """The model's queue is full; retry after `retry_after` seconds. `budget`: the latency
    budget (seconds) the request could not be answered within, when that was the reason.
    `rate`: the requests per second the model admits while overloaded, where its policy
    measures it (the server holds clients that send again early to a multiple of it)."""

    status = 503

    def __init__(self, message: str, *, retry_after: float = 1.0, budget: float | None = None,
                 rate: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.budget = budget
        self.rate = rate


class RequestTimeout(AserveError):
    status = 504


class ModelNotReady(AserveError):
    status = 503


class ModelError(AserveError):
    """The model raised while answering; `traceback` is its traceback text; `model` and
    `version` name the load that failed (set by the front that asked it)."""

    status = 500
    model = ""
    version = ""

    def __init__(self, message: str, *, traceback: str = "", error_type: str = "") -> None:
        super().__init__(message)
        self.traceback = traceback
        self.error_type = error_type


class ModelLoadError(AserveError):
    """A model could not be imported or loaded; the message names the file and cause."""

    status = 500


class EngineError(AserveError):
    """The interpreter engine cannot do what was asked (platform, limits, shutdown)."""

    status = 500


class UnsupportedMediaType(InvalidInput):
    """The body's Content-Type or Content-Encoding is not one the endpoint reads; the message names those it does."""

    status = 415


class BodyTimeout(AserveError):
    """The client did not send the whole request within the server's time for it (--request-timeout)."""

    status = 408


class Unauthorized(AserveError):
    """No bearer token where the endpoint needs one."""

    status = 401


class Forbidden(AserveError):
    """A bearer token that is not the one the endpoint needs."""

    status = 403


class NotSupported(AserveError):
    """The server knows the request but cannot do it for this model; the message names what it supports."""

    status = 501
