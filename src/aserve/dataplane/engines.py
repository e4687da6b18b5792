"""Which interpreter engine serves a model, and why.

The model's config.toml wins over the server's --engine; `auto` (and an explicit
`subinterp`, which must be checked) is settled by `aserve.engine.choose_engine`,
which imports the model in an isolated subinterpreter on Python >= 3.12.
"""

from __future__ import annotations

from ..config import ServerSettings
from ..engine import Choice, choose_engine
from ..errors import EngineError
from ..repository import ModelConfig


def requested_engine(model_config: ModelConfig, server_settings: ServerSettings) -> tuple[str, str]:
    """(engine asked for, where it was asked): the model config's, else the server's."""
    if model_config.engine is not None:
        return model_config.engine, "config.toml"
    return server_settings.engine, "--engine"


async def resolve_engine(
    model_config: ModelConfig, server_settings: ServerSettings, *, model_file: str
) -> tuple[str, str]:
    """(engine, reason) for one model; EngineError if the engine asked for cannot serve it."""
    requested, where = requested_engine(model_config, server_settings)
    if model_config.package is not None:
        # an archive is opened with torch.package, and torch does not load in isolated subinterpreters
        if requested == "subinterp":
            raise EngineError(f"engine 'subinterp' cannot serve {model_file}: a torch.package archive needs "
                              "torch, which refuses isolated subinterpreters; use engine 'private' or 'auto'")
        if requested == "auto":
            return "private", f"{where} says auto: a torch.package archive needs torch (private interpreters)"
    choice: Choice = await choose_engine(requested, model_file)
    return choice.engine, f"{where} says {requested}: {choice.reason}"
