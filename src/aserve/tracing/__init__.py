"""OpenTelemetry traces of every request: recorded on the loop, sent from an interpreter of their own.

Spans per sampled request (a W3C `traceparent` header continues the caller's trace):
the server span of the HTTP request, with children `decode`, `queue` (from arrival to
dispatch) and `encode`; per batch, a span of its own (its own trace, linked to the
request spans it serves) with a child for the run in the interpreter, timed by the
native worker's clock, and under that the spans model code opened with
`aserve.runtime.span`. See recorder.py for how this stays cheap, config.py for when it
is on.
"""

from __future__ import annotations

import asyncio
import logging
import pathlib
from typing import Any

from .. import __version__
from .._native import RequestTrace
from ..engine import ModelSpec, Pool
from ..errors import AserveError, EngineError
from ..tensor import Tensor
from .config import Resolved, TracingSettings, resolve
from .recorder import ERROR, INTERNAL, OK, SERVER, UNSET, Tracer, parse_traceparent, traceparent

__all__ = [
    "ERROR", "INTERNAL", "OK", "SERVER", "UNSET", "RequestTrace", "Resolved", "Tracer", "Tracing",
    "TracingSettings", "parse_traceparent", "resolve", "traceparent",
]

log = logging.getLogger("aserve.tracing")
EXPORTER = "aserve-trace-exporter"


class Tracing:
    """The tracer and the interpreter its exporter runs in; `start()` returns the tracer or None when off."""

    def __init__(self, settings: TracingSettings) -> None:
        self.settings = settings
        self.tracer: Tracer | None = None
        self._pool: Any = None

    async def start(self) -> Tracer | None:
        resolved = resolve(self.settings)
        if resolved is None:
            return None
        for engine in ("private", "main"):  # its own GIL where private interpreters exist
            pool = Pool(engine=engine, interpreters=1)
            try:
                await pool.start()
                await pool.load(ModelSpec(name=EXPORTER, path=str(pathlib.Path(__file__).with_name("exporter.py")),
                                          parameters={"env": resolved.exporter_env, "version": __version__,
                                                      "own_gc": engine == "private"}))
            except AserveError as e:
                await pool.close()
                log.warning("tracing: the exporter cannot run in a %s interpreter: %s", engine, e)
                continue
            self._pool = pool
            break
        else:
            log.error("tracing is off: no interpreter could load the OpenTelemetry exporter "
                      "(install aserve[otel]: opentelemetry-sdk, opentelemetry-exporter-otlp-proto-http)")
            return None
        self.tracer = Tracer(resolved, export=self.export)
        log.info("tracing on: sampler %s (ratio %g), exporting from a %s interpreter", resolved.sampler,
                 resolved.ratio, self._pool.engine)
        return self.tracer

    def export(self, payload: bytes) -> asyncio.Future[Any]:
        """Hand one message of recorded spans (a loop's `Tracer.flush`) to the exporter; the
        future of how many records it sent."""
        if self._pool is None:
            raise EngineError("tracing is off: no exporter runs")
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        def done(outputs: Any, error: BaseException | None, *_: Any) -> None:
            if future.done():
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(memoryview(outputs["EXPORTED"].data).cast("q")[0])

        self._pool.run(EXPORTER, [Tensor("UINT8", (len(payload),), payload)], done)
        return future

    async def close(self) -> None:
        """Send every span recorded, then close the exporter's interpreter."""
        if self._pool is None:
            return
        try:
            if self.tracer is not None:
                await asyncio.wait_for(self.tracer.drain(), 30)
        except Exception as e:  # noqa: BLE001 - closing goes on
            log.warning("tracing: the last spans could not be sent: %s", e)
        finally:
            await self._pool.close()
            self._pool = None
