"""Spans recorded on the event loop, exported in batches from an interpreter of their own.

The OpenTelemetry SDK's Python costs more per span, on the loop's GIL, than serving a
request does. So the loop records numbers in C (`aserve._native.Recorder`): one record
per sampled request and per batch, and here, as a `Span`, only what does not fit
(errors, the spans model code opened, staged runs). What waits goes every
`OTEL_BSP_SCHEDULE_DELAY` ms (at most 200), or when `OTEL_BSP_MAX_EXPORT_BATCH_SIZE`
records wait, in one message to the exporter (`aserve.tracing.exporter`), which
encodes and sends it under its own GIL: the SDK's batch span processor, split across
two interpreters, so export never blocks the loop (past `OTEL_BSP_MAX_QUEUE_SIZE`,
records are dropped and counted). Sampling follows the SDK's samplers, decided in C
at the start of a request.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Sequence
from typing import Any

import msgspec

from .._native import TRACE_BATCH_FIELDS, TRACE_LINK_FIELDS, TRACE_REQUEST_FIELDS, Recorder, RequestTrace
from .._native import parse_traceparent as _parse_traceparent
from .config import Resolved

log = logging.getLogger("aserve.tracing")

INTERNAL, SERVER = 0, 1  # OpenTelemetry SpanKind values
UNSET, OK, ERROR = 0, 1, 2  # OpenTelemetry StatusCode values
DECODE_START, DECODE_END, ENCODE_START, ENCODE_END = 0, 1, 4, 5  # RequestTrace.stamp's phases
MAX_FLUSH_SECONDS = 0.2
_MASK64 = (1 << 64) - 1

# The numeric records (unsigned 64-bit, native byte order), which the exporter's encoder writes as spans
# (a request as its server span and three children, as a RequestSpan; a batch as its span and its run's):
# a request: trace_hi, trace_lo, span_id, parent_id, remote, status, start, end, decode start, end, queue
#   start, end, encode start, end, route (table index), batch size, batch samples, batch compute (0.1 us),
#   interpreter + 1 (the last four 0: not batched);
# a batch: trace_hi, trace_lo, span_id, run span_id, start, end, run start, run end, interpreter + 1,
#   size, samples, model (table index);
# a link: batch span_id, then the trace_hi, trace_lo and span_id of a request it served.
REQUEST_FIELDS, BATCH_FIELDS, LINK_FIELDS = TRACE_REQUEST_FIELDS, TRACE_BATCH_FIELDS, TRACE_LINK_FIELDS
MAX_ROUTES = 1024  # table entries; requests beyond it carry their attributes as a span does
NO_EVENTS: tuple[Any, ...] = ()
_encode = msgspec.msgpack.Encoder().encode  # spans, and attributes shared by many of them


Event = tuple[str, int, dict[str, Any]]  # (name, time in ns since the epoch, attributes)
Link = tuple[int, int, int, dict[str, Any] | None]  # (trace_hi, trace_lo, span_id, attributes)


class Span(msgspec.Struct, array_like=True, gc=False):
    """A span recorded whole: one that does not fit the numeric records.

    It travels to the exporter as a msgpack array of its fields in this order, which
    the OTLP encoder reads (`put_span` in native/host/otlp.c). Not tracked by the
    garbage collector: it is encoded as soon as it is recorded, and holds no cycle."""

    trace_hi: int
    trace_lo: int
    span_id: int
    parent_id: int  # 0: a root
    remote: bool  # the parent is the caller's span (a traceparent header)
    name: str
    kind: int  # INTERNAL or SERVER
    start: int  # ns since the epoch
    end: int
    # a dict, None, or a tuple of them (what many spans share first, e.g. `shared(...)`, then the span's own)
    attributes: Any
    status: int  # UNSET, OK or ERROR
    message: str  # the status message
    events: Sequence[Event]
    links: Sequence[Link]
    trace_state: str  # the W3C tracestate of its trace ("" for none)


class RequestSpan(Span, array_like=True, gc=False):
    """A request's server span, then (start, end) in ns of its decode, queue and encode
    phases, which the encoder writes as child spans with ids derived from the request's
    (start 0: the request never got there)."""

    decode_start: int
    decode_end: int
    queue_start: int
    queue_end: int
    encode_start: int
    encode_end: int


def shared(attributes: dict[str, Any]) -> msgspec.Raw:
    """Attributes many spans carry (a route's, a batch's), encoded once: each span that holds
    them copies the bytes instead of encoding every key and value again."""
    return msgspec.Raw(_encode(attributes))


def parse_traceparent(value: str | None) -> tuple[int, int, bool] | None:
    """(trace id, parent span id, sampled) of a W3C `traceparent` header, or None if absent or
    invalid: the rule the native sampler applies."""
    return _parse_traceparent(value) if value else None


# W3C Trace Context `tracestate`: up to 32 list members key=value, keys unique
_STATE_KEY = re.compile(r"[a-z][a-z0-9_\-*/]{0,255}|[a-z0-9][a-z0-9_\-*/]{0,240}@[a-z][a-z0-9_\-*/]{0,13}")
_STATE_VALUE = re.compile(r"[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]")
MAX_STATE_MEMBERS = 32


def parse_tracestate(value: str | None) -> str | None:
    """A W3C `tracestate` header as its members joined by commas, or None when it is absent,
    empty or not valid (a malformed member, a key twice, more than 32 members): then it is
    dropped whole, as the OpenTelemetry SDK does, and the trace goes on without it."""
    if not value:
        return None
    members = []
    keys = set()
    for member in value.split(","):
        member = member.strip(" \t")
        if not member:
            continue
        key, eq, val = member.partition("=")
        if not eq or key in keys or not _STATE_KEY.fullmatch(key) or not _STATE_VALUE.fullmatch(val):
            return None
        keys.add(key)
        members.append(member)
    if not members or len(members) > MAX_STATE_MEMBERS:
        return None
    return ",".join(members)


def traceparent(trace_id: int, span_id: int, sampled: bool = True) -> str:
    return f"00-{trace_id:032x}-{span_id:016x}-{'01' if sampled else '00'}"


def finish(trace: RequestTrace, name: str, status: int, error: BaseException | None = None) -> None:
    """End a request's server span: OK below 500, ERROR (with the exception as an event)
    otherwise. A request answered without error and with no attributes of its own becomes
    a numeric record (`RequestTrace.end`); anything else, a span."""
    if error is None and trace.end(status):
        return
    end = time.time_ns()
    tracer: Tracer = trace.tracer
    attributes = trace.attributes or {}
    attributes["http.response.status_code"] = status
    size, samples, compute, interpreter = trace.batch
    batch: dict[str, Any] | None = None
    if size:
        batch = {"aserve.batch_size": size, "aserve.batch_samples": samples, "aserve.compute_us": compute / 10}
        if interpreter:
            batch["aserve.interpreter"] = interpreter - 1
        queued, dispatched = trace.queue
        attributes["aserve.queue_us"] = round((dispatched - queued) / 1e3, 1)
    common = tracer.route_attributes(trace.route) if trace.route >= 0 else trace.common
    events: Sequence[Event] = NO_EVENTS
    code, message = UNSET, ""
    if status >= 500:
        code = ERROR
        if error is not None:
            message = f"{type(error).__name__}: {error}"
            events = (("exception", end, {"exception.type": type(error).__name__,
                                          "exception.message": str(error)}),)
    elif error is not None:
        attributes["error.type"] = type(error).__name__
    trace_id = trace.trace_id
    tracer.record(RequestSpan(trace_id >> 64, trace_id & _MASK64, trace.span_id, trace.parent_id, trace.remote,
                              name, SERVER, trace.start, end, (common, batch, attributes), code, message, events,
                              NO_EVENTS, trace.tracestate or "", *trace.decode, *trace.queue, *trace.encode))


class Tracer:
    """Samples requests and records their spans; `export(payload)` hands a msgpack-encoded
    batch to the exporter and returns a future of how many it sent (None: spans are only
    counted, for tests of the recorder).

    `start(headers)` is the native sampler: a RequestTrace for a request starting now, or
    None when it is not sampled; `new_span_id()` draws an id from the same generator.

    source: which loop records (0 the host's, a front's index + 1): the exporter keeps each
    loop's table of shared attributes apart. `changed`, when set, is called after the
    sampling settings change (the host passes them on to its front loops)."""

    def __init__(self, resolved: Resolved, *, export: Any = None, max_queue: int | None = None,
                 source: int = 0) -> None:
        self.resolved = resolved
        self.source = source
        self.changed: Any = None
        env = resolved.exporter_env
        self.max_queue = max_queue if max_queue is not None else int(env.get("OTEL_BSP_MAX_QUEUE_SIZE", "2048"))
        self.max_batch = int(env.get("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "512"))
        self.delay = min(MAX_FLUSH_SECONDS, int(env.get("OTEL_BSP_SCHEDULE_DELAY", "5000")) / 1000.0)
        self.core = Recorder(self.max_queue, self.max_batch, self._wake, self)
        self.start = self.core.start
        self.new_span_id = self.core.span_id
        self.offset = self.core.offset  # the native workers' clock (monotonic) to the epoch
        self.ratio = resolved.ratio
        self.sampler = resolved.sampler  # with the ratio: the root sampler's bound
        self._buffer: list[bytes] = []  # recorded spans, each encoded (msgpack)
        self._routes: dict[Any, int] = {}  # what a route's attributes depend on -> index in _table
        self._table: list[tuple[str, dict[str, Any]]] = []  # (span name, attributes)
        self._table_raw: list[msgspec.Raw] = []
        self._table_sent = 0  # entries the exporter has (it keeps them)
        self._export = export
        self._timer: asyncio.TimerHandle | None = None
        self._exporting = 0
        self.exported = 0

    # ---- sampling ----

    @property
    def enabled(self) -> bool:
        """Triton's trace_level OFF turns sampling off without losing the exporter."""
        return self.core.enabled

    @enabled.setter
    def enabled(self, on: bool) -> None:
        self.core.enabled = on

    @property
    def sampler(self) -> str:
        """The OTEL_TRACES_SAMPLER name (always_on, always_off, traceidratio, parentbased_*)."""
        return self._sampler

    @sampler.setter
    def sampler(self, name: str) -> None:
        self._sampler = name
        self._set_bound()

    def set_ratio(self, ratio: float) -> None:
        self.ratio = ratio
        self._set_bound()

    def seed(self, seed: int) -> None:
        """Make the ids and sampling decisions that follow repeatable (tests)."""
        self.core.seed(seed)

    def _set_bound(self) -> None:
        """Set the native sampler: a trace is sampled when the low 64 bits of its id are below
        the bound (a root's id is drawn under it when it is sampled; `parentbased_*` follow a
        traceparent's sampled flag instead). It draws how many roots pass until the next
        sampled one, so that an unsampled root costs one decrement."""
        name = self._sampler
        always = name.endswith("always_on")
        bound = 0 if always or name.endswith("always_off") else min(_MASK64, round(self.ratio * (1 << 64)))
        self.core.sampler(always or bound >= _MASK64, bound, name.startswith("parentbased"))

    def settings(self) -> dict[str, Any]:
        """What a front loop's tracer is made from and kept in step with (`apply`)."""
        return {"sampler": self.sampler, "ratio": self.ratio, "enabled": self.enabled,
                "env": self.resolved.exporter_env}

    def apply(self, settings: dict[str, Any]) -> None:
        """Sample as `settings` (another tracer's `settings()`) say."""
        self.ratio = settings["ratio"]
        self.sampler = settings["sampler"]  # sets the native sampler's bound, with the ratio
        self.enabled = settings["enabled"]

    def to_epoch(self, monotonic_ns: int) -> int:
        return monotonic_ns + self.offset

    # ---- the table of attributes many records share ----

    def route(self, key: Any) -> int:
        """The table index of what `key` stands for (a route's span name and attributes), or -1
        if it has none yet (then `add_route`)."""
        return self._routes.get(key, -1)

    def add_route(self, key: Any, name: str, attributes: dict[str, Any]) -> int:
        """Make a table entry; -1 when the table is full (the caller records a span instead)."""
        if len(self._table) >= MAX_ROUTES:
            return -1
        index = self._routes[key] = len(self._table)
        self._table.append((name, attributes))
        self._table_raw.append(shared(attributes))
        return index

    def route_attributes(self, index: int) -> msgspec.Raw:
        return self._table_raw[index]

    # ---- recording and export ----

    def _wake(self) -> None:
        """The recorder's call when the first record waits (arm the flush timer) or
        max_batch wait (export now, unless an export is under way: its end exports). It
        runs inside a request's `end`: whatever goes wrong here is logged, never that
        request's failure."""
        try:
            if self.core.pending >= self.max_batch:
                if not self._exporting:
                    self.flush()
            elif self._timer is None:
                self._timer = asyncio.get_running_loop().call_later(self.delay, self._tick)
        except Exception as e:  # noqa: BLE001 - tracing never fails a request
            log.warning("trace export could not start: %s", e)

    def record(self, span: Span) -> None:
        """Record a span that does not fit the numeric records."""
        core = self.core
        if core.pending >= self.max_queue:
            core.drop(1)
            return
        self._buffer.append(_encode(span))
        core.count()

    def _tick(self) -> None:
        self._timer = None
        if self.core.pending:
            self.flush()

    def flush(self) -> asyncio.Future[Any] | None:
        """Hand every record waiting to the exporter, in one message."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        n, requests, batches, links = self.core.take()
        if not n:
            return None
        spans, self._buffer = self._buffer, []
        if self._export is None:
            self.exported += n
            return None
        k = len(spans)  # a msgpack array of the encoded spans
        header = b"\xdc" + k.to_bytes(2, "big") if k < 1 << 16 else b"\xdd" + k.to_bytes(4, "big")
        sent, self._table_sent = self._table_sent, len(self._table)
        payload = _encode({"spans": msgspec.Raw(b"".join((header, *spans))), "requests": requests,
                           "batches": batches, "links": links, "table_from": sent, "table": self._table[sent:],
                           "source": self.source})
        try:
            future: asyncio.Future[Any] = self._export(payload)
        except Exception as e:  # noqa: BLE001 - the exporter is gone (closing): the records are dropped
            self._table_sent = sent
            self.core.drop(n)
            log.warning("trace export failed: %s; %d records dropped", e, n)
            return None
        self._exporting += 1
        future.add_done_callback(self._exported)
        return future

    async def drain(self) -> None:
        """Export everything recorded so far and wait until the exporter has sent it."""
        future = self.flush()
        if future is not None:
            await asyncio.gather(future, return_exceptions=True)

    def _exported(self, future: asyncio.Future[Any]) -> None:
        self._exporting -= 1
        if future.cancelled():
            return
        error = future.exception()
        if error is not None:
            log.warning("trace export failed: %s", error)
        else:
            self.exported += int(future.result())
        if self.core.pending >= self.max_batch:
            self.flush()

    def stats(self) -> dict[str, int]:
        core = self.core
        return {"recorded": core.recorded, "exported": self.exported, "dropped": core.dropped}
