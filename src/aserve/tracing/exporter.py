"""The trace exporter: a model loaded in an interpreter of its own, sending OTLP/HTTP.

It takes what the loop recorded (one msgpack message, see recorder.py): spans, and the
numeric records of requests, batches and links, which it turns into spans here, in its
own interpreter, with the table of route attributes the loop sends each entry of once.
It encodes them into one OTLP ExportTraceServiceRequest with `aserve._native.otlp_encode`
(about a microsecond a span, where the SDK's Python encoder takes forty), and sends it
with the OpenTelemetry SDK's OTLP/HTTP span exporter, which resolves the endpoint,
headers, timeout, compression, TLS files and retries from the OTEL_EXPORTER_OTLP_*
variables (passed as the model's `env` parameter). The resource is the SDK's
(`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, telemetry.sdk.*). All of it runs in
this interpreter, under its own GIL, never on the event loop.

The decoded spans are lists and dicts without cycles, freed by their reference counts;
the cyclic garbage collector, left on, traversed them again and again while a batch
was encoded (the largest share of this interpreter's time at full sampling, on a core
the event loop shares). So in an interpreter of its own (`own_gc`: not when it runs on
a thread of the host's) it is off, and a collection runs every COLLECT_EVERY exports
for whatever cycles the HTTP client leaves.
"""

from __future__ import annotations

import gc
import logging
import os
from array import array
from typing import Any

from aserve.runtime import Model, TensorSpec
from aserve.tracing.recorder import BATCH_FIELDS, INTERNAL, LINK_FIELDS, REQUEST_FIELDS, SERVER, UNSET

log = logging.getLogger("aserve.tracing")
COLLECT_EVERY = 256


class TraceExporter(Model):
    inputs = (TensorSpec("SPANS", "UINT8", (-1,)),)
    outputs = (TensorSpec("EXPORTED", "INT64", (1,)),)

    def load(self) -> None:
        os.environ.update(self.parameters.get("env", {}))
        import msgspec
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource

        from aserve._native import otlp_encode

        self._decode = msgspec.msgpack.Decoder().decode
        self._encode = otlp_encode
        self._resource = dict(Resource.create().attributes)
        self._version = str(self.parameters.get("version", ""))
        self._exporter = OTLPSpanExporter()
        self.failures = 0
        self.exports = 0
        self._table: list[Any] = []  # [span name, attributes] of the loop's table, by index
        self._own_gc = bool(self.parameters.get("own_gc", False))
        if self._own_gc:
            gc.collect()
            gc.freeze()  # what loading made stays out of every later collection
            gc.disable()

    def _send(self, data: bytes) -> bool:
        client = getattr(self._exporter, "_client", None)
        if client is not None:  # opentelemetry-exporter-otlp-proto-http >= 1.40
            return bool(client.export(data).success)
        response = self._exporter._export(data)  # type: ignore[attr-defined]  # older releases: retries by the caller
        return bool(getattr(response, "ok", False))

    def __call__(self, inputs: dict[str, Any]) -> dict[str, Any]:
        self.exports += 1
        if self._own_gc and self.exports % COLLECT_EVERY == 0:
            gc.collect()
        message = self._decode(bytes(inputs["SPANS"]))
        records = (len(message["spans"]) + len(message["requests"]) // (8 * REQUEST_FIELDS)
                   + len(message["batches"]) // (8 * BATCH_FIELDS))
        spans = self.spans(message)
        if spans and not self._send(self._encode(self._resource, "aserve", self._version, spans)):
            self.failures += 1
            log.warning("trace export: the collector refused or did not answer; %d spans dropped", len(spans))
            return {"EXPORTED": [0]}
        return {"EXPORTED": [records]}

    def spans(self, message: dict[str, Any]) -> list[Any]:
        """The spans of one message from the loop: those it recorded as spans, then one per
        request record (which the encoder writes with its decode, queue and encode
        children) and two per batch record (the batch, linked to its requests, and the
        run in the interpreter)."""
        table = self._table
        del table[message["table_from"]:]
        table.extend(message["table"])
        spans: list[Any] = message["spans"]
        r = array("Q", message["requests"])
        for i in range(0, len(r), REQUEST_FIELDS):
            (hi, lo, span_id, parent, remote, status, start, end, d0, d1, q0, q1, e0, e1, route, size, samples,
             compute, interpreter) = r[i:i + REQUEST_FIELDS]
            name, common = table[route]
            own: dict[str, Any] = {"http.response.status_code": status}
            batch = None
            if size:
                batch = {"aserve.batch_size": size, "aserve.batch_samples": samples, "aserve.compute_us": compute / 10}
                if interpreter:
                    batch["aserve.interpreter"] = interpreter - 1
                own["aserve.queue_us"] = round((q1 - q0) / 1e3, 1)
            spans.append([hi, lo, span_id, parent, bool(remote), name, SERVER, start, end, [common, batch, own],
                          UNSET, "", [], [], d0, d1, q0, q1, e0, e1])
        links: dict[int, list[Any]] = {}
        k = array("Q", message["links"])
        for i in range(0, len(k), LINK_FIELDS):
            links.setdefault(k[i], []).append([k[i + 1], k[i + 2], k[i + 3], None])
        b = array("Q", message["batches"])
        for i in range(0, len(b), BATCH_FIELDS):
            hi, lo, span_id, run_id, start, end, ran_from, ran_to, interpreter, size, samples, model = \
                b[i:i + BATCH_FIELDS]
            name, common = table[model]
            facts: dict[str, Any] = {"aserve.batch_size": size, "aserve.batch_samples": samples}
            where = {"aserve.interpreter": interpreter - 1} if interpreter else None
            spans.append([hi, lo, span_id, 0, False, name, INTERNAL, start, end, [common, facts, where], UNSET, "", [],
                          links.get(span_id, [])])
            if run_id:
                spans.append([hi, lo, run_id, span_id, False, "run in interpreter", INTERNAL, ran_from, ran_to,
                              [where, common], UNSET, "", [], []])
        return spans
