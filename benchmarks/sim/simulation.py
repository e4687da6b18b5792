"""The real batcher in virtual time: a deterministic simulation of one or more models.

`simulate` (one model) and `Simulation` (several, optionally sharing a pool through
the real `FairScheduler`) submit requests to real `Batcher`s, with the real policies,
on a `VirtualLoop` (virtualtime.py): every decision, timer, admission check, deadline
and join is the batcher's own code, so the simulation cannot drift from it. Only the
engine is simulated (`Engine`):

  - a pool of `interpreters` that run one batch each, first come first served (a
    batch handed over while all are busy waits, as in the native queue);
  - `run(model, inputs, done)` (Pool.run): a batch of b samples completes `cost(b)`
    virtual seconds after it starts; its output echoes its input, so each request's
    answer is checked to be its own rows (a wrong split fails the simulation);
  - for a model with stage shares, `infer_staged`, `offer` and `progress` (layer-level
    joining, as native/host/pool_join.c and the runtime's stage loop do it): stage j of a
    batch of N samples takes shares[j] * cost(N); after each stage but the last the
    batch polls its offers in order: the first whose last_stage is at least the
    stages done joins (it runs stages 1..k alone, sum(shares[:k]) * cost(n), then the
    batch goes on with N + n samples, and polls again); one past its last_stage is
    turned away at once. An offer is refused (None) once the batch has done
    last_stage stages or completed. At completion the offers still waiting are turned
    away, then the absorbed ones are confirmed, then the batch's result (outputs for
    its samples and each absorbed group in order, and its own stage seconds) is set.

`cost` is the engine's truth; the policy's cost model may differ from it (an engine
slower than the policy believes, as a server whose event loop shares the cores). It is
called once per batch (and per stage run) in a deterministic order, so a cost with its
own seeded random jitter keeps a run reproducible.

Requests carry their index as their input values; `SimResult` records per request
its latency, refusal (with Retry-After), timeout or error, and per batch its start,
end, requests and joined groups; it summarises mean, percentiles, share over budget
and throughput. A run is deterministic: the same arrivals give the same result.
"""

from __future__ import annotations

import array
import functools
import math
import random
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from aserve.batching.batcher import Batcher, Done
from aserve.batching.fair import FairScheduler
from aserve.batching.join import JoinPlan, JoinPlanner
from aserve.batching.joining import Joining
from aserve.batching.policy import BatchPolicy, Decision, Pending
from aserve.errors import AserveError, Overloaded, RequestTimeout
from aserve.tensor import Tensor

from .virtualtime import SimulationError, VirtualLoop

Cost = Callable[[int], float]


class Arrival(NamedTuple):
    """One simulated request: when it arrives (virtual seconds), how many samples, an
    optional absolute deadline, an optional latency budget in seconds (None: the
    policy's own)."""

    time: float
    samples: int = 1
    deadline: float | None = None
    budget: float | None = None


def poisson(rate: float, seconds: float, seed: int, samples: Callable[[random.Random], int] | None = None,
            *, budget: float | None = None) -> list[Arrival]:
    """Poisson arrivals at `rate` per second for `seconds`, from `seed`; each of
    `samples(rng)` samples (drawn after its gap), or one; each with `budget`, if given."""
    rng = random.Random(seed)
    t = 0.0
    out: list[Arrival] = []
    while True:
        t += rng.expovariate(rate)
        if t >= seconds:
            return out
        out.append(Arrival(t, samples(rng) if samples else 1, None, budget))


# ---- records ----


class SimBatch(NamedTuple):
    """A batch as the engine ran it."""

    start: float
    end: float
    requests: tuple[int, ...]  # request indices, as dispatched
    samples: int  # as dispatched
    joined: tuple[int, ...] = ()  # requests it absorbed at stage boundaries, in order


