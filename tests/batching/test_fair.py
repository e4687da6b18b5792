"""FairScheduler: round-robin slots across models, turns passed, subsets, and real Batchers sharing a pool."""

from __future__ import annotations

import array
import asyncio
import time
from collections.abc import Callable, Sequence

import pytest

from aserve.batching import Batcher, FairScheduler, WindowPolicy
from aserve.batching.fair import Seat
from aserve.tensor import Tensor

# ---- the scheduler alone, with contenders that start a "batch" per offer ----


class Model:
    """A contender with `work` batches to run, its own limit, and a policy that may pass."""

    def __init__(self, scheduler: FairScheduler, name: str, log: list[str], *, interpreters: int,
                 work: int = 0, limit: int | None = None) -> None:
        self.seat: Seat = scheduler.join(self, interpreters=interpreters)
        self.name = name
        self.log = log
        self.work = work
        self.limit = interpreters if limit is None else limit
        self.accept = True

    def offer_slot(self) -> bool:
        if not self.work or not self.accept or self.seat.running >= self.limit or self.seat.room() <= 0:
            return False
        self.start()
        return True

    def start(self) -> None:
        self.work -= 1
        self.seat.take()
        self.log.append(self.name)

    def arrive(self, batches: int = 1) -> None:
        """New work: start at once while a slot is free (as a batcher does on an arrival)."""
        self.work += batches
        while self.work and self.accept and self.seat.running < self.limit and self.seat.room() > 0:
            self.start()


def test_slots_go_round_robin_one_batch_per_turn() -> None:
    s = FairScheduler(1)
    log: list[str] = []
    x, y, z = (Model(s, n, log, interpreters=1) for n in "xyz")
    x.arrive(3)
    y.arrive(3)
    z.arrive(3)
    assert log == ["x"] and s.free == 0
    holder = {"x": x, "y": y, "z": z}
    for _ in range(8):
        holder[log[-1]].seat.release()
    assert log == ["x", "y", "z"] * 3
    holder[log[-1]].seat.release()
    assert s.free == 1 and s.stats() == {"slots": 1, "in_flight": 0}


def test_rotation_starts_after_the_last_taker_not_the_releaser() -> None:
    s = FairScheduler(2)
    log: list[str] = []
    x, y, z = (Model(s, n, log, interpreters=2) for n in "xyz")
    x.arrive()
    y.arrive()
    z.arrive(2)
    x.arrive(2)
    assert log == ["x", "y"]
    x.seat.release()  # the last slot went to y: z is next, then x
    assert log == ["x", "y", "z"]
    y.seat.release()
    assert log == ["x", "y", "z", "x"]
    z.seat.release()
    assert log[-1] == "z"
    z.seat.release()
    assert log[-1] == "x"


def test_a_model_that_waits_passes_its_turn_and_takes_a_free_slot_later() -> None:
    s = FairScheduler(1)
    log: list[str] = []
    x, y, z = (Model(s, n, log, interpreters=1) for n in "xyz")
    x.arrive()
    y.arrive()
    z.arrive()
    y.accept = False  # its policy waits (for a fuller batch)
    x.seat.release()
    assert log == ["x", "z"]  # y passed
    z.seat.release()
    assert log == ["x", "z"] and s.free == 1  # nobody else wants it: the slot stays free
    y.accept = True
    y.arrive(0)  # its timer: it takes the free slot at once
    assert log == ["x", "z", "y"] and s.free == 0


def test_a_model_at_its_own_limit_leaves_slots_to_others() -> None:
    s = FairScheduler(3)
    log: list[str] = []
    x = Model(s, "x", log, interpreters=3, limit=1)
    y = Model(s, "y", log, interpreters=3)
    x.arrive(5)
    assert log == ["x"] and s.free == 2  # more work, but its own limit is 1
    y.arrive(3)
    assert log == ["x", "y", "y"] and s.free == 0
    y.seat.release()  # x is at its limit: y again
    assert log[-1] == "y"
    x.seat.release()  # the slot goes to x, the only one with work and room
    assert log[-1] == "x" and s.free == 0
    assert x.seat.running == 1


