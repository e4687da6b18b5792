"""Spans that model code opens inside its interpreter, exported with the request's trace.

    from aserve.runtime import span

    def __call__(self, inputs):
        with span("tokenize", tokens=n):
            ...

When the server traces the batch being run (OpenTelemetry is on and a request of it
was sampled), each span becomes a child of the batch's span for the run in this
interpreter, with its own start and end from this interpreter's clock and the given
attributes (str, bool, int, float). Otherwise `span` does nothing and costs one
check. Standard library only: this module runs in every interpreter.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

# The spans of the job being traced on this thread (interpreters of the `main` engine
# share one module between their threads), else None.
_state = threading.local()


@contextmanager
def span(name: str, **attributes: str | bool | float) -> Iterator[None]:
    """Time the block as a span named `name` of the batch's trace (if it is traced)."""
    spans = getattr(_state, "spans", None)
    if spans is None:
        yield
        return
    start = time.monotonic_ns()
    error = None
    try:
        yield
    except BaseException as e:
        error = f"{type(e).__name__}: {e}"
        raise
    finally:
        spans.append([str(name), start, time.monotonic_ns(), attributes, error])


def begin() -> None:
    """The engine is about to run a traced job: record the spans model code opens."""
    _state.spans = []


def end() -> str | None:
    """The traced job ended: its spans as JSON ([name, start_ns, end_ns, attributes, error])."""
    spans = getattr(_state, "spans", None)
    _state.spans = None
    if not spans:
        return None
    return json.dumps(spans, default=str)
