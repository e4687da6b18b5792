"""The host's asyncio front of the native interpreter pool.

`Pool` submits jobs to native worker threads (one interpreter each). Completions
arrive through one eventfd the event loop watches: one wake-up drains every job that
finished meanwhile, and each job's token is called right there, in the reader
callback. Batches (`Pool.run`) complete by calling the batcher's function directly,
so a request's answer costs no future or task of its own here; load, exec and the
convenience `infer` await futures.

A model's input names and datatypes are interned natively once per load
(`_native.Pool.register`); a batch is handed over as its input tensors in the
model's declared order, and the engine never copies a name or a buffer.

Faults. Model code that calls os._exit, os.abort or sys.exit fails its job
(ModelError "model M version V called os._exit(1)"; aserve.runtime.faults). A batch
nobody waits for any more is cancelled (`cancel`): the interpreter raises Cancelled in
it at the next bytecode boundary and comes back for the next batch. One that has not
returned `cancel_grace_s` later (blocked in native code) is given up: its interpreter
is marked lost and gets no more jobs (`lost`, `serves`, stats()["lost"]), until the job
returns, if it ever does. `close(timeout=...)` gives up what is still running at the
deadline rather than wait for it.
"""

from __future__ import annotations

import asyncio
import atexit
import base64
import functools
import json
import logging
import os
import platform
import sys
import sysconfig
import threading
import time
from collections.abc import Callable, Container, Mapping, Sequence
from typing import Any, Self

import msgspec

from .. import _native, cpus
from ..errors import EngineError, InvalidInput, ModelError, ModelLoadError, ModelNotFound, RequestTimeout
from ..runtime.model import TensorSpec
from ..tensor import Tensor
from . import tunables
from .placement import LonePlacement
from .polling import PHASE_S, REST_S, PollingProbe

ENGINES = ("private", "subinterp", "main")
BOOTSTRAP = "aserve.runtime._worker"
log = logging.getLogger("aserve.engine")


def _spinners(cpus: int) -> int:
    """How many interpreters may poll at once by default on `cpus` CPUs."""
    return 0 if cpus < 2 else max(1, (cpus - 1) // 2)


_LONE_JOBS = 8  # lone jobs whose times decide whether the loop polls for the next one
_POLL_PAYS_S = 100e-6  # the loop polls for lone jobs answered within this: a few times what its wake-up costs


class BatchCancelled(RequestTimeout):
    """A batch was cancelled because nobody waits for its answers (every request timed out)."""


class InterpreterLost(EngineError):
    """The interpreter running a job was given up: the job did not return after it was cancelled."""


class ModelSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What to load: a model file (or its folder) and what the config declares.

    `key` names the loaded instance in the pool (default: `name`): two versions of a
    model, or an old and a new load of one version, are loaded side by side under
    different keys. `package`: a torch.package archive's [package] table (archive,
    object or pickle), loaded instead of a model.py."""

    name: str
    path: str
    class_name: str | None = None
    inputs: list[TensorSpec] = []
    outputs: list[TensorSpec] = []
    parameters: dict[str, Any] = {}
    version: str = "1"
    key: str | None = None
    package: dict[str, Any] | None = None

    @property
    def pool_key(self) -> str:
        return self.key or self.name


class ModelInfo(msgspec.Struct, frozen=True, kw_only=True):
    """A loaded model as the interpreters report it."""

    name: str
    engine: str
    interpreters: int  # how many of the pool's interpreters serve it
    class_name: str
    file: str
    tensor_format: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    stages: int = 0  # the model's stages: > 0 lets batches absorb joiners at stage boundaries
    example: dict[str, Any] | None = None  # the model's example request (name -> Tensor), if it declares one


def interpreter_library() -> str:
    """Path of the library loaded first into each private namespace."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(here, "_interp" + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"))
    if not os.path.exists(path):
        raise EngineError(
            "engine 'private' needs a shared libpython (Python built with --enable-shared); "
            f"{sys.executable} has a static one, so aserve built no interpreter library. "
            "Use engine 'subinterp' (Python >= 3.12) or 'main'"
        )
    return path


def _check_platform() -> None:
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        raise EngineError(
            f"engine 'private' needs Linux with glibc (dlmopen namespaces); this is {sys.platform} "
            f"{platform.libc_ver()[0] or 'without glibc'}. Use engine 'subinterp' or 'main'"
        )


# Native pools outlive Pool objects: interpreters cannot be recreated in a namespace
# that once held torch, so a closed Pool parks its native pool here for the next one.
_parked: dict[str, list[_native.Pool]] = {}
_subinterp_pools: list[Any] = []


def _settle_shared_statics() -> None:
    """Fill, from the host, the process-wide state that extensions shared with subinterpreters
    fill lazily and without a lock, before interpreters with their own GIL race to fill it.

    ctypes: `_ctypes_get_fielddesc` (CPython 3.12, 3.13) marks its table of type codes
    initialized *before* filling it, so the second of two interpreters defining their first
    ctypes type at once reads an unfilled entry and crashes (SIGSEGV in ctypes/__init__.py,
    `class py_object`). Every interpreter of a pool loads its model at once, and the runtime
    (`memory`) and models import ctypes while loading. Importing it here defines its
    types, which fills the table once for the process."""
    try:
        import ctypes  # noqa: F401
    except ImportError:  # a Python built without _ctypes: nothing to fill
        pass