def test_models_on_a_subset_hold_no_more_slots_than_their_interpreters() -> None:
    s = FairScheduler(2)
    log: list[str] = []
    a = Model(s, "a", log, interpreters=1)  # both on interpreter 0
    b = Model(s, "b", log, interpreters=1)
    f = Model(s, "f", log, interpreters=2)
    a.arrive(2)
    b.arrive(2)
    assert log == ["a"] and s.free == 1
    assert b.seat.room() == 0 and f.seat.room() == 1  # only f can use the other interpreter
    f.arrive()
    assert log == ["a", "f"]
    a.seat.release()  # b is after a in the rotation
    assert log == ["a", "f", "b"]
    f.seat.release()  # nobody can use it: a and b wait for interpreter 0
    assert s.free == 1 and log == ["a", "f", "b"]
    b.seat.release()
    assert log == ["a", "f", "b", "a"]


def test_room_for_nested_subsets() -> None:
    s = FairScheduler(3)
    log: list[str] = []
    one = Model(s, "one", log, interpreters=1)
    two = Model(s, "two", log, interpreters=2)
    three = Model(s, "three", log, interpreters=3)
    one.arrive()
    assert (one.seat.room(), two.seat.room(), three.seat.room()) == (0, 1, 2)
    two.arrive()
    assert (one.seat.room(), two.seat.room(), three.seat.room()) == (0, 0, 1)
    three.arrive(2)
    assert log == ["one", "two", "three"] and s.free == 0
    one.seat.release()
    assert three.seat.room() == 0  # three took the slot again
    assert log[-1] == "three"


def test_a_model_leaving_with_a_slot_held_still_releases_it() -> None:
    s = FairScheduler(1)
    log: list[str] = []
    x = Model(s, "x", log, interpreters=1)
    y = Model(s, "y", log, interpreters=1)
    x.arrive(2)
    y.arrive()
    x.seat.leave()
    x.seat.release()
    assert log == ["x", "y"]
    y.seat.release()
    assert s.free == 1  # x left the rotation: its remaining work is not offered


def test_a_release_during_an_offer_keeps_the_rotation_going() -> None:
    """A batch may end inside the offer that started it (a task that fails at once)."""
    s = FairScheduler(1)
    log: list[str] = []

    class FailsAtOnce(Model):
        def start(self) -> None:
            super().start()
            self.seat.release()

    x = Model(s, "x", log, interpreters=1)
    f = FailsAtOnce(s, "f", log, interpreters=1)
    y = Model(s, "y", log, interpreters=1)
    x.arrive()
    f.arrive(0)
    f.work = 1
    y.arrive()
    x.seat.release()
    assert log == ["x", "f", "y"] and s.free == 0


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="slots"):
        FairScheduler(0)
    with pytest.raises(ValueError, match="interpreters"):
        Model(FairScheduler(2), "x", [], interpreters=0)


# ---- real Batchers with a runner whose batches the test completes by hand ----


