"""The trace exporter: a model loaded in an interpreter of its own, sending OTLP/HTTP.

It takes what the loop recorded (one msgpack message, see recorder.py: spans, the
numeric records of requests, batches and links, and the new entries of the table of
shared attributes) and encodes it into one OTLP ExportTraceServiceRequest with
`aserve._native.otlp_encode`, which writes the numeric records as spans without making
Python objects of them. The OpenTelemetry SDK's OTLP/HTTP exporter sends it, configured
by the OTEL_EXPORTER_OTLP_* variables (the model's `env` parameter), with the SDK's
resource. None of it runs on the event loop.

In an interpreter of its own (`own_gc`) the cyclic garbage collector is off: the
decoded spans hold no cycles, and collections would walk them over and over while a
batch is encoded. A collection runs every COLLECT_EVERY exports, for what the HTTP client
leaves.
"""

from __future__ import annotations

import gc
import logging
import os
from typing import Any

import msgspec

from aserve._native import TRACE_BATCH_FIELDS, TRACE_REQUEST_FIELDS, otlp_encode
from aserve.runtime import Model, TensorSpec

log = logging.getLogger("aserve.tracing")
COLLECT_EVERY = 256


class TraceExporter(Model):
    inputs = (TensorSpec("SPANS", "UINT8", (-1,)),)
    outputs = (TensorSpec("EXPORTED", "INT64", (1,)),)

    def load(self) -> None:
        os.environ.update(self.parameters.get("env", {}))
        # here, not at the top: the SDK is optional (aserve[otel]), and it reads the OTEL_* variables set above
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource

        self._decode = msgspec.msgpack.Decoder().decode
        self._encode = otlp_encode
        self._resource = dict(Resource.create().attributes)
        self._version = str(self.parameters.get("version", ""))
        self._exporter = OTLPSpanExporter()
        self.failures = 0
        self.exports = 0
        self._tables: dict[int, list[Any]] = {}  # each loop's table: [span name, attributes] by index
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
        requests = len(message["requests"]) // (8 * TRACE_REQUEST_FIELDS)
        batches = len(message["batches"]) // (8 * TRACE_BATCH_FIELDS)
        records = len(message["spans"]) + requests + batches
        if records and not self._send(self.encode(message)):
            self.failures += 1
            log.warning("trace export: the collector refused or did not answer; %d records dropped", records)
            return {"EXPORTED": [0]}
        return {"EXPORTED": [records]}

    def encode(self, message: dict[str, Any]) -> bytes:
        """The OTLP request of one message from the loop: the spans it recorded as spans, then
        the numeric records, which the encoder writes as spans itself (a request as its server
        span with decode, queue and encode children; a batch as its span, linked to its
        requests, and the run in the interpreter), with the table of route attributes the
        loop sends each entry of once (each loop its own table: `source` says whose)."""
        table = self._tables.setdefault(message.get("source", 0), [])
        del table[message["table_from"]:]
        table.extend(message["table"])
        return self._encode(self._resource, "aserve", self._version, message["spans"],
                            (table, message["requests"], message["batches"], message["links"]))
