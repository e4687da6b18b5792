"""Entry points the engine calls inside each interpreter.

The native worker imports this module once per interpreter and calls `load`,
`infer`, `unload` and `execute` with plain values (str, tuple, memoryview), so that
nothing but buffers and metadata ever crosses between interpreters.
"""

from __future__ import annotations

import base64
import contextlib
import gc
import importlib.util
import json
import linecache
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from . import faults, memory, trace, weights
from . import package as _package
from .model import TENSOR_FORMATS, Model, TensorSpec
from .package import PackageLoadError, PickledModule, close_archive, model_class, open_archive, settings
from .tensors import from_model, to_model

trace_begin = trace.begin  # the engine brackets a traced job with these
trace_end = trace.end
configure = faults.configure  # the engine calls it once per interpreter with its engine's name
Cancelled = faults.Cancelled  # what the engine raises in a batch it cancels


class LoadError(Exception):
    """A model could not be imported, constructed or loaded."""


class _Loaded:
    __slots__ = ("fmt", "importer", "inputs", "label", "model", "module_name", "outputs", "source", "stages")

    def __init__(self, model: Model, fmt: str, inputs: list[TensorSpec], outputs: list[TensorSpec]):
        self.model = model
        self.label = _label(model.name, model.version)  # how fault messages name it
        self.fmt = fmt
        self.inputs = {s.name: s for s in inputs}
        self.outputs = {s.name: s for s in outputs}
        self.stages = tuple(model.stages)
        self.importer: Any = None  # a packaged model's PackageImporter
        self.module_name: str | None = None  # a model.py's entry in sys.modules
        self.source: str | None = None  # a model.py's path (its lines are in linecache)


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
    """Import a model file from the bytes read once, and keep those lines in linecache:
    tracebacks show the code that runs, even after the file is edited on disk (until
    the model is loaded again)."""
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise LoadError(f"{path}: not a Python source file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        with open(path, "rb") as f:
            source = f.read()
        text = importlib.util.decode_source(source)
        # mtime None: linecache.checkcache keeps the entry whatever happens to the file
        linecache.cache[path] = (len(text), None, text.splitlines(True), path)
        exec(compile(source, path, "exec", dont_inherit=True), module.__dict__)  # noqa: S102 - the model's code
    except BaseException as e:
        sys.modules.pop(module_name, None)
        raise LoadError(f"{path}: import failed: {faults.describe(e)}") from e
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


def _label(name: str, version: str) -> str:
    return f"model {name} version {version}"


def _module_name(key: str) -> str:
    return "aserve_model_" + "".join(c if c.isalnum() else "_" for c in key)


def _from_file(key: str, spec: dict[str, Any]) -> tuple[type[Model], str, str]:
    """A model.py's class: (class, file, its sys.modules name)."""
    path = spec["path"]
    if os.path.isdir(path):
        path = os.path.join(path, "model.py")
    if not os.path.isfile(path):
        raise LoadError(f"{path}: model file not found (a model is a model.py file or a folder holding one)")
    module_name = _module_name(key)
    module = _import_file(path, module_name)
    try:
        return _find_class(module, path, spec.get("class")), path, module_name
    except BaseException:
        sys.modules.pop(module_name, None)
        raise


def _from_package(spec: dict[str, Any]) -> tuple[type[Model], str, Any]:
    """A torch.package archive's model class: (class, archive, importer); see package.py."""
    path = spec["path"]
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    try:
        archive, obj, pickled = settings(spec["package"], folder)
        importer = open_archive(archive)
    except PackageLoadError as e:
        raise LoadError(str(e)) from e.__cause__
    try:
        if obj is not None:
            with _package.quiet():
                return model_class(importer, archive, obj), archive, importer
        assert pickled is not None
        inputs = _specs(spec.get("inputs"), f"{archive}: inputs")
        outputs = _specs(spec.get("outputs"), f"{archive}: outputs")
        return PickledModule.bind(archive, pickled, inputs, outputs), archive, importer
    except BaseException as e:
        close_archive(importer)
        if isinstance(e, PackageLoadError):
            raise LoadError(str(e)) from e.__cause__
        raise


def _forget(importer: Any, module_name: str | None) -> None:
    if module_name is not None:
        sys.modules.pop(module_name, None)
    if importer is not None:
        close_archive(importer)


def load(key: str, spec_json: str) -> str:
    """Import, construct and load a model; return its metadata as JSON.

    `spec["package"]` (a config's [package] table) loads a torch.package archive
    instead of a model.py (see package.py)."""
    spec = json.loads(spec_json)
    label = _label(spec.get("name", key), str(spec.get("version", "1")))
    previous = faults.enter(label)
    try:
        return _load_contained(key, spec)
    finally:
        faults.leave(previous)


def _load_contained(key: str, spec: dict[str, Any]) -> str:
    weights.install_when_imported()  # torch.load / load_state_dict share mapped weights by default
    importer: Any = None
    module_name: str | None = None
    if spec.get("package") is not None:
        cls, path, importer = _from_package(spec)
    else:
        cls, path, module_name = _from_file(key, spec)
    try:
        return _load(key, spec, cls, path, importer, module_name)
    except BaseException:
        _forget(importer, module_name)
        raise


def _load(key: str, spec: dict[str, Any], cls: type[Model], path: str, importer: Any,
          module_name: str | None) -> str:
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
        with memory.loading(), weights.policy(bool(getattr(cls, "share_weights", True))), \
                _package.quiet() if importer is not None else contextlib.nullcontext():
            model = cls()
            model.name = spec.get("name", key)
            model.version = str(spec.get("version", "1"))
            model.directory = os.path.dirname(os.path.abspath(path))
            model.parameters = dict(spec.get("parameters") or {})
            model.package = importer
            model.load()
    except PackageLoadError as e:
        raise LoadError(str(e)) from e.__cause__
    except BaseException as e:
        raise LoadError(f"{path}: {cls.__name__} failed to load: {faults.describe(e)}") from e
    if "torch" in sys.modules:
        weights.install()
        memory.trim()  # give back what load() allocated and freed (weights it replaced by mapped ones)
    loaded = _Loaded(model, fmt, inputs, outputs)
    loaded.importer, loaded.module_name = importer, module_name
    loaded.source = path if module_name is not None else None
    bad = [i for i, stage in enumerate(loaded.stages) if not callable(stage)]
    if bad:
        raise LoadError(f"{path}: {cls.__name__}.stages[{bad[0]}] is not callable")
    if len(loaded.stages) > MAX_STAGES:
        raise LoadError(f"{path}: {cls.__name__} has {len(loaded.stages)} stages; at most {MAX_STAGES}")
    try:
        example = model.example_inputs()
        encoded = None if example is None else _encode_example(example, loaded.inputs)
    except BaseException as e:
        raise LoadError(f"{path}: {cls.__name__}.example_inputs(): {faults.describe(e)}") from e
    _models[key] = loaded
    return json.dumps(
        {
            "class": model.label if isinstance(model, PickledModule) else cls.__name__,
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


def unload(key: str, garbage: str | None = None) -> None:
    """Drop a model: its instance, its module (or its package's importer), then collect
    the cycles they leave and give the freed memory back to the system (memory.trim).

    garbage "later": leave the collection to a later unload in this interpreter (a full
    collection is long with torch imported; a pool that closes with several models
    collects once, after the last of them, and its finalizers run under that model's name)."""
    loaded = _models.pop(key, None)
    if loaded is None:
        return
    label = loaded.label
    previous = faults.enter(label)  # finalizers of the model's objects may run its code
    try:
        _forget(loaded.importer, loaded.module_name)
        if loaded.source is not None and all(m.source != loaded.source for m in _models.values()):
            linecache.cache.pop(loaded.source, None)
        del loaded  # the last reference: the collection below frees the model
        if garbage != "later":
            gc.collect()
            memory.trim()
    except SystemExit as e:
        raise faults.exit_error(label, e) from e
    finally:
        faults.leave(previous)


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
    previous = faults.enter(loaded.label)
    try:
        fmt = loaded.fmt
        batch = {name: to_model(datatype, shape, view, fmt) for name, datatype, shape, view in inputs}
        if join is not None:
            if not loaded.stages:
                raise TypeError(f"model {key!r} has no stages: it cannot run a joinable batch")
            result, seconds = _run_staged(loaded, batch, join)
            return _outputs(loaded, result), seconds
        return _outputs(loaded, loaded.model(batch))
    except SystemExit as e:
        raise faults.exit_error(loaded.label, e) from e
    finally:
        faults.leave(previous)


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
    label = "code run by Pool.execute"
    previous = faults.enter(label)
    try:
        exec(compile(source, "<aserve exec>", "exec"), _scratch)  # noqa: S102 - a diagnostics entry point
    except SystemExit as e:
        raise faults.exit_error(label, e) from e
    finally:
        faults.leave(previous)
    return repr(_scratch["result"]) if "result" in _scratch else ""


def format_exception(exc: BaseException) -> str:
    if isinstance(exc, (faults.ModelExit, faults.Cancelled)):
        # the traceback, then the message alone on the last line (what the host reports)
        lines = traceback.format_exception(exc)
        return "".join(lines[:-1]) + (str(exc) or "the batch was cancelled")
    if isinstance(exc, LoadError):
        return str(exc) + "".join(
            "\n" + line for c in [exc.__cause__] if c is not None for line in traceback.format_exception(c)
        )
    return "".join(traceback.format_exception(exc))
