"""glibc tunables the private engine needs, applied by re-executing the process.

glibc reads GLIBC_TUNABLES once, at process start: more link-map namespaces
(glibc.rtld.nns) and more optional static TLS (each libpython copy and torch take
some) cannot be granted later. So a process that will open private interpreters
re-executes itself once, early, with them set.
"""

from __future__ import annotations

import logging
import os
import sys

from .. import _native

log = logging.getLogger("aserve.engine")

REQUIRED = {"glibc.rtld.nns": "16", "glibc.rtld.optional_static_tls": "65536"}


def _parse(value: str | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in (value or "").split(":"):
        if "=" in item:
            k, v = item.split("=", 1)
            out[k] = v
    return out


def merged(value: str | None) -> str:
    """GLIBC_TUNABLES with the required tunables added (user settings kept)."""
    have = _parse(value)
    for k, v in REQUIRED.items():
        have.setdefault(k, v)
    return ":".join(f"{k}={v}" for k, v in have.items())


def in_effect() -> bool:
    """Whether the process started with the tunables the private engine needs."""
    have = _parse(_native.tunables_at_start())
    return all(k in have for k in REQUIRED)


def ensure_glibc_tunables() -> None:
    """Re-execute this process once with the tunables, if it did not start with them.

    Call it first thing in a program that will use the private engine; it never
    returns when it re-executes. Set ASERVE_NO_REEXEC=1 to forbid it (the private
    engine then works with fewer interpreters).
    """
    if not sys.platform.startswith("linux") or in_effect() or os.environ.get("ASERVE_NO_REEXEC") == "1":
        return
    if os.environ.get("ASERVE_REEXECED") == "1":
        log.warning("GLIBC_TUNABLES still not in effect after re-exec; private interpreters are limited")
        return
    env = dict(os.environ)
    env["GLIBC_TUNABLES"] = merged(env.get("GLIBC_TUNABLES"))
    env["ASERVE_REEXECED"] = "1"
    argv = list(getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv])
    sys.stdout.flush()
    sys.stderr.write(f"aserve: re-executing with GLIBC_TUNABLES={env['GLIBC_TUNABLES']} for private interpreters\n")
    sys.stderr.flush()
    os.execve(sys.executable, argv, env)
