"""The micro-batcher: window policy rules, errors, limits."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest

from aserve.batching import Batcher, Decision, WindowPolicy
from aserve.engine import ModelSpec, Pool
from aserve.errors import ModelError, Overloaded, RequestTimeout
from aserve.tensor import Tensor


@dataclass
class P:
    arrival: float
    samples: int
    deadline: float | None = None


# ---- policy ----

def test_window_lone_request_goes_at_once() -> None:
    w = WindowPolicy(max_queue_delay=0.010)
    assert w.decide(5.0, [P(5.0, 1)], idle=2, running=0, max_batch_size=8) == Decision(1, None)


def test_window_waits_while_a_batch_runs_then_closes() -> None:
    w = WindowPolicy(max_queue_delay=0.010)
    q = [P(5.0, 1), P(5.001, 2)]
    assert w.decide(5.002, q, idle=1, running=1, max_batch_size=8) == Decision(0, 5.010)
    assert w.decide(5.010, q, idle=1, running=1, max_batch_size=8) == Decision(2, None)


def test_window_full_batch_and_no_slot() -> None:
    w = WindowPolicy(max_queue_delay=0.010)
    q = [P(5.0, 4), P(5.0, 4), P(5.0, 4)]
    assert w.decide(5.0, q, idle=1, running=1, max_batch_size=8) == Decision(2, None)
    assert w.decide(5.0, q, idle=0, running=2, max_batch_size=8) == Decision(0, None)
    assert w.decide(5.0, q, idle=1, running=1, max_batch_size=0) == Decision(1, None)


def test_window_decides_the_same_told_the_queues_samples_as_walking_it() -> None:
    """The batcher tells the policy its queue's samples (it counts them as they come and go):
    the decision is the one a walk of the queue makes, for queues that fit one batch and
    queues that do not."""
    rng = np.random.default_rng(7)
    w = WindowPolicy(max_queue_delay=0.010)
    for _ in range(500):
        q = [P(5.0 + 0.001 * i, int(rng.integers(1, 9))) for i in range(int(rng.integers(1, 12)))]
        now, running, idle = 5.0 + float(rng.random()) * 0.02, int(rng.integers(0, 2)), int(rng.integers(0, 2))
        for limit in (0, 8, 32):
            walked = w.decide(now, q, idle=idle, running=running, max_batch_size=limit)
            told = w.decide(now, q, idle=idle, running=running, max_batch_size=limit,
                            queued=sum(p.samples for p in q))
            assert told == walked, (q, limit)


def test_window_deadline_inside_window_dispatches() -> None:
    w = WindowPolicy(max_queue_delay=0.010)
    assert w.decide(5.0, [P(5.0, 1, 5.005)], idle=1, running=1, max_batch_size=8) == Decision(1, None)


# ---- a batcher over a real pool (engine "main") ----

SOURCE = '''
import threading
from aserve.runtime import Model, TensorSpec

GATE = threading.Event()

class Echo(Model):
    """OUT = IN * 2 (INT32); a negative element raises; 777 blocks until 778 arrives."""
    inputs = [TensorSpec("IN", "INT32", (-1, 4))]
    outputs = [TensorSpec("OUT", "INT32", (-1, 4)), TensorSpec("ROWS", "INT32", (-1, 1))]

    def __call__(self, inputs):
        x = inputs["IN"].cast("B").cast("i")
        if any(v < 0 for v in x):
            raise ValueError("negative input")
        if 778 in x:
            GATE.set()
        if 777 in x:
            GATE.wait(10)
        rows = len(x) // 4
        doubled = [v * 2 for v in x]
        return {"OUT": [doubled[i * 4:(i + 1) * 4] for i in range(rows)], "ROWS": [[rows]] * rows}
'''

@pytest.fixture
async def echo_pool(model_dir):
    d = model_dir(SOURCE)
    pool = Pool(engine="main", interpreters=2)
    await pool.start()
    await pool.load(ModelSpec(name="echo", path=str(d)))
    try:
        yield pool
    finally:
        await pool.close()


def _req(rows: int, start: int) -> list[Tensor]:
    arr = np.arange(start, start + rows * 4, dtype=np.int32).reshape(rows, 4)
    return [Tensor("INT32", (rows, 4), arr.tobytes())]


def _out(result: dict[str, Tensor]) -> np.ndarray:
    t = result["OUT"]
    return np.frombuffer(t.data, np.int32).reshape(t.shape)


async def _unblock(pool: Pool) -> None:
    """Release the request blocked on 777 by running 778 in the pool's other interpreter."""
    await pool.infer("echo", {"IN": _marker(778)[0]})


