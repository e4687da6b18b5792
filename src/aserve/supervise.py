"""`aserve serve --supervise`: a small parent process that keeps a server running.

Model code runs inside the server's process, so a crash in native code (a segfault, an
abort() in an extension) ends the server with every request in flight. The supervisor
starts `aserve serve` (the same arguments, without --supervise) as a child, and when
the child dies it logs how (exit status or signal) and starts it again, after a
back-off that doubles on every start that did not become ready (1 s, 2 s, 4 s ... at
most 60 s) and starts over once a child answered /v2/health/ready. SIGTERM and SIGINT
are passed on to the child, and the supervisor exits when the child has; SIGHUP (rescan
the repository) is passed on. A child that exits with status 0 on its own was stopped
on purpose: the supervisor exits too; status 2 before ever becoming ready (its settings
or repository are invalid) is not retried.

This process never creates an interpreter or an event loop: it only spawns and
waits (subprocess, urllib), so it may fork safely (a process holding PEP 684
subinterpreters may not: MagicStack/uvloop#650).
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from types import FrameType

log = logging.getLogger("aserve.supervise")

FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 60.0
PROBE_EVERY_S = 0.2
SETTINGS_ERROR = 2  # what `aserve serve` exits with when its settings or repository are invalid


def probe_url(host: str, port: int) -> str:
    """The child's readiness endpoint, reachable from here whatever address it listens on."""
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/v2/health/ready"


def is_ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1.0) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def describe_exit(status: int) -> str:
    if status < 0:
        try:
            name = signal.Signals(-status).name
        except ValueError:
            name = f"signal {-status}"
        return f"was killed by {name} ({-status})"
    return f"exited with status {status}"


class Supervisor:
    """Runs `command` until told to stop; see the module's docstring."""

    def __init__(self, command: Sequence[str], ready_url: str) -> None:
        self.command = list(command)
        self.ready_url = ready_url
        self.child: subprocess.Popen[bytes] | None = None
        self.stopping: signal.Signals | None = None  # the signal that asked us to stop

    def _forward(self, signum: int, frame: FrameType | None) -> None:
        sig = signal.Signals(signum)
        if sig in (signal.SIGTERM, signal.SIGINT):
            self.stopping = sig
        child = self.child
        if child is not None and child.poll() is None:
            log.info("passing %s on to the server (pid %d)", sig.name, child.pid)
            child.send_signal(sig)

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._forward)
        backoff = FIRST_BACKOFF_S
        starts = 0
        while self.stopping is None:
            starts += 1
            started = time.monotonic()
            self.child = child = subprocess.Popen(self.command)
            log.info("started the server (pid %d, start %d): %s", child.pid, starts, " ".join(self.command))
            ready_at = self._wait(child)
            status = child.returncode
            ran = time.monotonic() - started
            if self.stopping is not None:
                log.info("the server (pid %d) %s after %s; stopping", child.pid, describe_exit(status),
                         self.stopping.name)
                return 0 if status in (0, -signal.SIGTERM, -signal.SIGINT) else 1
            if status == 0:
                log.info("the server (pid %d) exited with status 0 on its own; stopping", child.pid)
                return 0
            if status == SETTINGS_ERROR and ready_at is None:
                log.error("the server (pid %d) exited with status 2 before it became ready: its settings or "
                          "repository are invalid (see above); not restarting", child.pid)
                return SETTINGS_ERROR
            if ready_at is not None:
                backoff = FIRST_BACKOFF_S  # it served: the next failure starts the back-off over
                how = f"it had been ready for {time.monotonic() - ready_at:.1f} s"
            else:
                how = f"it never became ready ({ran:.1f} s after its start)"
            log.error("the server (pid %d) %s; %s; restarting it in %.1f s (restart %d)", child.pid,
                      describe_exit(status), how, backoff, starts,
                      extra={"exit_status": status, "restart": starts, "backoff_s": backoff})
            if self._pause(backoff):
                break
            if ready_at is None:
                backoff = min(backoff * 2, MAX_BACKOFF_S)
        log.info("stopping (%s) between server starts", self.stopping.name if self.stopping else "asked")
        return 0

    def _wait(self, child: subprocess.Popen[bytes]) -> float | None:
        """Wait for the child to exit; returns when it became ready (monotonic), or None."""
        ready_at: float | None = None
        while True:
            try:
                child.wait(timeout=PROBE_EVERY_S if ready_at is None else 1.0)
                return ready_at
            except subprocess.TimeoutExpired:
                pass
            if ready_at is None and self.stopping is None and is_ready(self.ready_url):
                ready_at = time.monotonic()
                log.info("the server (pid %d) is ready: %s", child.pid, self.ready_url)

    def _pause(self, seconds: float) -> bool:
        """Sleep out the back-off; True if asked to stop meanwhile."""
        end = time.monotonic() + seconds
        while self.stopping is None:
            left = end - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(left, 0.1))
        return True


def supervise(argv: Sequence[str], *, host: str, port: int) -> int:
    """Run `aserve <argv>` (a serve command line without --supervise) under supervision."""
    if port == 0:
        print("aserve: --supervise needs a fixed --port: it probes the server's /v2/health/ready", file=sys.stderr)
        return SETTINGS_ERROR
    command = [sys.executable, "-m", "aserve.cli", *argv]
    return Supervisor(command, probe_url(host, port)).run()
