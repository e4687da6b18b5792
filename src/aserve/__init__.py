"""aserve: a single-process Python model server.

Model code runs in a pool of interpreters inside this process (private libpython
copies or PEP 684 subinterpreters, each with its own GIL), fed by one asyncio event
loop. The public names are imported lazily so that `aserve.runtime`, which runs
inside every interpreter, never drags in the host side.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["Model", "ModelSpec", "Pool", "Tensor", "TensorSpec", "__version__"]

if TYPE_CHECKING:
    from .engine import ModelSpec, Pool
    from .runtime import Model, TensorSpec
    from .tensor import Tensor

_LAZY = {
    "Model": "aserve.runtime",
    "TensorSpec": "aserve.runtime",
    "Pool": "aserve.engine",
    "ModelSpec": "aserve.engine",
    "Tensor": "aserve.tensor",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'aserve' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
