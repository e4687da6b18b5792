"""The servers `benchmarks.http` compares, as subprocesses it starts, probes, measures and stops.

Each `ServerProcess` knows its command line, how to tell it is ready, and which thread
or process is its front (the event loop, or MOSEC's Rust front) whose CPU per request
the benchmark reports. Memory and CPU are read for the whole process tree (MOSEC's
front and workers are children of its Python launcher).
"""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import TYPE_CHECKING

import psutil

from . import ROOT, child_env

if TYPE_CHECKING:
    from aserve.server.threads import ThreadCpu

SERVERS = ("aserve", "aserve-main", "ceiling", "inline", "mosec", "mosec-native")
# aserve with OpenTelemetry tracing on, sampling every request or one in a hundred, sending to a
# local OTLP sink (not in the default run: `--servers aserve,aserve-trace,aserve-trace1`)
TRACED = {"aserve-trace": 1.0, "aserve-trace1": 0.01}
# aserve with its defaults changed: the same-run baseline of a default; aserve-same changes nothing (a
# second aserve in each round: how far two runs of one server differ, against which a difference is judged)
SETTINGS = {"aserve-nospin": ["--spin-us", "0"], "aserve-nocolocate": ["--no-colocate"], "aserve-same": [], "aserve-loops0": ["--loops", "0"],
            "aserve-loops1": ["--loops", "1"], "aserve-loops2": ["--loops", "2"], "aserve-loops3": ["--loops", "3"],
            "aserve-loops4": ["--loops", "4"], "aserve-loops6": ["--loops", "6"], "aserve-loops8": ["--loops", "8"],
            "aserve-loops10": ["--loops", "10"], "aserve-loops12": ["--loops", "12"],
            # two fronts, each batching with its own batcher (the pool's queue shared only by their batches)
            "aserve-loops2-loop": ["--loops", "2", "--front-batching", "loop"],
            "aserve-nogrpc": ["--no-grpc"]}
BEFORE = "aserve-before"  # aserve as another build serves it (`--before PYTHON`): a change's same-run baseline
MOSEC_VERSION = "0.9.8"
TORCH_PIN = "torch==2.13.0"  # the CPU wheel; an unpinned torch pulls gigabytes of CUDA packages
_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(processes: list[psutil.Process]) -> float:
    """User and system CPU seconds of `processes` together (those gone count nothing)."""
    total = 0.0
    for p in processes:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def stop_tree(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM a server, wait (kill it after 30 s), then end the processes it had started
    (workers, a front) by their ids; its exit status."""
    try:
        family = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        family = []
    proc.terminate()
    try:
        rc = proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = proc.wait()
    for p in family:
        try:
            p.wait(10)
        except psutil.TimeoutExpired:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    return rc


class ServerFailed(RuntimeError):
    """The server did not start or did not become ready; the message says why (log tail included)."""


def post(url: str, body: bytes, headers: dict[str, str], timeout: float = 30.0) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def stat_cpu_s(path: str) -> float:
    """utime + stime of a /proc/.../stat file, in seconds."""
    with open(path) as f:
        text = f.read()
    fields = text[text.rindex(")") + 2:].split()  # fields from 3 (state) on; comm may hold spaces
    return (int(fields[11]) + int(fields[12])) / _TICKS


def thread_cpu_s(sampler: ThreadCpu) -> dict[str, float]:
    """CPU seconds of a server process's threads by what they do, from their names (the
    server's own reading, `aserve.server.threads`): `host` (the main thread: the host's event
    loop), `loops` (front loops), `interpreters` (and the threads their models start), and
    `other`, the rest of the process's CPU."""
    from aserve.server.threads import HOST

    groups = {"host": 0.0, "loops": 0.0, "interpreters": 0.0}
    for key, seconds in sampler.sample().items():
        groups["host" if key == HOST else "loops" if key[0] == "loop" else "interpreters"] += seconds
    total = stat_cpu_s(f"/proc/{sampler.pid}/stat")  # every thread's, ended ones included
    return {**groups, "other": max(0.0, total - sum(groups.values()))}


