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
    """The model's queue is full; retry after `retry_after` seconds."""

    status = 503

    def __init__(self, message: str, *, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class RequestTimeout(AserveError):
    status = 504


class ModelNotReady(AserveError):
    status = 503


class ModelError(AserveError):
    """The model raised while answering; `traceback` is its traceback text."""

    status = 500

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
