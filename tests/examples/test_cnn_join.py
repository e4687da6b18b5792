"""The staged CNN with layer-level joining: a joined batch answers each request as running it alone."""

from __future__ import annotations

import asyncio

import pytest

from aserve.batching.adaptive import AdaptivePolicy
from aserve.batching.batcher import Batcher
from aserve.batching.costmodel import warmup
from aserve.batching.join import JoinPlanner, measure_stages
from aserve.batching.joining import Joining
from aserve.engine import Pool
from aserve.tensor import Tensor

from ..conftest import HAVE_TORCH, needs_torch
from .helpers import spec

pytestmark = [needs_torch, pytest.mark.serial]

if HAVE_TORCH:
    import torch


def _tensor(out: Tensor) -> torch.Tensor:
    return torch.frombuffer(bytearray(out.data), dtype=torch.float32).reshape(out.shape)


def _input(x: torch.Tensor) -> dict[str, Tensor]:
    return {"IMAGE": Tensor("FP32", tuple(x.shape), x.numpy().tobytes())}


@pytest.mark.parametrize("engine", ["private", "main"])
async def test_joined_batches_equal_requests_run_alone(engine: str) -> None:
    gen = torch.Generator().manual_seed(3)
    sizes = [8, 1, 2, 1, 3, 1, 1, 2, 1, 1]  # the first batch (8 images) runs while the others arrive
    images = [torch.randn(k, 3, 64, 64, generator=gen) for k in sizes]
    async with Pool(engine=engine, interpreters=1) as pool:
        info = await pool.load(spec("cnn"))
        assert info.stages == 4
        cost = await warmup(pool, info, 16, repeats=2)
        profile = await measure_stages(pool, info, 2, repeats=2)
        policy = AdaptivePolicy(cost, latency_budget_s=10.0, interpreters=1, max_queue_delay_s=0.0)
        batcher = Batcher(model="cnn", run=pool.run, policy=policy, max_batch_size=16, interpreters=1,
                          max_queue_size=1024, join=Joining(pool, JoinPlanner(cost, profile), 10.0, benefit=False))

        async def one(i: int) -> torch.Tensor:
            await asyncio.sleep(0.003 * i)  # arrivals while earlier batches run
            return _tensor((await batcher.submit(list(_input(images[i]).values()), sizes[i]))["SCORES"])

        joined = await asyncio.gather(*(one(i) for i in range(len(images))))
        stats = batcher.stats()
        assert stats["joins"] >= 1, stats  # budgets only, and 10 s of it: every join the engine can make
        assert stats["requests"] == len(images)
        for x, got in zip(images, joined):
            alone = _tensor((await pool.infer("cnn", _input(x)))["SCORES"])
            assert got.shape == alone.shape
            # batch-size dependent kernels differ in the last bits, not more
            torch.testing.assert_close(got, alone, rtol=1e-5, atol=1e-6)
