"""Layer-level joining at run time: a model's staged batches in flight, and the queue offered to them.

With joining on, the batcher runs every batch stage by stage (`start`, `result`,
`end`), and while no interpreter is free it calls `offer`: the head of its queue is
offered to a running batch whenever the planner (join.py) predicts that the joined
batch still meets every budget (under the benefit rule: and lowers the total
latency). The engine absorbs the group at a stage boundary, or turns it away when the
batch has moved past the offer's last stage; then the group goes back to the head of
the queue. Under the benefit rule, while the model's curve is one on which no join
can pay (`JoinPlanner.may_pay`), batches run whole and nothing is offered (`active`
is false): the staged run and the offers would cost the event loop time and buy
nothing.

The batcher keeps its queue: this module reads it, and moves requests out of it and
back only through the batcher's callbacks.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol

from ..tensor import Tensor, concat_inputs, same_sample_shapes
from .join import JoinPlanner, tightest
from .request import Request


class StagedPool(Protocol):
    """What joining needs of the engine (aserve.engine.Pool has it)."""

    def infer_staged(self, model: str, inputs: Sequence[Tensor], /) -> Any: ...

    def offer(self, run: Any, inputs: Sequence[Tensor], last_stage: int, /) -> asyncio.Future[bool] | None: ...

    def progress(self, run: Any, /) -> tuple[int, float] | None: ...


class Joining(NamedTuple):
    """Layer-level joining for one model: the engine, the planner, the default budget (s),
    and whether a join must also lower total latency (benefit) or only fit the budgets."""

    pool: StagedPool
    planner: JoinPlanner
    budget: float
    benefit: bool = True


Group = tuple[asyncio.Future[bool], list[Request]]  # requests offered together: the engine's answer, them


class StagedBatch:
    """A staged batch in flight: its requests, then the groups offered to it, in order."""

    __slots__ = ("cancelled", "groups", "limit", "requests", "run", "samples")

    def __init__(self, run: Any, requests: list[Request], samples: int, limit: float) -> None:
        self.cancelled = False
        self.run = run  # the engine's staged run
        self.requests = requests
        self.samples = samples  # with the groups offered and not turned away
        self.limit = limit  # earliest finish limit among its requests and groups
        self.groups: list[Group] = []

    def absorbed(self) -> list[Group]:
        """The groups that joined it (the engine answers every offer of a batch before the batch)."""
        return [(f, g) for f, g in self.groups if f.done() and not f.cancelled() and f.result()]

    def offered(self) -> list[Group]:
        """The groups offered to it and not turned away (absorbed, or waiting at its join point)."""
        return [(f, g) for f, g in self.groups if not f.done() or (not f.cancelled() and f.result())]

    def everyone(self) -> list[Request]:
        """Its requests, then those of the groups that joined it: what its outputs answer."""
        return self.requests + [r for _, group in self.absorbed() for r in group]


class LayerJoin:
    """Layer-level joining for the batcher of one model.

    key: the model's instance in the engine; queue: the batcher's queue, read here;
    drop_withdrawn(): the batcher drops the withdrawn requests at the head of its queue;
    take(n, now): it moves the first n into a running batch (they stop waiting at `now`);
    put_back(group, offered): an offer made at `offered` was turned away, the batcher
    returns its requests to the head of the queue and dispatches again."""

    def __init__(
        self, join: Joining, *, key: str, max_batch_size: int, uniform: bool, clock: Callable[[], float],
        queue: collections.deque[Request], drop_withdrawn: Callable[[], None],
        take: Callable[[int, float], list[Request]], put_back: Callable[[list[Request], float], None],
    ) -> None:
        self.pool = join.pool
        self.planner = join.planner
        self.budget = join.budget
        self.benefit = join.benefit
        self.key = key
        self.max_batch_size = max_batch_size
        self._uniform = uniform
        self._clock = clock
        self._queue = queue
        self._drop_withdrawn = drop_withdrawn
        self._take = take
        self._put_back = put_back
        self._batches: list[StagedBatch] = []
        self.joins = 0  # groups absorbed into running batches
        self.joined_requests = 0
        self.offers_turned_away = 0

    @property
    def active(self) -> bool:
        """Whether batches run stage by stage now (under the benefit rule: while a join may pay)."""
        return not self.benefit or self.planner.may_pay()

    @property
    def running(self) -> bool:
        """Whether a staged batch is in flight."""
        return bool(self._batches)

    def stats(self) -> dict[str, object]:
        return {"joins": self.joins, "joined_requests": self.joined_requests,
                "offers_turned_away": self.offers_turned_away, "join": self.planner.as_dict()}

    # ---- a staged batch ----

    def start(self, batch: list[Request], inputs: Sequence[Tensor], samples: int) -> StagedBatch:
        """Hand a dispatched batch (its `inputs` concatenated: `samples` in all) to the engine
        to run stage by stage; raises what the engine raises when it refuses the batch."""
        run = self.pool.infer_staged(self.key, inputs)
        staged = StagedBatch(run, batch, samples, min(self._limit(r) for r in batch))
        self._batches.append(staged)
        return staged

    async def result(self, staged: StagedBatch) -> tuple[dict[str, Tensor], Sequence[float]]:
        """The batch's outputs (for `staged.everyone()`) and its seconds per stage; raises the
        model's or the engine's error. A batch that ran as it was dispatched teaches the
        planner the stage shares."""
        outputs, seconds = await staged.run.result
        absorbed = staged.absorbed()
        if absorbed:
            self.joins += len(absorbed)
            self.joined_requests += sum(len(group) for _, group in absorbed)
        else:
            self.planner.profile.observe(seconds)
        return outputs, seconds

    def end(self, staged: StagedBatch) -> None:
        """Every request of the batch has its answer (or is being run alone): forget it."""
        self._batches.remove(staged)

    def in_flight(self) -> list[Request]:
        """The requests of the staged batches, then those of the groups offered to them."""
        batches = self._batches
        return ([r for s in batches for r in s.requests]
                + [r for s in batches for _, group in s.groups for r in group])

    def abandoned(self) -> list[Any]:
        """The engine's runs of the batches nobody waits for any more (every request of them
        timed out or went away), each reported once: to be cancelled."""
        runs = []
        for s in self._batches:
            if not s.cancelled and all(r.future.done() for r in s.requests) and \
                    all(r.future.done() for _, g in s.groups for r in g):
                s.cancelled = True
                runs.append(s.run.id)
        return runs

    # ---- offers ----

    def _limit(self, req: Request) -> float:
        return tightest(req.arrival - req.waited, req.budget if req.budget is not None else self.budget, req.deadline)

    def offer(self) -> None:
        """No interpreter is free: offer the head of the queue to the running staged batches."""
        if not self._batches or not self.active:
            return
        queue = self._queue
        now = self._clock()
        planner = self.planner
        running = []
        free_at = math.inf  # the earliest predicted end of a running batch: when a slot frees
        for staged in self._batches:
            progress = self.pool.progress(staged.run)
            if progress is None:
                continue
            running.append((staged, progress))
            if progress[1] >= 0.0:
                free_at = min(free_at, planner.own_end(
                    start=now - progress[1], now=now, samples=staged.samples,
                    offered=[sum(r.samples for r in g) for _, g in staged.offered()], done=progress[0],
                ))
        for staged, (done, elapsed) in running:
            self._drop_withdrawn()
            if not queue:
                return
            sizes: list[int] = []
            limits: list[float] = []
            total, limit = 0, math.inf
            for r in queue:
                if (staged.samples + total + r.samples > self.max_batch_size
                        or not (self._uniform or same_sample_shapes(staged.requests[0].inputs, r.inputs))):
                    break
                total += r.samples
                limit = min(limit, self._limit(r))
                sizes.append(total)
                limits.append(limit)
            if not sizes:
                continue
            groups = staged.offered()
            plan = planner.plan(
                now, done=done, elapsed=elapsed, samples=staged.samples, limit=staged.limit,
                sizes=sizes, limits=limits, max_batch_size=self.max_batch_size,
                offered=[sum(r.samples for r in g) for _, g in groups],
                requests=len(staged.requests) + sum(len(g) for _, g in groups),
                free_at=free_at if self.benefit else None,
            )
            if plan is None:
                continue
            head = list(itertools.islice(queue, plan.take))
            samples = sizes[plan.take - 1]
            inputs = head[0].inputs if len(head) == 1 else concat_inputs([r.inputs for r in head], samples)
            future = self.pool.offer(staged.run, inputs, plan.last_stage)
            if future is None:  # the batch completed or moved on meanwhile
                continue
            group = self._take(plan.take, now)
            staged.samples += samples
            staged.limit = min(staged.limit, limits[plan.take - 1])
            staged.groups.append((future, group))
            future.add_done_callback(functools.partial(self._offer_done, staged, group, samples, now))

    def _offer_done(self, staged: StagedBatch, group: list[Request], samples: int, offered: float,
                    future: asyncio.Future[bool]) -> None:
        if not future.cancelled() and future.result():
            return  # absorbed: the batch's outputs answer the group
        self.offers_turned_away += 1
        staged.samples -= samples
        self._put_back(group, offered)
