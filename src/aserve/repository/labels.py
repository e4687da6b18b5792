"""Class labels of a model's outputs, from files its config names.

Triton's classification extension and TF-Serving's classify answer class indices with
labels: `[parameters.classification_labels] OUTPUT = "labels.txt"` in config.toml names
a file in the version's folder, one label per line, in class order.
"""

from __future__ import annotations

import os

from ..errors import InvalidInput, NotSupported
from .config import ModelConfig

LABELS_PARAMETER = "classification_labels"


def read_labels(name: str, directory: str, config: ModelConfig, output: str) -> list[str] | None:
    """The labels of model `name`'s `output` (None when its config names no file for it);
    the file must lie inside the version's `directory`."""
    table = config.parameters.get(LABELS_PARAMETER)
    if not isinstance(table, dict) or not isinstance(table.get(output), str):
        return None
    folder = os.path.realpath(directory)
    path = os.path.realpath(os.path.join(folder, table[output]))
    if not path.startswith(folder + os.sep):
        raise InvalidInput(f"parameters.{LABELS_PARAMETER}.{output}: the labels file must be inside the model's "
                           f"folder, got {table[output]!r}")
    try:
        with open(path, encoding="utf-8") as f:
            return [line.rstrip("\r\n") for line in f]
    except OSError as e:
        raise NotSupported(f"model {name!r}: cannot read the labels of output {output!r} "
                           f"({table[output]}: {e.strerror})") from None
