"""The model contract users write against.

A model is a class deriving from `Model`. It declares its inputs and outputs, may
prepare itself in `load()`, and answers a batch of named tensors in `__call__` (or
`forward`). One instance lives in every interpreter that serves the model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
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
      share_weights: (default True) weights read from files are shared by every
        interpreter that runs the model, rather than copied into each: while the
        model is constructed and loaded, `torch.load(path)` maps zip checkpoints
        (`mmap=True` unless the call says otherwise) and `load_state_dict` keeps the
        parameters it loaded from a mapped file backed by that file (the values are
        bitwise the same; see `aserve.runtime.weights` for what else changes). False
        gives stock torch behaviour.
      stages: optional callables whose composition is the model (e.g. the children
        of an `nn.Sequential`). A model with stages lets the batcher join requests
        that arrive while a batch runs at a stage boundary (layer-level joining):
        they run the stages done so far, their activations are concatenated to the
        batch's along the first dimension, and all finish together. The staged path
        is `stage_output(stages[-1](...stages[0](stage_input(inputs))))` inside
        `stage_context()`, and must answer exactly what `__call__` answers. It may
        also be set in `load()`.

    Instance attributes set before `load()`: `name`, `version` (a string: "1" for a
    model without version folders), `directory` (the model's
    folder), `parameters` (the `parameters` table of its config) and `package` (for
    a model packaged with torch.package, the archive's `PackageImporter`: its
    `load_pickle` maps the archive's tensors too; None otherwise).

    Weights: read them with `aserve.runtime.load_weights(path)` (a `torch.save`
    zip checkpoint or a `.safetensors` file), which returns the tensors as views of
    one shared mapping of the file, so that they occupy one copy in memory however
    many interpreters run the model; `load_weights(path, into=net)` also loads them
    into `net` with `assign=True` (build `net` under `torch.device("meta")` to skip
    initialising weights that are replaced anyway):

        def load(self):
            with torch.device("meta"):
                net = Net()
            self.net = load_weights(os.path.join(self.directory, "weights.pt"), into=net).eval()

    Inputs are borrowed: they are valid only during the call; copy what you keep.
    Return a dict of output name -> tensor (torch tensor, numpy array, any object with
    the buffer protocol, or a (nested) list of numbers; for BYTES a list of bytes/str).
    """

    inputs: ClassVar[Sequence[TensorSpec]] = ()
    outputs: ClassVar[Sequence[TensorSpec]] = ()
    tensor_format: ClassVar[str] = "memoryview"
    torch_threads: ClassVar[int] = 1
    share_weights: ClassVar[bool] = True
    stages: Sequence[Callable[[Any], Any]] = ()

    name: str
    version: str = "1"
    directory: str
    parameters: dict[str, Any]
    package: Any = None

    def load(self) -> None:
        """Prepare the model (read weights, warm up). Runs once per interpreter."""

    def example_inputs(self) -> dict[str, Any] | None:
        """One request's inputs (batch dimension first when the model batches), in any
        form an output may take; the adaptive batcher measures the model's latency curve
        on batches made of them at load. None (the default): zeros of the declared shapes
        (BYTES: short strings), which suits models whose cost does not depend on values."""
        return None

    # ---- the staged path (used only when `stages` is not empty) ----

    def stage_input(self, inputs: dict[str, Any]) -> Any:
        """The first stage's input from the batch's inputs; by default the only input."""
        if len(inputs) != 1:
            raise TypeError(
                f"{type(self).__name__} has {len(inputs)} inputs: define stage_input(inputs) to make the "
                "first stage's input from them"
            )
        return next(iter(inputs.values()))

    def stage_output(self, activation: Any) -> dict[str, Any]:
        """The outputs from the last stage's result; by default it is the only declared output."""
        if len(self.outputs) != 1:
            raise TypeError(
                f"{type(self).__name__} declares {len(self.outputs)} outputs: define stage_output(activation)"
            )
        return {self.outputs[0].name: activation}

    def stage_concat(self, parts: list[Any]) -> Any:
        """Activations joined along the first (batch) dimension: torch.cat or numpy.concatenate."""
        first = parts[0]
        module = type(first).__module__.split(".")[0]
        if module == "torch":
            import torch

            return torch.cat(parts, 0)
        if module == "numpy":
            import numpy

            return numpy.concatenate(parts, 0)
        raise TypeError(
            f"{type(self).__name__}: cannot concatenate {type(first).__name__} activations; define "
            "stage_concat(parts)"
        )

    def stage_context(self) -> contextlib.AbstractContextManager[Any]:
        """Entered around the staged path: torch.inference_mode() for torch models."""
        if self.tensor_format == "torch":
            import torch

            return torch.inference_mode()
        return contextlib.nullcontext()

    def __call__(self, inputs: dict[str, Any]) -> dict[str, Any]:
        forward = getattr(self, "forward", None)
        if forward is None:
            raise NotImplementedError(
                f"{type(self).__name__} must define __call__(inputs) or forward(inputs)"
            )
        result: dict[str, Any] = forward(inputs)
        return result
