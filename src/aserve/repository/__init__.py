"""The model repository: `<repo>/<name>/[<version>/]model.py` + `config.toml`, scanned and parsed."""

from .config import (
    BatchingConfig,
    ConfigError,
    ModelConfig,
    PackageConfig,
    TensorConfig,
    VersionPolicy,
    load_config,
    merge_tables,
    parse_config,
    to_config,
)
from .labels import LABELS_PARAMETER, read_labels
from .scan import (
    ModelSource,
    RepositoryError,
    RepositoryScan,
    Skipped,
    VersionSource,
    scan_model,
    scan_repository,
)

__all__ = [
    "LABELS_PARAMETER", "BatchingConfig", "ConfigError", "ModelConfig", "ModelSource", "PackageConfig", "RepositoryError",
    "RepositoryScan", "Skipped", "TensorConfig", "VersionPolicy", "VersionSource", "load_config", "merge_tables",
    "parse_config", "read_labels", "scan_model", "scan_repository", "to_config",
]
