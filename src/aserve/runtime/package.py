"""Models packaged hermetically with torch.package.

A version folder holding a torch.package archive (`model.pt`, made with
`torch.package.PackageExporter`, `aserve.**` marked extern) is loaded from the
`[package]` table of its config.toml, which the host passes in the load spec as
`spec["package"]`:

    [package]
    archive = "model.pt"               # default
    object = "some.module:Name"        # a Model subclass, from the archive's own modules
    # or
    pickle = "package.name/model.pkl"  # a pickled torch.nn.Module in the archive

Each load opens its own `PackageImporter`: the archive's modules are imported from
the archive under a name mangled per importer (`<torch_package_N>.some.module`), never
from sys.path, so two versions whose packaged modules share names but not code live
side by side in one interpreter. Unloading drops the importer (and the source lines
torch.package put in `linecache` for tracebacks, which would keep it alive).

The archive's tensors are stored uncompressed in the zip; `MappedReader` hands the
importer each storage as a slice of one `MAP_PRIVATE` mapping of the archive (the way
`torch.load(mmap=True)` does for checkpoints), so packaged weights live in the page
cache, once for every interpreter that loads the archive.

Standard library only at import time: torch is imported when a package is opened.
"""

from __future__ import annotations

import contextlib
import linecache
import os
import warnings
from collections.abc import Iterator
from typing import Any

from .model import Model, TensorSpec


class PackageLoadError(Exception):
    """Raised with a message naming the archive and the mistake; the worker turns it into LoadError."""


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """torch.package unpickles storages through TypedStorage, which warns that it is
    deprecated: torch's own doing, nothing a model can change, so not shown (and not
    an error where warnings are errors)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="TypedStorage is deprecated", category=UserWarning)
        yield


def _reader_class() -> Any:
    import torch

    class MappedReader(torch._C.PyTorchFileReader):
        """The archive's reader, with each tensor storage a view of one mapping of the file."""

        def __init__(self, path: str) -> None:
            super().__init__(path)
            self.path = path
            self.whole: Any = None

        def get_storage_from_record(self, name: str, numel: int, dtype: Any) -> Any:
            nbytes = numel * dtype.itemsize
            try:
                offset = self.get_record_offset(name)  # type: ignore[attr-defined]
            except (RuntimeError, AttributeError):
                return super().get_storage_from_record(name, numel, dtype)
            if self.whole is None:
                self.whole = torch.UntypedStorage.from_file(self.path, False, os.path.getsize(self.path))
            if offset % dtype.itemsize or offset + nbytes > self.whole.nbytes():
                return super().get_storage_from_record(name, numel, dtype)  # not mappable as this dtype
            return torch.empty(0, dtype=dtype).set_(self.whole[offset:offset + nbytes], 0, (numel,), (1,))

    return MappedReader


def open_archive(path: str) -> Any:
    """A PackageImporter over the archive at `path`, its tensors mapped from the file."""
    if not os.path.exists(path):
        raise PackageLoadError(f"{path}: torch.package archive not found")
    if not os.path.isfile(path):
        raise PackageLoadError(f"{path}: not a file (a torch.package archive is one zip file)")
    try:
        from torch.package.package_importer import PackageImporter
    except ImportError:
        raise PackageLoadError(f"{path}: loading a torch.package archive needs torch, which is not installed") from None
    try:
        reader = _reader_class()(path)
    except Exception as e:  # noqa: BLE001 - any reader failure means "not an archive"
        raise PackageLoadError(f"{path}: not a torch.package archive ({_first_line(e)})") from None
    if not reader.has_record(".data/extern_modules"):
        raise PackageLoadError(
            f"{path}: not a torch.package archive (a zip without .data/extern_modules: a torch.save "
            "checkpoint? make it with torch.package.PackageExporter)"
        )
    try:
        importer = PackageImporter(reader)
    except Exception as e:  # noqa: BLE001
        raise PackageLoadError(f"{path}: not a readable torch.package archive ({_first_line(e)})") from None
    importer.filename = path  # for its own messages (it says "<pytorch_file_reader>" otherwise)
    return importer


def close_archive(importer: Any) -> None:
    """Forget what keeps an importer alive beyond its modules: linecache's lazy entries."""
    parent = getattr(getattr(importer, "_mangler", None), "_mangle_parent", None)
    if parent:
        for filename in [f for f in list(linecache.cache) if isinstance(f, str) and f.startswith(parent)]:
            linecache.cache.pop(filename, None)
    reader = getattr(importer, "zip_reader", None)
    if reader is not None and hasattr(reader, "whole"):
        reader.whole = None


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def settings(package: Any, folder: str) -> tuple[str, str | None, str | None]:
    """(archive path, object, pickle) from a spec's `package` table, checked."""
    if not isinstance(package, dict):
        raise PackageLoadError(f"{folder}: [package] must be a table, got {type(package).__name__}")
    unknown = sorted(set(package) - {"archive", "object", "pickle"})
    if unknown:
        raise PackageLoadError(f"{folder}: [package] has unknown keys {unknown}; expected archive, object or pickle")
    archive = package.get("archive") or "model.pt"
    path = archive if os.path.isabs(archive) else os.path.join(folder, archive)
    obj, pickled = package.get("object"), package.get("pickle")
    if (obj is None) == (pickled is None):
        raise PackageLoadError(
            f"{path}: [package] needs exactly one of object = \"module:Name\" (a Model subclass) or "
            "pickle = \"package/resource.pkl\" (a pickled torch.nn.Module)"
        )
    if obj is not None:
        module, _, name = str(obj).partition(":")
        if not module or not name:
            raise PackageLoadError(f"{path}: [package] object = {obj!r} must look like \"some.module:Name\"")
    if pickled is not None:
        where, _, resource = str(pickled).partition("/")
        if not where or not resource:
            raise PackageLoadError(
                f"{path}: [package] pickle = {pickled!r} must look like \"package.name/resource.pkl\""
            )
    return path, obj, pickled


