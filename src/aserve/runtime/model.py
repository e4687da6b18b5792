"""The model contract users write against.

A model is a class deriving from `Model`. It declares its inputs and outputs, may
prepare itself in `load()`, and answers a batch of named tensors in `__call__` (or
`forward`). One instance lives in every interpreter that serves the model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, NamedTuple

from .datatypes import lookup

TENSOR_FORMATS = ("memoryview", "numpy", "torch")


class TensorSpec(NamedTuple):
    """A declared input or output: V2 datatype and shape (-1 for a variable dimension)."""

    name: str
    datatype: str
    shape: tuple[int, ...]

    def check(self) -> TensorSpec:
        lookup(self.datatype)
        if not self.name:
            raise ValueError("tensor name must not be empty")
        for d in self.shape:
            if not isinstance(d, int) or d < -1:
                raise ValueError(
                    f"tensor {self.name!r}: shape {list(self.shape)} must hold integers >= -1"
                )
        return TensorSpec(self.name, self.datatype, tuple(self.shape))


class Model:
    """Base class for models served by aserve.

    Class attributes:
      inputs / outputs: sequences of `TensorSpec`; the first dimension of each is the
        batch dimension (-1) when the model batches.
      tensor_format: how input tensors are handed to `__call__`:
        "memoryview" (zero-copy typed memoryviews, no dependencies), "numpy" or
        "torch" (zero-copy arrays/tensors over the same memory). BYTES inputs are
        always flat lists of `bytes`.
      torch_threads: intra-op threads for torch in this interpreter (default 1:
        parallelism comes from interpreters).

    Instance attributes set before `load()`: `name`, `directory` (the model's
    folder) and `parameters` (the `parameters` table of its config).

    Inputs are borrowed: they are valid only during the call; copy what you keep.
    Return a dict of output name -> tensor (torch tensor, numpy array, any object with
    the buffer protocol, or a (nested) list of numbers; for BYTES a list of bytes/str).
    """

    inputs: ClassVar[Sequence[TensorSpec]] = ()
    outputs: ClassVar[Sequence[TensorSpec]] = ()
    tensor_format: ClassVar[str] = "memoryview"
    torch_threads: ClassVar[int] = 1

    name: str
    directory: str
    parameters: dict[str, Any]

    def load(self) -> None:
        """Prepare the model (read weights, warm up). Runs once per interpreter."""

    def __call__(self, inputs: dict[str, Any]) -> dict[str, Any]:
        forward = getattr(self, "forward", None)
        if forward is None:
            raise NotImplementedError(
                f"{type(self).__name__} must define __call__(inputs) or forward(inputs)"
            )
        result: dict[str, Any] = forward(inputs)
        return result
