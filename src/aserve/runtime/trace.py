"""Spans that model code opens inside its interpreter, exported with the request's trace.

Model code uses the OpenTelemetry API, as anywhere else:

    from opentelemetry import baggage, trace

    tracer = trace.get_tracer(__name__)

    def __call__(self, inputs):
        with tracer.start_as_current_span("tokenize") as s:
            s.set_attribute("tenant", baggage.get_baggage("tenant") or "")
            ...

When the server traces the batch being run (OpenTelemetry is on and a request of it
was sampled) and `opentelemetry-sdk` is importable here, the current span during the
call is the batch's `run in interpreter` span (its context: trace id, span id,
tracestate), the current baggage is what the batch's sampled requests share, and a
TracerProvider of this interpreter (otel.py) hands every span that ends in the batch's
trace to the engine, which sends them with the rest of the trace. Instrumented
libraries (an HTTP client injecting `traceparent`) see the same context. Otherwise
nothing is set up and the API's no-op tracer costs what it always does.

`span(name, **attributes)` is the short form of `start_as_current_span(name,
attributes=...)`. Where the SDK cannot be imported it still records its spans (with
this module alone: standard library only, since it runs in every interpreter).
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# Per thread (interpreters of the `main` engine share this module between their threads):
# spans, the spans recorded without the SDK for the job being traced, else None; parent,
# (trace id, run span id) of that job; token, what otel.attach returned.
_state = threading.local()
_otel: Any = None  # the otel module once imported here; False: the SDK cannot be imported


def _sdk() -> Any:
    global _otel
    if _otel is None:
        try:
            from . import otel
        except ImportError:
            _otel = False
        else:
            _otel = otel
    return _otel


@contextmanager
def span(name: str, **attributes: str | bool | float) -> Iterator[None]:
    """Time the block as a span named `name` of the batch's trace (if it is traced)."""
    token = getattr(_state, "token", None)
    if token is not None:
        with _otel.tracer().start_as_current_span(str(name), attributes=attributes):
            yield
        return
    spans = getattr(_state, "spans", None)
    if spans is None:
        yield
        return
    start = time.time_ns()
    error = None
    try:
        yield
    except BaseException as e:
        error = f"{type(e).__name__}: {e}"
        raise
    finally:
        trace_id, parent = _state.parent
        spans.append([trace_id, random.getrandbits(64) or 1, parent, str(name), 0, start, time.time_ns(),
                      attributes, 2 if error else 0, error or "", [], [], ""])


def begin(context: str | None = None) -> None:
    """The engine is about to run a job in a context: "traceparent\\ntracestate\\nbaggage"
    (the last two may be empty). A traced job's traceparent is its run span's, sampled; an
    untraced job's is its caller's, not sampled, or empty (baggage alone): model code sees
    them, and its spans are not recorded. None: a traced job of times only."""
    traceparent, _, rest = (context or "").partition("\n")
    state, _, bag = rest.partition("\n")
    sampled = context is None or traceparent.endswith("-01")
    _state.spans = [] if sampled else None
    _state.parent = (int(traceparent[3:35], 16), int(traceparent[36:52], 16)) if traceparent else (0, 0)
    if context is None:
        return
    otel = _otel if _otel is not None else _sdk()
    if otel:
        _state.token = otel.attach(_state.parent, state, bag, sampled)


def end() -> str | None:
    """The traced job ended: its spans as JSON, each [trace id, span id, parent id, name,
    kind, start_ns, end_ns (since the epoch), attributes, status, message, events [[name,
    ns, attributes]], links [[trace id, span id, attributes]], tracestate]."""
    token = getattr(_state, "token", None)
    spans = getattr(_state, "spans", None) or []
    if token is not None:
        _state.token = None
        spans.extend(_otel.detach(token))
    _state.spans = None
    if not spans:
        return None
    return json.dumps(spans, default=str)
