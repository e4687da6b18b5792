"""The `aserve` command: `aserve serve [REPOSITORY]`."""

from __future__ import annotations

import argparse
import pathlib
import sys
from collections.abc import Sequence

from .config import ENGINE_CHOICES, LOG_FORMATS, LOG_LEVELS, ServerSettings, SettingsError, load_settings


def bundled_examples() -> pathlib.Path | None:
    """The repository's examples/ folder (src/aserve/../../examples), if this is a source checkout."""
    here = pathlib.Path(__file__).resolve().parent
    candidate = here.parent.parent / "examples"
    return candidate if candidate.is_dir() else None


def _serve_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("serve", help="serve a model repository over HTTP",
                       description="Serve a model repository (Open Inference Protocol V2 and TF-Serving REST). "
                                   "Every flag also reads from the --config TOML file and ASERVE_<NAME> variables; "
                                   "flags win.")
    p.add_argument("repository", nargs="?", help="model repository folder (default: the bundled examples/)")
    p.add_argument("--host", help="address to listen on (default 127.0.0.1; ASERVE_HOST)")
    p.add_argument("--port", type=int, help="TCP port (default 8000; 0 = any free port; ASERVE_PORT)")
    p.add_argument("--engine", choices=ENGINE_CHOICES,
                   help="engine for models whose config names none (default auto; ASERVE_ENGINE)")
    p.add_argument("--interpreters", type=int, help="interpreters per engine pool (default: CPU count)")
    p.add_argument("--max-body-bytes", type=int, dest="max_body_bytes",
                   help="largest request body (default 64 MiB; larger gets 413)")
    p.add_argument("--shutdown-timeout", type=float, dest="shutdown_timeout_s",
                   help="on SIGTERM, longest wait for accepted requests (seconds, default 60)")
    p.add_argument("--access-log", action=argparse.BooleanOptionalAction, default=None,
                   help="log every request in the common log format (default off; ASERVE_ACCESS_LOG)")
    p.add_argument("--log-format", choices=LOG_FORMATS, dest="log_format",
                   help="text (default) or json: one object per line, with trace_id/span_id when tracing")
    p.add_argument("--backlog", type=int, help="connections the kernel queues before they are accepted (default 1024)")
    p.add_argument("--repository-poll-seconds", type=float, dest="repository_poll_s",
                   help="rescan the repository every N seconds: new versions load, changed ones reload, removed "
                        "ones unload (default 0: only on SIGHUP and load requests)")
    p.add_argument("--model-name", dest="model_name",
                   help="serve REPOSITORY itself as one model of this name: it holds model.py, model.pt, "
                        "config.toml or numbered version folders, as KServe's storage initializer leaves "
                        "/mnt/models (without it, a REPOSITORY holding model.py or model.pt is one model named "
                        "after the folder; ASERVE_MODEL_NAME)")
    p.add_argument("--drain-seconds", type=float, dest="drain_s",
                   help="on SIGTERM, answer /v2/health/ready with 503 and keep serving for this long before the "
                        "listener closes, so that load balancers take the server out first; SIGUSR1 begins the "
                        "drain early, e.g. from a preStop hook (default 0; ASERVE_DRAIN_S)")
    p.add_argument("--spin-us", type=int, dest="spin_us",
                   help="microseconds an interpreter that ran out of work polls for the next batch, and the loop "
                        "for a running batch's answer, before blocking: halves latency at low load for CPU that "
                        "would idle (default 200; 0 = always block; ASERVE_SPIN_US)")
    limits = p.add_argument_group("errors, limits and access")
    limits.add_argument("--expose-model-errors", action=argparse.BooleanOptionalAction, default=None,
                        dest="expose_model_errors",
                        help="send a model's own exception message to clients (default: on when bound to loopback, "
                             "off otherwise; then clients get an error id to find in the log)")
    limits.add_argument("--admin-token", dest="admin_token",
                        help="bearer token for /v2/repository/... and trace settings (ASERVE_ADMIN_TOKEN: prefer the "
                             "variable, flags show in the process list)")
    limits.add_argument("--api-token", dest="api_token",
                        help="bearer token for inference and metadata; health and /metrics stay open "
                             "(ASERVE_API_TOKEN)")
    limits.add_argument("--cors-origin", action="append", dest="cors_origins", metavar="ORIGIN",
                        help="let browser pages from ORIGIN (https://host[:port], or *) call the server; repeatable "
                             "(ASERVE_CORS_ORIGINS: comma-separated; default: no CORS)")
    limits.add_argument("--max-header-bytes", type=int, dest="max_header_bytes",
                        help="longest request line and header field (default 8190; longer gets 431)")
    limits.add_argument("--max-connections", type=int, dest="max_connections",
                        help="connections served at once; the requests of more get 503 (default 0: no limit)")
    limits.add_argument("--keepalive-timeout", type=float, dest="keepalive_timeout_s",
                        help="close a connection idle for this many seconds (default 75)")
    limits.add_argument("--wire-front", action=argparse.BooleanOptionalAction, default=None, dest="wire_front",
                        help="answer plain HTTP/1.1 infer and predict requests with aserve's own HTTP parser, "
                             "everything else with aiohttp (default on; --no-wire-front: aiohttp for every request)")
    limits.add_argument("--request-timeout", type=float, dest="request_timeout_s",
                        help="seconds a client has to send a whole request, headers and body; slower gets 408 "
                             "(default 60; 0 = no limit)")
    p.add_argument("--config", help="TOML file with server settings (keys are the setting names)")
    p.add_argument("--log-level", choices=LOG_LEVELS, dest="log_level", help="default info (ASERVE_LOG_LEVEL)")
    p.add_argument("--supervise", action="store_true",
                   help="run the server as a child of a small supervisor that restarts it (with back-off) when it "
                        "dies, e.g. of a crash in a model's native code, and passes SIGTERM/SIGINT/SIGHUP on")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="aserve", description="Single-process Python model server")
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    return parser