def _marker(value: int) -> list[Tensor]:
    return [Tensor("INT32", (1, 4), np.array([value, 0, 0, 0], np.int32).tobytes())]


class CountingPolicy(WindowPolicy):
    def __init__(self) -> None:
        super().__init__(max_queue_delay=0.05)
        self.observed: list[int] = []

    def observe(self, samples: int, seconds: float) -> None:
        self.observed.append(samples)


async def test_batches_form_under_load_and_results_do_not_cross(echo_pool: Pool) -> None:
    policy = CountingPolicy()
    b = Batcher(model="echo", run=echo_pool.run, policy=policy, max_batch_size=16, interpreters=1,
                max_queue_size=1000)
    sizes = [1 + i % 3 for i in range(60)]
    starts = [i * 1000 for i in range(60)]
    results = await asyncio.gather(*(b.submit(_req(n, s), n, deadline=None) for n, s in zip(sizes, starts)))
    for n, s, r in zip(sizes, starts, results):
        expect = np.arange(s, s + n * 4, dtype=np.int32).reshape(n, 4) * 2
        np.testing.assert_array_equal(_out(r), expect)
        assert r["ROWS"].shape == (n, 1)
    assert sum(policy.observed) == sum(sizes)
    assert b.batches < len(sizes)  # some requests shared a batch
    assert max(policy.observed) <= 16


async def test_model_error_fails_only_the_culprit(echo_pool: Pool) -> None:
    b = Batcher(model="echo", run=echo_pool.run, policy=WindowPolicy(max_queue_delay=0.05),
                max_batch_size=16, interpreters=1, max_queue_size=1000)
    blocker = b.submit(_marker(777), 1, deadline=None)  # holds the only slot
    assert b.running == 1  # dispatched at once: nothing else runs
    good1 = b.submit(_req(1, 10), 1, deadline=None)
    bad = b.submit([Tensor("INT32", (1, 4), np.full(4, -1, np.int32).tobytes())], 1, deadline=None)
    good2 = b.submit(_req(2, 20), 2, deadline=None)
    assert b.running == 1 and not blocker.done(), (b.running, blocker)
    assert b.queued == 4  # the three wait behind the blocker, to go as one batch
    await _unblock(echo_pool)
    await blocker
    np.testing.assert_array_equal(_out(await good1), np.arange(10, 14).reshape(1, 4) * 2)
    np.testing.assert_array_equal(_out(await good2), np.arange(20, 28).reshape(2, 4) * 2)
    with pytest.raises(ModelError, match="negative input"):
        await bad


async def test_limits_timeout_and_overload(echo_pool: Pool) -> None:
    loop = asyncio.get_running_loop()
    b = Batcher(model="echo", run=echo_pool.run, policy=WindowPolicy(max_queue_delay=0.001),
                max_batch_size=4, interpreters=1, max_queue_size=3)
    blocker = b.submit(_marker(777), 1, deadline=None)
    assert b.running == 1
    late = b.submit(_req(2, 0), 2, deadline=loop.time() + 0.05)
    with pytest.raises(Overloaded):
        await b.submit(_req(2, 0), 2, deadline=None)  # 2 + 2 > max_queue_size 3
    with pytest.raises(RequestTimeout, match="in the queue"):
        await late
    assert b.queued == 0
    await _unblock(echo_pool)
    await blocker
    r = await b.submit(_req(1, 5), 1, deadline=loop.time() + 5)  # still serving
    np.testing.assert_array_equal(_out(r), np.arange(5, 9).reshape(1, 4) * 2)
    await b.close(timeout=1)


async def _fail_held(b: Batcher, held: list[Callable[[dict[str, Tensor] | None, BaseException | None], None]],
                     *futures: asyncio.Future[dict[str, Tensor]]) -> None:
    """End the batches the test's runner holds, failing each request, and close the batcher."""
    for done, future in zip(held, futures):
        done(None, ModelError("stop"))
        with pytest.raises(ModelError):
            await future
    await b.close(timeout=1)