class SimJoin(NamedTuple):
    """A group of queued requests absorbed by a running staged batch."""

    batch: int  # index into SimResult.batches
    offered: float  # when the batcher offered it
    joined: float  # when the batch absorbed it (its boundary, or after earlier groups there)
    stage: int  # it ran stages 1..stage alone, then went on with the batch
    requests: tuple[int, ...]
    samples: int
    last_stage: int  # the plan's latest boundary
    predicted: float  # the planner's predicted finish of the batch when offered


@dataclass(frozen=True)
class SimResult:
    """One model's simulated run. latencies[i]: seconds from arrival to answer of request
    i (None: refused, timed out or failed); arrivals[i]: its arrival time."""

    latencies: list[float | None]
    batches: list[SimBatch]
    refused: list[int]  # indices refused by admission control or a full queue (Overloaded)
    timed_out: list[int]  # indices whose deadline passed (in the queue or while running)
    end: float  # virtual time of the last answer
    budgets: tuple[float | None, ...] = ()  # budgets[i]: request i's own budget, if any
    joins: tuple[SimJoin, ...] = ()  # groups absorbed by running batches (with joining)
    arrivals: tuple[float, ...] = ()
    retry_after: tuple[float, ...] = ()  # the Retry-After of each refusal, in `refused` order
    errors: tuple[tuple[int, str], ...] = ()  # other failures: (index, message)
    stats: Mapping[str, object] = field(default_factory=dict)  # the batcher's stats() at the end

    def sizes(self) -> list[int]:
        """Samples per batch as dispatched, in dispatch order."""
        return [b.samples for b in self.batches]

    def groups(self) -> list[tuple[int, ...]]:
        """Request indices per batch as dispatched, in dispatch order."""
        return [b.requests for b in self.batches]

    def served(self) -> list[float]:
        return [x for x in self.latencies if x is not None]

    def mean(self) -> float:
        s = self.served()
        return sum(s) / len(s) if s else math.nan

    def percentile(self, q: float) -> float:
        """The q-th percentile (0..100, nearest rank) of served latencies."""
        s = sorted(self.served())
        if not s:
            return math.nan
        k = max(0, min(len(s) - 1, math.ceil(q / 100.0 * len(s)) - 1))
        return s[k]

    def over(self, budget: float, *, admitted: bool = False) -> float:
        """Fraction of requests not served within their budget: their own where they have
        one, else `budget` seconds. Refusals and timeouts count, unless `admitted`: then
        the fraction is of the requests admitted (not refused)."""
        own = self.budgets or (None,) * len(self.latencies)
        refused = set(self.refused) if admitted else set()
        bad = total = 0
        for i, (x, b) in enumerate(zip(self.latencies, own)):
            if i in refused:
                continue
            total += 1
            if x is None or x > (budget if b is None else b):
                bad += 1
        return bad / total if total else 0.0

    def throughput(self, start: float = 0.0, end: float | None = None) -> float:
        """Requests answered per virtual second between `start` and `end` (default: from 0
        to the last answer)."""
        stop = self.end if end is None else end
        if stop <= start:
            return 0.0
        done = sum(1 for a, x in zip(self.arrivals, self.latencies) if x is not None and start <= a + x <= stop)
        return done / (stop - start)


# ---- the simulated engine ----


def _ids(t: Tensor) -> tuple[int, ...]:
    """The request indices in a batch's input, in order (each request's rows hold its index)."""
    return tuple(dict.fromkeys(memoryview(t.data).cast("B").cast("i").tolist()))


class _Record:
    __slots__ = ("end", "joined", "requests", "samples", "start")

    def __init__(self, requests: tuple[int, ...], samples: int) -> None:
        self.requests = requests
        self.samples = samples
        self.start = math.nan
        self.end = math.nan
        self.joined: list[int] = []


class _EngineModel:
    __slots__ = ("cost", "joins", "name", "planner", "records", "shares")

    def __init__(self, name: str, cost: Cost, shares: Sequence[float] | None) -> None:
        self.name = name
        self.cost = cost
        self.shares = list(shares) if shares else []
        self.records: list[_Record] = []
        self.joins: list[SimJoin] = []
        self.planner: _RecordingPlanner | None = None


