"""Spans recorded on the event loop, exported in batches from an interpreter of their own.

The OpenTelemetry SDK spends about 20 us of Python on every span it starts and ends, and
twice that encoding it for OTLP, on the thread and GIL that call it: five spans a
request would cost more than the request. So the loop only records numbers. A request
that was answered is one record of 19 unsigned 64-bit numbers appended to an array
(`array('Q')`: one C call, no object the garbage collector sees): its ids, times (from
`time.time_ns()`), the times of its decode, queue and encode, its status, the index of
its route's attributes in a table (made once per route, model and address), and the
facts of the batch that served it. A batch is one record of 12 (with the run in the
interpreter, timed by the native worker's clock) and one link record per sampled request
it served. What does not fit (errors with their exception, the spans model code opened,
staged runs) is recorded as a span: a msgpack-encoded list. Every
`OTEL_BSP_SCHEDULE_DELAY` milliseconds (at most 200 here), or as soon as
`OTEL_BSP_MAX_EXPORT_BATCH_SIZE` records wait, what waits is handed over in one msgpack
message to the exporter: a small model (`aserve.tracing.exporter`) loaded in a private
interpreter, with its own GIL, which turns the records into spans, encodes the OTLP
request in C and sends it with the SDK's OTLP/HTTP exporter. This is the batch span
processor of the OpenTelemetry specification, split across two interpreters: export never
blocks the loop, the loop pays about a microsecond and a half per sampled request, and
records beyond `OTEL_BSP_MAX_QUEUE_SIZE` waiting are dropped (counted) rather than slowing
requests down. (Spans kept as tuples of dicts kept the garbage collector busy on the
loop, about 5% of its time at full sampling; encoding each span as it was recorded cost
about 4 us of the loop per request.)

Sampling happens here, at the start of a request, as the SDK's samplers decide:
`parentbased_*` follow a `traceparent` header's sampled flag, `traceidratio` keeps the
traces whose low 64 bits of trace id fall under the ratio. A root (no `traceparent`) is
sampled with that probability, and its id is drawn with its low bits under the bound, so
the rule holds for every id the server sends on; the decisions are drawn as the number
of roots until the next sampled one (a geometric run of Bernoulli trials), so that an
unsampled root costs one decrement. Triton's trace setting
(`/v2/trace/setting`) changes the ratio at run time.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from array import array
from collections.abc import Mapping
from typing import Any

import msgspec

from .config import Resolved

log = logging.getLogger("aserve.tracing")

INTERNAL, SERVER = 0, 1  # OpenTelemetry SpanKind values
UNSET, OK, ERROR = 0, 1, 2  # OpenTelemetry StatusCode values
MAX_FLUSH_SECONDS = 0.2
_MASK64 = (1 << 64) - 1

# A span as the exporter reads it (msgpack): (trace_hi, trace_lo, span_id, parent_id, remote_parent, name,
# kind, start_ns, end_ns, attributes, status, status_message, events ((name, ns, attrs), ...), links
# ((trace_hi, trace_lo, span_id, attrs), ...)). attributes: a dict, None, or a tuple of dicts (one shared
# by many spans, then the span's own). A request is a span of 20 fields: its server span's 14, then
# (start, end) of its decode, queue and encode children, which the encoder (aserve._native.otlp_encode)
# writes as spans of their own with ids derived from the request's.
Span = tuple[Any, ...]
# The numeric records (array('Q')), which the exporter turns into spans of the form above:
# a request: trace_hi, trace_lo, span_id, parent_id, remote, status, start, end, decode start, end, queue
#   start, end, encode start, end, route (table index), batch size, batch samples, batch compute (0.1 us),
#   interpreter + 1 (the last four 0: not batched);
# a batch: trace_hi, trace_lo, span_id, run span_id, start, end, run start, run end, interpreter + 1,
#   size, samples, model (table index);
# a link: batch span_id, then the trace_hi, trace_lo and span_id of a request it served.
REQUEST_FIELDS, BATCH_FIELDS, LINK_FIELDS = 19, 12, 4
NOT_BATCHED = (0, 0, 0, 0)
MAX_ROUTES = 1024  # table entries; requests beyond it carry their attributes as a span does
NO_EVENTS: tuple[Any, ...] = ()
_encode = msgspec.msgpack.Encoder().encode  # spans, and attributes shared by many of them


def shared(attributes: dict[str, Any]) -> msgspec.Raw:
    """Attributes many spans carry (a route's, a batch's), encoded once: each span that holds
    them copies the bytes instead of encoding every key and value again."""
    return msgspec.Raw(_encode(attributes))


def parse_traceparent(value: str | None) -> tuple[int, int, bool] | None:
    """(trace id, parent span id, sampled) of a W3C `traceparent` header, or None if absent or invalid."""
    if not value:
        return None
    parts = value.strip().split("-")
    if len(parts) < 4 or len(parts[0]) != 2 or len(parts[1]) != 32 or len(parts[2]) != 16 or len(parts[3]) != 2:
        return None
    if parts[0] == "ff" or (parts[0] == "00" and len(parts) != 4):
        return None
    try:
        trace_id, span_id, flags = int(parts[1], 16), int(parts[2], 16), int(parts[3], 16)
    except ValueError:
        return None
    if not trace_id or not span_id:
        return None
    return trace_id, span_id, bool(flags & 1)


def traceparent(trace_id: int, span_id: int, sampled: bool = True) -> str:
    return f"00-{trace_id:032x}-{span_id:016x}-{'01' if sampled else '00'}"


class RequestTrace:
    """One sampled request: its server span (kept open until `finish`) and its children.

    `route`: the index of its attributes shared with other requests (route, server,
    model) in the tracer's table (`Tracer.route`), or -1 with them in `common`;
    `batch`: the facts of the batch that answered it (size, samples, compute time in
    tenths of a microsecond, interpreter + 1); `attributes`: its own beyond its status,
    if any (a request that has some is recorded as a span)."""

    __slots__ = ("attributes", "batch", "common", "decode", "encode", "parent_id", "queue", "remote", "route",
                 "span_id", "start", "trace_id", "tracer")

    def __init__(self, tracer: Tracer, trace_id: int, span_id: int, parent_id: int, remote: bool,
                 start: int) -> None:
        self.tracer = tracer
        self.trace_id = trace_id
        self.span_id = span_id
        self.parent_id = parent_id
        self.remote = remote
        self.start = start
        self.route = -1
        self.common: msgspec.Raw | None = None
        self.batch: tuple[int, int, int, int] = NOT_BATCHED
        self.attributes: dict[str, Any] | None = None
        self.decode = self.queue = self.encode = (0, 0)  # (start_ns, end_ns) of its phases; 0: not reached

    @property
    def trace_id_hex(self) -> str:
        return f"{self.trace_id:032x}"

    @property
    def span_id_hex(self) -> str:
        return f"{self.span_id:016x}"

    def child(self, name: str, start: int, end: int, attributes: dict[str, Any] | None = None,
              events: list[Any] | None = None) -> int:
        """Record a finished child span of the request; returns its span id."""
        tracer = self.tracer
        span_id = tracer.new_span_id()
        trace_id = self.trace_id
        tracer.record((trace_id >> 64, trace_id & _MASK64, span_id, self.span_id, False, name, INTERNAL,
                       start, end, attributes, UNSET, "", events or NO_EVENTS, NO_EVENTS))
        return span_id

    def finish(self, name: str, status: int, error: BaseException | None = None) -> None:
        """End the server span: OK below 500, ERROR (with the exception as an event) otherwise."""
        end = time.time_ns()
        tracer = self.tracer
        if error is None and self.attributes is None and self.route >= 0:  # the common case: numbers only
            if tracer.pending >= tracer.max_queue:
                tracer.dropped += 1
                return
            trace_id = self.trace_id
            tracer.requests.extend((trace_id >> 64, trace_id & _MASK64, self.span_id, self.parent_id, self.remote,
                                    status, self.start, end, *self.decode, *self.queue, *self.encode, self.route,
                                    *self.batch))
            tracer.added()
            return
        attributes = self.attributes or {}
        attributes["http.response.status_code"] = status
        size, samples, compute, interpreter = self.batch
        batch: dict[str, Any] | None = None
        if size:
            batch = {"aserve.batch_size": size, "aserve.batch_samples": samples, "aserve.compute_us": compute / 10}
            if interpreter:
                batch["aserve.interpreter"] = interpreter - 1
            attributes["aserve.queue_us"] = round((self.queue[1] - self.queue[0]) / 1e3, 1)
        common = tracer.route_attributes(self.route) if self.route >= 0 else self.common
        events: Any = NO_EVENTS
        code, message = UNSET, ""
        if status >= 500:
            code = ERROR
            if error is not None:
                message = f"{type(error).__name__}: {error}"
                events = (("exception", end, {"exception.type": type(error).__name__,
                                              "exception.message": str(error)}),)
        elif error is not None:
            attributes["error.type"] = type(error).__name__
        trace_id = self.trace_id
        tracer.record((trace_id >> 64, trace_id & _MASK64, self.span_id, self.parent_id, self.remote, name,
                       SERVER, self.start, end, (common, batch, attributes), code, message, events, NO_EVENTS,
                       *self.decode, *self.queue, *self.encode))


class Tracer:
    """Samples requests and records their spans; `export(payload)` hands a msgpack-encoded
    batch to the exporter and returns a future of how many it sent (None: spans are only
    counted, for tests of the recorder)."""

    def __init__(self, resolved: Resolved, *, export: Any = None, max_queue: int | None = None) -> None:
        self._rng = random.Random()
        self.ratio = resolved.ratio
        self.sampler = resolved.sampler  # with the ratio: the root sampler's bound
        self.enabled = True  # Triton's trace_level OFF turns sampling off without losing the exporter
        self.offset = time.time_ns() - time.monotonic_ns()  # the native workers' clock to the epoch
        self._buffer: list[bytes] = []  # recorded spans, each encoded (msgpack)
        self.requests = array("Q")  # numeric records (see REQUEST_FIELDS)
        self.batches = array("Q")
        self.links = array("Q")
        self.pending = 0  # records waiting: spans, requests and batches
        self._routes: dict[Any, int] = {}  # what a route's attributes depend on -> index in _table
        self._table: list[tuple[str, dict[str, Any]]] = []  # (span name, attributes)
        self._table_raw: list[msgspec.Raw] = []
        self._table_sent = 0  # entries the exporter has (it keeps them)
        self._export = export
        env = resolved.exporter_env
        self.max_queue = max_queue if max_queue is not None else int(env.get("OTEL_BSP_MAX_QUEUE_SIZE", "2048"))
        self.max_batch = int(env.get("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "512"))
        self.delay = min(MAX_FLUSH_SECONDS, int(env.get("OTEL_BSP_SCHEDULE_DELAY", "5000")) / 1000.0)
        self._timer: asyncio.TimerHandle | None = None
        self._exporting = 0
        self.recorded = 0
        self.dropped = 0
        self.exported = 0

    # ---- sampling ----

    @property
    def sampler(self) -> str:
        """The OTEL_TRACES_SAMPLER name (always_on, always_off, traceidratio, parentbased_*)."""
        return self._sampler

    @sampler.setter
    def sampler(self, name: str) -> None:
        self._sampler = name
        self._parentbased = name.startswith("parentbased")
        self._set_bound()

    def set_ratio(self, ratio: float) -> None:
        self.ratio = ratio
        self._set_bound()

    def _set_bound(self) -> None:
        """A root trace is sampled when the low 64 bits of its id are below the bound."""
        name = self._sampler
        if name.endswith("always_on"):
            self._bound = 1 << 64
        elif name.endswith("always_off"):
            self._bound = 0
        else:
            self._bound = round(self.ratio * (1 << 64))
        self._skip = self._roots_to_next()

    def _roots_to_next(self) -> int:
        """How many root requests until the next sampled one (this one included): a run of
        Bernoulli(ratio) decisions drawn at once (geometric), so that an unsampled root costs a
        decrement rather than a random number."""
        bound = self._bound
        if bound >= 1 << 64:
            return 1
        if bound <= 0:
            return 1 << 62  # never, in practice; a change of ratio draws again
        p = bound / (1 << 64)
        return 1 + int(math.log(1.0 - self._rng.random()) / math.log1p(-p))

    def new_span_id(self) -> int:
        return self._rng.getrandbits(64) or 1

    def start(self, headers: Mapping[str, str]) -> RequestTrace | None:
        """The trace of a request that starts now, or None if it is not sampled."""
        if not self.enabled:
            return None
        value = headers.get("traceparent")
        parent = parse_traceparent(value) if value is not None else None
        if parent is None:  # a root: sampled with probability ratio, its id's low 64 bits under the bound
            self._skip -= 1
            if self._skip > 0:
                return None
            self._skip = self._roots_to_next()
            bound = self._bound
            low = self._rng.getrandbits(64) if bound >= 1 << 64 else self._rng.randrange(bound)
            trace_id = (self._rng.getrandbits(64) << 64 | low) or 1
            return RequestTrace(self, trace_id, self.new_span_id(), 0, False, time.time_ns())
        trace_id, parent_id, sampled = parent
        if self._parentbased:
            if not sampled:
                return None
        elif (trace_id & _MASK64) >= self._bound:
            return None
        return RequestTrace(self, trace_id, self.new_span_id(), parent_id, True, time.time_ns())

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

    def added(self) -> None:
        """A record was appended: export when enough wait, else within the schedule delay."""
        self.pending += 1
        self.recorded += 1
        if self.pending >= self.max_batch and not self._exporting:
            self.flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.delay, self._tick)

    def record(self, span: Span) -> None:
        """Record a span that does not fit the numeric records."""
        if self.pending >= self.max_queue:
            self.dropped += 1
            return
        self._buffer.append(_encode(span))
        self.added()

    def record_batch(self, batch: tuple[int, ...], links: list[int]) -> None:
        """A batch's record (BATCH_FIELDS numbers) and its links (LINK_FIELDS numbers each)."""
        if self.pending >= self.max_queue:
            self.dropped += 1
            return
        self.batches.extend(batch)
        self.links.extend(links)
        self.added()

    def _tick(self) -> None:
        self._timer = None
        if self.pending:
            self.flush()

    def flush(self) -> asyncio.Future[Any] | None:
        """Hand every record waiting to the exporter, in one message."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        n, self.pending = self.pending, 0
        if not n:
            return None
        spans, self._buffer = self._buffer, []
        requests, batches, links = self.requests, self.batches, self.links
        self.requests, self.batches, self.links = array("Q"), array("Q"), array("Q")
        if self._export is None:
            self.exported += n
            return None
        self._exporting += 1
        k = len(spans)  # a msgpack array of the encoded spans
        header = b"\xdc" + k.to_bytes(2, "big") if k < 1 << 16 else b"\xdd" + k.to_bytes(4, "big")
        sent, self._table_sent = self._table_sent, len(self._table)
        payload = _encode({"spans": msgspec.Raw(b"".join((header, *spans))), "requests": requests.tobytes(),
                           "batches": batches.tobytes(), "links": links.tobytes(), "table_from": sent,
                           "table": self._table[sent:]})
        future: asyncio.Future[Any] = self._export(payload)
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
        if self.pending >= self.max_batch:
            self.flush()

    def stats(self) -> dict[str, int]:
        return {"recorded": self.recorded, "exported": self.exported, "dropped": self.dropped}
