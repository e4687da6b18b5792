"""The process's memory as the kernel accounts it, and giving freed memory back.

Standard library only: runs in the host and inside any interpreter.

- `pss()`: the process's proportional set size (bytes), from /proc/self/smaps_rollup:
  private pages count fully, shared ones divided among their mappings, so a file that
  several interpreters map counts once in total.
- `trim()`: glibc's `malloc_trim(0)` on *this interpreter's* C library. A private
  interpreter lives in its own link-map namespace with its own libc and so its own
  malloc arenas: `ctypes.CDLL("libc.so.6")` called from code in that namespace binds
  that namespace's libc (dlopen resolves in the caller's namespace), which is the one
  whose free chunks need returning. `malloc_trim` madvises away every free page of
  every arena, not just the top of the heap; after torch frees large tensors that
  glibc served from an arena (its mmap threshold rises as big blocks are freed),
  this is what returns them.
- `loading()`: around a model's construction and load() in a private interpreter,
  allocations of 128 KiB and more are served by mmap (glibc's M_MMAP_THRESHOLD), so
  that freeing them (a replaced weight, a temporary copy, the model at unload) unmaps
  them at once. Without it they come from the namespace libc's main arena, whose top
  chunk cannot be returned: a secondary namespace's libc may not move the program
  break, so `malloc_trim` can release holes but never the top, and what a model freed
  there stays in the process. glibc raises its mmap threshold dynamically (up to
  32 MiB) whenever a large mmapped block is freed, which is why a model's weights
  land in the arena from its second load on. Setting the threshold fixes it, so after
  loading it is set back to 32 MiB, where the dynamic threshold ends up anyway:
  inference keeps reusing arena memory for its activations. The host's own libc
  (engine "main") is left alone.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

_libc: Any = None
_private: bool | None = None

M_MMAP_THRESHOLD = -3
LOAD_MMAP_THRESHOLD = 128 * 1024  # glibc's default
SERVE_MMAP_THRESHOLD = 32 * 1024 * 1024  # DEFAULT_MMAP_THRESHOLD_MAX on 64-bit


def pss(pid: int | str = "self", *, libraries: bool = True) -> int:
    """Proportional set size of process `pid` (default: this one), in bytes; 0 if unknown.

    `libraries=False` leaves out the mappings of shared libraries (`*.so*`): their PSS
    is divided with every other process that maps the same library, so it moves when
    an unrelated torch process starts or exits (by tens of MB), whatever this process
    does. What a model costs is the rest: anonymous memory and mapped data files."""
    if libraries:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
    total = 0
    counted = True
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                if line[0] in "0123456789abcdef" and "-" in line.split(" ", 1)[0]:  # a mapping's header
                    parts = line.split(None, 5)
                    name = parts[5].strip().rsplit("/", 1)[-1] if len(parts) == 6 else ""
                    counted = libraries or not (name.endswith(".so") or ".so." in name)
                elif counted and line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
    except OSError:
        return 0
    return total


def _c_library() -> Any:
    """This interpreter's libc through ctypes, or False (no glibc, no ctypes)."""
    global _libc
    if _libc is None:
        _libc = False
        if sys.platform.startswith("linux"):
            try:
                import ctypes

                libc = ctypes.CDLL("libc.so.6")
                libc.malloc_trim.argtypes = [ctypes.c_size_t]
                libc.malloc_trim.restype = ctypes.c_int
                libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
                libc.mallopt.restype = ctypes.c_int
                _libc = libc
            except (ImportError, OSError, AttributeError):
                pass
    return _libc


def trim() -> bool:
    """malloc_trim(0) on this interpreter's libc; True if memory was returned. Best effort:
    False where there is no glibc or ctypes cannot load (e.g. some subinterpreters)."""
    libc: Any = _c_library()
    return bool(libc) and bool(libc.malloc_trim(0))


def in_private_namespace() -> bool:
    """Whether this interpreter's libc is a private link-map namespace's (engine "private")."""
    global _private
    if _private is None:
        _private = False
        libc = _c_library()
        if libc:
            try:
                import ctypes

                lmid = ctypes.c_long(0)
                if libc.dlinfo(ctypes.c_void_p(libc._handle), 1, ctypes.byref(lmid)) == 0:  # RTLD_DI_LMID
                    _private = lmid.value != 0
            except (AttributeError, OSError):
                pass
    return _private


@contextlib.contextmanager
def loading() -> Iterator[None]:
    """Large allocations made inside are mmapped, in a private interpreter (see above)."""
    libc: Any = _c_library() if in_private_namespace() else False
    if libc:
        libc.mallopt(M_MMAP_THRESHOLD, LOAD_MMAP_THRESHOLD)
    try:
        yield
    finally:
        if libc:
            libc.mallopt(M_MMAP_THRESHOLD, SERVE_MMAP_THRESHOLD)
