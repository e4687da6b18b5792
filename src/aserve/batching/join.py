"""Layer-level joining (LBCI): when requests waiting may join a running staged batch.

A model that declares stages runs its batches stage by stage; after each stage but
the last the engine polls a join point (see native/host/pool_join.c). The batcher offers
the head of its queue to a running batch when no interpreter is free, and the
engine absorbs the group at the first boundary it reaches no later than the offer's
`last_stage`, or turns it away.

The prediction, for a running batch of N samples started at t0 (measured by the
engine) and a group of n samples joining after stage k, with L the model's batch
latency curve and F_k the share of a batch's time spent in stages 1..k:

    reach boundary k   b_k = max(now, t0 + F_k (L(N) + sum_i L(g_i)))
    finish             b_k + F_k L(n) + (1 - F_k) L(N + n)

(the group runs stages 1..k alone, then everything finishes together). N counts the
groups g_i offered to the batch before (absorbed, or waiting at its join point):
each ran, or will run before this group, its own stages up to its boundary (at most
k) alone, and the batch's stages ran with at most N samples, so b_k bounds when the
batch is through boundary k with every earlier group. Without the g_i, a batch that
absorbs several groups at one boundary (single requests arriving one by one) would
be predicted to finish F_k L(g_i) too early per group, and miss the budgets it was
checked against. If the engine absorbs the group at the boundary it is still
polling (done) rather than the next, the finish is no later than predicted on a
subadditive curve (L(a) + L(b) >= L(a + b)). The offer's
`last_stage` is the latest boundary at which that finish still meets every budget
involved: the running batch's requests and the group's (arrival + budget, or an
earlier deadline). Joining later costs more (the group repeats more stages on its
own), so the engine joins at the first boundary it reaches.

Fitting the budgets is necessary, not sufficient: with `free_at` (when the group
would start without joining: the earliest predicted end of a running batch) the
planner also asks whether joining lowers the requests' total latency. Joining moves
the group's finish from free_at + L(n) to the joined finish and delays each of the
batch's requests by D = joined finish - the batch's own finish. It joins only if

    (requests in the group) x (gain) > (requests in the batch) x D.

On an affine curve a + c b, gain = (1 - F_k) a - (E - free_at) and D = F_k a + c n
(E: the batch's own end, `own_end`; free_at is the earliest `own_end` of the running
batches): joining pays where the per-batch overhead a is large next
to the per-sample cost c (LBCI's CPU models), and not for a model whose latency is
nearly proportional to its batch (where waiting for a free interpreter and batching
there costs less). Without `free_at` only the budgets are checked (LBCI's rule).

Where a <= c no join ever passes the check, so the planner is not asked (`may_pay`):
free_at <= E gives gain <= L(n) - D, and D >= c n whatever the boundary and `now`,
so a join needs g L(n) > (g + r) c n, that is g a > r c n, for a group of g requests
of n >= g samples joining a batch of r >= 1 requests: a > c. Under load the queue is
offered to every running batch at each arrival, so asking where no join can pay
would cost the event loop much for nothing.

`StageProfile` learns F from the stage timings of batches that ran without joiners.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from typing import NamedTuple

from ..engine import ModelInfo, Pool
from .costmodel import CostModel, sample_inputs


class StageProfile:
    """Each stage's share of a batch's latency: measured, then refined online.

    alpha: weight of one observed batch in the running shares."""

    def __init__(self, stages: int, seconds: Sequence[float] | None = None, *, alpha: float = 0.1) -> None:
        if stages < 1:
            raise ValueError(f"a staged model has at least one stage, got {stages}")
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        self.stages = stages
        self.alpha = alpha
        self.shares = [1.0 / stages] * stages
        self.observations = 0
        if seconds is not None:
            self.observe(seconds, weight=1.0)

    def observe(self, seconds: Sequence[float], *, weight: float | None = None) -> None:
        """Stage timings of one batch that ran without joiners."""
        total = sum(seconds)
        if len(seconds) != self.stages or not 0.0 < total < math.inf or any(s < 0.0 for s in seconds):
            return  # a stage that did not run or a non-finite timing would poison every share
        a = self.alpha if weight is None else weight
        self.shares = [old + a * (s / total - old) for old, s in zip(self.shares, seconds)]
        norm = sum(self.shares)
        self.shares = [s / norm for s in self.shares]
        self.observations += 1

    def done(self, k: int) -> float:
        """Share of a batch's time spent in stages 1..k."""
        return min(1.0, sum(self.shares[:k]))

    def as_dict(self) -> dict[str, object]:
        return {"stages": self.stages, "shares": [round(s, 4) for s in self.shares],
                "observations": self.observations}


class JoinPlan(NamedTuple):
    """An offer to make: the first `take` queued requests, joining no later than `last_stage`."""

    take: int
    last_stage: int
    finish: float  # predicted finish if it joins at the first possible boundary


