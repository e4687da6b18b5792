"""The spans of a batch that served sampled requests.

A batch gets a trace of its own, linked to the server spans of the requests it served,
with a child for its run in the interpreter (timed by the native worker's clock) and,
under that, the spans model code opened. Each sampled request gets its queue phase and
the batch's facts. A batch that ran without error, stages or model spans is one numeric
record (`Recorder.batch`); any other is recorded as spans.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any, Protocol

from .._native import RequestTrace
from .recorder import ERROR, INTERNAL, UNSET, Event, Link, Span, Tracer


class Queued(Protocol):
    """What tracing reads of a request of the batch (the batcher's queued request)."""

    @property
    def trace(self) -> RequestTrace | None: ...  # set when the request is sampled

    @property
    def arrival(self) -> float: ...  # when it was queued (monotonic seconds)


def trace_batch(tracer: Tracer, model: str, requests: Sequence[Queued], samples: int, started: float,
                ran: tuple[Any, ...] | None, error: BaseException | None, *, stages: Sequence[float] = (),
                joined: int = 0) -> None:
    """Record the spans of a batch of `samples` samples dispatched at `started` (monotonic
    seconds). ran: the engine's (interpreter, ran from, ran to (monotonic ns), the model's
    spans as JSON or None), None for a staged run; stages: a staged run's seconds per stage
    (recorded as events); joined: the requests that joined it at a stage boundary."""
    if ran is not None and error is None and not stages and not joined and not ran[3]:  # numbers only
        model_entry = tracer.route(("batch", model))
        if model_entry < 0:
            model_entry = tracer.add_route(("batch", model), f"batch {model}", {"aserve.model": model})
        if model_entry >= 0:
            tracer.core.batch(model_entry, requests, samples, started, ran)
            return
    now = time.time_ns()
    offset = tracer.offset
    start = int(started * 1e9) + offset
    hi, lo = tracer.new_span_id(), tracer.new_span_id()
    batch_id = tracer.new_span_id()
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
                       message, events, links))
    if ran is None:
        return
    interpreter, ran_from, ran_to, model_spans = ran
    run_id = tracer.new_span_id()
    tracer.record(Span(hi, lo, run_id, batch_id, False, "run in interpreter", INTERNAL, tracer.to_epoch(ran_from),
                       tracer.to_epoch(ran_to), {"aserve.interpreter": interpreter, "aserve.model": model}, UNSET,
                       "", [], []))
    if model_spans:
        for name, s_from, s_to, attrs, failed in json.loads(model_spans):
            tracer.record(Span(hi, lo, tracer.new_span_id(), run_id, False, name, INTERNAL, tracer.to_epoch(s_from),
                               tracer.to_epoch(s_to), attrs, ERROR if failed else UNSET, failed or "", [], []))
