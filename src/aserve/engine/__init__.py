"""Host side of the interpreter engine: pools of interpreters driven from asyncio."""

from .pool import ENGINES, ModelInfo, ModelSpec, Pool, interpreter_library
from .tunables import ensure_glibc_tunables

__all__ = ["ENGINES", "ModelInfo", "ModelSpec", "Pool", "ensure_glibc_tunables", "interpreter_library"]
