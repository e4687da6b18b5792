"""aserve's errors as gRPC status codes: the one mapping, for every method of the gRPC front.

The exception's HTTP status decides the code (`INVALID_ARGUMENT` for 400 and 415,
`NOT_FOUND`, `UNAVAILABLE`, `DEADLINE_EXCEEDED`, `UNAUTHENTICATED`, `PERMISSION_DENIED`,
`RESOURCE_EXHAUSTED` for 413, `UNIMPLEMENTED` for 501); the message is the one HTTP sends
(`server.errors.describe`: a model's failure and anything unexpected are `INTERNAL` with an
error id, and the log has the rest). A refusal for load carries the time to wait in
gRPC's own retry advice (`grpc-retry-pushback-ms` trailing metadata), which gRPC clients
with a retry policy follow.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import grpc

from ...errors import Overloaded
from ..errors import ErrorPolicy, describe

CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    408: grpc.StatusCode.DEADLINE_EXCEEDED,
    409: grpc.StatusCode.FAILED_PRECONDITION,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    415: grpc.StatusCode.INVALID_ARGUMENT,
    501: grpc.StatusCode.UNIMPLEMENTED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}

PUSHBACK = "grpc-retry-pushback-ms"


class Status(NamedTuple):
    """What a failed call is answered: its code, its message, and trailing metadata."""

    code: grpc.StatusCode
    message: str
    trailers: tuple[tuple[str, str], ...] = ()


class Answered(Exception):
    """A call another loop answered with a status (a front loop relays what it does not serve)."""

    def __init__(self, status: Status) -> None:
        super().__init__(status.message)
        self.status = status


def status_of(exc: BaseException, policy: ErrorPolicy, method: str) -> Status:
    """The status of a call to `method` that failed with `exc`."""
    if isinstance(exc, Answered):
        return exc.status
    failure = describe(exc, policy, method)
    code = CODES.get(failure.status)
    if code is None:
        code = grpc.StatusCode.INTERNAL if failure.status >= 500 else grpc.StatusCode.INVALID_ARGUMENT
    message = failure.message
    trailers: tuple[tuple[str, str], ...] = ()
    if failure.error_id is not None:
        if failure.error_id not in message:
            message = f"{message} (error id {failure.error_id})"
        trailers = (("error-id", failure.error_id),)
    elif isinstance(exc, Overloaded):
        wait = max(1, math.ceil(exc.retry_after * 1000))
        message = f"{message} (retry in {wait} ms)"
        trailers = ((PUSHBACK, str(wait)),)
    return Status(code, message, trailers)