def model_class(importer: Any, path: str, obj: str) -> type[Model]:
    """The Model subclass `module:Name` from the archive's own modules."""
    module_name, _, attr = obj.partition(":")
    try:
        module = importer.import_module(module_name)
    except ModuleNotFoundError as e:
        raise PackageLoadError(f"{path}: module {module_name!r} not found in the archive ({e})") from None
    except Exception as e:
        raise PackageLoadError(f"{path}: importing {module_name!r} from the archive failed: {_first_line(e)}") from e
    found: Any = module
    for part in attr.split("."):
        found = getattr(found, part, None)
        if found is None:
            raise PackageLoadError(f"{path}: module {module_name!r} in the archive has no {attr!r}")
    if not isinstance(found, type):
        raise PackageLoadError(f"{path}: {obj} is not a class (it is a {type(found).__name__} object)")
    if not issubclass(found, Model):
        own_copy = any(b.__name__ == "Model" and b.__module__.endswith("aserve.runtime.model") for b in found.__mro__)
        hint = (
            "; the archive holds its own copy of aserve: export with exporter.extern(\"aserve.**\")" if own_copy
            else "; a torch.nn.Module is served with pickle = \"package/resource.pkl\" instead"
        )
        raise PackageLoadError(f"{path}: {obj} is not a subclass of aserve.runtime.Model{hint}")
    return found


class PickledModule(Model):
    """A pickled torch.nn.Module served as a Model: the declared inputs, in order, are
    its positional arguments; its result (a tensor, or a tuple/list of them) is named
    by the declared outputs, in order. Runs under torch.inference_mode(). An
    `nn.Sequential` with one input and one output also gets its children as stages."""

    tensor_format = "torch"
    archive: str = ""
    package_name: str = ""
    resource: str = ""
    module: Any = None

    @classmethod
    def bind(cls, path: str, pickled: str, inputs: list[TensorSpec], outputs: list[TensorSpec]
             ) -> type[PickledModule]:
        if not inputs or not outputs:
            raise PackageLoadError(
                f"{path}: a pickled module needs its [[inputs]] and [[outputs]] declared in config.toml "
                "(their order is the module's argument order and its result order)"
            )
        package_name, _, resource = pickled.partition("/")
        attrs = {"archive": path, "package_name": package_name, "resource": resource,
                 "inputs": tuple(inputs), "outputs": tuple(outputs)}
        return type("PickledModule", (cls,), attrs)

    def load(self) -> None:
        import torch

        importer = self.package
        record = self.package_name.replace(".", "/") + "/" + self.resource
        if not importer.zip_reader.has_record(record):
            raise PackageLoadError(f"{self.archive}: no resource {self.package_name}/{self.resource} in the archive")
        try:
            module = importer.load_pickle(self.package_name, self.resource)
        except Exception as e:
            raise PackageLoadError(
                f"{self.archive}: unpickling {self.package_name}/{self.resource} failed: {_first_line(e)}"
            ) from e
        if not isinstance(module, torch.nn.Module):
            raise PackageLoadError(
                f"{self.archive}: {self.package_name}/{self.resource} holds a {type(module).__name__}, "
                "not a torch.nn.Module"
            )
        self.module = module.eval()
        self.names = [s.name for s in self.inputs]
        if isinstance(module, torch.nn.Sequential) and len(self.inputs) == 1 and len(self.outputs) == 1:
            self.stages = tuple(module.children())

    @property
    def label(self) -> str:
        """The pickled module's class, as metadata shows it."""
        name = type(self.module).__qualname__ if self.module is not None else "Module"
        return f"{name} (pickled {self.package_name}/{self.resource})"

    def __call__(self, inputs: dict[str, Any]) -> dict[str, Any]:
        import torch

        with torch.inference_mode():
            result = self.module(*(inputs[n] for n in self.names))
        if isinstance(result, torch.Tensor):
            result = (result,)
        if isinstance(result, dict):
            return result
        if not isinstance(result, (tuple, list)) or len(result) != len(self.outputs):
            count = len(result) if isinstance(result, (tuple, list)) else type(result).__name__
            raise TypeError(
                f"{type(self.module).__name__} returned {count} results; {len(self.outputs)} outputs are declared"
            )
        return {spec.name: value for spec, value in zip(self.outputs, result)}
