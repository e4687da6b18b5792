"""The layer join's planner in C (`_native.Plan.join`, what the pool offers a model's queued
requests to its running staged batches by) against `JoinPlanner`, the Python reference:
driven through the same traces in virtual time (Poisson arrivals while every interpreter
runs a staged batch, groups that join at the next boundary or are turned away, budgets and
deadlines of the requests' own, stage profiles learned from the batches that ran as
dispatched), the two plan the same offers at every step: the same group, the same last
stage, the same predicted finish, the same end of each running batch."""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass, field

import pytest

from aserve import _native
from aserve.batching.costmodel import CostModel, ladder
from aserve.batching.join import JoinPlanner, StageProfile, tightest
from aserve.batching.native import curve

STAGES = 5
TRUE_SHARES = (0.35, 0.25, 0.2, 0.12, 0.08)


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-15)


@dataclass
class Req:
    arrival: float
    samples: int
    budget: float | None
    deadline: float | None


@dataclass
class Batch:
    start: float
    samples: int  # with the groups that joined or wait at its join point
    requests: int
    limit: float
    bounds: list[float]  # when it passes each boundary 1..STAGES-1, then its end
    offered: list[int] = field(default_factory=list)
    joined: bool = False

    def done(self, now: float) -> int:
        return sum(1 for t in self.bounds[:-1] if t <= now)


def true_cost(a: float, c: float, b: int) -> float:
    return a + c * b


def replay(seed: int, a: float, c: float, benefit: bool, interpreters: int, load: float,
           contention: float = 1.0) -> dict[str, int]:
    rng = random.Random(seed)
    top = 16
    cost = CostModel([(b, true_cost(a, c, b) * rng.uniform(0.97, 1.03)) for b in ladder(top)],
                     max_batch_size=top, form="affine")
    measured = [s * rng.uniform(0.9, 1.1) for s in TRUE_SHARES]
    plan = _native.Plan(interpreters=interpreters, latency_budget_s=0.2, max_queue_delay_s=0.004,
                        contention=contention)
    cautious = plan.read(0.0)["slowdown_cautious"]  # batches as long as admission plans them
    assert cautious == pytest.approx(contention + 3.0 * (contention - 1.0))
    planner = JoinPlanner(cost, StageProfile(STAGES, measured), scale=lambda: cautious)
    plan.publish(*curve(cost, 0.1))
    plan.join_setup(planner.profile.shares, benefit, planner.profile.alpha)
    plan.may_pay(planner.may_pay())
    budget = 0.2
    rate = load * interpreters * 4 / true_cost(a, c, 4) / 2.0
    queue: list[Req] = []
    running: list[Batch] = []
    events: list[tuple[float, int, str]] = []
    seq = 0
    counts = {"offers": 0, "asked": 0, "batches": 0, "joined": 0, "turned_away": 0}

    def at(t: float, kind: str) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t, seq, kind))

    def limit_of(r: Req) -> float:
        return tightest(r.arrival, r.budget if r.budget is not None else budget, r.deadline)

    def timeline(start: float, n: int) -> list[float]:
        total = true_cost(a, c, n) * rng.uniform(0.95, 1.05)
        t, bounds = start, []
        for share in TRUE_SHARES:
            t += share * total
            bounds.append(t)
        return bounds

    def start_batches(now: float) -> None:
        while queue and len(running) < interpreters:
            take, total = [], 0
            while queue and total + queue[0].samples <= top:
                r = queue.pop(0)
                take.append(r)
                total += r.samples
            b = Batch(now, total, len(take), min(limit_of(r) for r in take), timeline(now, total))
            running.append(b)
            counts["batches"] += 1
            at(b.bounds[-1], "end")

    def offer(now: float) -> None:
        if not (not benefit or planner.may_pay()):
            return
        free_at = math.inf
        for b in running:
            done = b.done(now)
            py = planner.own_end(start=b.start, now=now, samples=b.samples, offered=b.offered, done=done)
            assert close(plan.own_end(b.start, now, b.samples, b.offered, done), py)
            free_at = min(free_at, py)
        for b in running:
            if not queue:
                return
            sizes, limits, total, limit = [], [], 0, math.inf
            for r in queue:
                if b.samples + total + r.samples > top:
                    break
                total += r.samples
                limit = min(limit, limit_of(r))
                sizes.append(total)
                limits.append(limit)
            if not sizes:
                continue
            done = b.done(now)
            py = planner.plan(now, done=done, elapsed=now - b.start, samples=b.samples, limit=b.limit, sizes=sizes,
                              limits=limits, max_batch_size=top, offered=b.offered, requests=b.requests,
                              free_at=free_at if benefit else None)
            c_plan = plan.join(now, done, now - b.start, b.samples, b.limit, sizes, limits, top, b.offered,
                               b.requests, free_at if benefit else None)
            counts["asked"] += 1
            assert (py is None) == (c_plan is None), (now, py, c_plan)
            if py is None or c_plan is None:
                continue
            assert (c_plan[0], c_plan[1]) == (py.take, py.last_stage), (py, c_plan)
            assert close(c_plan[2], py.finish)
            counts["offers"] += 1
            group = queue[:py.take]
            n = sizes[py.take - 1]
            k = done + 1  # the boundary it reaches next
            if k > py.last_stage or b.bounds[k - 1] <= now:
                counts["turned_away"] += 1
                continue
            del queue[:py.take]
            # the group runs stages 1..k alone at the boundary, then everything goes on together
            catch_up = sum(TRUE_SHARES[:k]) * true_cost(a, c, n)
            rest = true_cost(a, c, b.samples + n) / true_cost(a, c, b.samples)
            t = b.bounds[k - 1] + catch_up
            shift = [t]
            for i in range(k, STAGES):
                t += (b.bounds[i] - b.bounds[i - 1]) * rest
                shift.append(t)
            b.bounds[k - 1:] = shift
            b.samples += n
            b.requests += len(group)
            b.limit = min(b.limit, limits[py.take - 1])
            b.offered.append(n)
            b.joined = True
            counts["joined"] += 1
            at(b.bounds[-1], "end")

    t = 0.0
    for _ in range(400):
        t += rng.expovariate(rate)
        at(t, "arrival")
    while events:
        now, _, kind = heapq.heappop(events)
        if kind == "arrival":
            own = rng.random() < 0.2
            queue.append(Req(now, rng.choice((1, 1, 2, 3)), rng.uniform(0.05, 0.4) if own else None,
                             now + rng.uniform(0.03, 0.3) if rng.random() < 0.1 else None))
        else:
            ended = [b for b in running if close(b.bounds[-1], now) or b.bounds[-1] <= now]
            for b in ended:
                running.remove(b)
                if not b.joined:  # what a batch that ran as dispatched teaches the profile
                    seconds = [b.bounds[0] - b.start] + [b.bounds[i] - b.bounds[i - 1] for i in range(1, STAGES)]
                    planner.profile.observe(seconds)
                    plan.observe_stages(seconds)
                    for x, y in zip(plan.read(now)["join"]["stage_shares"], planner.profile.shares):
                        assert math.isclose(x, y, rel_tol=1e-9)
        start_batches(now)
        if len(running) >= interpreters:
            offer(now)
    return counts


