"""Server settings: one frozen Struct, filled from defaults, a TOML file, ASERVE_* variables and flags.

Precedence, lowest first: field defaults, the TOML file (`--config`), environment
variables (`ASERVE_<FIELD>` in upper case, e.g. ASERVE_PORT), then command-line flags.
Only the CLI reads argv; everything else receives a `ServerSettings`. The CLI makes its
flags from the fields (`settings_fields`): help from each field's description, the
default from the field's, and from the field's `extra` metadata where the flag differs
from `--field-name`: `flag` (its spelling; None: no flag), `choices`, `group` (a section
of `--help`) and `metavar`.
"""

from __future__ import annotations

import ipaddress
import os
import pathlib
import sys
from collections.abc import Mapping
from typing import Annotated, Any, NamedTuple

import msgspec
import msgspec.inspect as mi

from . import cpus, fds
from .tracing.config import TracingSettings

ENGINE_CHOICES = ("auto", "private", "subinterp", "main")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
LOG_FORMATS = ("text", "json")
FRONT_BATCHING = ("pool", "loop")
ENV_PREFIX = "ASERVE_"
ACCESS = "errors, limits and access"  # a section of `aserve serve --help`
GRPC_CONNECTIONS = "gRPC connections"  # another


class SettingsError(ValueError):
    """A setting has a wrong name, type or value; the message names the source and field."""


def _doc(text: str, **extra: Any) -> Any:
    return msgspec.Meta(description=text, extra=extra or None)


class ServerSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Everything the server reads at start; each field is also ASERVE_<FIELD>."""

    repository: Annotated[
        str | None, _doc("model repository folder; None = the bundled examples/", flag=None)  # the positional
    ] = None
    host: Annotated[str, _doc("address to listen on")] = "127.0.0.1"
    port: Annotated[int, msgspec.Meta(ge=0, le=65535, description="TCP port (0 = any free port)")] = 8000
    grpc_port: Annotated[
        int, msgspec.Meta(ge=0, le=65535, description="TCP port of the gRPC front (Open Inference Protocol and "
                                                      "Triton's gRPC service; 0 = any free port)")
    ] = 8001
    grpc: Annotated[bool, _doc("serve gRPC on --grpc-port beside HTTP (--no-grpc: HTTP only)")] = True
    # ---- the gRPC front's connections (bounded as gRPC's servers bound them; keepalive as gRPC's and Triton's defaults) ----
    grpc_max_concurrent_streams: Annotated[
        int, msgspec.Meta(ge=1, description="calls open at once on one gRPC connection; a client's next call waits "
                                            "for one to end", extra={"group": GRPC_CONNECTIONS})
    ] = 100
    grpc_max_connection_idle_s: Annotated[
        float, msgspec.Meta(ge=0, description="a gRPC connection with no call open for this many seconds is sent "
                                              "GOAWAY (its client reconnects on its next call; 0 = never)",
                            extra={"flag": "--grpc-max-connection-idle", "group": GRPC_CONNECTIONS})
    ] = 300.0
    grpc_max_connection_age_s: Annotated[
        float, msgspec.Meta(ge=0, description="a gRPC connection this many seconds old is sent GOAWAY: its client "
                                              "reconnects, e.g. to another replica behind an L4 balancer (0 = never)",
                            extra={"flag": "--grpc-max-connection-age", "group": GRPC_CONNECTIONS})
    ] = 0.0
    grpc_max_connection_age_grace_s: Annotated[
        float, msgspec.Meta(ge=0, description="after that GOAWAY, seconds the calls still open get before the "
                                              "connection is closed",
                            extra={"flag": "--grpc-max-connection-age-grace", "group": GRPC_CONNECTIONS})
    ] = 60.0
    grpc_keepalive_time_s: Annotated[
        float, msgspec.Meta(gt=0, description="seconds between the server's pings on a gRPC connection with a call "
                                              "open (on any, with --grpc-keepalive-permit-without-calls): they find "
                                              "a client that went away without closing it",
                            extra={"flag": "--grpc-keepalive-time", "group": GRPC_CONNECTIONS})
    ] = 7200.0
    grpc_keepalive_timeout_s: Annotated[
        float, msgspec.Meta(gt=0, description="a gRPC connection whose client does not answer a ping within this "
                                              "many seconds is closed",
                            extra={"flag": "--grpc-keepalive-timeout", "group": GRPC_CONNECTIONS})
    ] = 20.0
    grpc_min_ping_interval_s: Annotated[
        float, msgspec.Meta(ge=0, description="a client's ping sooner than this many seconds after its last, while "
                                              "the server sends no data, is a strike",
                            extra={"flag": "--grpc-min-ping-interval", "group": GRPC_CONNECTIONS})
    ] = 300.0
    grpc_max_ping_strikes: Annotated[
        int, msgspec.Meta(ge=0, description="strikes a gRPC connection is allowed; the next is answered GOAWAY "
                                            "(too_many_pings) and the connection closed (0 = no limit)",
                          extra={"group": GRPC_CONNECTIONS})
    ] = 2
    grpc_keepalive_permit_without_calls: Annotated[
        bool, _doc("on gRPC connections with no call open, accept the client's pings and send the server's "
                   "(otherwise such a client's ping within two hours of its last is a strike)", group=GRPC_CONNECTIONS)
    ] = False
    engine: Annotated[
        str, _doc("default interpreter engine for models whose config names none", choices=ENGINE_CHOICES)
    ] = "auto"
    interpreters: Annotated[
        int, msgspec.Meta(ge=1, description="interpreters per engine pool; None = the CPUs this process may use "
                                            "(its affinity and cgroup CPU quota), for the private engine at most "
                                            "the link-map namespaces the front loops leave")
    ] | None = None
    loops: Annotated[
        int, msgspec.Meta(ge=0, le=14, description="event loops that serve connections beside the host's, each in "
                                                   "a private interpreter of its own (0 = the host's loop serves "
                                                   "every connection; loops and private interpreters together at "
                                                   "most 15); None = none on one CPU, then one per 4 CPUs this "
                                                   "process may use, at least 2 and at most 4")
    ] | None = None
    front_batching: Annotated[
        str, _doc("where the front loops' requests are batched: pool = one queue per model in the extension, "
                  "shared by every loop, batched by the window rule in C; loop = each front's own batcher, "
                  "whose batches meet in the pool's queue", choices=FRONT_BATCHING)
    ] = "pool"
    log_level: Annotated[str, _doc("least severe log record written", choices=LOG_LEVELS)] = "info"
    max_body_bytes: Annotated[
        int, msgspec.Meta(ge=1, description="largest request body accepted; larger ones get 413")
    ] = 64 * 1024 * 1024
    max_inflate_ratio: Annotated[
        int, msgspec.Meta(ge=0, description="a gzip or deflate request body that inflates to more than this many "
                                             "times its compressed size (past its first MiB) gets 413 as soon as it "
                                             "does, as Apache's DeflateInflateRatioLimit: a bomb is refused with "
                                             "little inflated (0 = no limit; --max-body-bytes still applies)",
                          extra={"group": ACCESS})
    ] = 200
    shutdown_timeout_s: Annotated[
        float, msgspec.Meta(ge=0, description="on SIGTERM, longest wait for accepted requests to finish (seconds)",
                            extra={"flag": "--shutdown-timeout"})
    ] = 60.0
    access_log: Annotated[bool, _doc("log one line per request, in the common log format (costs throughput)")] = False
    spin_us: Annotated[
        int, msgspec.Meta(ge=0, le=1_000_000, description="microseconds an interpreter's thread that ran out of "
                                                           "work polls for the next batch before it blocks, and the "
                                                           "event loop polls for a running batch's answer (low "
                                                           "latency at low load, for CPU that would otherwise idle; "
                                                           "kept on only where measured to pay; 0 = always block)")
    ] = 200
    colocate: Annotated[bool, _doc("while one client's requests come one at a time and their batches run under a "
                                   "millisecond, and nothing polls, hold the interpreters' threads and the event "
                                   "loop's to the CPU the loop runs on: the hand-offs between them stay on one CPU, "
                                   "which costs less CPU per request; without front loops (--loops 0) only")] = True
    spin_always: Annotated[bool, _doc("poll within spin_us whether or not it is measured to pay: the lowest latency "
                                      "at low load, whatever it costs in CPU")] = False
    log_format: Annotated[str, _doc("text, or json: one JSON object per line, with trace_id/span_id when tracing",
                                    choices=LOG_FORMATS)] = "text"
    tracing: Annotated[TracingSettings, _doc("the [tracing] table: OpenTelemetry traces (see aserve.tracing)")] = (
        TracingSettings()
    )
    backlog: Annotated[
        int, msgspec.Meta(ge=1, description="connections the kernel queues before the server accepts them")
    ] = 1024
    repository_poll_s: Annotated[
        float, msgspec.Meta(ge=0, description="rescan the repository every this many seconds: new versions load, "
                                              "changed ones reload, removed ones unload (0 = only on SIGHUP and "
                                              "load requests)", extra={"flag": "--repository-poll-seconds"})
    ] = 0.0
    # ---- what clients see, who may do what ----
    expose_model_errors: Annotated[
        bool | None, _doc("send a model's own exception message to the client (paths made relative); None = yes "
                          "when bound to loopback, no otherwise (the client gets an error id, the log the rest)",
                          group=ACCESS)
    ] = None
    admin_token: Annotated[
        str, msgspec.Meta(min_length=1, description="bearer token for the repository (index, load, unload) and "
                                                     "trace-setting endpoints; None = open (prefer the variable "
                                                     "to the flag: flags show in the process list)",
                          extra={"group": ACCESS})
    ] | None = None
    api_token: Annotated[
        str, msgspec.Meta(min_length=1, description="bearer token for inference and metadata (health and /metrics "
                                                     "stay open); None = open", extra={"group": ACCESS})
    ] | None = None
    cors_origins: Annotated[
        list[str], _doc("origins browsers may call from (CORS), e.g. https://app.example.com, or *; "
                        "empty = no CORS headers", flag="--cors-origin", metavar="ORIGIN", group=ACCESS)
    ] = []
    # ---- limits ----
    max_header_bytes: Annotated[
        int, msgspec.Meta(ge=256, description="longest request line and header field (name and value); longer "
                                               "gets 431", extra={"group": ACCESS})
    ] = 8190
    max_connections: Annotated[
        int, msgspec.Meta(ge=0, description="open HTTP connections served at once; beyond, a connection's request "
                                             "gets 503 and it is closed, and one that sends none within a second "
                                             "is closed (0 = no limit); None = what the descriptor limit leaves: "
                                             "the soft RLIMIT_NOFILE, raised to the hard limit at start, less an "
                                             "eighth of it (at least 128) kept for the process's other "
                                             "descriptors", extra={"group": ACCESS})
    ] | None = None
    keepalive_timeout_s: Annotated[
        float, msgspec.Meta(gt=0, description="an idle connection (between requests, or before its first) is "
                                               "closed after this many seconds",
                            extra={"flag": "--keepalive-timeout", "group": ACCESS})
    ] = 75.0
    request_timeout_s: Annotated[
        float, msgspec.Meta(ge=0, description="seconds a client has to send a whole request, headers and body, "
                                               "once it starts; slower gets 408 (0 = no limit)",
                            extra={"flag": "--request-timeout", "group": ACCESS})
    ] = 60.0
    model_name: Annotated[
        str | None, _doc("serve the repository folder itself as one model of this name (it holds model.py, "
                         "model.pt, config.toml or numbered version folders: KServe's /mnt/models); None = a "
                         "repository of model folders, or one model named after the folder when it holds "
                         "model.py or model.pt")
    ] = None
    drain_s: Annotated[
        float, msgspec.Meta(ge=0, description="on SIGTERM (or from SIGUSR1 on), answer /v2/health/ready with 503 "
                                              "and keep serving until this many seconds after the drain began, "
                                              "then close the listener (0 = close at once); SIGUSR1 begins the "
                                              "drain early, e.g. from a preStop hook",
                            extra={"flag": "--drain-seconds"})
    ] = 0.0

    def __post_init__(self) -> None:
        if self.engine not in ENGINE_CHOICES:
            raise SettingsError(f"engine: expected one of {', '.join(ENGINE_CHOICES)}, got {self.engine!r}")
        if self.log_level.lower() not in LOG_LEVELS:
            raise SettingsError(f"log_level: expected one of {', '.join(LOG_LEVELS)}, got {self.log_level!r}")
        if self.log_format not in LOG_FORMATS:
            raise SettingsError(f"log_format: expected one of {', '.join(LOG_FORMATS)}, got {self.log_format!r}")
        if self.front_batching not in FRONT_BATCHING:
            raise SettingsError(f"front_batching: expected one of {', '.join(FRONT_BATCHING)}, "
                                f"got {self.front_batching!r}")
        if self.interpreters and (self.engine == "private" or (self.engine == "auto" and sys.version_info < (3, 12))):
            self._fits_namespaces()  # the default engine is private: these flags cannot start
        for origin in self.cors_origins:
            if origin != "*" and not _is_origin(origin):
                raise SettingsError(f"cors_origins: expected * or an origin such as https://app.example.com "
                                    f"(scheme://host[:port], no path), got {origin!r}")

    def __repr__(self) -> str:  # the tokens stay out of logs and tracebacks
        shown = {f: getattr(self, f) for f in FIELDS}
        for secret in ("admin_token", "api_token"):
            if shown[secret] is not None:
                shown[secret] = "***"
        return f"ServerSettings({', '.join(f'{k}={v!r}' for k, v in shown.items())})"

    @property
    def model_errors_exposed(self) -> bool:
        """Whether a model's own exception message reaches the client (`expose_model_errors`,
        by default: only when the server listens on a loopback address)."""
        if self.expose_model_errors is not None:
            return self.expose_model_errors
        return is_loopback(self.host)

    @property
    def connection_limit(self) -> int:
        """Open HTTP connections served at once (`max_connections`, or what the descriptor
        limit leaves: `fds.connections`); 0: no limit."""
        return self.max_connections if self.max_connections is not None else fds.connections()

    @property
    def loop_count(self) -> int:
        """Front loops to start (`loops`, or the default for the CPUs available)."""
        return self.loops if self.loops is not None else default_loops(cpus.available())

    def _fits_namespaces(self) -> None:
        """SettingsError when `interpreters` private interpreters and the front loops need more
        link-map namespaces than glibc has (one each)."""
        interpreters, loops = self.interpreters or 0, self.loop_count
        if interpreters + loops > PRIVATE_NAMESPACES:
            raise SettingsError(
                f"interpreters: {interpreters} private interpreters and {loops} front loops (--loops) need "
                f"{interpreters + loops} link-map namespaces, one each, and glibc allows {PRIVATE_NAMESPACES}: "
                f"expected --interpreters of at most {max(0, PRIVATE_NAMESPACES - loops)} with {loops} loops, "
                "fewer --loops, or --engine subinterp (Python 3.12+)")

    def pool_size(self, engine: str) -> int:
        """Interpreters the pool of `engine` gets: `interpreters`, or one per CPU available.
        A private interpreter and a front loop each take one of glibc's link-map namespaces
        (PRIVATE_NAMESPACES in all), so by default the private pool takes at most what the
        front loops leave, not an interpreter count that fails to start on 16 CPUs or more; an
        explicit count that does not fit beside the loops is refused (SettingsError)."""
        if self.interpreters:
            if engine == "private":
                self._fits_namespaces()
            return self.interpreters
        n = cpus.available()
        if engine == "private":
            n = min(n, PRIVATE_NAMESPACES - self.loop_count)
        return max(1, n)


# glibc.rtld.nns=16 (engine/tunables.py) less the base namespace: _native.MAX_NAMESPACES
PRIVATE_NAMESPACES = 15


def default_loops(available: int) -> int:
    """Front loops by default: none on one CPU (a front would take the CPU the interpreters
    run on), then one per 4 CPUs, at least 2 and at most 4. One front alone serves less than
    the host's loop alone (it is one loop too, and every connection is handed to it), so where
    fronts pay there are two; on 2 CPUs two fronts serve a window-policy model more than the
    host's loop alone at every concurrency (docs/multiloop.md). Each takes a link-map namespace the private
    interpreters also need, and 4 loops carry several times what one does while leaving 11
    for interpreters."""
    return 0 if available < 2 else max(2, min(4, available // 4))


FIELDS: tuple[str, ...] = ServerSettings.__struct_fields__
LIST_FIELDS = ("cors_origins",)  # ASERVE_CORS_ORIGINS: comma-separated


class Setting(NamedTuple):
    """A field of `ServerSettings` as a command line or a manual presents it."""

    name: str
    kind: type  # str, int, float, bool, list (of str), or dict: a nested table such as [tracing]
    default: Any
    description: str
    extra: Mapping[str, Any]  # the field's metadata `extra` (see the module's docstring)

    @property
    def variable(self) -> str:
        """Its environment variable."""
        return ENV_PREFIX + self.name.upper()


def settings_fields() -> list[Setting]:
    """Every field of `ServerSettings`, in declaration order."""
    kinds: dict[type, type] = {mi.StrType: str, mi.IntType: int, mi.FloatType: float, mi.BoolType: bool,
                               mi.ListType: list, mi.StructType: dict}
    out = []
    info = mi.type_info(ServerSettings)
    assert isinstance(info, mi.StructType)
    for field in info.fields:
        t: mi.Type = field.type
        description = ""
        extra: dict[str, Any] = {}
        while True:  # Annotated[...] | None, Annotated[... | None], Annotated[Annotated[...]]
            if isinstance(t, mi.Metadata):
                description = (t.extra_json_schema or {}).get("description", description)
                extra = {**(t.extra or {}), **extra}
                t = t.type
            elif isinstance(t, mi.UnionType):
                (t,) = [m for m in t.types if not isinstance(m, mi.NoneType)]
            else:
                break
        kind = kinds.get(type(t))
        if kind is None:
            raise TypeError(f"ServerSettings.{field.name}: no command-line form for {t!r}")
        default = field.default if field.default is not msgspec.NODEFAULT else field.default_factory()
        out.append(Setting(field.name, kind, default, description, extra))
    return out


def is_loopback(host: str) -> bool:
    """True for an address only this machine reaches (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _is_origin(origin: str) -> bool:
    scheme, sep, rest = origin.partition("://")
    return bool(sep) and scheme in ("http", "https") and bool(rest) and "/" not in rest and " " not in rest


def _convert(values: Mapping[str, Any], source: str) -> dict[str, Any]:
    """Check `values` field by field so the error names the source and the field."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if key not in FIELDS:
            raise SettingsError(f"{source}: unknown setting {key!r}; expected one of {', '.join(FIELDS)}")
        out[key] = value
    try:
        msgspec.convert(out, ServerSettings, strict=False)
    except (msgspec.ValidationError, SettingsError) as e:
        raise SettingsError(f"{source}: {e}") from None
    return out


def from_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Settings from a TOML file (keys are the field names)."""
    p = pathlib.Path(path)
    try:
        data = msgspec.toml.decode(p.read_bytes())
    except OSError as e:
        raise SettingsError(f"{p}: cannot read settings file: {e.strerror}") from None
    except msgspec.DecodeError as e:
        raise SettingsError(f"{p}: invalid TOML: {e}") from None
    if not isinstance(data, dict):
        raise SettingsError(f"{p}: expected a table of settings")
    return _convert(data, str(p))


def from_env(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Settings from ASERVE_<FIELD> variables; other ASERVE_* variables are not settings and are ignored."""
    env = os.environ if environ is None else environ
    found: dict[str, Any] = {}
    for name in FIELDS:
        value = env.get(ENV_PREFIX + name.upper())
        if value is not None and value != "":
            found[name] = [v.strip() for v in value.split(",") if v.strip()] if name in LIST_FIELDS else value
    out: dict[str, Any] = {}
    for key, value in found.items():
        out.update(_convert({key: value}, f"environment variable {ENV_PREFIX}{key.upper()}"))
    return out


def load_settings(
    *, file: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> ServerSettings:
    """Merge defaults < file < environment < overrides (flags; None values are skipped)."""
    merged: dict[str, Any] = {}
    if file is not None:
        merged.update(from_file(file))
    merged.update(from_env(environ))
    if overrides:
        merged.update(_convert({k: v for k, v in overrides.items() if v is not None}, "command line"))
    try:
        return msgspec.convert(merged, ServerSettings, strict=False)
    except (msgspec.ValidationError, SettingsError) as e:  # pragma: no cover - each part was checked
        raise SettingsError(str(e)) from None