class _Offer:
    __slots__ = ("future", "inputs", "last_stage", "offered", "predicted", "requests", "samples")

    def __init__(self, future: Any, inputs: Sequence[Tensor], last_stage: int, offered: float,
                 predicted: float) -> None:
        self.future = future
        self.inputs = inputs
        self.samples = inputs[0].shape[0]
        self.requests = _ids(inputs[0])
        self.last_stage = last_stage
        self.offered = offered
        self.predicted = predicted


class StagedJob:
    """A staged batch in the simulated engine (what Pool.infer_staged returns: `result`
    resolves to (outputs, stage seconds))."""

    __slots__ = ("absorbed", "batch", "done", "finished", "inputs", "model", "offers", "result", "seconds",
                 "start", "width")

    def __init__(self, model: _EngineModel, inputs: Sequence[Tensor], result: Any, batch: int) -> None:
        self.model = model
        self.inputs = inputs
        self.result = result
        self.batch = batch  # index of its record
        self.width = inputs[0].shape[0]  # samples its stages run with
        self.done = 0  # stages done (at the last join point)
        self.start = -1.0  # -1 while queued
        self.finished = False
        self.offers: deque[_Offer] = deque()
        self.absorbed: list[_Offer] = []
        self.seconds: list[float] = []


class Engine:
    """Simulated interpreters on a VirtualLoop: Pool.run, and for staged models
    infer_staged / offer / progress (see the module doc)."""

    def __init__(self, loop: VirtualLoop, *, interpreters: int) -> None:
        if interpreters < 1:
            raise ValueError(f"interpreters must be >= 1, got {interpreters}")
        self.loop = loop
        self.interpreters = interpreters
        self.busy = 0
        self.most_busy = 0  # most batches running at once
        self.most_waiting = 0  # most batches waiting for an interpreter at once
        self._waiting: deque[Callable[[], None]] = deque()
        self._models: dict[str, _EngineModel] = {}

    def add(self, model: str, cost: Cost, *, shares: Sequence[float] | None = None) -> None:
        """Load `model`: a batch of b samples takes cost(b) seconds; with `shares`, it has
        stages taking those shares of it."""
        self._models[model] = _EngineModel(model, cost, shares)

    def _model(self, name: str) -> _EngineModel:
        m = self._models.get(name)
        if m is None:
            raise SimulationError(f"model {name!r} is not loaded in the simulated engine")
        return m

    def _occupy(self, start: Callable[[], None]) -> None:
        if self.busy < self.interpreters:
            self.busy += 1
            self.most_busy = max(self.most_busy, self.busy)
            start()
        else:
            self._waiting.append(start)
            self.most_waiting = max(self.most_waiting, len(self._waiting))

    def _free(self) -> None:
        if self._waiting:
            self._waiting.popleft()()
        else:
            self.busy -= 1

    # ---- plain batches (Pool.run) ----

    def run(self, model: str, inputs: Sequence[Tensor], done: Done, /) -> None:
        m = self._model(model)
        record = _Record(_ids(inputs[0]), inputs[0].shape[0])
        m.records.append(record)
        self._occupy(functools.partial(self._start_plain, m, record, inputs, done))

    def _start_plain(self, m: _EngineModel, record: _Record, inputs: Sequence[Tensor], done: Done) -> None:
        record.start = now = self.loop.time()
        self.loop.call_at(now + m.cost(record.samples), self._end_plain, record, inputs, done)

    def _end_plain(self, record: _Record, inputs: Sequence[Tensor], done: Done) -> None:
        record.end = self.loop.time()
        self._free()
        first = inputs[0]
        done({"Y": Tensor(first.datatype, first.shape, first.data)}, None)

    # ---- staged batches (layer-level joining) ----

    def infer_staged(self, model: str, inputs: Sequence[Tensor], /) -> StagedJob:
        m = self._model(model)
        if not m.shares:
            raise SimulationError(f"model {model!r} has no stages in the simulated engine")
        inputs = list(inputs)
        record = _Record(_ids(inputs[0]), inputs[0].shape[0])
        m.records.append(record)
        job = StagedJob(m, inputs, self.loop.create_future(), len(m.records) - 1)
        self._occupy(functools.partial(self._start_staged, job))
        return job

    def _start_staged(self, job: StagedJob) -> None:
        job.start = self.loop.time()
        job.model.records[job.batch].start = job.start
        self._stage(job)

    def _stage(self, job: StagedJob) -> None:
        """Run the job's next stage with every sample it holds."""
        m = job.model
        seconds = m.shares[job.done] * m.cost(job.width)
        job.seconds.append(seconds)
        self.loop.call_at(self.loop.time() + seconds, self._after_stage, job)

    def _after_stage(self, job: StagedJob) -> None:
        job.done += 1
        if job.done == len(job.model.shares):
            self._end_staged(job)
        else:
            self._poll(job)

    def _poll(self, job: StagedJob) -> None:
        """The join point after `job.done` stages (and again after each group absorbed there)."""
        m = job.model
        now = self.loop.time()
        while job.offers:
            offer = job.offers.popleft()
            if job.done <= offer.last_stage:
                job.width += offer.samples
                job.absorbed.append(offer)
                m.records[job.batch].joined.extend(offer.requests)
                m.joins.append(SimJoin(job.batch, offer.offered, now, job.done, offer.requests, offer.samples,
                                       offer.last_stage, offer.predicted))
                alone = sum(m.shares[:job.done]) * m.cost(offer.samples)
                self.loop.call_at(now + alone, self._poll, job)
                return
            offer.future.set_result(False)  # too late for this group: the batcher queues it again
        self._stage(job)

    def _end_staged(self, job: StagedJob) -> None:
        job.finished = True
        job.model.records[job.batch].end = self.loop.time()
        self._free()
        while job.offers:
            job.offers.popleft().future.set_result(False)
        parts = [job.inputs[0]]
        for offer in job.absorbed:
            offer.future.set_result(True)
            parts.append(offer.inputs[0])
        first = job.inputs[0]
        data = b"".join(bytes(memoryview(p.data).cast("B")) for p in parts)
        outputs = {"Y": Tensor(first.datatype, (job.width, *first.shape[1:]), data)}
        job.result.set_result((outputs, tuple(job.seconds)))

    def offer(self, run: StagedJob, inputs: Sequence[Tensor], last_stage: int, /) -> Any:
        """Offer a group to a staged batch (Pool.offer): None once it is complete or has
        done `last_stage` stages; else a future that says whether it joined."""
        if run.finished or run.done >= last_stage:
            return None
        planner = run.model.planner
        predicted = planner.last.finish if planner is not None and planner.last is not None else math.nan
        future = self.loop.create_future()
        run.offers.append(_Offer(future, list(inputs), last_stage, self.loop.time(), predicted))
        return future

    def progress(self, run: StagedJob) -> tuple[int, float] | None:
        """(stages done, seconds running or -1 while queued); None once complete."""
        if run.finished:
            return None
        if run.start < 0.0:
            return 0, -1.0
        return run.done, self.loop.time() - run.start