def settings_from_args(args: argparse.Namespace) -> ServerSettings:
    overrides = {
        name: getattr(args, name, None)
        for name in ("repository", "host", "port", "engine", "interpreters", "max_body_bytes",
                     "shutdown_timeout_s", "access_log", "log_level", "backlog", "log_format",
                     "repository_poll_s", "model_name", "drain_s", "spin_us")
    }
    overrides.update({name: getattr(args, name, None) for name in (
        "expose_model_errors", "admin_token", "api_token", "cors_origins", "max_header_bytes", "max_connections",
        "keepalive_timeout_s", "request_timeout_s", "wire_front")})
    return load_settings(file=args.config, overrides=overrides)


def _repository(settings: ServerSettings) -> pathlib.Path:
    if settings.repository:
        return pathlib.Path(settings.repository)
    bundled = bundled_examples()
    if bundled is None:
        raise SettingsError(
            "no model repository given and the bundled examples/ folder is not next to this installation "
            "(it ships with source checkouts only): run `aserve serve PATH`"
        )
    return bundled


def _serve(args: argparse.Namespace) -> int:
    # Private interpreters need glibc tunables at process start: re-execute now, before anything else.
    from .engine import ensure_glibc_tunables

    ensure_glibc_tunables()
    try:
        settings = settings_from_args(args)
        repository = _repository(settings)
    except SettingsError as e:
        print(f"aserve: {e}", file=sys.stderr)
        return 2
    from .logs import configure

    configure(settings.log_level, settings.log_format)

    import uvloop

    from .repository import RepositoryError
    from .server import serve

    try:
        uvloop.run(serve(settings, repository=repository))
    except RepositoryError as e:
        print(f"aserve: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"aserve: cannot listen on {settings.host}:{settings.port}: {e.strerror or e}", file=sys.stderr)
        return 1
    return 0


def _supervise(args: argparse.Namespace, argv: Sequence[str]) -> int:
    # before the tunables' re-exec and any interpreter: the supervisor only spawns and waits
    try:
        settings = settings_from_args(args)
    except SettingsError as e:
        print(f"aserve: {e}", file=sys.stderr)
        return 2
    from .logs import configure
    from .supervise import supervise

    configure(settings.log_level, settings.log_format)
    return supervise([a for a in argv if a != "--supervise"], host=settings.host, port=settings.port)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.supervise:
        return _supervise(args, sys.argv[1:] if argv is None else argv)
    return _serve(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
