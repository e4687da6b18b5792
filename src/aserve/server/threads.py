"""CPU seconds of each event loop and each interpreter, read from the threads' names (/proc).

The pools name their threads (engine/pool.py): front loop i is `aserve-loopi`, interpreter
w of a pool `aserve-privw` (`-subiw`, `-mainw`), and threads a model starts take their
interpreter's name. The host's loop is the main thread. `ThreadCpu.sample()` sums the CPU
of each name, so that an operator sees which is at a core: the loops (more `--loops`) or the
interpreters (more `--interpreters`). A sum never falls: what a thread that ended had spent
by the last sample stays counted (what it spent after that is not seen).
"""

from __future__ import annotations

import os
import re

_TICKS = os.sysconf("SC_CLK_TCK")
_NAME = re.compile(rb"aserve-(loop|priv|subi|main)(\d+)")
ENGINES = {"priv": "private", "subi": "subinterp", "main": "main"}
HOST = ("loop", "host")  # the main thread: the host's event loop

Key = tuple[str, ...]  # ("loop", "host" | index) or ("interpreter", engine, index)


class ThreadCpu:
    """The CPU of one process's named threads, summed per event loop and per interpreter."""

    def __init__(self, pid: int | None = None, proc: str = "/proc") -> None:
        self.pid = os.getpid() if pid is None else pid
        self._task = f"{proc}/{self.pid}/task"
        self._main = str(self.pid)
        self._seen: dict[str, tuple[Key, float]] = {}  # thread id -> (its key, its CPU at the last sample)
        self._ended: dict[Key, float] = {}  # CPU of the ended threads of each key, as last seen

    def sample(self) -> dict[Key, float]:
        """CPU seconds per key, ended threads included (as far as a sample saw them)."""
        now: dict[str, tuple[Key, float]] = {}
        try:
            tids = os.listdir(self._task)
        except OSError:
            tids = []  # no /proc: nothing to report
        for tid in tids:
            read = self._read(tid)
            if read is not None:
                now[tid] = read
        for tid, (key, cpu) in self._seen.items():
            if tid not in now:
                self._ended[key] = self._ended.get(key, 0.0) + cpu
        self._seen = now
        totals = dict(self._ended)
        for key, cpu in now.values():
            totals[key] = totals.get(key, 0.0) + cpu
        return totals

    def _read(self, tid: str) -> tuple[Key, float] | None:
        """(key, CPU seconds) of one thread, or None for a thread of no loop or interpreter
        (or one that ended while it was read)."""
        try:  # os.read, not open(): a scrape reads one of these per thread, on the loop
            fd = os.open(f"{self._task}/{tid}/stat", os.O_RDONLY)
            try:
                text = os.read(fd, 1024)
            finally:
                os.close(fd)
        except OSError:
            return None
        end = text.rfind(b")")
        if tid == self._main:
            key: Key = HOST
        else:
            m = _NAME.fullmatch(text, text.find(b"(") + 1, end)
            if m is None:
                return None
            kind, index = m[1].decode(), m[2].decode()
            key = ("loop", index) if kind == "loop" else ("interpreter", ENGINES[kind], index)
        fields = text[end + 2:].split()  # from field 3 (state) on
        return key, (int(fields[11]) + int(fields[12])) / _TICKS
