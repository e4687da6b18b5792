"""Host side of the interpreter engine: pools of interpreters driven from asyncio."""

from .choose import Choice, choose_engine
from .pool import (
    ENGINES,
    BatchCancelled,
    InterpreterLost,
    ModelInfo,
    ModelSpec,
    Pool,
    StagedRun,
    interpreter_library,
)
from .tunables import ensure_glibc_tunables

__all__ = ["ENGINES", "BatchCancelled", "Choice", "InterpreterLost", "ModelInfo", "ModelSpec", "Pool", "StagedRun", "choose_engine", "ensure_glibc_tunables", "interpreter_library"]