class JoinPlanner:
    """Decides offers to running staged batches from the cost model and the stage profile.

    scale: how much longer than the curve batches run now (the policy's cautious slowdown,
    as its admission plans with; None: as the curve says). A join's finish predicted on the
    bare curve is early whenever the interpreters contend, and a join then breaks the
    budgets it was checked against."""

    def __init__(self, cost: CostModel, profile: StageProfile, scale: Callable[[], float] | None = None) -> None:
        self.cost = cost
        self.profile = profile
        self.scale = scale

    def _predict(self, samples: int) -> float:
        """Seconds a batch of `samples` is expected to take now."""
        return (1.0 if self.scale is None else self.scale()) * self.cost.predict(samples)

    def _memo(self) -> Callable[[int], float]:
        """`_predict` for one plan: the scale read once, each size's seconds computed once
        (a plan asks for the same few sizes for every group and boundary it tries)."""
        scale = 1.0 if self.scale is None else self.scale()
        predict = self.cost.predict
        seen: dict[int, float] = {}

        def at(samples: int) -> float:
            v = seen.get(samples)
            if v is None:
                v = seen[samples] = scale * predict(samples)
            return v
        return at

    def may_pay(self) -> bool:
        """False where no join can lower the total latency: an affine curve whose
        per-batch overhead a is at most its per-sample cost c (see the module doc)."""
        line = self.cost.affine
        return line is None or line[0] > line[1]

    def finish(self, *, start: float, now: float, samples: int, joining: int, k: int,
               offered: Sequence[int] = ()) -> float:
        """Predicted finish of a batch of `samples` started at `start` if `joining` samples
        join after stage k; `offered`: the samples of each group offered to it before,
        counted in `samples` (see the module doc)."""
        predict = self._predict
        f = self.profile.done(k)
        boundary = max(now, start + f * (predict(samples) + sum(predict(g) for g in offered)))
        return boundary + f * predict(joining) + (1.0 - f) * predict(samples + joining)

    def plan(
        self,
        now: float,
        *,
        done: int,
        elapsed: float,
        samples: int,
        limit: float,
        sizes: Sequence[int],
        limits: Sequence[float],
        max_batch_size: int,
        offered: Sequence[int] = (),
        requests: int = 1,
        free_at: float | None = None,
    ) -> JoinPlan | None:
        """The largest group from the head of the queue that may join, or None.

        done, elapsed: the running batch's stages done and seconds running (engine's
        progress); samples: its samples (with groups already offered); limit: the
        earliest time by which one of its requests must finish; sizes[i]/limits[i]:
        cumulative samples and tightest finish limit of the first i+1 queued requests;
        offered: the samples of each group offered to the batch and not turned away
        (absorbed or waiting), which run their first stages alone; requests: the
        batch's requests (with those groups); free_at: when the group would start
        without joining, for the benefit check (None: budgets only)."""
        last = self.profile.stages - 1  # boundaries are after stages 1..last
        first = done + 1
        if elapsed < 0.0 or first > last:
            return None  # not started yet, or past its last boundary
        start = now - elapsed
        predict = self._memo()
        ahead = sum(predict(g) for g in offered)
        shares = [self.profile.done(k) for k in range(last + 1)]
        own = predict(samples)
        for take in range(len(sizes), 0, -1):
            n = sizes[take - 1]
            if samples + n > max_batch_size:
                continue
            bound = min(limit, limits[take - 1])
            alone, joined = predict(n), predict(samples + n)
            # the engine joins at the first boundary it reaches (normally `first`; a later
            # one if the batch moved on meanwhile; `done` if it is still absorbing groups
            # there, which finishes no later): every boundary up to last_stage must fit
            # (`finish`, its terms computed once per group)
            best = None
            for k in range(first, last + 1):
                f = shares[k]
                if max(now, start + f * (own + ahead)) + f * alone + (1.0 - f) * joined > bound:
                    break
                best = k
            if best is None:
                continue
            f = shares[first]
            end = max(now, start + f * (own + ahead)) + f * alone + (1.0 - f) * joined
            if free_at is not None:
                # whether joining lowers the total latency of the group's and the batch's requests
                delay = max(0.0, end - max(now, start + own + f * ahead))  # own_end, `first - 1` stages done
                gain = max(now, free_at) + alone - end
                if not take * gain > requests * delay:
                    continue
            return JoinPlan(take, best, end)
        return None

    def own_end(self, *, start: float, now: float, samples: int, offered: Sequence[int], done: int) -> float:
        """Predicted end of a running batch as it stands: its `samples` (the groups
        `offered` to it included) through every stage, behind those groups' own runs
        through the first stages (bounded by the next boundary's share, as in `finish`)."""
        predict = self._predict
        f = self.profile.done(done + 1)
        return max(now, start + predict(samples) + f * sum(predict(g) for g in offered))

    def as_dict(self) -> dict[str, object]:
        return {"stage_profile": self.profile.as_dict()}


def tightest(arrival: float, budget: float, deadline: float | None) -> float:
    """When a request must finish: arrival + budget, or its deadline if earlier."""
    return min(arrival + budget, deadline if deadline is not None else math.inf)


async def measure_stages(pool: Pool, info: ModelInfo, samples: int, *, repeats: int = 5) -> StageProfile:
    """The stage shares of `info`'s model: median stage timings of `repeats` staged batches
    of `samples` generated samples (after one unmeasured run)."""
    if info.stages < 1:
        raise ValueError(f"model {info.name!r} has no stages")
    inputs = sample_inputs(info, samples)
    runs = []
    for i in range(repeats + 1):
        _, seconds = await pool.infer_staged(info.name, inputs).result
        if i:
            runs.append(seconds)
    return StageProfile(info.stages, [statistics.median(r[k] for r in runs) for k in range(info.stages)])