class _RecordingPlanner(JoinPlanner):
    """The caller's planner (its cost model, stage profile and scale, shared), remembering the
    last plan it made so the engine can record each offer's predicted finish."""

    last: JoinPlan | None = None

    def plan(self, now: float, **kw: Any) -> JoinPlan | None:
        self.last = super().plan(now, **kw)
        return self.last


class _WithoutAdmission:
    """A policy's decide and observe, without its admission control."""

    def __init__(self, policy: BatchPolicy) -> None:
        self._policy = policy

    def decide(self, now: float, queue: Sequence[Pending], *, idle: int, running: int,
               max_batch_size: int, queued: int | None = None) -> Decision:
        return self._policy.decide(now, queue, idle=idle, running=running, max_batch_size=max_batch_size,
                                   queued=queued)

    def observe(self, samples: int, seconds: float) -> None:
        self._policy.observe(samples, seconds)


def _true_shares(stages: Sequence[float] | None, join: JoinPlanner) -> list[float]:
    shares = list(join.profile.shares) if stages is None else [float(s) for s in stages]
    if len(shares) != join.profile.stages:
        raise ValueError(f"{len(shares)} stage shares for a planner of {join.profile.stages} stages")
    total = sum(shares)
    if any(not s >= 0.0 for s in shares) or not 0.0 < total < math.inf:
        raise ValueError(f"stage shares must be >= 0 with a positive sum, got {shares}")
    return [s / total for s in shares]


