"""Containing model faults inside a pool interpreter (standard library only).

Model code shares the server's process, so a model that calls `os._exit()` or
`os.abort()` would end the server and every request in it. `configure()` (called
once per interpreter by the engine) replaces those functions in the interpreter's
`os` module with guards that raise `ModelExit` instead, naming the model and version
that called them; `sys.exit()` raises SystemExit, which the runtime turns into the
same `ModelExit` (see `_worker`). The job fails with that message; the interpreter
and the server go on.

`Cancelled` is what the engine raises inside a running batch whose requests all
timed out (PyThreadState_SetAsyncExc, at the next bytecode boundary). `time.sleep` is
replaced by one that sleeps in slices of at most `SLEEP_SLICE` seconds, so that a
cancelled model sleeping in Python ends within a slice; a call blocked in C (a lock
without timeout, I/O, ctypes, an extension) cannot be interrupted this way.

Where it applies: private interpreters and PEP 684 subinterpreters have their own
`os`, `posix` and `time` modules, so the guards cover every thread of them (threads a
model starts included). The `main` engine's interpreters are threads of the host,
whose modules the server itself uses: there the guards act only on a worker thread
while it runs a job, and other threads (also those a model starts) get the real
functions. Nothing here stops a model that ends the process another way (`os.kill`
of its own pid, `ctypes` calls of libc's `exit` or `abort`, a crash in C): see
fault.c for how a fatal signal is reported.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

SLEEP_SLICE = 0.05  # seconds: the longest a cancelled model sleeping in time.sleep goes on


class ModelExit(BaseException):
    """Model code tried to end the process (os._exit, os.abort, sys.exit); its job fails instead.

    A BaseException, like SystemExit, so that `except Exception` in model code does not
    swallow it."""


class Cancelled(BaseException):
    """Raised in a running batch by the engine: every request of it timed out.

    A BaseException so that `except Exception` in model code does not swallow it."""


_local = threading.local()  # .label: "model NAME version V" while this thread runs a job
_every_thread = False  # private and subinterp: every thread of the interpreter runs model code
_last_label = "model code"  # the label of the last job started: what threads a model started report
_pid = os.getpid()
_configured = False


def _label() -> str | None:
    """Who is calling, if the guards apply to this thread: "model NAME version V"."""
    label: str | None = getattr(_local, "label", None)
    if label is not None:
        return label
    if _every_thread:
        return _last_label
    return None


def enter(label: str) -> str | None:
    """This thread starts running `label`'s code; returns what `leave` restores."""
    global _last_label
    previous: str | None = getattr(_local, "label", None)
    _local.label = _last_label = label
    return previous


def leave(previous: str | None) -> None:
    _local.label = previous


def exit_error(label: str, exc: SystemExit) -> ModelExit:
    """A SystemExit raised by model code, as the job's failure."""
    code = exc.code
    return ModelExit(f"{label} called sys.exit({'' if code is None else repr(code)})")


def describe(exc: BaseException) -> str:
    """An exception model code raised, as a load failure names it."""
    if isinstance(exc, SystemExit):
        return str(exit_error(_label() or "model code", exc))
    if isinstance(exc, ModelExit):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def _guard(real: Callable[..., Any], describe: Callable[..., str]) -> Callable[..., Any]:
    def guarded(*args: Any, **kwargs: Any) -> Any:
        label = _label()
        if label is None or os.getpid() != _pid:  # not model code, or a forked child: the real thing
            return real(*args, **kwargs)
        raise ModelExit(f"{label} called {describe(*args, **kwargs)}")

    guarded.__name__ = real.__name__
    guarded.__qualname__ = real.__name__
    guarded.__doc__ = real.__doc__
    guarded.__wrapped__ = real  # type: ignore[attr-defined]
    return guarded


def _sliced_sleep(real: Callable[[float], None]) -> Any:
    monotonic = time.monotonic

    def sleep(seconds: float) -> None:
        # short sleeps, other types (the real one raises) and threads the guards skip: as is
        if not isinstance(seconds, (int, float)) or seconds <= SLEEP_SLICE or _label() is None:
            return real(seconds)
        end = monotonic() + seconds
        while True:  # between slices the interpreter checks for a pending Cancelled
            left = end - monotonic()
            if left <= 0:
                return None
            real(min(left, SLEEP_SLICE))

    sleep.__name__ = "sleep"
    sleep.__qualname__ = "sleep"
    sleep.__doc__ = real.__doc__
    sleep.__wrapped__ = real  # type: ignore[attr-defined]
    return sleep


def configure(engine: str) -> None:
    """Install the guards in this interpreter (once). `engine`: private, subinterp or main."""
    global _every_thread, _configured, _pid
    if _configured:
        return
    _configured = True
    _pid = os.getpid()
    _every_thread = engine in ("private", "subinterp")
    import posix

    exit_guard = _guard(os._exit, lambda code, *_: f"os._exit({code!r})")
    abort_guard = _guard(os.abort, lambda *_: "os.abort()")
    os._exit = posix._exit = exit_guard
    os.abort = posix.abort = abort_guard
    time.sleep = _sliced_sleep(time.sleep)