@atexit.register
def _end_subinterpreters() -> None:
    # a host that finalizes with live subinterpreters aborts (3.12): end them first
    for native in _subinterp_pools:
        native.shutdown()


def _error(payload: tuple[str, str]) -> Exception:
    error_type, text = payload
    if error_type == "LoadError":
        return ModelLoadError(text.strip())
    if error_type == "EngineError":
        return EngineError(text)
    if error_type == "Cancelled":
        return BatchCancelled("the batch was cancelled: every request of it timed out")
    if error_type == "InterpreterLost":
        return InterpreterLost(text)
    last = text.strip().splitlines()[-1] if text.strip() else error_type
    return ModelError(last, traceback=text, error_type=error_type)


def describe_key(key: str) -> str:
    """A pool key (`name/version`, `name/version#load`, or a bare name) as logs name it."""
    name, slash, version = key.rpartition("/")
    if not slash:
        return f"model {key}"
    return f"model {name} version {version.partition('#')[0]}"


def _example(encoded: list[dict[str, Any]] | None) -> dict[str, Tensor] | None:
    if not encoded:
        return None
    return {t["name"]: Tensor(t["datatype"], tuple(t["shape"]), base64.b64decode(t["data"])) for t in encoded}


def _settle(fut: asyncio.Future[Any], ok: bool, payload: Any) -> None:
    """The token of a job someone awaits: resolve its future."""
    if fut.done():  # the caller stopped waiting; the job itself still ran
        return
    if ok:
        fut.set_result(payload)
    else:
        fut.set_exception(_error(payload))


def tensors(outputs: list[tuple[str, str, tuple[int, ...], Any]]) -> dict[str, Tensor]:
    """A completed batch's outputs (name, datatype, shape, buffer) as named tensors."""
    return {name: Tensor(datatype, shape, buf) for name, datatype, shape, buf in outputs}


# What a batch's completion hands its `done` function: (outputs, None) or (None, error).
Done = Callable[[dict[str, Tensor] | None, BaseException | None], None]
_NO_COMPLETION = ("EngineError", "the engine could not build this job's completion (out of memory)")


class _Model:
    """A loaded model's entry in a pool: what the interpreters reported, which of them
    run it, and its interned native registration."""

    __slots__ = ("info", "input_names", "mask", "ref", "refs_by_signature")

    def __init__(self, info: ModelInfo, mask: int, native: Any) -> None:
        self.info = info
        self.mask = mask
        self.input_names = tuple(s.name for s in info.inputs)
        self.ref = native.register(info.name, [(s.name, s.datatype) for s in info.inputs])
        # models that declare no inputs: one registration per (name, datatype) signature seen
        self.refs_by_signature: dict[tuple[tuple[str, str], ...], Any] = {}


class StagedRun:
    """A staged batch in the pool: offer it groups of requests while it runs.

    `result` resolves to (outputs, stage_seconds): the outputs cover the batch's own
    samples, then each absorbed group in the order offered."""

    __slots__ = ("id", "model", "result")

    def __init__(self, job: int, model: str,
                 result: asyncio.Future[tuple[dict[str, Tensor], tuple[float, ...]]]) -> None:
        self.id = job
        self.model = model
        self.result = result