# ---- the driver ----


class _Model:
    """One simulated model: its batcher, its arrivals and what became of each request."""

    def __init__(self, name: str, batcher: Batcher, engine: _EngineModel) -> None:
        self.name = name
        self.batcher = batcher
        self.engine = engine
        self.arrivals: list[Arrival] = []
        self.latencies: list[float | None] = []
        self.refused: list[int] = []
        self.retry_after: list[float] = []
        self.timed_out: list[int] = []
        self.errors: list[tuple[int, str]] = []
        self.answered = 0
        self.end = 0.0
        self.finished: Any = None  # a future: every request answered


class Simulation:
    """Several models on one simulated pool of `interpreters`; with `fair`, their
    batchers share it through a real FairScheduler (as the server's models in one pool)."""

    def __init__(self, *, interpreters: int, fair: bool = False) -> None:
        self.loop = VirtualLoop()  # type: ignore[abstract]  # no I/O: the abstract I/O methods stay absent
        self.engine = Engine(self.loop, interpreters=interpreters)
        self.interpreters = interpreters
        self.scheduler = FairScheduler(interpreters) if fair else None
        self._models: dict[str, _Model] = {}
        self._ran = False
        self.submitting: int | None = None  # the index of the arrival being submitted, while it is

    def model(
        self, name: str, policy: BatchPolicy, cost: Cost, *, max_batch_size: int, interpreters: int | None = None,
        admit: bool = True, join: JoinPlanner | None = None, stages: Sequence[float] | None = None,
        budget: float | None = None, benefit: bool = True, max_queue_size: int = 1 << 30,
    ) -> None:
        """Add a model served by a real Batcher.

        policy: its BatchPolicy; cost: seconds a batch of b samples truly takes;
        interpreters: batches of it at once (default: the pool's); admit: use the
        policy's admission control if it has one (as the server does); join: layer-level
        joining with this planner (ignored when max_batch_size is 0, as in the batcher),
        with `stages` the true stage shares (default: the planner's profile at the
        start), `budget` the latency budget (s) of requests without their own, and
        `benefit` the planner's benefit check (False: budgets only)."""
        if name in self._models:
            raise ValueError(f"model {name!r} is already in the simulation")
        shares: list[float] | None = None
        joining = None
        if join is not None and max_batch_size > 0:
            if budget is None or not budget > 0.0:
                raise ValueError(f"joining needs the default latency budget in seconds, got {budget}")
            shares = _true_shares(stages, join)
            planner = _RecordingPlanner(join.cost, join.profile, join.scale)
            joining = Joining(self.engine, planner, budget, benefit)
        self.engine.add(name, cost, shares=shares)
        engine_model = self.engine._models[name]
        if joining is not None:
            engine_model.planner = joining.planner  # type: ignore[assignment]
        batcher = Batcher(
            model=name, run=self.engine.run, policy=policy if admit else _WithoutAdmission(policy),
            max_batch_size=max_batch_size, interpreters=interpreters or self.interpreters,
            max_queue_size=max_queue_size, join=joining, scheduler=self.scheduler, uniform=True,
            clock=self.loop.time,
        )
        self._models[name] = _Model(name, batcher, engine_model)

    def arrive(self, name: str, arrivals: Sequence[Arrival | tuple[float, ...] | float]) -> None:
        """Requests for model `name`: Arrival, (time, samples[, deadline[, budget]]) or a bare
        time (one sample); any order (sorted by time, stably)."""
        m = self._models[name]
        items = [a if isinstance(a, Arrival) else Arrival(*a) if isinstance(a, tuple) else Arrival(float(a))
                 for a in arrivals]
        m.arrivals.extend(items)
        m.arrivals.sort(key=lambda a: a.time)

    def run(self) -> dict[str, SimResult]:
        """Run every model's arrivals to the last answer; the result per model."""
        if self._ran:
            raise RuntimeError("a Simulation runs once")
        self._ran = True
        try:
            self.loop.run_until_complete(self._main())
        finally:
            self.loop.close()
        return {name: self._result(m) for name, m in self._models.items()}

    async def _main(self) -> None:
        loop = self.loop
        for m in self._models.values():
            m.latencies = [None] * len(m.arrivals)
            m.finished = loop.create_future()
            if m.arrivals:
                loop.call_at(m.arrivals[0].time, self._arrive, m, 0)
            else:
                m.finished.set_result(None)
        for m in self._models.values():
            await m.finished
        for m in self._models.values():
            await m.batcher.close()

    def _arrive(self, m: _Model, i: int) -> None:
        if i + 1 < len(m.arrivals):
            self.loop.call_at(m.arrivals[i + 1].time, self._arrive, m, i + 1)
        a = m.arrivals[i]
        data = (array.array("i", [i]) * a.samples).tobytes()
        self.submitting = i
        try:
            future = m.batcher.submit([Tensor("INT32", (a.samples, 1), data)], a.samples, deadline=a.deadline,
                                      budget=a.budget)
        except Overloaded as e:
            m.refused.append(i)
            m.retry_after.append(e.retry_after)
        except RequestTimeout:
            m.timed_out.append(i)
        except AserveError as e:
            m.errors.append((i, str(e)))
        else:
            future.add_done_callback(functools.partial(self._answered, m, i))
            return
        finally:
            self.submitting = None
        self._count(m)

    def _answered(self, m: _Model, i: int, future: Any) -> None:
        now = self.loop.time()
        if future.cancelled():
            m.errors.append((i, "cancelled"))
        elif (exc := future.exception()) is not None:
            if isinstance(exc, RequestTimeout):
                m.timed_out.append(i)
            else:
                m.errors.append((i, f"{type(exc).__name__}: {exc}"))
        else:
            out = future.result()["Y"]
            values = memoryview(out.data).cast("B").cast("i")
            samples = m.arrivals[i].samples
            if out.shape[0] != samples or len(values) != samples or values[0] != i or values[-1] != i:
                raise SimulationError(
                    f"model {m.name!r}: request {i} ({samples} samples) got rows {values.tolist()[:8]}"
                )
            m.latencies[i] = now - m.arrivals[i].time
            m.end = max(m.end, now)
        self._count(m)

    def _count(self, m: _Model) -> None:
        m.answered += 1
        if m.answered == len(m.arrivals) and not m.finished.done():
            m.finished.set_result(None)

    def _result(self, m: _Model) -> SimResult:
        records = m.engine.records
        batches = [SimBatch(r.start, r.end, r.requests, r.samples, tuple(r.joined)) for r in records]
        joins = sorted(m.engine.joins, key=lambda j: (j.joined, j.batch))
        return SimResult(
            latencies=m.latencies, batches=batches, refused=m.refused, timed_out=sorted(m.timed_out),
            end=m.end, budgets=tuple(a.budget for a in m.arrivals), joins=tuple(joins),
            arrivals=tuple(a.time for a in m.arrivals), retry_after=tuple(m.retry_after),
            errors=tuple(sorted(m.errors)), stats=m.batcher.stats(),
        )


