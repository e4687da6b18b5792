"""The model manager: every (model, version) of a repository, its state, and its transitions.

One `ModelRegistry` owns the pools (one per engine in use) and the state of every model
version: LOADING, READY, UNLOADING or UNAVAILABLE, with the reason. What it serves is
what the repository aspires to: for each model folder, the versions its version policy
selects (`latest = n`, `specific = [...]`, `all = true`), minus models unloaded by
request. `rescan()` (SIGHUP, `--repository-poll-seconds`), `load()` and `unload()` move
the served set toward that, one change at a time (a lock serialises them):

- a new version is loaded, warmed up (its batching policy measured), then published;
- a version whose files or config changed is loaded again as a new instance beside the
  old one, which stops taking requests only when the new one is ready (the
  availability-preserving transition, the default); `transition = "resource"` unloads
  the old instance first, for models too big to hold twice;
- a version that fails to load leaves what was serving in place (the failure is shown in
  the index and logged with the file and the cause), and is not retried until its files
  change or a load request asks;
- a version no longer aspired to is taken out of the routes; the requests it accepted
  are answered, then it is unloaded from every interpreter, off the request path.

The request path reads `routes[name]`, an immutable `ModelRoutes` snapshot that every
change replaces whole: a lookup takes no lock and never waits for a load.
"""

from __future__ import annotations

import asyncio
import logging
import pathlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from .. import _native
from ..batching import Batcher, FairScheduler
from ..batching.adaptive import AdaptivePolicy
from ..batching.native import PlanFeed
from ..config import ServerSettings
from ..engine import ModelSpec, Pool
from ..engine.choose import close_probe
from ..errors import AserveError, EngineError, InvalidInput, ModelNotFound
from ..inference import ModelSchema
from ..redact import cut_traceback
from ..repository import (
    ModelSource,
    RepositoryError,
    RepositoryScan,
    Skipped,
    VersionSource,
    scan_model,
    scan_repository,
)
from ..runtime.memory import pss
from ..tracing import Tracer
from .engines import resolve_engine
from .models import (
    READY,
    UNAVAILABLE,
    UNLOADING,
    ModelHandle,
    ModelRoutes,
    make_policy,
    queue_layout,
)
from .stats import BatchTotals, Metrics

log = logging.getLogger("aserve.server")


class LoadFailed(AserveError):
    """A load request did not leave any version of the model serving (Triton answers 400)."""

    status = 400


class ModelRecord:
    """The manager's state of one model folder (mutable; the routes are built from it)."""

    __slots__ = ("failed", "labels", "name", "others", "override", "serving", "source", "unloaded", "unloading")

    def __init__(self, name: str) -> None:
        self.name = name
        self.source: ModelSource | None = None
        self.override: dict[str, Any] | None = None  # a load request's config fields, kept until the next load
        self.unloaded = False  # unloaded by request: rescans leave it unloaded until a load request
        self.serving: dict[int, ModelHandle] = {}
        self.others: dict[int, ModelHandle] = {}  # versions not serving: loading, failed (why)
        self.unloading: dict[int, ModelHandle] = {}  # retired loads still answering their requests
        self.labels: dict[str, int] = {}
        self.failed: dict[int, str] = {}  # version -> fingerprint that failed to load (not retried as is)


