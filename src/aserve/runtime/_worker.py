"""Entry points the engine calls inside each interpreter.

The native worker imports this module once per interpreter and calls `load`,
`infer`, `unload` and `execute` with plain values (str, tuple, memoryview), so that
nothing but buffers and metadata ever crosses between interpreters.
"""

from __future__ import annotations

import base64
import gc
import importlib.util
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from . import trace
from .model import TENSOR_FORMATS, Model, TensorSpec
from .tensors import from_model, to_model

trace_begin = trace.begin  # the engine brackets a traced job with these
trace_end = trace.end


class LoadError(Exception):
    """A model could not be imported, constructed or loaded."""


class _Loaded:
    __slots__ = ("fmt", "inputs", "model", "outputs", "stages")

    def __init__(self, model: Model, fmt: str, inputs: list[TensorSpec], outputs: list[TensorSpec]):
        self.model = model
        self.fmt = fmt
        self.inputs = {s.name: s for s in inputs}
        self.outputs = {s.name: s for s in outputs}
        self.stages = tuple(model.stages)


MAX_STAGES = 64  # AS_MAX_STAGES in native/abi.h
_models: dict[str, _Loaded] = {}
_scratch: dict[str, Any] = {"__name__": "__aserve_exec__"}


def _specs(declared: Any, where: str) -> list[TensorSpec]:
    out = []
    for d in declared or ():
        if isinstance(d, dict):
            d = TensorSpec(d["name"], d["datatype"], tuple(d["shape"]))
        elif not isinstance(d, TensorSpec):
            d = TensorSpec(*d)
        try:
            out.append(d.check())
        except ValueError as e:
            raise LoadError(f"{where}: {e}") from None
    return out


