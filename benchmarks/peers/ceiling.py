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


def main() -> None:
    _web.serve_one_route(__doc__ or "", "/v2/models/{model}/infer", infer)


if __name__ == "__main__":
    main()
