"""FairScheduler with real Batchers on a virtual-time loop (benchmarks.sim.virtualtime): a model
whose policy waits passes its turn, and its timer takes the free slot exactly when it asked. The
hand-completed runner and the batchers are tests/batching/test_fair.py's."""

from __future__ import annotations

import array
import asyncio
from collections.abc import Sequence

import pytest

from aserve.batching import Decision, FairScheduler, Pending
from benchmarks.sim import virtualtime
from tests.batching.test_fair import HandRunner, batcher, x


class Holding:
    """A policy that waits (wake_at in `wait` seconds) while `hold` is set; else dispatches the head."""

    def __init__(self, wait: float) -> None:
        self.wait = wait
        self.hold = True
        self.asked = 0

    def decide(self, now: float, queue: Sequence[Pending], *, idle: int, running: int,
               max_batch_size: int, queued: int | None = None) -> Decision:
        self.asked += 1
        if idle <= 0:
            return Decision(0, None)
        return Decision(0, now + self.wait) if self.hold else Decision(1, None)

    def observe(self, samples: int, seconds: float) -> None:
        pass


def test_a_model_whose_policy_waits_passes_its_turn_then_takes_a_free_slot() -> None:
    # on a virtual-time loop: shy's timer fires exactly when it asked, no real waiting
    async def main() -> None:
        loop = asyncio.get_running_loop()
        run = HandRunner()
        s = FairScheduler(1)
        hot = batcher("hot", run, s, clock=loop.time)
        policy = Holding(wait=0.02)
        shy = batcher("shy", run, s, policy=policy, clock=loop.time)
        flood = [asyncio.ensure_future(hot.submit(x(i), 1)) for i in range(3)]
        req = asyncio.ensure_future(shy.submit(x(7), 1))
        assert policy.asked == 0  # no slot: the policy is not even asked
        run.finish("hot")
        assert policy.asked == 1 and run.running == ["hot"]  # shy passed: hot got the slot
        run.finish("hot")  # the batch of the two others queued
        assert policy.asked == 2 and run.running == [] and s.free == 1  # shy passed again: the slot stays free
        policy.hold = False
        asked = loop.time()
        await asyncio.wait_for(run.started_batch("shy"), 1.0)  # virtual seconds: its timer takes the free slot
        assert run.running == ["shy"] and s.free == 0 and loop.time() == pytest.approx(asked + 0.02)
        run.finish("shy")
        assert array.array("i", bytes((await req)["Y"].view())).tolist() == [7]
        await asyncio.gather(*flood)

    virtualtime.run(main())
