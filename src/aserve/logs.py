"""Logging set-up: text (the default) or one JSON object per line, with the request's trace ids.

With `--log-format json` every record is a JSON object: `time` (ISO 8601, UTC),
`level`, `logger`, `message`, the exception text if any, the fields a log call passed
in `extra`, and, while a traced request is being answered, `trace_id` and `span_id`
of its server span, so that a log line leads to its trace. The access log
(`--access-log`) writes one line per request in the common log format, or in JSON
mode an object with the same fields.
"""

from __future__ import annotations

import contextvars
import datetime
import json
import logging
from typing import Any

# The trace of the request being answered, set by the data plane (in the context its answer is
# made in) while tracing is on and the log format writes trace ids.
current_trace: contextvars.ContextVar[Any] = contextvars.ContextVar("aserve_trace", default=None)
trace_ids_logged = False

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class TraceIds(logging.Filter):
    """Adds trace_id and span_id of the request being answered, if it is traced."""

    def filter(self, record: logging.LogRecord) -> bool:
        trace = current_trace.get()
        if trace is not None:
            record.trace_id = trace.trace_id_hex
            record.span_id = trace.span_id_hex
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure(level: str, fmt: str) -> None:
    """Set up the root logger (replacing its handlers) for `level` and `fmt` (text | json)."""
    global trace_ids_logged
    trace_ids_logged = fmt == "json"
    handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(TraceIds())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())


class AccessLogger:
    """One line per request: the common log format, with its fields also as record attributes
    (so that the JSON formatter writes them as keys)."""

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger

    def log(self, request: Any, status: int, size: int, seconds: float) -> None:
        """`request` (aserve.server.http.Request) was answered `status` in `size` bytes, head included."""
        if not self.logger.isEnabledFor(logging.INFO):
            return
        now = datetime.datetime.now(datetime.UTC).strftime("%d/%b/%Y:%H:%M:%S +0000")
        remote = request.remote or "-"
        line = f"{request.method} {request.target} HTTP/{request.version}"
        self.logger.info(
            '%s - - [%s] "%s" %d %d', remote, now, line, status, size,
            extra={"remote": remote, "request": line, "status": status, "bytes": size,
                   "duration_ms": round(seconds * 1000, 3), "protocol": "http"},
        )

    def rpc(self, peer: str, method: str, code: int, code_name: str, size: int, seconds: float) -> None:
        """A gRPC call to `method` (/package.Service/Method) from `peer` (grpc's `ipv4:1.2.3.4:5`)
        ended with status `code` (`code_name`: OK, NOT_FOUND, ...), its answer `size` bytes: the
        same line, with the gRPC status code where HTTP has its status."""
        if not self.logger.isEnabledFor(logging.INFO):
            return
        now = datetime.datetime.now(datetime.UTC).strftime("%d/%b/%Y:%H:%M:%S +0000")
        kind, _, address = peer.partition(":")
        remote = address.rpartition(":")[0].strip("[]") if kind in ("ipv4", "ipv6") else peer or "-"
        line = f"POST {method} HTTP/2"
        self.logger.info(
            '%s - - [%s] "%s" %d %d', remote, now, line, code, size,
            extra={"remote": remote, "request": line, "status": code, "bytes": size,
                   "duration_ms": round(seconds * 1000, 3), "protocol": "grpc", "grpc_status": code_name},
        )