class ModelRegistry:
    """Every model version of a repository, loaded into one pool per engine in use.

    The models of a pool share its interpreters through one FairScheduler: their
    batches take the pool's slots round-robin by model version, so a busy model cannot
    starve the others."""

    def __init__(self, repository: str | pathlib.Path, settings: ServerSettings,
                 metrics: Metrics | None = None) -> None:
        self.repository = pathlib.Path(repository)
        self.settings = settings
        self.metrics = metrics if metrics is not None else Metrics()
        self.tracer: Tracer | None = None  # given to every batcher
        self.routes: dict[str, ModelRoutes] = {}  # the request path's view: swapped, never mutated
        self.records: dict[str, ModelRecord] = {}
        self.pools: dict[str, Pool] = {}
        # whether the last requests came from one client (DataPlane.sole): a pool holds its
        # threads to the loop's CPU for one client only (engine/placement.py)
        self.sole: Callable[[], bool] | None = None
        self.on_publish: Callable[[], None] | None = None  # the routes changed (front loops learn them)
        # before a load is unloaded, once its batcher answered everything: other loops answer theirs
        self.before_unload: Callable[[str], Awaitable[None]] | None = None
        self.schedulers: dict[str, FairScheduler] = {}  # per engine, beside its pool
        self.totals: dict[tuple[str, str], BatchTotals] = {}
        self.skipped: list[Skipped] = []
        self._scan: RepositoryScan | None = None
        self._lock = asyncio.Lock()
        self._retiring: set[asyncio.Task[None]] = set()
        self._loads = 0  # loads so far: each gets its own key in the pool
        self.queue_fronts = 0  # front loops whose batchers share each model's queue bound with the host's
        self._keys: set[str] = set()
        self._closed = False
        self._started = False  # after the first loads, loads are staggered over the interpreters

    # ---- the request path ----

    def get(self, name: str, version: str | None = None) -> ModelHandle:
        """The handle a request for `name` (version None = the latest serving; a version
        number or a label) goes to. A version that exists but does not serve gives its
        not-ready handle (503 with the reason); ModelNotFound names what exists."""
        routes = self.routes.get(name)
        if routes is None:
            raise ModelNotFound(self._unknown(name))
        if version is None:
            found = routes.latest or routes.status()
        else:
            found = routes.find(version)
            if found is None:
                raise ModelNotFound(self._why_not(routes, version))
        if found is None:
            raise ModelNotFound(f"model {name!r} has no version to serve; {routes.describe()}")
        return found

    def _unknown(self, name: str) -> str:
        """A 404's message: it does not list the models (POST /v2/repository/index does, to
        those allowed to call it)."""
        where = "POST /v2/repository/index lists the models"
        if self.settings.admin_token or self.settings.api_token:
            where += " (with the admin token)"
        return f"unknown model {name!r}; {where}"

    def _why_not(self, routes: ModelRoutes, version: str) -> str:
        record = self.records.get(routes.name)
        source = record.source if record is not None else None
        if source is not None and version.isdigit() and int(version) in source.versions and source.config:
            return (f"model {routes.name!r} version {version} is not served: its version policy is "
                    f"{source.config.version_policy.describe()}; {routes.describe()}")
        return f"model {routes.name!r} has no version {version!r}; {routes.describe()}"

    def handles(self) -> list[ModelHandle]:
        """Every current load: serving, loading, failed, and those still answering after retirement."""
        out: list[ModelHandle] = []
        for record in self.records.values():
            out.extend(record.serving.values())
            out.extend(h for v, h in record.others.items() if v not in record.serving)
            out.extend(h for v, h in record.unloading.items() if v not in record.serving and v not in record.others)
        return out

    @property
    def closed(self) -> bool:
        """True once `close()` began: nothing more is loaded or served."""
        return self._closed

    @property
    def ready(self) -> bool:
        """True once every version the repository aspires to serves (models unloaded by request aside)."""
        if self._closed or not self.records:
            return False
        for record in self.records.values():
            if record.unloaded:
                continue
            if record.source is None or record.source.config is None:
                return False
            wanted = record.source.served()
            if not wanted or any(v not in record.serving or not record.serving[v].ready for v in wanted):
                return False
        return True

    def not_ready(self) -> list[dict[str, str]]:
        """What keeps the server from being ready: a row (name, version, state, reason) per
        model version the repository asks for that does not serve (reasons as the index
        gives them; a model whose own config is invalid has version "")."""
        rows: list[dict[str, str]] = []
        for name in sorted(self.records):
            record = self.records[name]
            if record.unloaded:
                continue
            source = record.source
            if source is None or source.config is None:
                reason = source.error if source is not None and source.error else "its folder could not be read"
                rows.append({"name": name, "version": "", "state": UNAVAILABLE, "reason": reason or ""})
                continue
            wanted = source.served()
            if not wanted:
                rows.append({"name": name, "version": "", "state": UNAVAILABLE,
                             "reason": f"no version on disk is served by the version policy "
                                       f"({source.config.version_policy.describe()})"})
            for v in wanted:
                if v in record.serving:
                    serving = record.serving[v]
                    if not serving.ready:  # its interpreters were given up on
                        rows.append({"name": name, "version": str(v), "state": UNAVAILABLE,
                                     "reason": serving.no_interpreter_reason()})
                    continue
                handle = record.others.get(v)
                state = handle.state if handle is not None else UNAVAILABLE
                reason = handle.reason if handle is not None and handle.reason else state.lower()
                rows.append({"name": name, "version": str(v), "state": state, "reason": reason})
        return rows

    # ---- scanning ----

    def scan(self) -> None:
        """Read the repository (configs only; nothing is loaded) and show every model as
        loading (or unavailable, with why). Raises RepositoryError."""
        self._scan = scan_repository(self.repository, model_name=self.settings.model_name)
        self._note_skipped(self._scan.skipped)
        for name, source in self._scan.models.items():
            record = self.records.setdefault(name, ModelRecord(name))
            record.source = source
            for v in source.served():
                record.others[v] = self._handle(name, source.versions[v])
            if source.config is None:
                record.others.setdefault(0, self._failed(name, source))
            self._publish(record)

    def _note_skipped(self, skipped: list[Skipped]) -> None:
        before = {(s.path, s.reason) for s in self.skipped}
        for s in skipped:
            if (s.path, s.reason) not in before:
                log.warning("repository: skipped %s: %s", s.path, s.reason)
        self.skipped = list(skipped)

    def _handle(self, name: str, source: VersionSource) -> ModelHandle:
        return ModelHandle(name, source, stats=self.metrics.stats(name, str(source.version)))

    def _new_key(self, handle: ModelHandle) -> str:
        """The name of a new load in its pool: `name/version`, then `name/version#n` for reloads."""
        self._loads += 1
        key = f"{handle.name}/{handle.version}"
        if key in self._keys:
            key += f"#{self._loads}"
        self._keys.add(key)
        return key

    def _failed(self, name: str, source: ModelSource) -> ModelHandle:
        """A stand-in handle for a model whose own config.toml is invalid."""
        v = VersionSource(version=min(source.versions, default=1), directory=source.directory, config=None,
                          error=source.error)
        return ModelHandle(name, v, stats=self.metrics.stats(name, str(v.version)))

    # ---- changes ----

    async def start(self) -> None:
        """Load every version the repository aspires to, one at a time (so that the memory
        each load adds is that load's)."""
        if self._scan is None:
            self.scan()
        assert self._scan is not None
        async with self._lock:
            try:
                await self._apply(self._scan, retry=True)
            finally:
                self._started = True
                await close_probe()
        waiting = self.not_ready()
        if waiting or not self.records:
            log.warning("not ready: %s", "; ".join(
                f"{r['name']}{' version ' + r['version'] if r['version'] else ''}: "
                f"{cut_traceback(r['reason']).splitlines()[0] if r['reason'] else r['state']}" for r in waiting)
                or f"the repository {self.repository} holds no model")

    async def rescan(self) -> None:
        """Read the repository again and move every model to what it now holds: new versions
        loaded, removed ones unloaded, changed ones reloaded. A repository that cannot be
        read changes nothing (and is logged)."""
        async with self._lock:
            if self._closed:
                return
            try:
                found = scan_repository(self.repository, {n: r.override for n, r in self.records.items()
                                                          if r.override}, model_name=self.settings.model_name)
            except RepositoryError as e:
                log.error("repository rescan failed, nothing changed: %s", e)
                return
            self._note_skipped(found.skipped)
            try:
                await self._apply(found, retry=False)
            finally:
                await close_probe()

    async def load(self, name: str, override: dict[str, Any] | None = None) -> None:
        """Load (or reload) a model from its folder as it is now, with `override`'s config
        fields laid over its config.toml until the next load; clears an unload. Raises
        LoadFailed when no version of it serves afterwards, naming why."""
        if override is not None and not isinstance(override, dict):
            raise InvalidInput(f"parameters.config: expected a JSON object of config fields, got {override!r}")
        async with self._lock:
            if self._closed:
                raise EngineError("the server is shutting down")
            found = scan_model(self.repository, name, override=override, model_name=self.settings.model_name)
            if isinstance(found, Skipped):
                raise LoadFailed(f"failed to load {name!r}: {found.path}: {found.reason}")
            problems = [found.error] if found.error else [
                f"version {v}: {found.versions[v].error}" for v in found.served() if found.versions[v].error]
            if problems:  # nothing changes
                raise LoadFailed(f"failed to load {name!r}: " + "; ".join(str(p) for p in problems))
            record = self.records.setdefault(name, ModelRecord(name))
            record.override = override or None
            record.unloaded = False
            try:
                await self._reconcile(record, found, retry=True)
            finally:
                await close_probe()
            missing = [v for v in found.served() if v not in record.serving]
            if missing or not record.serving:
                reasons = [f"version {v}: {record.others[v].reason}" for v in missing if v in record.others]
                raise LoadFailed(f"failed to load {name!r}: " + ("; ".join(reasons) or "no version to serve"))

    async def unload(self, name: str) -> None:
        """Stop serving every version of a model: answer what each accepted, then unload it.
        The model stays unloaded across rescans until a load request."""
        async with self._lock:
            record = self.records.get(name)
            if record is None:
                raise ModelNotFound(self._unknown(name))
            record.unloaded = True
            going = list(record.serving.values())
            record.serving.clear()
            record.others.clear()
            self._publish(record)
            await asyncio.gather(*(self._retire(record, h) for h in going))
            log.info("model %s unloaded by request", name)

    async def _apply(self, found: RepositoryScan, *, retry: bool) -> None:
        for name in sorted(found.models):
            record = self.records.setdefault(name, ModelRecord(name))
            await self._reconcile(record, found.models[name], retry=retry)
        for name in sorted(set(self.records) - set(found.models)):
            record = self.records[name]
            log.info("model %s: its folder is gone; unloading it", name)
            await self._reconcile(record, None, retry=False)

    async def _reconcile(self, record: ModelRecord, source: ModelSource | None, *, retry: bool) -> None:
        """Move one model from what it serves to what `source` aspires to."""
        record.source = source
        aspired = [] if source is None or record.unloaded else source.served()
        if source is not None and source.config is None:
            # the model's own config.toml is invalid: what serves goes on serving
            record.others = {0: self._failed(record.name, source)} if not record.serving else {}
            log.error("model %s: %s", record.name, source.error)
            self._publish(record)
            return
        to_load: list[VersionSource] = []
        others: dict[int, ModelHandle] = {}
        for v in aspired:
            assert source is not None
            vs = source.versions[v]
            current = record.serving.get(v)
            if current is not None and current.fingerprint == vs.fingerprint:
                continue
            if vs.error is not None:
                others[v] = self._handle(record.name, vs)  # unavailable, with the error
                if current is not None:
                    others[v].reason += "; the previous load keeps serving"
                if record.failed.get(v) != vs.fingerprint:
                    log.error("model %s version %d cannot be loaded: %s", record.name, v, vs.error)
                record.failed[v] = vs.fingerprint
                continue
            if not retry and record.failed.get(v) == vs.fingerprint and v in record.others:
                others[v] = record.others[v]  # failed as it is now: not retried until it changes
                continue
            to_load.append(vs)
        record.others = others
        retiring = [v for v in record.serving if v not in aspired]
        transition = source.config.transition if source is not None and source.config is not None \
            else "availability"
        going: list[ModelHandle] = []
        if transition == "resource":
            # the old loads go first: retire and unload them, then load
            first = [record.serving.pop(v) for v in retiring]
            first += [record.serving.pop(vs.version) for vs in to_load if vs.version in record.serving]
            self._publish(record)
            await asyncio.gather(*(self._retire(record, h) for h in first))
            retiring = []
        loaded: dict[int, ModelHandle] = {}
        for vs in to_load:
            handle = self._handle(record.name, vs)
            handle.key = self._new_key(handle)
            record.others[vs.version] = handle
            self._publish(record)  # the index shows it loading
            await self._load(handle)
            if handle.ready:
                loaded[vs.version] = handle
                del record.others[vs.version]
                record.failed.pop(vs.version, None)
            else:
                record.failed[vs.version] = vs.fingerprint
                if vs.version in record.serving:
                    handle.reason += f"; the previous load of version {vs.version} keeps serving"
        for v, handle in loaded.items():
            old = record.serving.get(v)
            if old is not None:
                going.append(old)
            record.serving[v] = handle
        if retiring:
            missing = [v for v in aspired if v not in record.serving]
            if missing:
                # availability first: what was to be replaced serves until its successors do
                log.error("model %s: version %s did not load; version %s keeps serving", record.name,
                          ", ".join(map(str, missing)), ", ".join(map(str, retiring)))
            else:
                going += [record.serving.pop(v) for v in retiring]
        self._set_labels(record, source)
        self._publish(record)
        for handle in going:
            self._retire_soon(record, handle)

    def _set_labels(self, record: ModelRecord, source: ModelSource | None) -> None:
        wanted = dict(source.config.labels) if source is not None and source.config is not None else {}
        labels: dict[str, int] = {}
        for label, v in wanted.items():
            old = record.labels.get(label)
            if v not in record.serving and old is not None and old != v and old in record.serving:
                log.error("model %s: label %r stays on version %d: version %d does not serve", record.name,
                          label, old, v)
                labels[label] = old
            else:
                labels[label] = v
        if labels != record.labels:
            log.info("model %s labels: %s", record.name,
                     ", ".join(f"{k} -> {v}" for k, v in sorted(labels.items())) or "none")
        record.labels = labels

    def _lost_changed(self) -> None:
        """An interpreter was given up or came back: which models are ready changed."""
        if self.on_publish is not None:
            self.on_publish()

    def _publish(self, record: ModelRecord) -> None:
        """Swap in the model's new routes (or drop them when the model is gone)."""
        if self.on_publish is not None:
            self.on_publish()
        if record.source is None and not record.serving and not record.unloading:
            self.routes.pop(record.name, None)
            self.records.pop(record.name, None)
            return
        others = dict(record.others)
        if record.unloaded:
            for v in record.source.served() if record.source is not None else []:
                stand_in = self._stand_in(record, v, "unloaded by request")
                if stand_in is not None:
                    others.setdefault(v, stand_in)
        self.routes[record.name] = ModelRoutes(record.name, dict(record.serving), record.labels, others)

    def _stand_in(self, record: ModelRecord, v: int, reason: str) -> ModelHandle | None:
        assert record.source is not None
        vs = record.source.versions.get(v)
        if vs is None:
            return None
        handle = ModelHandle(record.name, vs, stats=self.metrics.stats(record.name, str(v)))
        handle.state, handle.reason = UNAVAILABLE, reason
        return handle

    # ---- one load, one retirement ----

    async def _pool(self, engine: str) -> Pool:
        pool = self.pools.get(engine)
        if pool is not None:
            return pool
        pool = Pool(engine=engine, interpreters=self.settings.pool_size(engine), spin_us=self.settings.spin_us,
                    spin_always=self.settings.spin_always,
                    # front loops queue jobs the host's loop does not see: it cannot tell a lone one
                    colocate=self.settings.colocate and self.settings.loop_count == 0, sole=self.sole)
        pool.on_lost = self._lost_changed
        try:
            await pool.start()
        except Exception as e:
            raise EngineError(f"engine {engine!r} failed to start: {e}") from e
        self.pools[engine] = pool
        self.schedulers[engine] = FairScheduler(pool.interpreters)
        return pool

    async def _load(self, handle: ModelHandle) -> None:
        """Choose the engine, load the version in its interpreters, warm its policy up."""
        config = handle.config
        try:
            handle.engine, handle.engine_reason = await resolve_engine(
                config, self.settings, model_file=handle.source.model_file
            )
            pool = await self._pool(handle.engine)
            if config.interpreters is not None and config.interpreters > pool.interpreters:
                raise EngineError(
                    f"model {handle.name!r}: config.toml asks for interpreters = {config.interpreters}, the "
                    f"{handle.engine} pool has {pool.interpreters} (--interpreters)"
                )
            spec = ModelSpec(
                name=handle.name, version=handle.version, key=handle.key, path=handle.source.directory,
                class_name=config.class_name, inputs=config.input_specs, outputs=config.output_specs,
                parameters=config.parameters,
                package=None if config.package is None else msgspec.to_builtins(config.package),
            )
            before = pss()
            started = time.perf_counter()
            # once serving, one interpreter at a time: the others answer requests meanwhile
            info = await pool.load(spec, interpreters=config.interpreters, staggered=self._started)
            try:
                policy, joining = await make_policy(
                    config.batching, pool=pool, info=info, max_batch_size=config.max_batch_size
                )
            except BaseException:
                await pool.unload(handle.key)
                raise
            handle.memory_bytes = max(0, pss() - before)
            handle.load_seconds = time.perf_counter() - started
        except (AserveError, ValueError, TypeError) as e:
            handle.state, handle.reason = UNAVAILABLE, cut_traceback(str(e))  # the log line has the traceback
            log.error("model %s version %s failed to load: %s", handle.name, handle.version, e)
            return
        schema = ModelSchema(
            handle.name, handle.version, inputs=info.inputs, outputs=info.outputs,
            max_batch_size=config.max_batch_size, max_latency_budget_ms=handle.timeout_ms,
        )
        handle.info = info
        handle.schema = schema
        if self.queue_fronts:
            slots, summed = queue_layout(self.queue_fronts)
            handle.queued = _native.Counter(slots, summed=summed)
        handle.batcher = Batcher(
            model=handle.name, key=handle.key, run=pool.run, policy=policy, max_batch_size=config.max_batch_size,
            interpreters=info.interpreters, max_queue_size=config.batching.max_queue_size, join=joining,
            scheduler=self.schedulers[handle.engine], uniform=schema.uniform, cancel=pool.cancel,
            shared=handle.queued,
        )
        if self.queue_fronts and isinstance(policy, AdaptivePolicy):
            # the fronts' requests are batched (and join running batches) in the pool by the
            # policy in C, fed from here
            handle.plan = PlanFeed(policy, joining)
            handle.plan.start()
        handle.pool = pool
        handle.batcher.tracer = self.tracer
        handle.state, handle.reason = READY, ""
        handle.loaded_at = time.time()
        log.info("model %s version %s ready in %.2f s: engine %s (%s), %d interpreters", handle.name,
                 handle.version, handle.load_seconds, handle.engine, handle.engine_reason, info.interpreters)

    def _retire_soon(self, record: ModelRecord, handle: ModelHandle) -> None:
        self._begin_retiring(record, handle)
        task = asyncio.get_running_loop().create_task(self._retire(record, handle))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    @staticmethod
    def _begin_retiring(record: ModelRecord, handle: ModelHandle) -> None:
        handle.retired = True
        handle.state = UNLOADING
        record.unloading[handle.number] = handle

    async def _retire(self, record: ModelRecord, handle: ModelHandle) -> None:
        """Answer every request the load accepted, then unload it from its interpreters.

        It is already out of the routes; a request that looked it up before that and has
        not yet reached its batcher looks the model up again (`ModelHandle.retired`)."""
        self._begin_retiring(record, handle)
        try:
            if handle.batcher is not None:
                await handle.batcher.close()  # every request has a deadline: this ends
                self.totals.setdefault((handle.name, handle.version), BatchTotals()).add(handle.batcher)
            if self.before_unload is not None:
                await self.before_unload(handle.key)
            pool = self.pools.get(handle.engine)
            if pool is not None and handle.info is not None:
                await pool.unload(handle.key, staggered=True)
            if handle.plan is not None:
                handle.plan.stop()
            log.info("model %s version %s unloaded (load %s)", handle.name, handle.version, handle.key)
        except Exception as e:  # noqa: BLE001 - one failed unload must not stop the manager
            log.error("model %s version %s: unloading failed: %s", handle.name, handle.version, e)
        finally:
            handle.state, handle.reason = UNAVAILABLE, "unloaded"
            if record.unloading.get(handle.number) is handle:
                del record.unloading[handle.number]
            if record.source is None and not record.serving and not record.unloading:
                self._publish(record)

    # ---- what the repository API reports ----

    def index(self, *, ready_only: bool = False) -> list[dict[str, Any]]:
        """Triton's repository index: a row per model version, with its state and reason."""
        rows: list[dict[str, Any]] = []
        for name in sorted(self.records):
            record = self.records[name]
            source = record.source
            numbers = set(record.serving) | set(record.others) | set(record.unloading)
            if source is not None:
                numbers |= set(source.versions)
            numbers.discard(0)
            for v in sorted(numbers):
                if v in record.serving:
                    state = READY
                    reason = f"reload failed: {record.others[v].reason}" if v in record.others else ""
                elif v in record.others:
                    state, reason = record.others[v].state, record.others[v].reason
                elif v in record.unloading:
                    state, reason = UNLOADING, "answering the requests it accepted"
                elif record.unloaded:
                    state, reason = UNAVAILABLE, "unloaded by request"
                elif source is not None and source.config is None:
                    state, reason = UNAVAILABLE, f"the model's config is invalid: {source.error}"
                else:
                    policy = source.config.version_policy.describe() if source and source.config else "none"
                    state, reason = UNAVAILABLE, f"not served by the version policy ({policy})"
                if ready_only and state != READY:
                    continue
                row: dict[str, Any] = {"name": name, "version": str(v), "state": state}
                if reason:
                    row["reason"] = reason
                rows.append(row)
            if 0 in record.others and not ready_only:  # the model's own config is invalid
                rows.append({"name": name, "version": "", "state": UNAVAILABLE, "reason": record.others[0].reason})
        return rows

    # ---- the end ----

    async def close(self, *, timeout: float | None = None) -> None:
        """Answer what is queued, then close every pool (tolerating failures of each)."""
        self._closed = True
        loop = asyncio.get_running_loop()
        end = None if timeout is None else loop.time() + timeout
        async with self._lock:
            batchers = [h.batcher for h in self.handles() if h.batcher is not None]
            for h in self.handles():
                if h.plan is not None:
                    h.plan.stop()
            await asyncio.gather(*(b.close(timeout=timeout) for b in batchers), return_exceptions=True)
            if self._retiring:
                await asyncio.gather(*self._retiring, return_exceptions=True)
            left = None if end is None else max(0.0, end - loop.time())  # a stuck job is given up then
            results = await asyncio.gather(*(p.close(timeout=left) for p in self.pools.values()),
                                           return_exceptions=True)
            for engine, result in zip(list(self.pools), results):
                if isinstance(result, BaseException):
                    log.error("closing the %s pool failed: %s", engine, result)
