"""aserve's benchmarks, run from the repository root as `python -m benchmarks.NAME [args]`
(or `./dev bench NAME [args]`): each module has `main(argv) -> int` and prints JSON records.

Not part of the installed package: they import aserve's modules, never the other way round.
This file imports only the standard library: MOSEC's peer imports the package in MOSEC's
own environment, where aserve is not installed.
"""

from __future__ import annotations

import os
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent  # the repository: `benchmarks` is a folder in it


def child_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's environment) with the repository first on PYTHONPATH, so
    that a child started as `python -m benchmarks.X` finds this package from any folder."""
    out = dict(os.environ if env is None else env)
    out["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), out.get("PYTHONPATH", "")) if p)
    return out