def simulate(
    policy: BatchPolicy,
    arrivals: Sequence[Arrival | tuple[float, ...] | float],
    cost: Cost,
    *,
    interpreters: int,
    max_batch_size: int,
    admit: bool = True,
    join: JoinPlanner | None = None,
    stages: Sequence[float] | None = None,
    budget: float | None = None,
    benefit: bool = True,
    max_queue_size: int = 1 << 30,
) -> SimResult:
    """One model on `interpreters` simulated interpreters behind a real Batcher; deterministic.

    arrivals: Arrival, (time, samples[, deadline[, budget]]) or a bare time (one
    sample); cost: seconds a batch of b samples truly takes; admit: the policy's
    admission control on (as in the server) or off; join, stages, budget, benefit:
    layer-level joining (see Simulation.model)."""
    sim = Simulation(interpreters=interpreters)
    sim.model("sim", policy, cost, max_batch_size=max_batch_size, admit=admit, join=join, stages=stages,
              budget=budget, benefit=benefit, max_queue_size=max_queue_size)
    sim.arrive("sim", arrivals)
    return sim.run()["sim"]


class _AdmitOne:
    """A policy whose admission control lets in request `index` (of the arrivals the
    simulation is submitting, `submitting()`) whatever it predicts, and judges every other
    request as the policy does."""

    def __init__(self, policy: BatchPolicy, index: int, submitting: Callable[[], int | None]) -> None:
        self._policy = policy
        self._index = index
        self._submitting = submitting

    def __getattr__(self, name: str) -> Any:
        return getattr(self._policy, name)

    def decide(self, now: float, queue: Sequence[Pending], *, idle: int, running: int,
               max_batch_size: int, queued: int | None = None) -> Decision:
        return self._policy.decide(now, queue, idle=idle, running=running, max_batch_size=max_batch_size,
                                   queued=queued)

    def admit(self, now: float, queued_samples: int, samples: int = 1, budget: float | None = None,
              waited: float = 0.0, *, count: bool = True) -> float | None:
        wait: float | None = self._policy.admit(  # type: ignore[attr-defined]
            now, queued_samples, samples, budget, waited, count=count)
        return None if self._submitting() == self._index else wait

    def refuses(self, now: float, queued_samples: int, samples: int = 1, budget: float | None = None,
                waited: float = 0.0) -> float | None:
        wait: float | None = self._policy.refuses(  # type: ignore[attr-defined]
            now, queued_samples, samples, budget, waited)
        return None if self._submitting() == self._index else wait