class HandRunner:
    """Pool.run's contract: a batch runs until the test completes it; outputs echo the input.

    A Batcher dispatches within `submit` and within the `done` callback of the batch that
    frees a slot, so the state after either call is the state to check: no loop turn
    is waited for. `started_batch(model)` resolves when `model`'s next batch starts (a
    batch a timer dispatches)."""

    def __init__(self) -> None:
        self.started: list[tuple[str, list[int]]] = []  # (model, values) in start order
        self._running: list[tuple[str, list[int], Callable[..., None]]] = []
        self._waiting: dict[str, asyncio.Future[None]] = {}

    def __call__(self, model: str, inputs: Sequence[Tensor], done: Callable[..., None], /) -> None:
        values = array.array("i", bytes(inputs[0].view())).tolist()
        self.started.append((model, values))
        self._running.append((model, values, done))
        waiter = self._waiting.pop(model, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    @property
    def running(self) -> list[str]:
        return [m for m, _, _ in self._running]

    def started_batch(self, model: str) -> asyncio.Future[None]:
        waiter = self._waiting[model] = asyncio.get_running_loop().create_future()
        return waiter

    def finish(self, model: str) -> None:
        """Complete the oldest running batch of `model` (the batchers react at once)."""
        i = self.running.index(model)
        _, values, done = self._running.pop(i)
        done({"Y": Tensor("INT32", (len(values), 1), array.array("i", values).tobytes())}, None)


def x(value: int) -> list[Tensor]:
    return [Tensor("INT32", (1, 1), array.array("i", [value]).tobytes())]


def batcher(name: str, run: HandRunner, scheduler: FairScheduler | None, *, interpreters: int = 2,
            policy: object | None = None, max_batch_size: int = 2, clock: Callable[[], float] = time.monotonic
            ) -> Batcher:
    return Batcher(
        model=name, run=run, policy=policy or WindowPolicy(max_queue_delay=0.0),  # type: ignore[arg-type]
        max_batch_size=max_batch_size, interpreters=interpreters, max_queue_size=1000, scheduler=scheduler,
        clock=clock,
    )


async def test_a_flooded_model_cannot_starve_another() -> None:
    run = HandRunner()
    s = FairScheduler(2)
    hot = batcher("hot", run, s)
    cold = batcher("cold", run, s)
    flood = [asyncio.ensure_future(hot.submit(x(i), 1)) for i in range(40)]
    assert run.running == ["hot", "hot"] and hot.queued == 38  # the pool's two slots
    answered = []
    for k in range(5):
        req = asyncio.ensure_future(cold.submit(x(1000 + k), 1))
        assert run.running == ["hot", "hot"]  # no slot free: cold waits on the host
        run.finish("hot")  # the first slot that frees goes to cold
        assert run.started[-1] == ("cold", [1000 + k])
        assert run.running == ["hot", "cold"]
        run.finish("hot")  # the next one goes back to hot (a full batch of 2)
        assert run.started[-1][0] == "hot" and len(run.started[-1][1]) == 2
        run.finish("cold")
        assert run.started[-1][0] == "hot"  # cold has nothing queued
        answered.append(await req)
    assert [array.array("i", bytes(r["Y"].view())).tolist() for r in answered] == [[1000 + k] for k in range(5)]
    while run.running:
        run.finish("hot")
    results = await asyncio.gather(*flood)
    assert [array.array("i", bytes(r["Y"].view()))[0] for r in results] == list(range(40))
    assert s.in_flight == 0 and s.free == 2
    await hot.close(timeout=1)
    await cold.close(timeout=1)


async def test_without_a_scheduler_each_model_counts_only_its_own_interpreters() -> None:
    run = HandRunner()
    hot = batcher("hot", run, None)
    cold = batcher("cold", run, None)
    flood = [asyncio.ensure_future(hot.submit(x(i), 1)) for i in range(6)]
    req = asyncio.ensure_future(cold.submit(x(99), 1))
    assert sorted(run.running) == ["cold", "hot", "hot"]  # three batches for two interpreters
    run.finish("cold")
    await req
    while run.running:
        run.finish("hot")
    await asyncio.gather(*flood)


async def test_models_on_one_interpreter_share_it_and_another_model_uses_the_rest() -> None:
    run = HandRunner()
    s = FairScheduler(2)
    a = batcher("a", run, s, interpreters=1)
    b = batcher("b", run, s, interpreters=1)
    wide = batcher("wide", run, s, interpreters=2)
    reqs = [asyncio.ensure_future(m.submit(x(i), 1)) for i in range(6) for m in (a, b, wide)]
    assert sorted(run.running) == ["a", "wide"]  # b waits: a holds the only interpreter it shares with a
    run.finish("a")
    assert sorted(run.running) == ["b", "wide"]
    run.finish("wide")
    assert sorted(run.running) == ["b", "wide"]  # a or b cannot use wide's interpreter
    for _ in range(40):
        if not run.running:
            break
        run.finish(run.running[0])
    assert len(await asyncio.gather(*reqs)) == 18
    assert s.in_flight == 0