class ServerProcess:
    """One server under test, started with `start()`, always stopped with `stop()`."""

    def __init__(self, name: str, model: str, argv: list[str], *, env: dict[str, str] | None = None,
                 ready: str = "probe", front: str = "main-thread", path: str | None = None) -> None:
        self.name = name
        self.model = model
        self.argv = argv
        self.env = env
        self.ready = ready  # "probe": the check request answers 200; "aserve": the repository index
        self.front = front  # "main-thread": the loop is the main thread; "mosec": the Rust front process
        self.port = int(argv[argv.index("--port") + 1])
        self.base = f"http://127.0.0.1:{self.port}"
        self.url = self.base + (path or f"/v2/models/{model}/infer")  # where the requests go
        self.proc: subprocess.Popen[bytes] | None = None
        self.log: pathlib.Path | None = None  # the server's stdout and stderr
        self.notes: dict[str, object] = {}
        self._threads: ThreadCpu | None = None  # its threads' CPU by name, kept across readings

    # ---- lifecycle ----

    def start(self, probe: Callable[[], bool], timeout: float = 300.0) -> None:
        fd, path = tempfile.mkstemp(prefix=f"benchmarks-{self.name}-", suffix=".log")
        self.log = pathlib.Path(path)
        with os.fdopen(fd, "wb") as log:
            self.proc = subprocess.Popen(self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerFailed(f"{self.name} exited with {self.proc.returncode} while starting: {self.log_tail()}")
            try:
                if self._ready(probe):
                    return
            except OSError:
                pass  # not listening yet
            time.sleep(0.1)  # poll the server's observable state until the deadline
        raise ServerFailed(f"{self.name} was not ready after {timeout:.0f} s: {self.log_tail()}")

    def _ready(self, probe: Callable[[], bool]) -> bool:
        if self.ready == "aserve":
            status, _, body = post(f"{self.base}/v2/repository/index", b"", {}, timeout=5)
            index = json.loads(body) if status == 200 else None
            if not index or any(m["state"] == "LOADING" for m in index):
                return False
            states = {m["name"]: m["state"] for m in index}
            if states.get(self.model) != "READY":
                raise ServerFailed(f"{self.name}: model {self.model} is {states.get(self.model)}: "
                                   f"{self.log_tail()}")
            _, meta = get(f"{self.base}/v2/models/{self.model}")
            params = json.loads(meta).get("parameters", {})
            self.notes["engine"] = params.get("engine")
            return True
        return probe()

    def stop(self) -> int | None:
        """SIGTERM, wait, then kill whatever of its tree is left; the exit status of the server."""
        if self.proc is None:
            return None
        rc = stop_tree(self.proc)
        if self.log is not None:
            self.log.unlink(missing_ok=True)
        return rc

    def log_tail(self, n: int = 1500) -> str:
        text = self.log.read_text(errors="replace") if self.log is not None else ""
        return text[-n:].strip() or "(no output)"

    # ---- measurements ----

    def tree(self) -> list[psutil.Process]:
        assert self.proc is not None
        try:
            root = psutil.Process(self.proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def pss_mb(self) -> float:
        total = 0
        for p in self.tree():
            try:
                total += p.memory_full_info().pss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        return total / 2**20

    def tree_cpu_s(self) -> float:
        return cpu_s(self.tree())

    def front_cpu_s(self) -> float:
        """CPU of the server's front: its event-loop threads (the main thread's, and the front
        loops' where there are any), or MOSEC's Rust process (all threads)."""
        assert self.proc is not None
        if self.front == "mosec":
            for p in self.tree()[1:]:
                try:
                    if p.name() == "mosec":
                        return stat_cpu_s(f"/proc/{p.pid}/stat")
                except (psutil.NoSuchProcess, FileNotFoundError):
                    pass
            raise ServerFailed("mosec: no Rust front process (named 'mosec') under the server")
        groups = self.threads_cpu_s()
        return groups["host"] + groups["loops"]

    def threads_cpu_s(self) -> dict[str, float]:
        """`thread_cpu_s` of the server's main process."""
        assert self.proc is not None
        if self._threads is None or self._threads.pid != self.proc.pid:
            # the server's own reading, imported here: it imports the server package
            from aserve.server.threads import ThreadCpu

            self._threads = ThreadCpu(self.proc.pid)
        return thread_cpu_s(self._threads)

    @property
    def front_source(self) -> str:
        if self.front == "mosec":
            return "MOSEC Rust front process, all its threads (MOSEC has no Python event loop)"
        return "event-loop threads: the main thread (TID = PID) and the front loops' (aserve-loop*)"


# ---- command lines ---------------------------------------------------------------

def aserve_server(name: str, model: str, repository: pathlib.Path, *, interpreters: int,
                  otlp: str | None = None, python: pathlib.Path | None = None) -> ServerProcess:
    """aserve serving `repository`; `python`: another build's interpreter (aserve installed there)."""
    argv = [str(python or sys.executable), "-m", "aserve.cli", "serve", str(repository), "--interpreters", str(interpreters),
            "--port", str(free_port()), "--log-level", "warning"]
    if name == "aserve-main":
        argv += ["--engine", "main"]
    argv += SETTINGS.get(name, [])
    # the gRPC front on a free port rather than 8001, which another server may hold (a build
    # without gRPC ignores the variable)
    env = dict(os.environ, ASERVE_GRPC_PORT="0")
    if name in TRACED:
        if otlp is None:
            raise ValueError(f"{name} needs an OTLP endpoint")
        env = {k: v for k, v in env.items() if not k.startswith("OTEL_")}
        env.update(OTEL_EXPORTER_OTLP_ENDPOINT=otlp, OTEL_TRACES_SAMPLER="parentbased_traceidratio",
                   OTEL_TRACES_SAMPLER_ARG=str(TRACED[name]))
    return ServerProcess(name, model, argv, env=env, ready="aserve")


def otlp_sink() -> tuple[subprocess.Popen[bytes], str]:
    """An OTLP/HTTP receiver that drops what it gets, and its endpoint."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.peers.otlp_sink", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=child_env())
    return proc, f"http://127.0.0.1:{port}"


def aiohttp_peer(name: str, model: str, examples: pathlib.Path) -> ServerProcess:
    module = {"ceiling": "benchmarks.peers.ceiling", "inline": "benchmarks.peers.inline"}[name]
    argv = [sys.executable, "-m", module, "--port", str(free_port())]
    if name == "inline":
        argv += ["--model", model, "--model-py", str(examples / model / "model.py")]
    return ServerProcess(name, model, argv, env=child_env())


def mosec_server(model: str, examples: pathlib.Path, python: pathlib.Path, *, native: bool = False,
                 workers: int = 2) -> ServerProcess:
    """MOSEC serving V2 JSON (`mosec`), or its own JSON body on /inference (`mosec-native`), with
    `workers` worker processes."""
    env = child_env(dict(os.environ, ASERVE_BENCH_MODEL=model, ASERVE_BENCH_WORKERS=str(workers),
                         ASERVE_BENCH_MODEL_PY=str(examples / model / "model.py")))
    # an example's model.py imports aserve.runtime (standard library only), which is not installed there
    env["PYTHONPATH"] = os.pathsep.join((str(ROOT / "src"), env["PYTHONPATH"]))
    module = "benchmarks.peers.mosec_native" if native else "benchmarks.peers.mosec_server"
    argv = [str(python), "-m", module, "--address", "127.0.0.1", "--port", str(free_port()), "--log-level", "warning"]
    return ServerProcess("mosec-native" if native else "mosec", model, argv, env=env, front="mosec",
                         path="/inference" if native else None)


# ---- MOSEC's environment -----------------------------------------------------------

def _pip(python: pathlib.Path, *packages: str) -> subprocess.CompletedProcess[str]:
    cmd = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    if pathlib.Path("/opt/wheels").is_dir():  # local wheels, as ./dev uses them
        cmd += ["--find-links", "/opt/wheels"]
    return subprocess.run([*cmd, *packages], capture_output=True, text=True, check=False)


def _imports(python: pathlib.Path, module: str) -> bool:
    return subprocess.run([str(python), "-c", f"import {module}"], capture_output=True, check=False).returncode == 0


def mosec_python(folder: pathlib.Path, *, torch: bool) -> tuple[pathlib.Path, str]:
    """The Python of MOSEC's virtual environment under `folder`, created with pip on first use.

    Returns (python, MOSEC's version); raises ServerFailed with pip's output when it cannot.
    """
    venv = folder / "mosec-venv"
    python = venv / "bin" / "python"
    if not python.exists():
        print(f"http: creating MOSEC's environment in {venv} (once)", file=sys.stderr, flush=True)
        made = subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], capture_output=True, text=True,
                              check=False)
        if made.returncode != 0:
            raise ServerFailed(f"cannot create {venv}: {made.stderr.strip()}")
    if not (_imports(python, "mosec") and _imports(python, "msgspec")):
        # msgspec: MOSEC's typed workers decode with it (its `validation` extra), and so do the peers
        print(f"http: installing mosec=={MOSEC_VERSION} and msgspec into {venv}", file=sys.stderr, flush=True)
        got = _pip(python, f"mosec=={MOSEC_VERSION}", "msgspec")
        if got.returncode != 0:
            print(f"http: mosec=={MOSEC_VERSION} is not available; installing the newest", file=sys.stderr)
            got = _pip(python, "mosec", "msgspec")
        if got.returncode != 0:
            raise ServerFailed(f"pip could not install mosec into {venv}: {got.stderr.strip()[-800:]}")
    if torch and not _imports(python, "torch"):
        print(f"http: installing {TORCH_PIN} into {venv}", file=sys.stderr, flush=True)
        got = _pip(python, TORCH_PIN)
        if got.returncode != 0:
            raise ServerFailed(f"pip could not install {TORCH_PIN} into {venv}: {got.stderr.strip()[-800:]}")
    version = subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.version('mosec'))"],
                             capture_output=True, text=True, check=False).stdout.strip()
    return python, version
