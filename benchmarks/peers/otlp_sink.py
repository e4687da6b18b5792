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


def make_app() -> web.Application:
    app = web.Application(client_max_size=64 << 20)
    app.router.add_post("/v1/traces", traces)
    return app


def main() -> None:
    args = _web.arguments(__doc__ or "", model=False)
    _web.run(make_app(), host=args.host, port=args.port)


if __name__ == "__main__":
    main()
