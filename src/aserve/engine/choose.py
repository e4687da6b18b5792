"""Choosing an engine per model: `auto` probes the model in an isolated subinterpreter.

On Python >= 3.12 a model whose imports all load in an isolated PEP 684
subinterpreter is served there (cheap interpreters, one libpython); a model that
imports an extension refusing subinterpreters (torch, numpy, msgspec today) is
served by private libpython copies. Before 3.12 the answer is always private.
"""

from __future__ import annotations

import ast
import os
import re
import sys

import msgspec

from ..errors import EngineError
from .pool import Pool

REFUSAL = re.compile(r"module ([\w.]+) does not support loading in subinterpreters")


class Choice(msgspec.Struct, frozen=True):
    engine: str
    reason: str


_PROBE = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location({name!r}, {path!r})
module = importlib.util.module_from_spec(spec)
try:
    spec.loader.exec_module(module)
    result = ""
except ImportError as e:
    result = str(e)
finally:
    sys.modules.pop({name!r}, None)
"""

_probe_pool: Pool | None = None


async def _probe(path: str) -> str:
    """'' if the model file imports in an isolated subinterpreter, else the ImportError text."""
    global _probe_pool
    if _probe_pool is None:
        _probe_pool = Pool(engine="subinterp", interpreters=1)
    pool = _probe_pool
    await pool.start()
    return str(ast.literal_eval(await pool.execute(0, _PROBE.format(name="aserve_probe", path=path))))  # repr of a str


def model_file(path: str) -> str:
    return os.path.join(path, "model.py") if os.path.isdir(path) else path


async def choose_engine(requested: str, path: str) -> Choice:
    """Resolve `requested` (auto | private | subinterp | main) for the model at `path`."""
    if requested in ("private", "main"):
        return Choice(requested, f"engine {requested!r} asked for")
    if sys.version_info < (3, 12):
        if requested == "subinterp":
            raise EngineError(
                f"engine 'subinterp' needs PEP 684 subinterpreters (Python >= 3.12); this is Python "
                f"{sys.version.split()[0]}: use engine 'private' or 'auto'"
            )
        return Choice("private", f"Python {sys.version.split()[0]} has no per-interpreter GIL (PEP 684 needs 3.12)")
    failure = await _probe(model_file(path))
    if not failure:
        if requested == "subinterp":
            return Choice("subinterp", "engine 'subinterp' asked for; the model imports in an isolated subinterpreter")
        return Choice("subinterp", "every import of the model loads in an isolated subinterpreter")
    refused = REFUSAL.search(failure)
    if requested == "subinterp":
        what = f"module {refused.group(1)} refuses" if refused else f"import failed ({failure})"
        raise EngineError(f"engine 'subinterp' cannot serve {model_file(path)}: {what} isolated subinterpreters; "
                          "use engine 'private' or 'auto'")
    if refused:
        return Choice("private", f"module {refused.group(1)} does not support isolated subinterpreters")
    return Choice("private", f"the model does not import in an isolated subinterpreter: {failure}")


async def close_probe() -> None:
    global _probe_pool
    if _probe_pool is not None:
        await _probe_pool.close()
        _probe_pool = None
