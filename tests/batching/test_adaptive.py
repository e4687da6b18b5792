"""AdaptivePolicy: exact decisions in hand-built scenarios. Its behaviour under load, through
the real Batcher in virtual time, is tested beside the simulator (benchmarks/tests/test_adaptive_sim.py),
with the curves and the policy built here."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from aserve.batching.adaptive import CAUTION, OVERLOAD_SUSTAINED_S, AdaptivePolicy
from aserve.batching.costmodel import CostModel, ladder
from aserve.batching.policy import Decision


def curve(overhead: float, per_sample: float) -> Callable[[int], float]:
    return lambda b: overhead + per_sample * b


def policy(cost: Callable[[int], float], *, max_batch_size: int = 32, budget: float = 0.1,
           interpreters: int = 2, delay: float = 0.02, alpha: float = 0.1) -> AdaptivePolicy:
    model = CostModel([(b, cost(b)) for b in ladder(max_batch_size)], max_batch_size=max_batch_size, alpha=alpha)
    return AdaptivePolicy(model, latency_budget_s=budget, interpreters=interpreters, max_queue_delay_s=delay)


class Req:
    """A queued request as the policy sees it."""

    def __init__(self, arrival: float, samples: int = 1, deadline: float | None = None,
                 budget: float | None = None, waited: float = 0.0) -> None:
        self.arrival = arrival
        self.samples = samples
        self.deadline = deadline
        self.budget = budget
        self.waited = waited


def queue(*arrivals: float, samples: int = 1, budget: float | None = None) -> list[Req]:
    return [Req(t, samples, None, budget) for t in arrivals]


OVERHEAD = curve(0.010, 0.0005)  # batching is nearly free
LINEAR = curve(0.001, 0.004)  # per-sample work dominates
BENT = curve(0.010, 0.002)
CNN = curve(0.0027, 0.0031)  # the bundled staged CNN, measured on this machine
CNN_BUSY = curve(0.0042, 0.0041)  # the same on a busier machine
UNIT = curve(1.0, 2.0)  # seconds: overhead below the per-sample cost
UNIT_FLAT = curve(4.0, 0.5)  # seconds: overhead above it


def capacity(cost: Callable[[int], float], max_batch_size: int, interpreters: int = 2) -> float:
    return interpreters * max(b / cost(b) for b in range(1, max_batch_size + 1))


# ---- exact decisions ----


def test_backlog_size_fits_the_budget_after_one_interpreters_turn() -> None:
    p = policy(CNN, budget=0.05)
    # (1 + 1/2) L(9) = 45.9 ms <= 50 < (1 + 1/2) L(10); the efficient size is 11
    assert (p.largest_batch(0.05, 32), p.cost.efficient_batch(0.05), p.backlog_batch(0.05, 32)) == (9, 11, 9)
    p = policy(BENT, budget=0.05)  # L(b) = 10 + 2b ms: L(11) = 32 <= 33.3; batching pays
    assert p.batching_pays() and p.backlog_batch(0.05, 32) == p.largest_batch(0.05, 32) == 11
    p = policy(LINEAR, budget=0.05)  # efficient size 5 caps where batching does not pay
    assert (p.largest_batch(0.05, 32), p.cost.efficient_batch(0.05), p.backlog_batch(0.05, 32)) == (8, 5, 5)
    assert policy(OVERHEAD).backlog_batch(0.1, 32) == 32  # never past max_batch_size
    assert policy(CNN, budget=0.001).backlog_batch(0.001, 32) == 11  # no batch fits: serve efficiently


def test_the_admission_rate_is_a_backlog_drained_in_backlog_batches() -> None:
    """What a refusal tells the server the model admits while overloaded: every interpreter
    running backlog-size batches (9 here, 45.9 / 1.5 ms each: see above), at the slowdown."""
    p = policy(CNN, budget=0.05)
    assert p.admission_rate() == pytest.approx(2 * 9 / CNN(9), rel=1e-3)
    p.observe(9, 2 * CNN(9))  # batches run twice as long as the curve says: half the rate
    assert p.admission_rate() < 2 * 9 / CNN(9) * 0.75


def test_batching_pays_follows_the_requests_size() -> None:
    p = policy(CNN_BUSY)  # 4.2 ms overhead, 4.1 ms a sample: two single samples batch well
    assert p.batching_pays()
    p.decide(1.0, queue(*[0.01 * i for i in range(30)], samples=6), idle=0, running=2, max_batch_size=32)
    assert not p.batching_pays()  # two requests of 6: L(12) > 1.5 L(6)


def test_waits_only_when_the_overhead_saved_pays_for_the_wait() -> None:
    def primed(delay: float = 0.02) -> AdaptivePolicy:
        p = policy(OVERHEAD, delay=delay)
        p.decide(0.048, queue(*[0.002 * i for i in range(25)]), idle=0, running=2, max_batch_size=32)
        return p  # has seen 500 requests/s: keep-up size 4 on OVERHEAD

    q = queue(0.050, 0.052)
    p = primed()
    assert p.keep_up_batch(0.052, 32) == 4
    # 2 more arrive by 0.056; the wait costs 2 requests 4 ms each <= L(2) + L(2) - L(4) = 10 ms
    assert p.decide(0.052, q, idle=1, running=1, max_batch_size=32) == Decision(0, 0.07)
    # the head's own budget brings its latest start forward: 0.05 + 0.02 - L(4) = 0.058
    tight = primed().decide(0.052, queue(0.050, 0.052, budget=0.02), idle=1, running=1, max_batch_size=32)
    assert tight.take == 0 and tight.wake_at == pytest.approx(0.058)
    # nothing running: no batch is on its way to fill; run at once (as one batch: at 500
    # requests/s, batches of 4 keep up, two alone would hold both interpreters)
    assert primed().decide(0.052, q, idle=2, running=0, max_batch_size=32) == Decision(2, None)
    # the window closes (0.055) before the batch fills (0.056)
    assert primed(delay=0.005).decide(0.052, q, idle=1, running=1, max_batch_size=32) == Decision(2, None)
    # per-sample work dominates (the CNN): never wait
    p = policy(CNN)
    p.decide(0.048, queue(*[0.002 * i for i in range(25)]), idle=0, running=2, max_batch_size=32)
    assert p.decide(0.052, q, idle=1, running=1, max_batch_size=32).take >= 1


def test_no_decision_without_a_free_slot_and_no_batching_model() -> None:
    p = policy(LINEAR)
    assert p.decide(0.0, queue(0.0), idle=0, running=2, max_batch_size=32) == Decision(0, None)
    assert p.decide(0.0, queue(0.0, 0.0), idle=1, running=0, max_batch_size=0) == Decision(1, None)


def test_arrival_rate_tracks_gaps_and_decays_in_silence() -> None:
    p = policy(LINEAR)
    q = queue(*[0.01 * i for i in range(50)])
    p.decide(0.49, q, idle=0, running=2, max_batch_size=32)
    assert p.arrival_rate(0.49) == pytest.approx(100.0)
    p.decide(0.49, q, idle=0, running=2, max_batch_size=32)  # the same queue again: nothing new
    assert p.arrival_rate(0.49) == pytest.approx(100.0)
    assert p.arrival_rate(1.49) == pytest.approx(1 / (0.01 + 0.05 * (1.0 - 0.01)))
    assert p.arrival_rate(100.0) < 1.0
    # refused arrivals count: 20 more, 5 ms apart, bring the gap estimate toward 5 ms
    for i in range(20):
        assert p.admit(0.5 + 0.005 * i, 10_000, 1, None) is not None
    p.decide(0.6, queue(0.6), idle=0, running=2, max_batch_size=32)
    assert p.arrival_rate(0.6) == pytest.approx(1 / (0.005 + 0.005 * 0.95 ** 20))


def test_the_slowdown_scales_every_prediction() -> None:
    p = policy(CNN, budget=0.05, alpha=0.0)
    assert p.slowdown == 1.0 and p.effective(4) == pytest.approx(CNN(4))
    p.observe(4, 1.5 * CNN(4))  # the first batch sets it
    assert p.slowdown == pytest.approx(1.5)
    for _ in range(30):
        p.observe(8, 1.5 * CNN(8))
    assert p.slowdown == pytest.approx(1.5) and p.effective(6) == pytest.approx(1.5 * CNN(6))
    assert p.backlog_batch(0.05, 32) == 6  # 1.5 x 1.5 x L(6) = 47.9 ms
    p.observe(8, 100.0)  # a stalled batch moves it a bounded step
    assert p.slowdown == pytest.approx(1.5 + 0.2 * (4.0 - 1.5))


def test_admission_judges_each_request_by_its_own_budget() -> None:
    p = policy(UNIT, budget=14.0, interpreters=1)
    assert p.decide(0.0, queue(0.0), idle=1, running=0, max_batch_size=32) == Decision(1, None)  # ends at 3
    # behind 3 queued samples a request ends at 3 + 2 L(2) = 13 at the earliest (batches of 2)
    assert p.predicted_finish(0.1, 3, 1) == pytest.approx(15.0)
    assert p.predicted_finish(0.1, 3, 1, within=13.0) == pytest.approx(13.0)
    assert p.admit(0.1, 3, 1, None) is None
    assert p.admit(0.1, 3, 1, 12.0) is not None  # its own, tighter budget
    assert p.admit(0.1, 3, 1, 20.0) is None
    # time it spent in the server before the batcher saw it counts against its budget
    assert p.admit(0.1, 3, 1, None, 0.5) is None  # ends at 13 <= 0.1 - 0.5 + 14
    assert p.admit(0.1, 3, 1, None, 1.5) is not None  # 13 > 0.1 - 1.5 + 14
    assert p.limit_of(Req(5.0, waited=1.5)) == pytest.approx(17.5)
    assert p.admit(0.1, 7, 1, None) == pytest.approx(3 + 2 * 7 + 7 - 14.1)  # batches of 3: ends at 24


def made() -> AdaptivePolicy:
    """A policy that has seen five arrivals, one interpreter busy: asked ahead or again below."""
    p = policy(UNIT, budget=14.0, interpreters=1)
    p.decide(0.0, queue(0.0), idle=1, running=0, max_batch_size=32)
    for i in range(5):
        p.admit(0.1 * (i + 1), i, 1, None)
    return p


def test_admission_asked_ahead_answers_alike_and_counts_nothing() -> None:
    """Asked ahead of a request (from its head, count=False), admission answers what it
    answers when asked with the request, and leaves the arrival rate and the keep-up size as
    they were; `arrive` counts what admit counts."""

    answers = []
    for queued, budget in ((3, None), (3, 12.0), (7, None), (3, 20.0), (40, 20.0)):
        p, before = made(), made().as_dict(1.0)
        ahead = p.admit(1.0, queued, 1, budget, count=False)
        assert p.as_dict(1.0) == before and p.keep_up_batch(1.0, 32) == made().keep_up_batch(1.0, 32)
        assert p.admit(1.0, queued, 1, budget) == ahead  # asked with the request: the same answer
        assert p.as_dict(1.0) != before  # and now the arrival counts
        counted = made()
        counted.arrive(1.0, 1)
        assert counted.as_dict(1.0) == p.as_dict(1.0)
        answers.append(ahead is None)
    assert answers == [True, True, False, True, False]  # admitted and refused alike


def test_refuses_answers_as_admit_and_counts_only_a_refusal() -> None:
    """`refuses` (a request refused before, sent again) answers what `admit` answers; where
    that is a refusal, it counts the arrival as `admit` does; where it admits, nothing is
    counted (the request is then asked about in full)."""

    answers = []
    for queued, budget in ((3, None), (3, 12.0), (7, None), (3, 20.0), (40, 20.0)):
        p, asked = made(), made()
        before = p.as_dict(1.0)
        wait = p.refuses(1.0, queued, 1, budget)
        assert wait == asked.admit(1.0, queued, 1, budget)
        if wait is None:
            assert p.as_dict(1.0) == before and p.keep_up_batch(1.0, 32) == made().keep_up_batch(1.0, 32)
        else:
            assert p.as_dict(1.0) == asked.as_dict(1.0) != before
        answers.append(wait is None)
    assert answers == [True, True, False, True, False]  # admitted and refused alike


@pytest.mark.parametrize("cost", [OVERHEAD, LINEAR, BENT, CNN, UNIT, UNIT_FLAT],
                         ids=["overhead", "linear", "bent", "cnn", "unit", "unit-flat"])
def test_a_sure_admission_is_one_the_full_prediction_makes(cost: Callable[[int], float]) -> None:
    """`admits_surely` (the bound `admit` asks first from a request's head) never says yes
    where the full prediction (`admit` with the request) would refuse, in states built by a
    random run of arrivals, decisions and completions; and it does say yes where the budget
    is loose."""
    import copy
    import random

    rng = random.Random(5)
    scale = cost(1)
    sure = agreed = 0
    for reserve in (0.0, 0.3):
        model = CostModel([(b, cost(b)) for b in ladder(32)], max_batch_size=32)
        p = AdaptivePolicy(model, latency_budget_s=10 * scale, interpreters=rng.choice([1, 2, 4]),
                           max_queue_delay_s=scale / 5, overload_reserve=reserve)
        now, waiting = 0.0, []
        for _ in range(400):
            now += rng.expovariate(1.0) * scale / 4
            samples = rng.choice([1, 1, 2, 5])
            waiting.append(Req(now, samples))
            p.admit(now, sum(r.samples for r in waiting), samples, None)
            if rng.random() < 0.7:
                decision = p.decide(now, waiting, idle=1, running=rng.randint(0, 2), max_batch_size=32)
                del waiting[:decision.take]
            if rng.random() < 0.3:
                p.observe(rng.randint(1, 8), cost(rng.randint(1, 8)) * rng.uniform(0.7, 1.6))
            for budget in (None, *(k * scale for k in (0.5, 1, 1.5, 2, 3, 4, 6, 8, 12, 16, 24, 32, 100))):
                queued = sum(r.samples for r in waiting) + rng.randint(0, 8)
                waited = rng.uniform(0, scale)
                if p.admits_surely(now, queued, samples, budget, waited):
                    sure += 1
                    assert p.admit(now, queued, samples, budget, waited, count=False) is None
                    agreed += copy.deepcopy(p).admit(now, queued, samples, budget, waited) is None
    assert agreed == sure and sure > 100


def test_overload_reserve_applies_only_while_arrivals_outpace_every_size() -> None:
    def make(reserve: float) -> AdaptivePolicy:
        model = CostModel([(b, UNIT(b)) for b in ladder(32)], max_batch_size=32)
        return AdaptivePolicy(model, latency_budget_s=14.0, interpreters=1, max_queue_delay_s=0.02,
                              overload_reserve=reserve)

    plain, reserved = make(0.0), make(0.2)
    for p in (plain, reserved):  # one arrival: keeping up takes batches of 1, no overload
        assert p.decide(0.0, queue(0.0), idle=1, running=0, max_batch_size=32) == Decision(1, None)
    assert reserved.predicted_finish(0.1, 3, 1, within=14.1) == pytest.approx(13.0)
    assert reserved.admit(0.1, 3, 1, None) is None  # ends at 13 of 14: no reserve below overload
    # 50 arrivals a millisecond apart: no batch size serves 1000 a second on this curve
    burst = queue(*[0.1 + 0.001 * i for i in range(50)])
    for p in (plain, reserved):  # the first batch ended: the next is planned for the burst
        p.observe(1, 3.0)
        p.decide(0.15, burst, idle=1, running=0, max_batch_size=32)
        assert p.keep_up_batch(0.15, 32) is None
    # requests with a budget of 11: the next batch ends at 10.15, within the budget and past 0.8 x 11
    assert plain.predicted_finish(0.15, 1, 1, within=0.15 + 11.0) == pytest.approx(10.15)
    assert reserved.admit(0.15, 1, 1, 11.0) is None  # outpaced only just now: a burst, no reserve yet
    now = 0.15 + OVERLOAD_SUSTAINED_S  # still outpaced (the same decision stands): the reserve applies
    full, kept = now + 11.0, now + 0.8 * 11.0
    for q in range(12):
        in_budget = plain.predicted_finish(now, q, 1, within=full) <= full
        in_reserve = reserved.predicted_finish(now, q, 1, within=kept) <= kept
        assert (plain.admit(now, q, 1, 11.0) is None) == in_budget
        assert (reserved.admit(now, q, 1, 11.0) is None) == in_reserve
    assert plain.admit(now, 1, 1, 11.0) is None
    wait = reserved.admit(now, 1, 1, 11.0)
    assert wait is not None and wait >= 10.15 - kept


def test_a_burst_before_any_batch_is_admitted_on_the_contention_measured_at_warm_up() -> None:
    """Before any batch has been timed, admission plans with the warm-up's contention (every
    interpreter busy), not with the curve of one batch run alone; the first batch timed
    replaces it."""
    model = CostModel([(b, UNIT(b)) for b in ladder(32)], max_batch_size=32, alpha=0.0)
    alone = AdaptivePolicy(model, latency_budget_s=14.0, interpreters=1, max_queue_delay_s=0.02)
    busy = AdaptivePolicy(model, latency_budget_s=14.0, interpreters=1, max_queue_delay_s=0.02, contention=1.5)
    assert busy.slowdown == busy.contention == 1.5 and busy.as_dict(0.0)["contention"] == 1.5
    # how far a batch alone is from one with every interpreter busy is the spread it plans with
    assert busy.as_dict(0.0)["slowdown_cautious"] == pytest.approx(1.5 + CAUTION * 0.5)
    assert alone.as_dict(0.0)["slowdown_cautious"] == 1.0
    for p in (alone, busy):  # a burst: the first request runs at once (ends at 3 on the curve, 4.5 at 1.5x it)
        assert p.decide(0.0, queue(0.0), idle=1, running=0, max_batch_size=32) == Decision(1, None)
    # behind 3 queued samples: batches of 2 end at 3 + 2 L(2) = 13 on the curve, 19.5 at 1.5x it
    assert alone.predicted_finish(0.1, 3, 1, within=13.0) == pytest.approx(13.0)
    assert busy.predicted_finish(0.1, 3, 1, within=14.1) > 14.1
    assert alone.admit(0.1, 3, 1, None) is None
    assert busy.admit(0.1, 3, 1, None) is not None  # refused: the burst would end past its budget
    busy.observe(2, 5.0)  # a batch ran as the curve says: the measured slowdown is 1
    assert busy.slowdown == pytest.approx(1.0)
    with pytest.raises(ValueError, match="contention"):
        AdaptivePolicy(model, latency_budget_s=14.0, interpreters=1, max_queue_delay_s=0.0, contention=0.2)


def test_invalid_settings_are_refused() -> None:
    model = CostModel([(1, 0.01)], max_batch_size=1)
    for bad in ({"latency_budget_s": 0.0}, {"interpreters": 0}, {"max_queue_delay_s": -1.0}, {"headroom": 0.5},
                {"rate_alpha": 0.0}, {"admit_factor": 0.0}, {"overload_reserve": 1.0}, {"overload_reserve": -0.1},
                {"tolerance": 1.0}, {"slowdown_alpha": 1.5}):
        options: dict[str, float] = {"latency_budget_s": 0.05, "interpreters": 1, "max_queue_delay_s": 0.0}
        options.update(bad)
        with pytest.raises(ValueError):
            AdaptivePolicy(model, **options)  # type: ignore[arg-type]


def test_as_dict_reports_the_plan() -> None:
    p = policy(CNN, budget=0.05)
    state = p.as_dict(0.0)
    assert state["policy"] == "adaptive" and state["backlog_batch"] == 9 and state["slowdown"] == 1.0
    assert state["drain_rate_samples_per_s"] == pytest.approx(2 * 9 / CNN(9))
    assert state["batching_pays"] is False and state["largest_batch"] == 9


def test_backlog_size_follows_whether_batching_pays_for_the_requests_seen() -> None:
    # 10 ms + 3 ms per sample: a second single-sample request costs less than a first
    # (batching pays, the backlog batch is the largest within the budget, 32), a second
    # request of 5 samples does not (the backlog batch stops at the efficient size, 21)
    p = policy(lambda b: 0.010 + 0.003 * b, budget=0.2)
    assert p.batching_pays() and p.backlog_batch(0.2, 32) == 32
    t = 0.0
    for _ in range(200):  # requests of 5 samples arrive
        t += 0.05
        p.admit(t, 0, 5)
    assert not p.batching_pays() and p.backlog_batch(0.2, 32) == 21
