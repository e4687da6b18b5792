"""The `aserve` command: `aserve serve [REPOSITORY]`."""

from __future__ import annotations

import argparse
import pathlib
import sys
from collections.abc import Sequence
from typing import Any

from .config import ServerSettings, Setting, SettingsError, load_settings, settings_fields
from .logs import configure


def bundled_examples() -> pathlib.Path | None:
    """The repository's examples/ folder (src/aserve/../../examples), if this is a source checkout."""
    here = pathlib.Path(__file__).resolve().parent
    candidate = here.parent.parent / "examples"
    return candidate if candidate.is_dir() else None


def _default_text(setting: Setting) -> str:
    v = setting.default
    if v is None or v == []:
        return "none"
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, int) and setting.name.endswith("_bytes") and v >= 1 << 20 and v % (1 << 20) == 0:
        return f"{v} = {v >> 20} MiB"
    return str(v)


def setting_help(setting: Setting) -> str:
    """A setting's --help text: its description, default and environment variable."""
    variable = setting.variable + (", comma-separated" if setting.kind is list else "")
    return f"{setting.description} (default {_default_text(setting)}; {variable})".replace("%", "%%")


def setting_flag(setting: Setting) -> str | None:
    """A setting's command-line flag, None for one that has none."""
    flag: str | None = setting.extra.get("flag", "--" + setting.name.replace("_", "-"))
    return flag


def settings_table() -> str:
    """Every setting as a Markdown table: flag, variable, default, what (`aserve settings`;
    docs/settings.md is its output, and a test keeps the two the same)."""
    rows = ["| flag | variable | default | what |", "| --- | --- | --- | --- |"]
    for setting in settings_fields():
        if setting.kind is dict:  # nested tables ([tracing]) are the file's only
            continue
        flag = setting_flag(setting)
        shown = "`aserve serve PATH`" if flag is None else f"`{flag}`"
        if flag is not None and setting.kind is bool:
            shown += f", `--no-{flag[2:]}`"
        variable = setting.variable + (" (comma-separated)" if setting.kind is list else "")
        description = setting.description.replace("|", "\\|")
        rows.append(f"| {shown} | `{variable}` | {_default_text(setting)} | {description} |")
    return "\n".join(rows) + "\n"


def _add_setting_flags(p: argparse.ArgumentParser) -> None:
    """One flag per field of ServerSettings (nested tables such as [tracing] are the file's only)."""
    groups: dict[str, argparse._ArgumentGroup] = {}
    for setting in settings_fields():
        flag = setting_flag(setting)
        if flag is None or setting.kind is dict:
            continue
        group = setting.extra.get("group")
        target: argparse.ArgumentParser | argparse._ArgumentGroup = p
        if group is not None:
            target = groups.get(group) or groups.setdefault(group, p.add_argument_group(group))
        options: dict[str, Any] = {"dest": setting.name, "help": setting_help(setting)}
        if setting.kind is bool:
            options.update(action=argparse.BooleanOptionalAction, default=None)
        elif setting.kind is list:
            options.update(action="append")
        else:
            options.update(type=setting.kind)
        if "choices" in setting.extra:
            options["choices"] = setting.extra["choices"]
        if "metavar" in setting.extra:
            options["metavar"] = setting.extra["metavar"]
        target.add_argument(flag, **options)


def _serve_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("serve", help="serve a model repository over HTTP",
                       description="Serve a model repository (Open Inference Protocol V2 and TF-Serving REST). "
                                   "Every flag also reads from the --config TOML file and ASERVE_<NAME> variables; "
                                   "flags win.")
    p.add_argument("repository", nargs="?",
                   help="model repository folder (default: the bundled examples/; ASERVE_REPOSITORY)")
    _add_setting_flags(p)
    p.add_argument("--config", help="TOML file with server settings (keys are the setting names)")
    p.add_argument("--supervise", action="store_true",
                   help="run the server as a child of a small supervisor that restarts it (with back-off) when it "
                        "dies, e.g. of a crash in a model's native code, and passes SIGTERM/SIGINT/SIGHUP on")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="aserve", description="Single-process Python model server")
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    sub.add_parser("settings", help="print every server setting (flag, variable, default) as a Markdown table",
                   description="Print every setting of `aserve serve` as a Markdown table, from the settings "
                               "themselves: docs/settings.md is this output.")
    return parser


def settings_from_args(args: argparse.Namespace) -> ServerSettings:
    overrides = {setting.name: getattr(args, setting.name, None) for setting in settings_fields()}
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
    from .fds import raise_limit

    raise_limit()  # before the re-exec, which keeps it: --max-connections's default follows from it
    ensure_glibc_tunables()
    try:
        settings = settings_from_args(args)
        repository = _repository(settings)
    except SettingsError as e:
        print(f"aserve: {e}", file=sys.stderr)
        return 2
    configure(settings.log_level, settings.log_format)

    # the server, its event loop and the engine load only once the tunables are in effect
    import uvloop

    from .repository import RepositoryError
    from .server import serve

    try:
        uvloop.run(serve(settings, repository=repository))
    except RepositoryError as e:
        print(f"aserve: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        where = getattr(e, "address", None) or f"{settings.host}:{settings.port}"  # the gRPC front names its own
        print(f"aserve: cannot listen on {where}: {e.strerror or e}", file=sys.stderr)
        return 1
    return 0


def _supervise(args: argparse.Namespace, argv: Sequence[str]) -> int:
    # before the tunables' re-exec and any interpreter: the supervisor only spawns and waits
    try:
        settings = settings_from_args(args)
    except SettingsError as e:
        print(f"aserve: {e}", file=sys.stderr)
        return 2
    from .supervise import supervise  # the supervisor only spawns and waits: it loads no server

    configure(settings.log_level, settings.log_format)
    return supervise([a for a in argv if a != "--supervise"], host=settings.host, port=settings.port)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "settings":
        sys.stdout.write(settings_table())
        return 0
    if args.supervise:
        return _supervise(args, sys.argv[1:] if argv is None else argv)
    return _serve(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
