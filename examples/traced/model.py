"""A model instrumented with the OpenTelemetry API only, as it would be in any service.

It opens spans with `trace.get_tracer(__name__)`, reads the caller's baggage with
`baggage.get_baggage`, and, when the `feature_url` parameter names a feature service,
calls it with the current context injected (`propagate.inject`: traceparent,
tracestate, baggage), as an instrumented HTTP client would. Under aserve with tracing
on, its spans are children of the batch's `run in interpreter` span and go out with
the request's trace; without tracing the API's no-op tracer does nothing. Pure Python,
so it runs in every engine; where opentelemetry-api is not installed (aserve without its
`otel` extra) it serves the same answers, untraced.
"""

from __future__ import annotations

import urllib.request
from array import array
from typing import Any

from aserve.runtime import Model, TensorSpec

try:
    from opentelemetry import baggage, propagate, trace
except ImportError:  # serves untraced (the bundled examples load wherever aserve runs)
    baggage = propagate = trace = None  # type: ignore[assignment]

tracer = trace.get_tracer(__name__) if trace is not None else None
DEFAULT_SCALE = 2.0


class Scaler(Model):
    inputs = (TensorSpec("X", "FP32", (-1, 4)),)
    outputs = (TensorSpec("Y", "FP32", (-1, 4)),)
    tensor_format = "memoryview"

    def load(self) -> None:
        self.url = self.parameters.get("feature_url")

    def __call__(self, inputs: dict[str, Any]) -> dict[str, Any]:
        x = inputs["X"].cast("B").cast("f")
        if tracer is None:
            scale = self.scale()
            return {"Y": memoryview(array("f", [v * scale for v in x])).cast("B")}
        with tracer.start_as_current_span("fetch scale", kind=trace.SpanKind.CLIENT) as span:
            scale = self.scale()
            span.set_attribute("scale", scale)
        with tracer.start_as_current_span("scale rows") as span:
            span.set_attribute("rows", len(x) // 4)
            tenant = baggage.get_baggage("tenant")
            if tenant is not None:
                span.set_attribute("tenant", str(tenant))
            y = array("f", [v * scale for v in x])
        return {"Y": memoryview(y).cast("B")}

    def scale(self) -> float:
        if not self.url:
            return DEFAULT_SCALE
        headers: dict[str, str] = {}
        if propagate is not None:
            propagate.inject(headers)  # the current span's traceparent, its tracestate, the baggage
        with urllib.request.urlopen(urllib.request.Request(self.url, headers=headers), timeout=5) as r:
            return float(r.read())
