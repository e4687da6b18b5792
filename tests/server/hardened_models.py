"""Models for the error, limit, access and protocol tests: a classifier, a regressor, and a
model whose exception names files."""

from __future__ import annotations

import pathlib

from .conftest import MODELS, write_repository

# SCORES = X: FP32 rows of 4 class scores; labels from labels.txt
CLASSIFIER_MODEL = '''
from array import array
from aserve.runtime import Model, TensorSpec

class Classifier(Model):
    inputs = [TensorSpec("X", "FP32", (-1, 4))]
    outputs = [TensorSpec("SCORES", "FP32", (-1, 4))]

    def __call__(self, inputs):
        return {"SCORES": array("f", inputs["X"].cast("B").cast("f"))}
'''

CLASSIFIER_CONFIG = '''
max_batch_size = 8
[[inputs]]
name = "X"
datatype = "FP32"
shape = [-1, 4]
[[outputs]]
name = "SCORES"
datatype = "FP32"
shape = [-1, 4]
[parameters.classification_labels]
SCORES = "labels.txt"
'''

LABELS = ["cat", "dog", "bird", "fish"]

# Y = X[0] + X[1] per row: one value per example
REGRESSOR_MODEL = '''
from array import array
from aserve.runtime import Model, TensorSpec

class Regressor(Model):
    inputs = [TensorSpec("X", "FP32", (-1, 2))]
    outputs = [TensorSpec("Y", "FP32", (-1, 1))]

    def __call__(self, inputs):
        x = inputs["X"].cast("B").cast("f")
        return {"Y": array("f", [x[i] + x[i + 1] for i in range(0, len(x), 2)])}
'''

REGRESSOR_CONFIG = '''
max_batch_size = 8
[[inputs]]
name = "X"
datatype = "FP32"
shape = [-1, 2]
[[outputs]]
name = "Y"
datatype = "FP32"
shape = [-1, 1]
'''

# raises an error naming its own file and another absolute path
LEAKY_MODEL = '''
from aserve.runtime import Model, TensorSpec

class Leaky(Model):
    inputs = [TensorSpec("X", "FP32", (-1, 1))]
    outputs = [TensorSpec("X", "FP32", (-1, 1))]

    def __call__(self, inputs):
        raise OSError(f"cannot read {__file__} nor /etc/aserve/secret.key")
'''

LEAKY_CONFIG = '''
max_batch_size = 4
[[inputs]]
name = "X"
datatype = "FP32"
shape = [-1, 1]
[[outputs]]
name = "X"
datatype = "FP32"
shape = [-1, 1]
'''

HARDENED = {
    **MODELS,
    "clf": (CLASSIFIER_MODEL, CLASSIFIER_CONFIG),
    "reg": (REGRESSOR_MODEL, REGRESSOR_CONFIG),
    "leaky": (LEAKY_MODEL, LEAKY_CONFIG),
}


def hardened_repository(root: pathlib.Path, **extra: tuple[str, str]) -> pathlib.Path:
    repo = write_repository(root, {**HARDENED, **extra})
    (repo / "clf" / "labels.txt").write_text("\n".join(LABELS) + "\n")
    return repo


def add_body(first: int = 1) -> dict:
    row = [first, 2, 3, 4]
    return {"inputs": [{"name": "A", "datatype": "INT32", "shape": [1, 4], "data": row},
                       {"name": "B", "datatype": "INT32", "shape": [1, 4], "data": [1, 1, 1, 1]}]}
