"""Running a peer's aiohttp application on uvloop, as `aserve serve` runs its own."""

from __future__ import annotations

import argparse
from typing import Any

from aiohttp import web


def arguments(description: str, *, model: bool) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    if model:
        p.add_argument("--model", required=True, choices=("simple", "mlp"))
        p.add_argument("--model-py", help="examples/mlp/model.py (for --model mlp)")
    return p.parse_args()


def serve_one_route(description: str, path: str, handler: Any, *, client_max_size: int = 1 << 20) -> None:
    """Serve one POST route, on the host and port of the command line (`main` of a peer)."""
    args = arguments(description, model=False)
    app = web.Application(client_max_size=client_max_size)
    app.router.add_post(path, handler)
    run(app, host=args.host, port=args.port)


def run(app: web.Application, *, host: str, port: int) -> None:
    """Serve until SIGTERM or SIGINT; no access log (neither does the benchmarked aserve)."""
    import uvloop

    web.run_app(app, host=host, port=port, access_log=None, print=None, backlog=1024,
                loop=uvloop.new_event_loop())
