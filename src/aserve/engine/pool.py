"""The host's asyncio front of the native interpreter pool.

`Pool` submits jobs to native worker threads (one interpreter each) and awaits
them as futures; completions arrive through one eventfd the event loop watches, so
one wake-up resolves every job that finished meanwhile.
"""

from __future__ import annotations

import asyncio
import atexit
import base64
import json
import os
import platform
import sys
import sysconfig
from collections.abc import Mapping
from typing import Any, Self

import msgspec

from .. import _native
from ..errors import EngineError, ModelError, ModelLoadError, ModelNotFound
from ..runtime.model import TensorSpec
from ..tensor import Tensor
from . import tunables

ENGINES = ("private", "subinterp", "main")
BOOTSTRAP = "aserve.runtime._worker"


class ModelSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What to load: a model file (or its folder) and what the config declares."""

    name: str
    path: str
    class_name: str | None = None
    inputs: list[TensorSpec] = []
    outputs: list[TensorSpec] = []
    parameters: dict[str, Any] = {}


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


class StagedRun:
    """A staged batch in the pool: offer it groups of requests while it runs.

    `result` resolves to (outputs, stage_seconds): the outputs cover the batch's own
    samples, then each absorbed group in the order offered."""

    __slots__ = ("id", "result")

    def __init__(self, job: int, result: asyncio.Future[tuple[dict[str, Tensor], tuple[float, ...]]]) -> None:
        self.id = job
        self.result = result


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
_parked: dict[str, list[Any]] = {}
_subinterp_pools: list[Any] = []


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
    last = text.strip().splitlines()[-1] if text.strip() else error_type
    return ModelError(last, traceback=text, error_type=error_type)


def _example(encoded: list[dict[str, Any]] | None) -> dict[str, Tensor] | None:
    if not encoded:
        return None
    return {t["name"]: Tensor(t["datatype"], tuple(t["shape"]), base64.b64decode(t["data"])) for t in encoded}


def _wire(inputs: Mapping[str, Tensor]) -> list[tuple[str, str, tuple[int, ...], Any]]:
    return [(name, t.datatype, t.shape, t.data) for name, t in inputs.items()]


class Pool:
    """A pool of interpreters running model code.

    engine: "private" (a private libpython copy per interpreter, dlmopen), "subinterp"
    (PEP 684 subinterpreters with their own GIL, Python >= 3.12) or "main" (threads of
    this interpreter, sharing its GIL: the baseline).
    """

    def __init__(self, *, engine: str = "private", interpreters: int | None = None) -> None:
        if engine not in ENGINES:
            raise EngineError(f"engine {engine!r}: expected one of {', '.join(ENGINES)}")
        n = interpreters if interpreters is not None else (os.cpu_count() or 1)
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
        self.engine = engine
        self.interpreters = n
        self._native: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: set[asyncio.Future[Any]] = set()
        self._models: dict[str, ModelInfo] = {}
        self._masks: dict[str, int] = {}
        self._closed = False

    # ---- lifecycle ----

    async def start(self) -> None:
        """Start (or reuse) the interpreters; raises EngineError if one cannot start."""
        if self._native is not None:
            return
        loop = asyncio.get_running_loop()
        native = self._take_native()
        have = native.stats()["ready"]
        futures = []
        for _ in range(self.interpreters - have):
            fut = loop.create_future()
            native.add_interpreter(fut)
            futures.append(fut)
        self._native, self._loop = native, loop
        loop.add_reader(native.fileno(), self._drain)
        results = await asyncio.gather(*futures, return_exceptions=True)
        errors = [str(r) for r in results if isinstance(r, BaseException)]
        native.set_active(self.interpreters)
        if errors:
            await self.close()
            raise EngineError(f"engine {self.engine!r}: interpreter start failed: {errors[0]}")

    def _take_native(self) -> Any:
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
        native = _native.Pool(
            self.engine, executable=sys.executable, path=[p for p in sys.path if p], bootstrap=BOOTSTRAP,
            library=library,
        )
        if self.engine == "subinterp":
            _subinterp_pools.append(native)
        return native

    async def close(self) -> None:
        """Finish every job already submitted, unload the models, park the interpreters."""
        if self._native is None or self._closed:
            self._closed = True
            return
        self._closed = True
        native, loop = self._native, self._loop
        assert loop is not None
        try:
            if self._pending:
                await asyncio.gather(*list(self._pending), return_exceptions=True)
            for name in list(self._models):
                await self._unload(name)
        finally:
            native.set_active(0)
            loop.remove_reader(native.fileno())
            self._drain()
            _parked.setdefault(self.engine, []).append(native)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- jobs ----

    def _drain(self) -> None:
        for fut, ok, payload in self._native.drain():
            if fut.done():  # the caller stopped waiting; the job itself still ran
                continue
            if ok:
                fut.set_result(payload)
            else:
                fut.set_exception(_error(payload))

    def _future(self) -> asyncio.Future[Any]:
        if self._native is None or self._loop is None:
            raise EngineError("the pool is not started: await pool.start() first")
        fut = self._loop.create_future()
        self._pending.add(fut)
        fut.add_done_callback(self._pending.discard)
        return fut

    def _submit(self, kind: int, *, model: str | None = None, text: str | None = None,
                inputs: list[tuple[str, str, tuple[int, ...], Any]] | None = None,
                target: int = -1, mask: int = -1) -> asyncio.Future[Any]:
        fut = self._future()
        self._native.submit(fut, kind, model, text, inputs, target, mask & 0xFFFFFFFFFFFFFFFF)
        return fut

    def _check_open(self) -> None:
        if self._closed:
            raise EngineError("the pool is closed")

    def _targets(self, name: str) -> range:
        # host-interpreter threads share one set of modules: load once
        n = self._models[name].interpreters if name in self._models else self.interpreters
        return range(1) if self.engine == "main" else range(n)

    async def load(self, spec: ModelSpec, *, interpreters: int | None = None) -> ModelInfo:
        """Load a model in its interpreters (all, or the first `interpreters`), concurrently.

        ModelLoadError names the file and the cause."""
        self._check_open()
        if spec.name in self._models:
            await self.unload(spec.name)
        n = self.interpreters if interpreters is None else interpreters
        if not 1 <= n <= self.interpreters:
            raise EngineError(f"model {spec.name!r}: interpreters={n} outside 1..{self.interpreters}")
        targets = range(1) if self.engine == "main" else range(n)
        text = json.dumps(
            {
                "name": spec.name,
                "path": os.path.abspath(spec.path),
                "class": spec.class_name,
                "inputs": [list(s) for s in spec.inputs],
                "outputs": [list(s) for s in spec.outputs],
                "parameters": spec.parameters,
            }
        )
        futures = [self._submit(_native.JOB_LOAD, model=spec.name, text=text, target=i) for i in targets]
        results = await asyncio.gather(*futures, return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            for i, r in zip(targets, results):
                if not isinstance(r, BaseException):
                    await self._submit(_native.JOB_UNLOAD, model=spec.name, target=i)
            raise failed[0]
        meta = json.loads(str(results[0]))
        info = ModelInfo(
            name=spec.name,
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
        self._models[spec.name] = info
        self._masks[spec.name] = (1 << n) - 1
        return info

    async def _unload(self, name: str) -> None:
        targets = self._targets(name)
        self._models.pop(name, None)
        self._masks.pop(name, None)
        await asyncio.gather(*(self._submit(_native.JOB_UNLOAD, model=name, target=i) for i in targets))

    async def unload(self, name: str) -> None:
        self._check_open()
        if name not in self._models:
            raise ModelNotFound(f"model {name!r} is not loaded")
        await self._unload(name)

    async def infer(self, model: str, inputs: Mapping[str, Tensor], /) -> dict[str, Tensor]:
        """Run one batch on the first idle interpreter; outputs are buffers it keeps alive."""
        self._check_open()
        mask = self._masks.get(model)
        if mask is None:
            raise ModelNotFound(f"model {model!r} is not loaded")
        outputs = await self._submit(_native.JOB_INFER, model=model, inputs=_wire(inputs), mask=mask)
        return {name: Tensor(datatype, shape, buf) for name, datatype, shape, buf in outputs}

    def infer_staged(self, model: str, inputs: Mapping[str, Tensor], /) -> StagedRun:
        """Queue one batch of a staged model that may absorb groups offered while it runs."""
        self._check_open()
        mask = self._masks.get(model)
        if mask is None:
            raise ModelNotFound(f"model {model!r} is not loaded")
        if not self._models[model].stages:
            raise EngineError(f"model {model!r} has no stages: it cannot run a joinable batch")
        fut = self._future()
        job = self._native.submit(fut, _native.JOB_INFER, model, None, _wire(inputs), -1,
                                  mask & 0xFFFFFFFFFFFFFFFF, True)
        result: asyncio.Future[tuple[dict[str, Tensor], tuple[float, ...]]] = self._loop.create_future()  # type: ignore[union-attr]

        def done(f: asyncio.Future[Any]) -> None:
            if result.done():
                return
            if f.cancelled():
                result.cancel()
            elif (e := f.exception()) is not None:
                result.set_exception(e)
            else:
                outputs, seconds = f.result()
                result.set_result(({n: Tensor(d, s, b) for n, d, s, b in outputs}, seconds))

        fut.add_done_callback(done)
        return StagedRun(job, result)

    def offer(self, run: StagedRun, inputs: Mapping[str, Tensor], last_stage: int, /) -> asyncio.Future[bool] | None:
        """Offer a group of requests to a staged batch: it joins at the first stage boundary
        the batch reaches no later than `last_stage`. The future says whether it joined
        (True: the batch's outputs cover it) or was turned away (False: run it otherwise);
        None: the batch is complete or already past `last_stage`."""
        fut = self._future()
        if not self._native.offer(run.id, fut, _wire(inputs), last_stage):
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

    # ---- state ----

    @property
    def models(self) -> dict[str, ModelInfo]:
        return dict(self._models)

    def stats(self) -> dict[str, int]:
        """interpreters, ready, active, busy (running a job) and queued (waiting) counts."""
        if self._native is None:
            return {"interpreters": 0, "ready": 0, "active": 0, "busy": 0, "queued": 0}
        stats: dict[str, int] = self._native.stats()
        return stats

    @property
    def idle(self) -> int:
        """Interpreters with nothing to do right now."""
        s = self.stats()
        return max(0, s["active"] - s["busy"] - s["queued"])
