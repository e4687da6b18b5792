"""The ceiling: aiohttp + uvloop, one POST route that reads the body and answers a fixed body.

No decoding, no model, no batching: what one event loop on one core can answer, the
bound every other server's requests/s is compared with in `benchmarks.http`.

    python -m benchmarks.peers.ceiling --port 8001
"""

from __future__ import annotations

from aiohttp import web

from . import _web

BODY = b'{"model_name":"ceiling","outputs":[]}'


async def infer(request: web.Request) -> web.Response:
    await request.read()
    return web.Response(body=BODY, content_type="application/json")


def make_app() -> web.Application:
    app = web.Application()
    app.router.add_post("/v2/models/{model}/infer", infer)
    return app


def main() -> None:
    args = _web.arguments(__doc__ or "", model=False)
    _web.run(make_app(), host=args.host, port=args.port)


if __name__ == "__main__":
    main()