def _import_file(path: str, module_name: str) -> Any:
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise LoadError(f"{path}: not a Python source file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as e:
        sys.modules.pop(module_name, None)
        raise LoadError(f"{path}: import failed: {type(e).__name__}: {e}") from e
    return module


def _find_class(module: Any, path: str, class_name: str | None) -> type[Model]:
    if class_name:
        cls = getattr(module, class_name, None)
        if not isinstance(cls, type):
            raise LoadError(f"{path}: no class named {class_name!r}")
        return cls
    found = [
        v
        for v in vars(module).values()
        if isinstance(v, type) and issubclass(v, Model) and v is not Model and v.__module__ == module.__name__
    ]
    if len(found) != 1:
        names = ", ".join(c.__name__ for c in found) or "none"
        raise LoadError(
            f"{path}: expected exactly one aserve.runtime.Model subclass (found {names}); "
            "name the one to serve with `class` in the model config"
        )
    return found[0]


def load(key: str, spec_json: str) -> str:
    """Import, construct and load a model; return its metadata as JSON."""
    spec = json.loads(spec_json)
    path = spec["path"]
    if os.path.isdir(path):
        path = os.path.join(path, "model.py")
    if not os.path.isfile(path):
        raise LoadError(f"{path}: model file not found (a model is a model.py file or a folder holding one)")
    module_name = "aserve_model_" + "".join(c if c.isalnum() else "_" for c in key)
    module = _import_file(path, module_name)
    cls = _find_class(module, path, spec.get("class"))
    inputs = _specs(spec.get("inputs") or getattr(cls, "inputs", ()), f"{path}: inputs")
    outputs = _specs(spec.get("outputs") or getattr(cls, "outputs", ()), f"{path}: outputs")
    fmt = getattr(cls, "tensor_format", "memoryview")
    if fmt not in TENSOR_FORMATS:
        raise LoadError(f"{path}: tensor_format {fmt!r} must be one of {', '.join(TENSOR_FORMATS)}")
    if fmt == "torch" or "torch" in sys.modules:
        try:
            import torch

            torch.set_num_threads(int(getattr(cls, "torch_threads", 1)))
        except ImportError:
            if fmt == "torch":
                raise LoadError(f"{path}: tensor_format 'torch' but torch is not installed") from None
    try:
        model = cls()
        model.name = spec.get("name", key)
        model.directory = os.path.dirname(os.path.abspath(path))
        model.parameters = dict(spec.get("parameters") or {})
        model.load()
    except BaseException as e:
        raise LoadError(f"{path}: {cls.__name__} failed to load: {type(e).__name__}: {e}") from e
    loaded = _Loaded(model, fmt, inputs, outputs)
    bad = [i for i, stage in enumerate(loaded.stages) if not callable(stage)]
    if bad:
        raise LoadError(f"{path}: {cls.__name__}.stages[{bad[0]}] is not callable")
    if len(loaded.stages) > MAX_STAGES:
        raise LoadError(f"{path}: {cls.__name__} has {len(loaded.stages)} stages; at most {MAX_STAGES}")
    try:
        example = model.example_inputs()
        encoded = None if example is None else _encode_example(example, loaded.inputs)
    except BaseException as e:
        raise LoadError(f"{path}: {cls.__name__}.example_inputs(): {type(e).__name__}: {e}") from e
    _models[key] = loaded
    return json.dumps(
        {
            "class": cls.__name__,
            "file": path,
            "tensor_format": fmt,
            "inputs": [{"name": s.name, "datatype": s.datatype, "shape": list(s.shape)} for s in inputs],
            "outputs": [{"name": s.name, "datatype": s.datatype, "shape": list(s.shape)} for s in outputs],
            "stages": len(loaded.stages),
            "example": encoded,
        }
    )


def _raw(data: Any) -> bytes:
    """The bytes of an output's data: a buffer, or a torch tensor's (address, nbytes, tensor)."""
    if isinstance(data, tuple):
        import torch

        return bytes(data[2].contiguous().flatten().view(torch.uint8).tolist())
    return memoryview(data).cast("B").tobytes()


def _encode_example(example: Any, declared: dict[str, TensorSpec]) -> list[dict[str, Any]]:
    """A model's example request as JSON-ready tensors (data in base64)."""
    if not isinstance(example, dict) or not example:
        raise TypeError(f"expected a dict of input name -> tensor, got {type(example).__name__}")
    if declared and set(example) != set(declared):
        raise ValueError(f"inputs {sorted(example)} do not match the declared inputs {sorted(declared)}")
    out = []
    for name, value in example.items():
        spec = declared.get(name)
        _, datatype, shape, data = from_model(name, value, spec)
        if spec is not None and (
            len(shape) != len(spec.shape) or any(d != s for d, s in zip(shape, spec.shape) if s != -1)
        ):
            raise ValueError(f"input {name!r}: shape {list(shape)} does not fit the declared {list(spec.shape)}")
        out.append({"name": name, "datatype": datatype, "shape": list(shape),
                    "data": base64.b64encode(_raw(data)).decode("ascii")})
    return out


def unload(key: str) -> None:
    if _models.pop(key, None) is not None:
        sys.modules.pop("aserve_model_" + "".join(c if c.isalnum() else "_" for c in key), None)
        gc.collect()


Wire = list[tuple[str, str, tuple[int, ...], memoryview]]


def _run_staged(loaded: _Loaded, batch: dict[str, Any], join: Callable[[int], Wire | None]
                ) -> tuple[Any, tuple[float, ...]]:
    """The staged path: after each stage but the last, absorb the groups the host lets join.

    A joining group runs the stages done so far on its own inputs; its activation is
    concatenated after the batch's. Returns the outputs and each stage's seconds."""
    model, stages = loaded.model, loaded.stages
    last = len(stages) - 1
    seconds = []
    with model.stage_context():
        x = model.stage_input(batch)
        for k, stage in enumerate(stages):
            start = time.perf_counter()
            x = stage(x)
            seconds.append(time.perf_counter() - start)
            if k == last:
                break
            while (wire := join(k + 1)) is not None:
                group = {name: to_model(datatype, shape, view, loaded.fmt) for name, datatype, shape, view in wire}
                y = model.stage_input(group)
                for done in stages[: k + 1]:
                    y = done(y)
                x = model.stage_concat([x, y])
        return model.stage_output(x), tuple(seconds)


def infer(key: str, inputs: Wire, join: Callable[[int], Wire | None] | None = None) -> Any:
    """Run one batch; inputs and outputs are (name, datatype, shape, data) tuples.

    With `join` (a staged batch that may absorb joiners) returns (outputs, stage seconds)."""
    loaded = _models.get(key)
    if loaded is None:
        raise KeyError(f"model {key!r} is not loaded in this interpreter")
    fmt = loaded.fmt
    batch = {name: to_model(datatype, shape, view, fmt) for name, datatype, shape, view in inputs}
    if join is not None:
        if not loaded.stages:
            raise TypeError(f"model {key!r} has no stages: it cannot run a joinable batch")
        result, seconds = _run_staged(loaded, batch, join)
        return _outputs(loaded, result), seconds
    return _outputs(loaded, loaded.model(batch))


def _outputs(loaded: _Loaded, result: Any) -> list[Any]:
    if isinstance(result, (list, tuple)) and loaded.outputs:
        result = dict(zip(loaded.outputs, result))
    if not isinstance(result, dict):
        raise TypeError(f"model returned {type(result).__name__}; expected a dict of output name -> tensor")
    specs = loaded.outputs
    if specs:
        missing = [n for n in specs if n not in result]
        if missing:
            raise TypeError(f"model did not return declared outputs {missing}")
    return [from_model(name, value, specs.get(name)) for name, value in result.items()]


def execute(source: str) -> str:
    """Run Python source in this interpreter's scratch namespace; return repr(result)."""
    _scratch.pop("result", None)
    exec(compile(source, "<aserve exec>", "exec"), _scratch)  # noqa: S102 - a diagnostics entry point
    return repr(_scratch["result"]) if "result" in _scratch else ""


def format_exception(exc: BaseException) -> str:
    if isinstance(exc, LoadError):
        return str(exc) + "".join(
            "\n" + line for c in [exc.__cause__] if c is not None for line in traceback.format_exception(c)
        )
    return "".join(traceback.format_exception(exc))
