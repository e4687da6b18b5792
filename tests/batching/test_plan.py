"""The adaptive policy in C (`_native.Plan`, what the pool batches the fronts' requests of an
adaptive model by) against `AdaptivePolicy`, the Python reference: driven through the same
traces in virtual time (Poisson arrivals at rising loads, batches that run long or fail,
requests with budgets and deadlines of their own), the two admit, refuse and batch alike at
every step, and keep the same rate, slowdown and Retry-After."""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass

import pytest

from aserve import _native
from aserve.batching.adaptive import AdaptivePolicy
from aserve.batching.costmodel import CostModel, ladder
from aserve.batching.native import PlanFeed, curve


@dataclass
class Req:
    """What a policy sees of a queued request (policy.Pending)."""

    arrival: float
    samples: int
    deadline: float | None
    budget: float | None
    waited: float


def close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-15)


def true_cost(form: str, b: int) -> float:
    """Seconds a batch of b takes on the simulated interpreter (what the cost model is fitted to)."""
    if form == "affine":
        return 0.004 + 0.0011 * b
    if form == "interp":
        return 0.002 + 0.0016 * b + 0.00002 * b * b
    return 0.003 + 0.02 / (1.0 + math.exp(-(b - 12) / 3.0))  # logistic: a knee


def replay(seed: int, form: str, load: float, interpreters: int, max_batch_size: int) -> dict[str, int]:
    """One trace through both policies; every answer compared. What happened, counted."""
    rng = random.Random(seed)
    points = [(b, true_cost(form, b) * rng.uniform(0.95, 1.05)) for b in ladder(max_batch_size)]
    policy = AdaptivePolicy(
        CostModel(points, max_batch_size=max_batch_size, form=form), latency_budget_s=0.05,
        interpreters=interpreters, max_queue_delay_s=0.004, overload_reserve=0.2, contention=1.15,
    )
    feed = PlanFeed(policy)  # shares the policy's cost model: republished after each batch
    plan = feed.plan
    # arrivals per second that keep every interpreter busy with the efficient batch, times load
    b = policy.cost.efficient_batch(policy.tolerance)
    rate = load * interpreters * b / true_cost(form, b) / 2.0  # requests hold 2 samples on average
    events: list[tuple[float, int, str, tuple[int, float, bool]]] = []
    seq = 0

    def at(t: float, kind: str, data: tuple[int, float, bool] = (0, 0.0, True)) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t, seq, kind, data))

    queue: list[Req] = []
    running = 0
    counts = {"admitted": 0, "refused": 0, "batches": 0, "waits": 0, "failed": 0, "ahead": 0}

    def decide(now: float) -> None:
        nonlocal running
        while queue:
            idle = interpreters - running
            py = policy.decide(now, queue, idle=idle, running=running, max_batch_size=max_batch_size)
            take, wake = plan.decide(now, queue, idle, running, max_batch_size)
            assert (take, wake is None) == (py.take, py.wake_at is None), (now, len(queue), py, take, wake)
            assert close(wake, py.wake_at)
            if not take:
                if wake is not None:
                    counts["waits"] += 1
                    at(wake, "wake")
                return
            batch, queue[:] = queue[:take], queue[take:]
            samples = sum(r.samples for r in batch)
            seconds = true_cost(form, samples) * rng.lognormvariate(0.0, 0.15) * (1.4 if running else 1.0)
            running += 1
            counts["batches"] += 1
            at(now + seconds, "done", (samples, seconds, rng.random() > 0.03))

    t = 0.0
    for _ in range(1500):
        t += rng.expovariate(rate)
        at(t, "arrive")
    while events:
        now, _, kind, (samples, seconds, ok) = heapq.heappop(events)
        if kind == "arrive":
            req = Req(now, rng.choice([1, 1, 2, 3, 3]), None if rng.random() < 0.8 else now + rng.uniform(0.01, 0.1),
                      None if rng.random() < 0.7 else rng.uniform(0.02, 0.2), rng.uniform(0.0, 0.002))
            queued = sum(r.samples for r in queue)
            if queue or running >= interpreters:
                if rng.random() < 0.2:  # asked from the head first: nothing may change
                    counts["ahead"] += 1
                    ahead = policy.admit(now, queued, 1, req.budget, req.waited, count=False)
                    assert close(plan.admit(now, queued, 1, req.budget, req.waited, count=False), ahead)
                    assert plan.admits_surely(now, queued, 1, req.budget, req.waited) == \
                        policy.admits_surely(now, queued, 1, req.budget, req.waited)
                wait = policy.admit(now, queued, req.samples, req.budget, req.waited)
                assert close(plan.admit(now, queued, req.samples, req.budget, req.waited), wait), now
                if wait is not None:
                    counts["refused"] += 1
                    assert close(plan.admission_rate(), policy.admission_rate())
                    continue
            else:
                policy.arrive(now, req.samples)
                plan.arrive(now, req.samples)
            counts["admitted"] += 1
            queue.append(req)
        elif kind == "done":
            running -= 1
            # the Plan reads the curve before the observation refines it, as observe does
            plan.finish(ok, samples, seconds)
            if ok:
                policy.observe(samples, seconds)
                feed.feed()
            else:
                counts["failed"] += 1
            state = plan.read(now)
            assert close(state["slowdown"], policy.slowdown)
            assert close(state["arrival_rate_samples_per_s"], policy.arrival_rate(now))
        decide(now)
    return counts


@pytest.mark.parametrize("form", ["affine", "interp", "logistic"])
@pytest.mark.parametrize("load", [0.3, 0.8, 1.6])
def test_the_plan_decides_and_admits_as_the_adaptive_policy(form: str, load: float) -> None:
    counts = replay(seed=hash((form, load)) % 1000, form=form, load=load, interpreters=2, max_batch_size=16)
    assert counts["batches"] > 100
    if load > 1.0:  # overloaded: admission refuses, and the batches grow
        assert counts["refused"] > 0 and counts["admitted"] > counts["batches"]


@pytest.mark.parametrize("seed", range(4))
def test_the_plan_follows_the_policy_on_more_interpreters_and_sizes(seed: int) -> None:
    rng = random.Random(seed)
    counts = replay(seed=seed, form=rng.choice(["affine", "interp", "logistic"]), load=rng.choice([0.5, 1.0, 2.0]),
                    interpreters=rng.choice([1, 3, 4]), max_batch_size=rng.choice([1, 4, 32]))
    assert counts["batches"] > 0


def test_a_plan_refuses_nothing_and_takes_one_request_until_its_curve_is_published() -> None:
    plan = _native.Plan(interpreters=2, latency_budget_s=0.01, max_queue_delay_s=0.002)
    assert plan.admit(1.0, 1000, 1) is None
    assert plan.decide(1.0, [Req(0.9, 2, None, None, 0.0)] * 3, 2, 0, 8) == (1, None)
    assert plan.admission_rate() is None
    plan.publish(*curve(CostModel([(1, 0.01), (8, 0.02)], max_batch_size=8), 0.05))
    assert plan.admit(1.1, 1000, 1) is not None  # a thousand samples ahead cannot make 10 ms


def test_publish_names_what_it_expects() -> None:
    plan = _native.Plan(interpreters=1, latency_budget_s=0.01, max_queue_delay_s=0.0)
    with pytest.raises(ValueError, match="prediction 2 is not a positive number"):
        plan.publish([0.01, 0.0], 1, 1, 1)
    with pytest.raises(ValueError, match="interpreters"):
        _native.Plan(interpreters=0, latency_budget_s=0.01, max_queue_delay_s=0.0)
