"""Finding the models of a repository folder: one sub-folder per model."""

from __future__ import annotations

import os
import pathlib

import msgspec

from .config import CONFIG_FILE, ConfigError, ModelConfig, load_config

MODEL_FILE = "model.py"


class RepositoryError(ConfigError):
    """The repository folder itself is missing or unreadable."""


class ModelEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One model folder of a repository, its config parsed (or why it could not be)."""

    name: str
    directory: str
    config: ModelConfig | None
    error: str | None = None  # the ConfigError message when config is None

    @property
    def model_file(self) -> str:
        return os.path.join(self.directory, MODEL_FILE)


def _is_model_dir(path: pathlib.Path) -> bool:
    # purely numeric folders are reserved for versions (<repo>/<name>/<version>/)
    return path.is_dir() and not path.name.isdigit() and not path.name.startswith((".", "_")) \
        and (path / MODEL_FILE).is_file()


def scan_repository(root: str | os.PathLike[str]) -> list[ModelEntry]:
    """Every `<root>/<name>/model.py`, sorted by name, with its config.toml parsed.

    A model whose config is invalid is still listed, with `config=None` and `error`
    naming the file and field, so that one bad model does not hide the others."""
    base = pathlib.Path(root)
    if not base.is_dir():
        raise RepositoryError(f"model repository {str(base)!r} is not a folder")
    entries: list[ModelEntry] = []
    try:
        children = sorted(base.iterdir(), key=lambda p: p.name)
    except OSError as e:
        raise RepositoryError(f"model repository {str(base)!r}: cannot list: {e.strerror}") from None
    for child in children:
        if not _is_model_dir(child):
            continue
        try:
            config: ModelConfig | None = load_config(child / CONFIG_FILE)
            error = None
        except ConfigError as e:
            config, error = None, str(e)
        entries.append(ModelEntry(name=child.name, directory=str(child.resolve()), config=config, error=error))
    return entries