class Pool:
    """A pool of interpreters running model code.

    engine: "private" (a private libpython copy per interpreter, dlmopen), "subinterp"
    (PEP 684 subinterpreters with their own GIL, Python >= 3.12) or "main" (threads of
    this interpreter, sharing its GIL: the baseline).

    cancel_grace_s: how long a cancelled job may take to return before its interpreter
    is given up (marked lost).

    spin_us: how long after it ran out of jobs an interpreter's thread may still poll
    for the next one before it blocks, and how long the event loop polls for a batch's
    completion before it waits for the eventfd (0: both block at once). Waking a blocked
    thread on an idle virtual CPU costs tens of microseconds, more than a small model
    runs: at low concurrency polling saves a request those wake-ups. Each thread polls
    only over the window its recent idle gaps predict (it sleeps until then), so a
    client's pace costs a sliver of a core, not the whole gap (pool.c). At most
    `spinners` interpreters poll at once; by default about half the CPUs but the loop's,
    and none when the process has fewer than two CPUs (affinity and cgroup quota), where
    a polling thread would take the loop's. An idle pool polls for nothing. Whether polling
    pays is measured while batches come, and it is turned off where it does not
    (engine/polling.py), unless `spin_always`.

    threads: its interpreters' thread names, before each one's index (at most 11
    characters; default aserve-priv, aserve-subi or aserve-main): what top -H, perf and
    /proc show, and what threads a model starts inherit.

    colocate: while its jobs come one at a time, from one client (`sole()`, where given),
    run short and nothing polls, hold its interpreters' threads and the loop's (the one that
    starts it) to the CPU the loop runs on, so that each hand-off between the loop and an
    interpreter stays on one CPU (engine/placement.py). Only for a pool whose every job its
    own loop queues (not one front loops queue in).
    """

    cancel_grace_s = 10.0

    def __init__(self, *, engine: str = "private", interpreters: int | None = None, spin_us: int = 0,
                 spinners: int | None = None, spin_always: bool = False, threads: str | None = None,
                 colocate: bool = False, sole: Callable[[], bool] | None = None) -> None:
        if engine not in ENGINES:
            raise EngineError(f"engine {engine!r}: expected one of {', '.join(ENGINES)}")
        have = cpus.available()
        n = interpreters if interpreters is not None else have
        if n < 1:
            raise EngineError(f"interpreters must be >= 1, got {n}")
        if engine == "private" and n > _native.MAX_NAMESPACES:
            raise EngineError(
                f"engine 'private': {n} interpreters asked for, glibc allows at most "
                f"{_native.MAX_NAMESPACES} link-map namespaces besides the base one"
            )
        if engine == "subinterp" and sys.version_info < (3, 12):
            raise EngineError(
                f"engine 'subinterp' needs PEP 684 subinterpreters (Python >= 3.12); this is Python "
                f"{platform.python_version()}: use engine 'private'"
            )
        if spin_us < 0:
            raise EngineError(f"spin_us must be >= 0, got {spin_us}")
        if threads is not None and not (0 < len(threads) <= 11 and threads.isprintable() and threads.isascii()):
            raise EngineError(f"threads: expected a thread name of 1 to 11 printable ASCII characters, got {threads!r}")
        self.engine = engine
        self.interpreters = n
        self.threads = threads
        self.spin_us = spin_us
        self.spinners = spinners if spinners is not None else _spinners(have)
        self._poll_s = spin_us / 1e6 if have >= 2 else 0.0  # on one CPU the loop's polling starves the batch
        self._polling = False  # a _poll callback is scheduled
        # whether polling pays here, measured on every batch (None: it never polls, or always does)
        self.probe: PollingProbe | None = (
            PollingProbe() if self._poll_s and self.spinners and not spin_always else None)
        self._probe_timer: asyncio.TimerHandle | None = None
        self._poll_until = 0.0
        self._native: _native.Pool | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._in_flight = 0  # jobs submitted and not yet completed
        self._alone_at = 0.0  # when the job now alone in flight was queued (0: none)
        self._lone_polled = False  # ... and the loop polls for its answer
        self._lone: list[float] = []  # seconds the last lone jobs took, queued to answered
        self._lone_pays = True  # whether the loop polls for a lone job's answer
        self._lone_count = 0  # lone jobs queued, all told
        # with `colocate` (and two CPUs or more): the interpreters' threads held to the loop's CPU
        # while jobs come alone and run short (engine/placement.py)
        self._colocate = colocate and have >= 2
        self._sole = sole
        self.placement: LonePlacement | None = None
        self._idle: asyncio.Future[None] | None = None  # resolved when _in_flight drops to 0
        self._models: dict[str, _Model] = {}
        self._closed = False
        self.lost_mask = 0  # bit i: interpreter i is lost (stuck in a job it was asked to give up)
        self._giving_up: dict[int, asyncio.TimerHandle] = {}  # job -> its grace timer
        self.on_lost: Callable[[], None] | None = None  # an interpreter was given up, or came back

    @property
    def _started(self) -> _native.Pool:
        """The native pool; EngineError before start() (or after close())."""
        native = self._native
        if native is None:
            raise EngineError(f"engine {self.engine!r}: the pool is not started")
        return native

    # ---- lifecycle ----

    async def start(self) -> None:
        """Start (or reuse) the interpreters; raises EngineError if one cannot start."""
        if self._native is not None:
            return
        loop = asyncio.get_running_loop()
        native = self._take_native()
        native.name_threads(self.threads or f"aserve-{self.engine[:4]}")  # a parked pool's too
        have = native.stats()["ready"]
        self._native, self._loop = native, loop
        loop.add_reader(native.fileno(), self._drain)
        futures = []
        for _ in range(self.interpreters - have):
            fut = self._future()
            try:
                native.add_interpreter(functools.partial(self._complete, fut))
            except _native.EngineError as e:
                self._forget()
                fut.set_exception(EngineError(str(e)))
            futures.append(fut)
        results = await asyncio.gather(*futures, return_exceptions=True)
        errors = [str(r) for r in results if isinstance(r, BaseException)]
        native.set_active(self.interpreters)
        native.set_spin(self.spin_us, min(self.spinners, self.interpreters))
        native.set_spin_paused(self.probe is not None and not self.probe.on)
        if self._colocate:
            self.placement = LonePlacement(native.thread_ids, threading.get_native_id(), self._sole)
        if self.probe is not None:
            self._probe_timer = loop.call_later(PHASE_S, self._probe_tick)
        if errors:
            await self.close()
            raise EngineError(f"engine {self.engine!r}: interpreter start failed: {errors[0]}")

    def _take_native(self) -> _native.Pool:
        parked = _parked.setdefault(self.engine, [])
        if parked:
            # the parked pool with the most ready interpreters needs the fewest new ones
            parked.sort(key=lambda p: p.stats()["ready"])
            return parked.pop()
        if self.engine == "private":
            _check_platform()
            if not tunables.in_effect():
                tunables.log.warning(
                    "GLIBC_TUNABLES not set at process start; private interpreters beyond a few may fail "
                    "to load (call aserve.engine.ensure_glibc_tunables() first)"
                )
            library: str | None = interpreter_library()
        else:
            library = None
        if self.engine == "subinterp":
            _settle_shared_statics()
        try:
            native = _native.Pool(
                self.engine, executable=sys.executable, path=[p for p in sys.path if p], bootstrap=BOOTSTRAP,
                library=library,
            )
        except _native.EngineError as e:
            raise EngineError(str(e)) from None
        if self.engine == "subinterp":
            _subinterp_pools.append(native)
        return native

    async def close(self, *, timeout: float | None = None) -> None:
        """Finish every job already submitted, unload the models, park the interpreters.

        With `timeout` (seconds), what still runs then is cancelled, and what has not
        returned a grace period later (at most `cancel_grace_s`, at most a second past
        the deadline) is given up: its interpreter is lost, and a pool with a lost
        interpreter is not parked for reuse (`stuck()` lists those jobs)."""
        if self._native is None or self._closed:
            self._closed = True
            return
        self._closed = True
        native, loop = self._native, self._loop
        assert loop is not None
        try:
            if not await self._quiesce(timeout):
                await self._abandon(min(self.cancel_grace_s, 1.0))
            # one full collection per interpreter, after the last model unloaded from it (long
            # with torch imported, and the main engine's walks the whole server's heap)
            last: dict[int, str] = {}
            for name in self._models:
                for i in self._targets(name):
                    last[i] = name
            for name in list(self._models):
                await self._unload(name, collect={i for i, m in last.items() if m == name})
        finally:
            native.set_active(0)
            native.set_spin(0, 0)  # parked interpreters do not poll
            if self.placement is not None and self.placement.cpu >= 0:
                self.placement.spread()  # a parked pool's threads keep every CPU
            if self._probe_timer is not None:
                self._probe_timer.cancel()
                self._probe_timer = None
            for handle in self._giving_up.values():
                handle.cancel()
            self._giving_up.clear()
            loop.remove_reader(native.fileno())
            self._drain()
            if not self.lost_mask:
                _parked.setdefault(self.engine, []).append(native)

    async def _quiesce(self, timeout: float | None = None) -> bool:
        """Wait until no job is in flight; False if `timeout` seconds passed first."""
        assert self._loop is not None
        end = None if timeout is None else self._loop.time() + timeout
        while self._in_flight:
            if self._idle is None or self._idle.done():
                self._idle = self._loop.create_future()
            try:
                await asyncio.wait_for(asyncio.shield(self._idle),
                                       None if end is None else max(0.0, end - self._loop.time()))
            except TimeoutError:
                return False
        return True

    async def _abandon(self, grace: float) -> None:
        """Cancel every job still queued or running; give up those not back within `grace` s."""
        self._started.set_active(0)
        running = self._started.cancel_all()  # queued jobs complete now (failed); running ones when they stop
        if not await self._quiesce(grace):
            for job in running:
                self._give_up(job)
            await self._quiesce(0.0)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- completions ----

    def _drain(self) -> None:
        """The eventfd's reader: answer every finished job, each exactly once."""
        self._answer(self._started.drain())

    def _poll_soon(self) -> None:
        """A job was queued (and counted in flight): poll for answers from the next turn of the
        loop on, if it is the only one (at low load; under load the loop turns anyway, and
        polling would only add a callback to every turn) and lone jobs polled for have lately
        been answered within about what a wake-up costs (polling for a longer batch burns
        the loop's CPU for the whole batch to save one wake-up; one lone job in
        _LONE_JOBS is polled for all the same, to learn whether that changed), or while
        polling goes on."""
        lone = self._in_flight == 1
        if lone:
            self._lone_count += 1
        placement = self.placement
        poll = bool(self._poll_s) and (self.probe is None or self.probe.on) and (
            self._polling or (lone and (self._lone_pays or self._lone_count % _LONE_JOBS == 0)))
        # a lone job's time is taken only where it is used: by the placement, and to judge
        # polling (a job not alone, or not polled for, says nothing of polling)
        self._lone_polled = lone and poll
        now = self._alone_at = time.perf_counter() if lone and (poll or placement is not None) else 0.0
        if placement is not None:
            placement.queued(lone, self.interpreters_poll)
        if poll:
            self._poll_until = (now or time.perf_counter()) + self._poll_s
            if not self._polling and self._loop is not None:
                self._polling = True
                self._loop.call_soon(self._poll)

    @property
    def interpreters_poll(self) -> bool:
        """Whether the interpreters may poll for their next batch now: spin_us, and the last
        measurement found that it pays."""
        return self.spin_us > 0 and self.spinners > 0 and (self.probe is None or self.probe.on)

    def _lone_done(self, seconds: float) -> None:
        """The only job in flight, which the loop polled for, was answered (a job it did not
        poll for counts nothing: its time waiting for the eventfd would count the wake-up
        too): remember how long it took, and whether polling for the next lone one pays (the
        median of the last few). A job that outlasted the polling counts too: the loop burnt
        spin_us on it, and a model whose batches outlast spin_us would otherwise be judged
        by the few it caught."""
        lone = self._lone
        lone.append(seconds)
        if len(lone) > _LONE_JOBS:
            del lone[0]
        self._lone_pays = len(lone) < _LONE_JOBS or sorted(lone)[_LONE_JOBS // 2] <= _POLL_PAYS_S

    def _poll(self) -> None:
        """While a batch runs, answer what finished at every turn of the loop rather than
        wait for the eventfd to wake it, until nothing is in flight or spin_us passed
        since the last batch was queued. I/O is served between two turns as usual."""
        if self._closed or self._native is None:
            self._polling = False
            return
        items = self._native.poll()
        if items is not None:
            self._answer(items)
        if self._in_flight and time.perf_counter() < self._poll_until:
            assert self._loop is not None
            self._loop.call_soon(self._poll)
        else:
            self._polling = False

    def _answer(self, items: list[Any]) -> None:
        """Call each finished job's token; one that raises is reported to the loop and
        does not stop the others."""
        for item in items:
            try:
                if isinstance(item, tuple):
                    token, ok, payload = item
                    token(ok, payload)
                else:  # the engine could not build this completion
                    item(False, _NO_COMPLETION)
            except Exception as exc:  # noqa: BLE001 - every other completion must still be answered
                assert self._loop is not None
                self._loop.call_exception_handler(
                    {"message": "aserve: a job's completion handler raised", "exception": exc}
                )

    def _complete(self, fut: asyncio.Future[Any], ok: bool, payload: Any) -> None:
        self._done_one()
        _settle(fut, ok, payload)

    def _probe_tick(self) -> None:
        """The probe's timer: close its phase with the pool's readings (every batch's, the
        host loop's and the fronts' alike), turn polling on or off as it says, and come back
        at the next phase's end, when its verdict stops holding, or in REST_S while no batch
        comes."""
        self._probe_timer = None
        probe, native, loop = self.probe, self._native, self._loop
        if probe is None or native is None or loop is None or self._closed:
            return
        now = time.perf_counter()
        stats = native.stats()
        answered = stats["answered"]
        resting = probe.rests(now, answered)
        verdicts = probe.verdicts
        if probe.tick(now, time.process_time(), answered, stats["flight_s"]):
            native.set_spin_paused(not probe.on)
        if probe.verdicts != verdicts:
            log.info("engine %s: polling %s: it saves %.1f us of a sample's round trip for %.1f us more CPU",
                     self.engine, "stays on" if probe.on else "is off", probe.saved_us, probe.cost_us)
        if resting:
            delay = REST_S
        else:
            delay = PHASE_S if probe.probing else max(PHASE_S, probe.hold_until() - now)
        self._probe_timer = loop.call_later(delay, self._probe_tick)

    def _done_one(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0 and self._alone_at:
            took = time.perf_counter() - self._alone_at
            self._alone_at = 0.0
            if self._lone_polled:
                self._lone_done(took)
            if self.placement is not None:
                self.placement.answered(took)
        if self._in_flight == 0 and self._idle is not None and not self._idle.done():
            self._idle.set_result(None)

    def _future(self) -> asyncio.Future[Any]:
        if self._native is None or self._loop is None:
            raise EngineError("the pool is not started: await pool.start() first")
        self._in_flight += 1
        return self._loop.create_future()

    def _forget(self) -> None:
        """A job that was never queued after all (no lone job's time either)."""
        self._alone_at = 0.0
        self._done_one()

    def _submit(self, kind: int, *, model: str | None = None, text: str | None = None,
                target: int = -1) -> asyncio.Future[Any]:
        fut = self._future()
        try:
            self._started.submit(functools.partial(self._complete, fut), kind, model, text, target)
        except _native.EngineError as e:
            self._forget()
            raise EngineError(str(e)) from None
        except BaseException:
            self._forget()
            raise
        return fut

    def _check_open(self) -> None:
        if self._closed:
            raise EngineError("the pool is closed")

    def _targets(self, name: str) -> range:
        # host-interpreter threads share one set of modules: load once
        entry = self._models.get(name)
        n = entry.info.interpreters if entry is not None else self.interpreters
        return range(1) if self.engine == "main" else range(n)

    def _entry(self, model: str) -> _Model:
        entry = self._models.get(model)
        if entry is None:
            raise ModelNotFound(f"model {model!r} is not loaded")
        return entry

    # ---- models ----

    async def load(self, spec: ModelSpec, *, interpreters: int | None = None, staggered: bool = False) -> ModelInfo:
        """Load a model in its interpreters (all, or the first `interpreters`), concurrently,
        or (`staggered`) one after another, so that the others go on serving meanwhile.

        ModelLoadError names the file and the cause."""
        self._check_open()
        key = spec.pool_key
        if key in self._models:
            await self.unload(key)
        n = self.interpreters if interpreters is None else interpreters
        if not 1 <= n <= self.interpreters:
            raise EngineError(f"model {key!r}: interpreters={n} outside 1..{self.interpreters}")
        targets = self._usable(range(1) if self.engine == "main" else range(n), key)
        text = json.dumps(
            {
                "name": spec.name,
                "version": spec.version,
                "path": os.path.abspath(spec.path),
                "class": spec.class_name,
                "inputs": [list(s) for s in spec.inputs],
                "outputs": [list(s) for s in spec.outputs],
                "parameters": spec.parameters,
                "package": spec.package,
            }
        )
        if staggered:  # one interpreter at a time: the others keep serving the pool's other models
            results: list[Any] = []
            for i in targets:
                try:
                    results.append(await self._submit(_native.JOB_LOAD, model=key, text=text, target=i))
                except Exception as e:  # noqa: BLE001 - the first failure ends the load (below)
                    results.append(e)
                    break
            targets = targets[:len(results)]
        else:
            futures = [self._submit(_native.JOB_LOAD, model=key, text=text, target=i) for i in targets]
            results = await asyncio.gather(*futures, return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            for i, r in zip(targets, results):
                if not isinstance(r, BaseException) and not self.lost_mask >> i & 1:
                    await self._submit(_native.JOB_UNLOAD, model=key, target=i)
            raise failed[0]
        meta = json.loads(str(results[0]))
        info = ModelInfo(
            name=key,
            engine=self.engine,
            interpreters=n,
            class_name=meta["class"],
            file=meta["file"],
            tensor_format=meta["tensor_format"],
            inputs=[TensorSpec(d["name"], d["datatype"], tuple(d["shape"])) for d in meta["inputs"]],
            outputs=[TensorSpec(d["name"], d["datatype"], tuple(d["shape"])) for d in meta["outputs"]],
            stages=int(meta.get("stages", 0)),
            example=_example(meta.get("example")),
        )
        self._models[key] = _Model(info, sum(1 << i for i in targets) if self.engine != "main" else (1 << n) - 1,
                                   self._native)
        return info

    def _usable(self, targets: range | list[int], key: str) -> range | list[int]:
        """The interpreters of `targets` that are not lost (main: the first that is not)."""
        if not self.lost_mask:
            return targets
        if self.engine == "main":
            usable = [i for i in range(self.interpreters) if not self.lost_mask >> i & 1][:1]
        else:
            usable = [i for i in targets if not self.lost_mask >> i & 1]
        if not usable:
            raise EngineError(f"model {key!r}: every interpreter it would load in is lost (stuck in model code "
                              f"that did not return after it was cancelled: {self.lost})")
        return usable

    async def _unload(self, name: str, *, staggered: bool = False, collect: Container[int] | None = None) -> None:
        """Drop `name` from its interpreters; those in `collect` (default: all) then collect
        the garbage, the others leave it to a later unload ("later", see _worker.unload)."""
        targets: range | list[int] = self._targets(name)
        if self.lost_mask:
            try:
                targets = self._usable(targets, name)
            except EngineError:  # every interpreter of it is lost: nothing to unload from
                targets = []
        self._models.pop(name, None)
        jobs = [(i, None if collect is None or i in collect else "later") for i in targets]
        if staggered:
            for i, garbage in jobs:
                await self._submit(_native.JOB_UNLOAD, model=name, text=garbage, target=i)
            return
        await asyncio.gather(*(self._submit(_native.JOB_UNLOAD, model=name, text=garbage, target=i)
                               for i, garbage in jobs))

    async def unload(self, name: str, *, staggered: bool = False) -> None:
        """Drop a model from its interpreters: all at once, or (`staggered`) one interpreter
        after another, so that while one collects the model's garbage (a full collection,
        long with torch imported) the others go on serving the pool's other models."""
        self._check_open()
        if name not in self._models:
            raise ModelNotFound(f"model {name!r} is not loaded")
        await self._unload(name, staggered=staggered)

    # ---- batches ----

    def run(self, model: str, inputs: Sequence[Tensor], done: Done, /, *, trace: bool | str = False,
            context: str | None = None) -> int:
        """Queue one batch on the first idle interpreter of `model`; returns its job id (for `cancel`).

        inputs: the model's declared inputs, in order. `done(outputs, None)` or
        `done(None, error)` is called from the loop's completion callback; outputs are
        buffers the interpreter keeps alive until they are garbage. With `trace`, a
        batch that ran calls `done(outputs, None, ran)`: ran is (interpreter, start_ns,
        end_ns on the CLOCK_MONOTONIC of time.monotonic_ns, the model's spans as JSON or None); a
        str `trace` is the W3C context model code runs in (tracing/batches.py `BatchContext.header`);
        `context`, that of an untraced batch (its caller's, not sampled)."""
        self._check_open()
        entry = self._models.get(model)
        if entry is None:
            raise ModelNotFound(f"model {model!r} is not loaded")
        self._in_flight += 1
        self._poll_soon()
        try:
            if trace:
                job: int = self._started.infer(entry.ref, functools.partial(self._traced_done, done), inputs,
                                              entry.mask, False, True, trace if isinstance(trace, str) else None)
            elif context is not None:
                job = self._started.infer(entry.ref, functools.partial(self._batch_done, done), inputs, entry.mask,
                                          False, False, context)
            else:
                job = self._started.infer(entry.ref, functools.partial(self._batch_done, done), inputs, entry.mask)
        except BaseException:
            self._forget()
            raise
        return job

    def _batch_done(self, done: Done, ok: bool, payload: Any) -> None:
        self._done_one()
        if ok:
            done(tensors(payload), None)
        else:
            done(None, _error(payload))

    def _traced_done(self, done: Any, ok: bool, payload: Any) -> None:
        self._done_one()
        if ok:
            outputs, interpreter, start_ns, end_ns, spans = payload
            done(tensors(outputs), None, (interpreter, start_ns, end_ns, spans))
        else:
            done(None, _error(payload))

    def ordered(self, model: str, inputs: Mapping[str, Tensor]) -> tuple[Any, list[Tensor]]:
        """(native registration, tensors in its order) for inputs given by name."""
        entry = self._entry(model)
        names = entry.input_names
        if names:
            if inputs.keys() != set(names):
                raise InvalidInput(f"model {model!r} takes inputs {list(names)}, got {list(inputs)}")
            return entry.ref, [inputs[n] for n in names]
        signature = tuple((name, t.datatype) for name, t in inputs.items())
        ref = entry.refs_by_signature.get(signature)
        if ref is None:
            ref = entry.refs_by_signature[signature] = self._started.register(model, signature)
        return ref, list(inputs.values())

    async def infer(self, model: str, inputs: Mapping[str, Tensor], /) -> dict[str, Tensor]:
        """Run one batch, inputs given by name, on the first idle interpreter of `model`."""
        self._check_open()
        ref, ordered = self.ordered(model, inputs)
        fut = self._future()
        self._poll_soon()
        try:
            self._started.infer(ref, functools.partial(self._complete, fut), ordered, self._models[model].mask)
        except BaseException:
            self._forget()
            raise
        return tensors(await fut)

    def infer_staged(self, model: str, inputs: Mapping[str, Tensor] | Sequence[Tensor], /) -> StagedRun:
        """Queue one batch of a staged model that may absorb groups offered while it runs
        (inputs by name, or in the model's declared order)."""
        self._check_open()
        entry = self._entry(model)
        if not entry.info.stages:
            raise EngineError(f"model {model!r} has no stages: it cannot run a joinable batch")
        if isinstance(inputs, Mapping):
            ref, ordered = self.ordered(model, inputs)
        else:
            ref, ordered = entry.ref, list(inputs)
        loop = self._loop
        assert loop is not None
        result: asyncio.Future[tuple[dict[str, Tensor], tuple[float, ...]]] = loop.create_future()

        def done(ok: bool, payload: Any) -> None:
            self._done_one()
            if result.done():
                return
            if not ok:
                result.set_exception(_error(payload))
            else:
                outputs, seconds = payload
                result.set_result((tensors(outputs), seconds))

        self._in_flight += 1
        self._poll_soon()
        try:
            job = self._started.infer(ref, done, ordered, entry.mask, True)
        except BaseException:
            self._forget()
            raise
        return StagedRun(job, model, result)

    def offer(self, run: StagedRun, inputs: Mapping[str, Tensor] | Sequence[Tensor], last_stage: int, /
              ) -> asyncio.Future[bool] | None:
        """Offer a group of requests to a staged batch: it joins at the first stage boundary
        the batch reaches no later than `last_stage`. The future says whether it joined
        (True: the batch's outputs cover it) or was turned away (False: run it otherwise);
        None: the batch is complete or already past `last_stage`."""
        ordered = self.ordered(run.model, inputs)[1] if isinstance(inputs, Mapping) else list(inputs)
        fut = self._future()
        try:
            posted = self._started.offer(run.id, functools.partial(self._complete, fut), ordered, last_stage)
        except BaseException:
            self._forget()
            raise
        if not posted:
            self._forget()
            fut.cancel()
            return None
        return fut

    def progress(self, run: StagedRun) -> tuple[int, float] | None:
        """(stages done, seconds it has been running or -1 while queued); None once complete."""
        if self._native is None:
            return None
        state: tuple[int, float] | None = self._native.progress(run.id)
        return state

    async def execute(self, interpreter: int, source: str, /) -> str:
        """Run Python source in one interpreter; returns repr of its `result` variable."""
        self._check_open()
        if not 0 <= interpreter < self.interpreters:
            raise EngineError(f"interpreter {interpreter} out of range 0..{self.interpreters - 1}")
        result: str = await self._submit(_native.JOB_EXEC, text=source, target=interpreter)
        return result

    # ---- faults ----

    def cancel(self, job: int, /) -> bool:
        """Cancel a batch nobody waits for any more: a queued one never runs, a running one
        gets Cancelled raised in its interpreter. Its completion still comes (failed with
        BatchCancelled). A running job that has not returned `cancel_grace_s` later is
        given up and its interpreter marked lost. False: the job already completed."""
        if self._native is None or self._closed:
            return False
        state = self._native.cancel(job)
        if state == "running":
            self.watch(job)
        return state is not None

    def watch(self, job: int, /) -> None:
        """A running job was cancelled (here, or by a front loop's Link): give its interpreter
        up if it has not returned `cancel_grace_s` from now."""
        if job not in self._giving_up and self._loop is not None and not self._closed:
            self._giving_up[job] = self._loop.call_later(self.cancel_grace_s, self._give_up, job)

    def _give_up(self, job: int) -> None:
        """The grace period of a cancelled job ended: if it still runs, its interpreter is lost."""
        self._giving_up.pop(job, None)
        given_up = self._started.lose(job, functools.partial(self._returned, time.monotonic()))
        if given_up is None:
            return
        index, key, seconds = given_up
        self.lost_mask |= 1 << index
        self._lost_changed()
        usable = self.interpreters - self.lost_mask.bit_count()
        log.error(
            "interpreter %d of the %s pool is lost: %s has not returned %.1f s into a batch that was cancelled "
            "(blocked in native code: a C extension, ctypes, a lock or I/O); it gets no more jobs; %d of %d "
            "interpreters serve", index, self.engine, describe_key(key), seconds, usable, self.interpreters,
            extra={"interpreter": index, "engine": self.engine, "pool_key": key, "seconds": round(seconds, 3)},
        )

    def _returned(self, since: float, ok: bool, payload: Any) -> None:
        """A job given up on returned after all: its interpreter takes jobs again."""
        still = {index for index, _, _, _, lost in self._started.jobs() if lost}
        for index in self.lost:
            if index not in still:
                self.lost_mask &= ~(1 << index)
                self._lost_changed()
                log.warning("interpreter %d of the %s pool is back %.1f s after it was given up; it takes jobs "
                            "again", index, self.engine, time.monotonic() - since)

    def _lost_changed(self) -> None:
        if self.on_lost is not None:
            self.on_lost()

    @property
    def lost(self) -> list[int]:
        """Interpreters given up on: stuck in a cancelled job, they get no jobs."""
        return [i for i in range(self.interpreters) if self.lost_mask >> i & 1]

    @property
    def address(self) -> int:
        """The native pool's address, for a front's Link (server/front.py)."""
        address: int = self._started.address
        return address

    def mask_of(self, model: str) -> int:
        """The interpreters that run `model`, as a bit mask."""
        return self._entry(model).mask

    def serves(self, model: str) -> bool:
        """Whether an interpreter that is not lost runs `model` (False if it is not loaded)."""
        entry = self._models.get(model)
        return entry is not None and (not self.lost_mask or entry.mask & ~self.lost_mask != 0)

    def interpreters_of(self, model: str) -> tuple[list[int], list[int]]:
        """(interpreters that run `model`, those of them that are lost); main: the pool's threads."""
        entry = self._models.get(model)
        if entry is None:
            return [], []
        mine = [i for i in range(self.interpreters) if entry.mask >> i & 1]
        return mine, [i for i in mine if self.lost_mask >> i & 1]

    def stuck(self) -> list[tuple[int, str, float]]:
        """Jobs running now on lost interpreters: (interpreter, model key, seconds running)."""
        if self._native is None:
            return []
        return [(index, key, seconds) for index, _, key, seconds, lost in self._started.jobs() if lost]

    def running_jobs(self) -> list[tuple[int, str, float]]:
        """Every job running now: (interpreter, model key, seconds running)."""
        if self._native is None:
            return []
        return [(index, key, seconds) for index, _, key, seconds, _ in self._started.jobs()]

    # ---- state ----

    @property
    def models(self) -> dict[str, ModelInfo]:
        return {name: entry.info for name, entry in self._models.items()}

    def stats(self) -> dict[str, Any]:
        """interpreters, ready, active, busy (running a job), queued (waiting), spinning
        (polling for a job) and waiting (blocked until a job comes) counts; spin_s: seconds
        the interpreters' threads spent polling; polled: batches that found an interpreter
        polling for them (no wake-up); woke_napping, woke_blocked: batches that woke one
        asleep until its polling window (early), or blocked (late, or not polling);
        coalesced: front loops' batches that ran as one batch with another front's
        (--loops); polling: 1 while polling is on (spin_us, and the last measurement found
        that it pays); colocated: 1 while its threads and the loop's are held to the loop's
        CPU, holds: how many times they were (`colocate`)."""
        if self._native is None:
            return {"interpreters": 0, "ready": 0, "active": 0, "busy": 0, "queued": 0, "spinning": 0, "waiting": 0,
                    "spin_s": 0.0, "polled": 0, "woke_napping": 0, "woke_blocked": 0, "coalesced": 0, "polling": 0,
                    "colocated": 0, "holds": 0}
        stats: dict[str, Any] = self._native.stats()
        stats["polling"] = int(self.interpreters_poll)
        placement = self.placement
        stats["colocated"] = int(placement is not None and placement.cpu >= 0)
        stats["holds"] = 0 if placement is None else placement.held
        return stats

    @property
    def idle(self) -> int:
        """Interpreters with nothing to do right now."""
        s = self.stats()
        return max(0, int(s["active"]) - int(s["busy"]) - int(s["queued"]))
