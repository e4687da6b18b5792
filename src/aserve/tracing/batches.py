"""The spans of a batch that served sampled requests.

A batch gets a trace of its own, linked to the server spans of the requests it served,
with a child for its run in the interpreter (timed by the native worker's clock) and,
under that, the spans model code opened. Its ids are drawn before it runs
(`batch_context`): model code runs with the run span as its current OpenTelemetry span,
and with the tracestate and baggage its sampled requests share. Each sampled request
gets its queue phase and the batch's facts. A batch that ran without error, stages,
model spans or tracestate is one numeric record (`Recorder.batch`); any other is
recorded as spans.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, Protocol

from .._native import RequestTrace
from .recorder import ERROR, INTERNAL, UNSET, Event, Link, Span, Tracer, parse_traceparent, parse_tracestate

_MASK64 = (1 << 64) - 1


class Queued(Protocol):
    """What tracing reads of a request of the batch (the batcher's queued request)."""

    @property
    def trace(self) -> RequestTrace | None: ...  # set when the request is sampled

    @property
    def arrival(self) -> float: ...  # when it was queued (monotonic seconds)


class BatchContext(NamedTuple):
    """A traced batch's ids, drawn before it runs, and what its model code gets of them."""

    ids: tuple[int, int, int, int]  # trace_hi, trace_lo, the batch's span id, its run's span id
    tracestate: str  # "" for none
    header: str  # for the interpreter: "traceparent\ntracestate\nbaggage" of the run span


def _shared(values: set[Any]) -> str:
    """The one header value every sampled request of a batch carries, else ""."""
    return (values.pop() or "") if len(values) == 1 else ""


def batch_context(tracer: Tracer, requests: Sequence[Queued]) -> BatchContext:
    """The ids of a batch about to run, with the tracestate and baggage that its sampled
    requests agree on (all of them carry the same header, or none of it goes to the batch)."""
    hi, lo, batch_id, run_id = tracer.new_span_id(), tracer.new_span_id(), tracer.new_span_id(), tracer.new_span_id()
    traces = [t for r in requests if (t := r.trace) is not None]
    state = _shared({t.tracestate for t in traces})
    bag = _shared({t.baggage for t in traces})
    return BatchContext((hi, lo, batch_id, run_id), state, f"00-{hi:016x}{lo:016x}-{run_id:016x}-01\n{state}\n{bag}")


def untraced_context(headers: Mapping[str, str]) -> str | None:
    """The context model code runs in for a request that is not sampled but carries a valid
    `traceparent` (its caller's span, not sampled: outgoing calls continue the caller's trace
    unsampled, as W3C Trace Context asks) or `baggage`; None when it carries neither."""
    parent = headers.get("traceparent")
    bag = headers.get("baggage") or ""
    parsed = parse_traceparent(parent) if parent else None
    if parsed is None:
        return f"\n\n{bag}" if bag else None
    trace_id, span_id, _ = parsed
    state = parse_tracestate(headers.get("tracestate")) or ""
    return f"00-{trace_id:032x}-{span_id:016x}-00\n{state}\n{bag}"


def batch_untraced_context(requests: Sequence[Any]) -> str | None:
    """The context of an untraced batch: the one every request of it carries (a batch of one:
    its request's), else None."""
    first = requests[0].context
    for r in requests:
        if r.context != first:
            return None
    return first  # type: ignore[no-any-return]


def trace_batch(tracer: Tracer, model: str, requests: Sequence[Queued], samples: int, started: float,
                ran: tuple[Any, ...] | None, error: BaseException | None, *, stages: Sequence[float] = (),
                joined: int = 0, context: BatchContext | None = None) -> None:
    """Record the spans of a batch of `samples` samples dispatched at `started` (monotonic
    seconds). ran: the engine's (interpreter, ran from, ran to (monotonic ns), the model's
    spans as JSON or None), None for a staged run; stages: a staged run's seconds per stage
    (recorded as events); joined: the requests that joined it at a stage boundary; context:
    its ids when they were drawn before it ran."""
    state = context.tracestate if context is not None else ""
    if ran is not None and error is None and not stages and not joined and not ran[3] and not state:  # numbers only
        model_entry = tracer.route(("batch", model))
        if model_entry < 0:
            model_entry = tracer.add_route(("batch", model), f"batch {model}", {"aserve.model": model})
        if model_entry >= 0:
            tracer.core.batch(model_entry, requests, samples, started, ran, context.ids if context else None)
            return
    now = time.time_ns()
    offset = tracer.offset
    start = int(started * 1e9) + offset
    if context is not None:
        hi, lo, batch_id, run_id = context.ids
    else:
        hi, lo = tracer.new_span_id(), tracer.new_span_id()
        batch_id, run_id = tracer.new_span_id(), tracer.new_span_id()
    interpreter = ran[0] if ran is not None else -1
    facts = (len(requests), samples, (now - start) // 100, interpreter + 1)  # on each request's span
    traced = []
    for r in requests:
        t = r.trace
        if t is not None:
            t.queue = (int(r.arrival * 1e9) + offset, start)
            t.batch = facts
            traced.append(t)
    links: list[Link] = [(t.trace_id >> 64, t.trace_id & 0xFFFFFFFFFFFFFFFF, t.span_id, None) for t in traced]
    attributes = {"aserve.model": model, "aserve.batch_size": len(requests), "aserve.batch_samples": samples}
    if interpreter >= 0:
        attributes["aserve.interpreter"] = interpreter
    if joined:
        attributes["aserve.joined_requests"] = joined
    events: list[Event] = []
    at = start
    for k, seconds in enumerate(stages):
        at += int(seconds * 1e9)
        events.append((f"stage {k + 1} done", at, {"aserve.stage": k + 1, "aserve.stage_us": round(seconds * 1e6, 1)}))
    status, message = UNSET, ""
    if error is not None:
        status, message = ERROR, f"{type(error).__name__}: {error}"
        events.append(("exception", now, {"exception.type": type(error).__name__, "exception.message": str(error)}))
    tracer.record(Span(hi, lo, batch_id, 0, False, f"batch {model}", INTERNAL, start, now, attributes, status,
                       message, events, links, state))
    if ran is None:
        return
    interpreter, ran_from, ran_to, model_spans = ran
    tracer.record(Span(hi, lo, run_id, batch_id, False, "run in interpreter", INTERNAL, tracer.to_epoch(ran_from),
                       tracer.to_epoch(ran_to), {"aserve.interpreter": interpreter, "aserve.model": model}, UNSET,
                       "", [], [], state))
    if model_spans:
        record_model_spans(tracer, model_spans)


def record_model_spans(tracer: Tracer, model_spans: str) -> None:
    """Record the spans model code ended in the batch's trace (runtime/trace.py `end`: JSON
    records with their own ids, epoch times and OpenTelemetry kinds and status codes)."""
    for (trace_id, span_id, parent_id, name, kind, s_from, s_to, attrs, status, message, events, links,
         state) in json.loads(model_spans):
        tracer.record(Span(trace_id >> 64, trace_id & _MASK64, span_id, parent_id, False, str(name), int(kind),
                           int(s_from), int(s_to), attrs, int(status), str(message),
                           [(str(e[0]), int(e[1]), e[2]) for e in events],
                           [(t >> 64, t & _MASK64, s, a) for t, s, a in links], str(state)))
