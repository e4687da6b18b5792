"""Weights that occupy one copy in memory however many interpreters run the model.

Every private interpreter has its own libtorch, so tensors cannot be handed from one
to another; what they can share is a file. A tensor whose storage is a slice of a
read-only-in-practice `MAP_PRIVATE` mapping of the weights file lives in the page
cache: every interpreter that maps the file maps the same physical pages, and PSS
divides them among the mappings, so the file counts once for the whole process. A
write to such a tensor copies just the page written (copy on write) and never reaches
the file.

What this module does, in each interpreter:

- `load_weights(path)`: `torch.load(path, mmap=True, weights_only=True)` for torch's
  zip checkpoints, and `.safetensors` files parsed here (no `safetensors` package
  needed), each tensor a view of one mapping of the file. `load_weights(path,
  into=module)` also loads them into `module` with `assign=True`, so the module's
  parameters *are* the mapped tensors (build the module under `torch.device("meta")`
  to skip initialising weights that are replaced anyway).

- `install()` (the runtime does it in every interpreter that loads a model: at once
  if torch is imported there, else the moment it is) makes two defaults share, so
  that the plain idiom
  `net.load_state_dict(torch.load(path))` shares too:

  1. `torch.load(f)` maps the file (`mmap=True`) when the caller did not pass `mmap`,
     `f` is a path to a zip-format checkpoint (torch's format since 1.6), and torch's
     default mmap flags are `MAP_PRIVATE` (if mapping fails, it loads the stock way).
     File objects, legacy-format files, TorchScript archives and `.safetensors` paths
     load as before; `mmap=False` always copies.
  2. `Module.load_state_dict(sd)` (without `assign`) runs unchanged, copying as
     always; then each parameter or buffer whose source tensor in `sd` lives in a
     file mapping, and that now holds bitwise the same bytes with the same dtype,
     shape and strides, on the CPU, owning its whole storage, is pointed at that
     source tensor (`param.data = source`): the same Parameter objects with the same
     values, but backed by the file instead of a private copy, which is freed.

  Why this is safe: the values a model computes with are bitwise the ones it would
  have had; dtype conversions, key renames or transforms done by load hooks make the
  comparison fail and leave that tensor copied. What changes: (a) a parameter shares
  memory with the tensor in the loaded state dict (an in-place write to one shows in
  the other, where before they were independent); views of the *old* parameter taken
  before loading keep the loaded values but stop aliasing it; (b) the weights file
  must not be truncated or rewritten in place while the model is loaded (replace it
  by renaming a new file over it, or use a new version folder): a mapped page that
  disappears raises SIGBUS, which ends the whole server process, as it would with
  any mapping, `load_weights` and torch.package's included; (c) under memory pressure the kernel may drop clean
  weight pages and read them again from the file, rather than keep them resident.
  A model opts out with `share_weights = False` on its class (both defaults then
  behave as stock torch while its constructor and `load()` run), or per call with
  `torch.load(..., mmap=False)` / `load_state_dict(..., assign=True)`.

Packaged models (torch.package) get the same through `package.py`, which reads the
archive's tensors as slices of one mapping of the archive.

Standard library only at import time: torch is imported when first needed.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import json
import os
import sys
from collections.abc import Iterator, Mapping
from typing import Any

_ZIP_MAGIC = b"PK\x03\x04"
_MAP_PRIVATE = 2  # mmap.MAP_PRIVATE on Linux; torch's default for mmap=True

# The policy of the model being loaded (its class's `share_weights`); True otherwise.
_share = True
_installed = False

# safetensors dtype names -> torch dtype attribute names
_SAFETENSORS_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
    "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8",
    "U64": "uint64", "U32": "uint32", "U16": "uint16", "U8": "uint8", "BOOL": "bool",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "C64": "complex64",
}


def load_weights(path: str | os.PathLike[str], *, into: Any = None, strict: bool = True,
                 map_location: Any = None) -> Any:
    """Load a weights file as tensors backed by one shared mapping of the file.

    `path`: a checkpoint saved with `torch.save` (zip format) or a `.safetensors` file.
    Returns what `torch.load(path, mmap=True, weights_only=True)` returns (for
    safetensors: a dict of name -> tensor). With `into` (a `torch.nn.Module`), loads
    the state dict into it with `assign=True` (the module's parameters become the
    mapped tensors; `strict` as for `load_state_dict`) and returns the module.

    Every interpreter that loads the same file maps the same pages: the weights count
    once in the process's memory. Writes to the tensors are private (copy on write).
    Raises ValueError for a legacy-format (non-zip) checkpoint, which cannot be mapped.
    """
    import torch

    fspath = os.fspath(path)
    if fspath.endswith(".safetensors"):
        state: Any = _load_safetensors(fspath)
        if map_location is not None:
            state = {k: v.to(map_location) for k, v in state.items()}
    else:
        if not _is_zip(fspath):
            raise ValueError(
                f"{fspath}: not a zip-format torch checkpoint (legacy torch.save format?), so it cannot "
                "be memory-mapped; save it again with torch.save (torch >= 1.6) or as .safetensors"
            )
        with torch.serialization.set_default_mmap_options(_MAP_PRIVATE):
            state = _original_load()(fspath, map_location=map_location, weights_only=True, mmap=True)
    if into is None:
        return state
    into.load_state_dict(state, strict=strict, assign=True)
    return into


def _load_safetensors(path: str) -> dict[str, Any]:
    """A .safetensors file as tensors over one MAP_PRIVATE mapping (format: an 8-byte
    little-endian header length, a JSON header of name -> dtype, shape, data_offsets,
    then the data)."""
    import torch

    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"{path}: too short for a safetensors file")
        n = int.from_bytes(head, "little")
        if n > size - 8:
            raise ValueError(f"{path}: header length {n} runs past the end of the file")
        header = json.loads(f.read(n))
    base = 8 + n
    whole = torch.UntypedStorage.from_file(path, False, size)
    out: dict[str, Any] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype_name = _SAFETENSORS_DTYPES.get(info["dtype"])
        dtype = getattr(torch, dtype_name, None) if dtype_name else None
        if dtype is None:
            raise ValueError(f"{path}: tensor {name!r} has dtype {info['dtype']!r}, which torch cannot hold")
        start, end = (base + int(o) for o in info["data_offsets"])
        shape = tuple(int(d) for d in info["shape"])
        count = 1
        for d in shape:
            count *= d
        if end > size or end - start != count * dtype.itemsize:
            raise ValueError(f"{path}: tensor {name!r}: data_offsets do not fit its shape and dtype")
        strides, step = [], 1
        for d in reversed(shape):
            strides.append(step)
            step *= max(d, 1)
        out[name] = torch.empty(0, dtype=dtype).set_(whole[start:end], 0, shape, tuple(reversed(strides)))
    return out


def _is_zip(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == _ZIP_MAGIC
    except OSError:
        return False


def _original_load() -> Any:
    import torch

    return getattr(torch.serialization.load, "__aserve_original__", torch.serialization.load)


# ---- interpreter-wide defaults ----


@contextlib.contextmanager
def policy(share: bool) -> Iterator[None]:
    """While a model's constructor and load() run: its `share_weights` setting."""
    global _share
    previous, _share = _share, share
    try:
        yield
    finally:
        _share = previous