async def test_refusing_ahead_asks_the_rule_submit_applies() -> None:
    """From a request's head the batcher refuses only what `submit` would refuse of any
    request: the queue-full rule for one sample, the policy's admission with the budget
    given (the loosest the request may carry), asked so that the policy counts nothing; a
    refusal counts once, the policy's arrival included."""

    class Admitting(WindowPolicy):
        """Admission control that refuses unless the budget is at least a second."""

        def __init__(self) -> None:
            super().__init__(max_queue_delay=0.001)
            self.asked: list[tuple[int, int, float | None, bool]] = []
            self.arrived: list[int] = []

        def admit(self, now: float, queued_samples: int, samples: int, budget: float | None, waited: float, *,
                  count: bool = True) -> float | None:
            self.asked.append((queued_samples, samples, budget, count))
            return None if budget is not None and budget >= 1.0 else 0.5

        def arrive(self, now: float, samples: int) -> None:
            self.arrived.append(samples)

    held: list[Callable[[dict[str, Tensor] | None, BaseException | None], None]] = []
    policy = Admitting()
    b = Batcher(model="m", run=lambda model, inputs, done: held.append(done), policy=policy, max_batch_size=4,
                interpreters=1, max_queue_size=3)
    b.refuse_ahead()  # an interpreter is free: nothing to ask
    assert policy.asked == []
    running = b.submit(_req(1, 0), 1, budget=2.0)
    assert b.running == 1 and policy.asked == []
    b.refuse_ahead(budget=2.0, waited=0.1)  # every interpreter busy: asked, counting nothing
    assert policy.asked == [(0, 1, 2.0, False)] and policy.arrived == [] and b.refused == 0
    with pytest.raises(Overloaded, match="latency budget") as refused:
        b.refuse_ahead()  # the policy's own budget
    assert refused.value.retry_after == 0.5 and b.refused == 1 and policy.arrived == [1]
    queued = b.submit(_req(3, 0), 3, budget=2.0)  # asked with the request, counted by admit itself
    assert policy.asked[-1] == (0, 3, 2.0, True) and b.queued == 3
    with pytest.raises(Overloaded, match="max_queue_size 3"):
        b.refuse_ahead(budget=2.0)  # admitted by the policy, but one more sample is over the queue's size
    assert b.refused == 2 and policy.arrived == [1, 1]
    await _fail_held(b, held, running, queued)


@pytest.mark.parametrize("refuses", [True, False], ids=["policy-refuses", "policy-admit-only"])
async def test_refusing_again_answers_as_submit_and_counts_only_a_refusal(refuses: bool) -> None:
    """A request refused before, sent again (`refuse_again`), meets `submit`'s admission with
    its own samples and budget: refused, it counts as `submit` counts a refusal (the policy's
    arrival included); admitted, nothing is counted and nothing queued (its caller submits it).
    A policy with `refuses` is asked that; one with `admit` alone, ahead, then told the arrival."""

    class Admitting(WindowPolicy):
        """Admission control that refuses unless the budget is at least a second."""

        def __init__(self) -> None:
            super().__init__(max_queue_delay=0.001)
            self.asked: list[tuple[str, int, int, float | None]] = []
            self.arrived: list[int] = []

        def admit(self, now: float, queued_samples: int, samples: int, budget: float | None, waited: float, *,
                  count: bool = True) -> float | None:
            self.asked.append(("admit" if count else "ahead", queued_samples, samples, budget))
            if count:
                self.arrived.append(samples)
            return None if budget is not None and budget >= 1.0 else 0.5

        def arrive(self, now: float, samples: int) -> None:
            self.arrived.append(samples)

    class Refusing(Admitting):
        def admission_rate(self) -> float:
            return 7.0  # requests/s it admits while overloaded: carried by its refusals

        def refuses(self, now: float, queued_samples: int, samples: int, budget: float | None,
                    waited: float) -> float | None:
            self.asked.append(("refuses", queued_samples, samples, budget))
            wait = None if budget is not None and budget >= 1.0 else 0.5
            if wait is not None:
                self.arrived.append(samples)
            return wait

    held: list[Callable[[dict[str, Tensor] | None, BaseException | None], None]] = []
    policy = Refusing() if refuses else Admitting()
    b = Batcher(model="m", run=lambda model, inputs, done: held.append(done), policy=policy, max_batch_size=4,
                interpreters=1, max_queue_size=3)
    assert b.refuse_again(2) is None and policy.asked == []  # an interpreter is free: nothing to ask
    running = b.submit(_req(1, 0), 1, budget=2.0)
    policy.arrived.clear()
    asked = "refuses" if refuses else "ahead"
    assert b.refuse_again(2, budget=2.0, waited=0.1) is None  # admitted: nothing counted, nothing queued
    assert policy.asked == [(asked, 0, 2, 2.0)] and policy.arrived == [] and b.refused == 0 and b.queued == 0
    refused = b.refuse_again(2)  # the policy's own budget: refused, its arrival counted once
    assert isinstance(refused, Overloaded) and refused.retry_after == 0.5 and "latency budget" in str(refused)
    assert refused.rate == (7.0 if refuses else None)
    assert policy.asked[-1] == (asked, 0, 2, None) and policy.arrived == [2] and b.refused == 1
    queued = b.submit(_req(3, 0), 3, budget=2.0)
    refused = b.refuse_again(1, budget=2.0)  # admitted by the policy, one sample over the queue's size
    assert isinstance(refused, Overloaded) and "max_queue_size 3" in str(refused) and b.refused == 2
    assert policy.arrived == [2, 3, 1]  # the policy admitted it, and was asked: the arrival counts, as in submit
    await _fail_held(b, held, running, queued)