@pytest.mark.parametrize("benefit", [True, False])
@pytest.mark.parametrize("load", [0.5, 1.0, 1.8])
def test_the_plan_offers_as_the_join_planner_where_joins_pay(benefit: bool, load: float) -> None:
    """A per-batch overhead large next to the per-sample cost (LBCI's CPU models): joins pay."""
    counts = replay(3, 0.02, 0.002, benefit, 2, load)
    assert counts["asked"] > 50
    assert counts["offers"] > 5 and counts["joined"] > 0


@pytest.mark.parametrize("seed", range(4))
def test_the_plan_offers_as_the_join_planner_on_more_interpreters_and_curves(seed: int) -> None:
    a, c = ((0.01, 0.004), (0.03, 0.001), (0.002, 0.003), (0.05, 0.0005))[seed]
    counts = replay(10 + seed, a, c, seed % 2 == 0, 1 + seed, 1.2)
    assert counts["batches"] > 10


@pytest.mark.parametrize("benefit", [True, False])
def test_joins_are_planned_with_batches_as_long_as_the_slowdown_makes_them(benefit: bool) -> None:
    """Interpreters that contend (contention 1.15: batches 1.6 times the curve, cautiously)."""
    slow = replay(4, 0.02, 0.002, benefit, 2, 1.0, contention=1.15)
    assert slow["asked"] > 50 and slow["batches"] > 10 and slow["offers"] > 5


def test_under_the_benefit_rule_nothing_is_offered_where_no_join_can_pay() -> None:
    """a <= c: JoinPlanner.may_pay is false, the Plan's join is inactive and nothing is asked."""
    counts = replay(5, 0.002, 0.004, True, 2, 1.5)
    assert counts["asked"] == 0
    plan = _native.Plan(interpreters=1, latency_budget_s=0.1, max_queue_delay_s=0.0)
    plan.publish([0.002 + 0.004 * b for b in range(1, 33)], 16, 16, 16)
    plan.join_setup([0.5, 0.5], True, 0.1)
    plan.may_pay(False)
    assert plan.read(0.0)["join"]["active"] is False
    plan.may_pay(True)
    assert plan.read(0.0)["join"]["active"] is True


def test_join_setup_names_what_it_expects() -> None:
    plan = _native.Plan(interpreters=1, latency_budget_s=0.1, max_queue_delay_s=0.0)
    with pytest.raises(ValueError, match="stage shares"):
        plan.join_setup([], True, 0.1)
    with pytest.raises(ValueError, match="alpha"):
        plan.join_setup([1.0], True, 0.0)
    with pytest.raises(ValueError, match="differ in length"):
        plan.join(0.0, 1, 0.0, 1, 1.0, [1, 2], [1.0], 16, [], 1, None)
