"""The OpenTelemetry SDK in an interpreter: model code's spans go out with the batch's trace.

Imported by trace.py the first time a traced batch runs here (so never while tracing
is off), and only where `opentelemetry-sdk` is importable. It makes this interpreter's
global TracerProvider: roots are not sampled (a span opened outside a traced batch is a
no-op span), children follow their parent. Where model code already set an SDK
TracerProvider of its own, that one stays and exports the model's spans itself (they
are still children of the run span); aserve collects none of them. While a traced batch runs, `attach` makes its run span (a non-recording
span with the ids the host drew) and baggage the current context, so spans opened with
the standard API are its children; the processor keeps every span that ends in that
trace, and `detach` hands them to the engine as records. Spans that end after their
batch returned, or in another trace, are not exported.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import context as _context
from opentelemetry import trace as _trace
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

# trace id -> the records of the spans that ended in it, while its batch runs (threads of the
# `main` engine run batches of different traces at once)
_jobs: dict[int, list[list[Any]]] = {}
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_NOT_SAMPLED = TraceFlags(TraceFlags.DEFAULT)
_baggage = W3CBaggagePropagator()
# (tracestate, baggage) headers -> their TraceState and a context holding the baggage: parsed
# once, since the same few recur (both are immutable)
_parsed: dict[tuple[str, str], tuple[TraceState | None, Context]] = {}
MAX_PARSED = 256


def record(span: ReadableSpan) -> list[Any]:
    """A finished span as the engine carries it (trace.end)."""
    ctx = span.get_span_context()
    assert ctx is not None  # an SDK span always has one
    parent = span.parent
    status = span.status
    return [ctx.trace_id, ctx.span_id, parent.span_id if parent is not None else 0, span.name, span.kind.value,
            span.start_time, span.end_time, dict(span.attributes or {}), status.status_code.value,
            status.description or "",
            [[e.name, e.timestamp, dict(e.attributes or {})] for e in span.events],
            [[link.context.trace_id, link.context.span_id, dict(link.attributes or {})] for link in span.links],
            ctx.trace_state.to_header() if ctx.trace_state else ""]


class Collect(SpanProcessor):
    """Keeps the spans that end in a batch's trace while the batch runs."""

    def on_start(self, span: Any, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        ctx = span.get_span_context()
        records = _jobs.get(ctx.trace_id) if ctx is not None else None
        if records is not None:
            records.append(record(span))

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def _install() -> TracerProvider | None:
    """This interpreter's TracerProvider with the processor that collects the batch's spans,
    or None when model code set a provider of its own (its processors export its spans)."""
    if isinstance(_trace.get_tracer_provider(), TracerProvider):
        return None
    provider = TracerProvider(sampler=ParentBased(root=ALWAYS_OFF), shutdown_on_exit=False)  # nothing to flush
    provider.add_span_processor(Collect())
    _trace.set_tracer_provider(provider)
    return provider


_provider = _install()
_tracer = _trace.get_tracer("aserve.runtime")


def tracer() -> _trace.Tracer:
    """The tracer `aserve.runtime.span` opens its spans with."""
    return _tracer


def attach(parent: tuple[int, int], state: str, baggage: str, sampled: bool = True) -> tuple[object, int]:
    """Make the batch's run span (trace id, span id; not sampled: the caller's span of an
    untraced batch; (0, 0): none), its tracestate and the baggage the current context;
    returns what `detach` takes."""
    trace_id, span_id = parent
    parsed = _parsed.get((state, baggage))
    if parsed is None:
        if len(_parsed) >= MAX_PARSED:
            _parsed.clear()
        parsed = _parsed[state, baggage] = (TraceState.from_header([state]) if state else None,
                                            _baggage.extract({"baggage": baggage}, Context()) if baggage else Context())
    trace_state, with_baggage = parsed
    if not span_id:
        return _context.attach(with_baggage), 0
    run = NonRecordingSpan(SpanContext(trace_id, span_id, is_remote=not sampled,
                                       trace_flags=_SAMPLED if sampled else _NOT_SAMPLED, trace_state=trace_state))
    if sampled:
        _jobs[trace_id] = []
    return _context.attach(_trace.set_span_in_context(run, with_baggage)), trace_id


def detach(token: tuple[object, int]) -> list[list[Any]]:
    """Restore the context from before `attach`; the records of the spans that ended in the batch's trace."""
    attached, trace_id = token
    _context.detach(attached)  # type: ignore[arg-type]
    return _jobs.pop(trace_id, []) if trace_id else []
