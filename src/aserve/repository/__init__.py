"""The model repository: `<repo>/<name>/model.py` + `config.toml`, scanned and parsed."""

from .config import BatchingConfig, ConfigError, ModelConfig, TensorConfig, load_config, parse_config
from .scan import ModelEntry, RepositoryError, scan_repository

__all__ = [
    "BatchingConfig", "ConfigError", "ModelConfig", "ModelEntry", "RepositoryError", "TensorConfig",
    "load_config", "parse_config", "scan_repository",
]