def refused_in_time(
    fresh: Callable[[], tuple[BatchPolicy, JoinPlanner | None]],
    arrivals: Sequence[Arrival],
    cost: Cost,
    result: SimResult,
    *,
    interpreters: int,
    max_batch_size: int,
    budget: float,
    **model: Any,
) -> list[int]:
    """The requests `result` refused that would have been answered within their budget:
    each is replayed, admitted (its arrival counted as before), in a fresh run of the same
    `arrivals` (in time order, as poisson's) up to its limit (what arrives later cannot change whether it makes it) under
    a fresh policy and join planner (`fresh()`). `model`: simulate's other keywords
    (stages, benefit)."""
    made = []
    for i in result.refused:
        a = arrivals[i]
        own = min(budget if a.budget is None else a.budget, math.inf if a.deadline is None else a.deadline - a.time)
        part = [x for x in arrivals if x.time <= a.time + own]
        policy, join = fresh()
        sim = Simulation(interpreters=interpreters)
        sim.model("sim", _AdmitOne(policy, i, functools.partial(getattr, sim, "submitting")), cost,
                  max_batch_size=max_batch_size,
                  budget=budget, join=join, **model)
        sim.arrive("sim", part)
        x = sim.run()["sim"].latencies[i]
        if x is not None and x <= own:
            made.append(i)
    return made
