"""An OTLP/HTTP trace receiver that accepts and drops everything: where a traced aserve sends
its spans in `benchmarks.http` (the collector's own cost is not aserve's).

    python -m benchmarks.peers.otlp_sink --port 4318
"""

from __future__ import annotations

from aiohttp import web

from . import _web


async def traces(request: web.Request) -> web.Response:
    await request.read()
    return web.Response(body=b"", content_type="application/x-protobuf")  # an empty ExportTraceServiceResponse


def main() -> None:
    _web.serve_one_route(__doc__ or "", "/v1/traces", traces, client_max_size=64 << 20)


if __name__ == "__main__":
    main()