async def test_a_request_that_waited_out_a_hold_is_asked_about_even_with_an_idle_interpreter() -> None:
    """A request that would run at once is admitted unasked, however long it took to read
    (a budget tighter than the loop's own time is still served by an idle server), unless it
    waited out a hold of its connection unread: then admission judges it, from when it was
    sent."""

    class Refusing(WindowPolicy):
        latency_budget_s = 0.05  # the policy's own budget

        def __init__(self) -> None:
            super().__init__(max_queue_delay=0.001)
            self.asked: list[tuple[float | None, float]] = []

        def admit(self, now: float, queued_samples: int, samples: int, budget: float | None, waited: float, *,
                  count: bool = True) -> float | None:
            self.asked.append((budget, waited))
            return 0.02

        def arrive(self, now: float, samples: int) -> None:
            pass

    held: list[Callable[[dict[str, Tensor] | None, BaseException | None], None]] = []
    policy = Refusing()
    b = Batcher(model="m", run=lambda model, inputs, done: held.append(done), policy=policy, max_batch_size=4,
                interpreters=2, max_queue_size=8)
    fresh = b.submit(_req(1, 0), 1, waited=0.06)  # past the policy's 50 ms on the loop: not asked
    assert policy.asked == [] and b.running == 1
    with pytest.raises(Overloaded, match="1 of 2 interpreters busy, after a hold of its connection") as refused:
        b.submit(_req(1, 0), 1, waited=0.03, held=True)  # an interpreter is free, but it was held
    assert policy.asked == [(None, 0.03)] and refused.value.budget == 0.05 and b.refused == 1
    own = b.submit(_req(1, 0), 1, budget=0.0005, waited=0.001)  # a budget tighter than its read: served
    assert len(policy.asked) == 1 and b.refused == 1
    for done in held:
        done(None, ModelError("stop"))
    for future in (fresh, own):
        with pytest.raises(ModelError):
            await future
    await b.close(timeout=1)


async def test_a_sub_millisecond_window_rearms_without_asking_the_timer(echo_pool: Pool) -> None:
    """A window shorter than a millisecond: uvloop hands back plain handles for such timers
    (no `when()`); the batcher keeps the time it armed for and must never ask the handle."""
    b = Batcher(model="echo", run=echo_pool.run, policy=WindowPolicy(max_queue_delay=0.0003),
                max_batch_size=16, interpreters=2, max_queue_size=1000)
    blocker = b.submit(_marker(777), 1, deadline=None)  # one batch runs: the next requests wait for the window
    waiting = [b.submit(_req(1, 100 * i), 1, deadline=None) for i in range(1, 6)]  # arrivals re-decide each time
    for i, fut in enumerate(waiting, start=1):
        np.testing.assert_array_equal(_out(await fut), np.arange(100 * i, 100 * i + 4).reshape(1, 4) * 2)
    assert b.batches < 1 + len(waiting)  # the window gathered some of them into one batch
    await _unblock(echo_pool)
    await blocker
    await b.close(timeout=1)