def _mappable(f: Any) -> bool:
    if not isinstance(f, (str, os.PathLike)):
        return False
    fspath = os.fspath(f)
    return isinstance(fspath, str) and not fspath.endswith(".safetensors") and _is_zip(fspath)


def install() -> None:
    """Make torch.load map zip checkpoints and load_state_dict share mapped tensors, by
    default, in this interpreter (see the module docstring). Idempotent; imports torch."""
    global _installed
    if _installed:
        return
    import torch
    import torch.serialization

    original_load = _original_load()

    @functools.wraps(original_load)
    def load(f: Any, *args: Any, mmap: bool | None = None, **kwargs: Any) -> Any:
        if (mmap is None and _share and _mappable(f)
                and torch.serialization.get_default_mmap_options() == _MAP_PRIVATE):
            try:
                return original_load(f, *args, mmap=True, **kwargs)
            except (RuntimeError, OSError, ValueError):
                pass  # e.g. a file system that cannot map: load it the stock way (its error, if any)
        return original_load(f, *args, mmap=mmap, **kwargs)

    load.__aserve_original__ = original_load  # type: ignore[attr-defined]
    torch.load = torch.serialization.load = load

    module_cls = torch.nn.Module
    original_lsd = getattr(module_cls.load_state_dict, "__aserve_original__", module_cls.load_state_dict)

    @functools.wraps(original_lsd)
    def load_state_dict(self: Any, state_dict: Mapping[str, Any], *args: Any, **kwargs: Any) -> Any:
        result = original_lsd(self, state_dict, *args, **kwargs)
        assign = kwargs.get("assign", args[1] if len(args) > 1 else False)
        if _share and not assign and isinstance(state_dict, Mapping):
            share_state(self, state_dict)
        return result

    load_state_dict.__aserve_original__ = original_lsd  # type: ignore[attr-defined]
    module_cls.load_state_dict = load_state_dict  # type: ignore[method-assign]
    _installed = True


