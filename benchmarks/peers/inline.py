"""Inline: aiohttp + uvloop decoding the V2 request and running the model in the handler.

The plainest Python server one would write: one process, one event loop, the model
called on the loop's thread between reading the request and writing the answer (no
batching, no worker). JSON and the binary tensor extension in, V2 JSON or binary out.

    python -m benchmarks.peers.inline --port 8002 --model simple
    python -m benchmarks.peers.inline --port 8002 --model mlp --model-py examples/mlp/model.py
"""

from __future__ import annotations

import json
from collections.abc import Callable

from aiohttp import web

from . import _web, models, v2

HEADER_LENGTH = "Inference-Header-Content-Length"


def make_app(model: str, run: Callable[[dict[str, v2.Tensor]], dict[str, v2.Tensor]]) -> web.Application:
    async def infer(request: web.Request) -> web.Response:
        if request.match_info["model"] != model:
            return _error(404, f"this server serves model {model!r} only")
        body = await request.read()
        length = request.headers.get(HEADER_LENGTH)
        try:
            decoded = v2.decode_request(body, int(length) if length else None)
            models.validate(model, decoded.inputs)
        except (v2.BadRequest, ValueError) as e:
            return _error(400, str(e))
        payload, head = v2.encode_response(model, run(decoded.inputs), binary=decoded.binary_output)
        if head is None:
            return web.Response(body=payload, content_type="application/json")
        return web.Response(body=payload, content_type="application/octet-stream",
                            headers={HEADER_LENGTH: str(head)})

    app = web.Application()
    app.router.add_post("/v2/models/{model}/infer", infer)
    return app


def _error(status: int, message: str) -> web.Response:
    return web.Response(status=status, body=json.dumps({"error": message}).encode(),
                        content_type="application/json")


def runner(model: str, model_py: str | None) -> Callable[[dict[str, v2.Tensor]], dict[str, v2.Tensor]]:
    """The function the handler calls on one request's inputs."""
    if model == "simple":
        return models.simple
    if not model_py:
        raise SystemExit("inline: --model mlp needs --model-py (examples/mlp/model.py)")
    mlp = models.MLP(model_py)
    return lambda inputs: mlp([inputs])[0]


def main() -> None:
    args = _web.arguments(__doc__ or "", model=True)
    _web.run(make_app(args.model, runner(args.model, args.model_py)), host=args.host, port=args.port)

if __name__ == "__main__":
    main()
