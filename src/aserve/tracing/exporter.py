"""The trace exporter: a model loaded in an interpreter of its own, where the OpenTelemetry SDK runs.

It takes a batch of spans as the loop recorded them (msgpack, see recorder.py), makes
each an SDK `ReadableSpan` of the server's resource and instrumentation scope, and
hands it to a `BatchSpanProcessor` over the OTLP/HTTP exporter, both configured by the
OTEL_* variables passed as the model's `env` parameter (`OTEL_EXPORTER_OTLP_*`,
`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_BSP_*`). The processor's thread
and the HTTP requests run under this interpreter's GIL, never the event loop's. With
FLUSH set it sends everything before answering (at shutdown).
"""

from __future__ import annotations

import os
from typing import Any

from aserve.runtime import Model, TensorSpec


class TraceExporter(Model):
    inputs = (TensorSpec("SPANS", "UINT8", (-1,)), TensorSpec("FLUSH", "INT32", (1,)))
    outputs = (TensorSpec("EXPORTED", "INT64", (1,)),)

    def load(self) -> None:
        os.environ.update(self.parameters.get("env", {}))
        import msgspec
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import Event, ReadableSpan
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope
        from opentelemetry.trace.status import Status, StatusCode

        self._decode = msgspec.msgpack.Decoder().decode
        self._api = trace
        self._Event, self._ReadableSpan, self._Status, self._StatusCode = Event, ReadableSpan, Status, StatusCode
        self._resource = Resource.create()
        self._scope = InstrumentationScope("aserve", self.parameters.get("version", ""))
        self._processor = BatchSpanProcessor(OTLPSpanExporter())

    def _context(self, trace_hi: int, trace_lo: int, span_id: int, remote: bool = False) -> Any:
        api = self._api
        return api.SpanContext(trace_id=(trace_hi << 64) | trace_lo, span_id=span_id, is_remote=remote,
                               trace_flags=api.TraceFlags(api.TraceFlags.SAMPLED))

    def _span(self, r: list[Any]) -> Any:
        (trace_hi, trace_lo, span_id, parent_id, remote, name, kind, start, end, attributes, status, message,
         events, links) = r
        api = self._api
        parent = self._context(trace_hi, trace_lo, parent_id, remote) if parent_id else None
        code = (self._StatusCode.UNSET, self._StatusCode.OK, self._StatusCode.ERROR)[status]
        return self._ReadableSpan(
            name=name,
            context=self._context(trace_hi, trace_lo, span_id),
            parent=parent,
            resource=self._resource,
            attributes=attributes,
            events=[self._Event(n, attributes=a, timestamp=t) for n, t, a in events],
            links=[api.Link(self._context(h, lo, s), attributes=a) for h, lo, s, a in links],
            kind=api.SpanKind(kind),
            status=self._Status(code, message or None) if code == self._StatusCode.ERROR else self._Status(code),
            start_time=start,
            end_time=end,
            instrumentation_scope=self._scope,
        )

    def __call__(self, inputs: dict[str, Any]) -> dict[str, Any]:
        payload = bytes(inputs["SPANS"])
        spans = self._decode(payload) if payload else []
        for r in spans:
            self._processor.on_end(self._span(r))
        if inputs["FLUSH"][0]:
            self._processor.force_flush()
        return {"EXPORTED": [len(spans)]}