def uninstall() -> None:
    """Undo install(): stock torch.load and load_state_dict again (tests use it)."""
    global _installed
    _remove_hook()
    torch: Any = sys.modules.get("torch")
    if torch is None:
        return
    load = getattr(torch.serialization.load, "__aserve_original__", None)
    if load is not None:
        torch.load = torch.serialization.load = load
    lsd = getattr(torch.nn.Module.load_state_dict, "__aserve_original__", None)
    if lsd is not None:
        torch.nn.Module.load_state_dict = lsd
    _installed = False


class _TorchHook:
    """A one-shot import hook: installs the defaults as soon as torch finishes importing,
    so that model code importing torch (even `from torch import load`) sees them."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != "torch":
            return None
        _remove_hook()
        import importlib.util

        spec = importlib.util.find_spec("torch")
        loader = getattr(spec, "loader", None)
        exec_module = getattr(loader, "exec_module", None)
        if spec is None or exec_module is None:
            return spec

        def exec_then_install(module: Any) -> None:
            exec_module(module)
            install()

        loader.exec_module = exec_then_install  # type: ignore[union-attr]
        return spec


def _remove_hook() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _TorchHook)]


def install_when_imported() -> None:
    """install() now if torch is imported in this interpreter, else when it is."""
    if _installed:
        return
    if "torch" in sys.modules:
        install()
    elif not any(isinstance(f, _TorchHook) for f in sys.meta_path):
        sys.meta_path.insert(0, _TorchHook())


def _file_ranges() -> list[tuple[int, int]]:
    """Sorted (start, end) of this process's mappings of regular files."""
    ranges = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) == 6 and parts[4] != "0" and parts[5].startswith("/"):
                    start, end = parts[0].split("-")
                    ranges.append((int(start, 16), int(end, 16)))
    except OSError:
        return []
    ranges.sort()
    return ranges


def _in(ranges: list[tuple[int, int]], address: int) -> bool:
    i = bisect.bisect_right(ranges, (address, 1 << 64)) - 1
    return i >= 0 and ranges[i][0] <= address < ranges[i][1]


def file_backed(tensor: Any) -> bool:
    """Whether a CPU tensor's memory is a mapping of a file (shared through the page cache)."""
    return tensor.numel() > 0 and _in(_file_ranges(), tensor.data_ptr())


def share_state(module: Any, state_dict: Mapping[str, Any]) -> int:
    """Point `module`'s parameters and buffers at the file-backed tensors of `state_dict`
    they were just copied from, where that changes nothing but where the bytes live
    (see the module docstring). Returns the bytes now shared."""
    import torch

    ranges = _file_ranges()
    if not ranges:
        return 0
    shared = 0
    named = [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]
    with torch.no_grad():
        for name, t in named:
            s = state_dict.get(name)
            if not isinstance(s, torch.Tensor) or not _same_layout(t, s):
                continue
            if t.untyped_storage().data_ptr() == s.untyped_storage().data_ptr():
                continue  # already shares it (tied weights, or loaded twice)
            if not _in(ranges, s.data_ptr()):
                continue
            if not torch.equal(t.reshape(-1).view(torch.uint8), s.reshape(-1).view(torch.uint8)):
                continue
            t.data = s
            shared += t.numel() * t.element_size()
    return shared


def _same_layout(t: Any, s: Any) -> bool:
    import torch

    return bool(
        t.numel() > 0
        and t.layout == torch.strided and s.layout == torch.strided
        and t.device.type == "cpu" and s.device.type == "cpu"
        and not t.is_quantized and not s.is_quantized
        and t.dtype == s.dtype and t.shape == s.shape and t.stride() == s.stride()
        and t.is_contiguous() and t.storage_offset() == 0
        and t.untyped_storage().nbytes() == t.numel() * t.element_size()
        and type(s) in (torch.Tensor, torch.nn.Parameter)
    )
