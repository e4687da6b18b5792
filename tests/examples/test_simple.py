"""`simple`: Triton's quickstart add/sub model, checked against numpy's int32 arithmetic."""

from __future__ import annotations

import asyncio

import pytest

from aserve.engine import Pool
from aserve.errors import ModelError
from aserve.tensor import Tensor

from .helpers import ENGINES, spec

np = pytest.importorskip("numpy")


def _pair(batch: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = rng.integers(-(2**31), 2**31, (batch, 16), dtype=np.int32)
    b = rng.integers(-(2**31), 2**31, (batch, 16), dtype=np.int32)
    # the extremes, where int32 wraps around
    a[0, :4] = [2**31 - 1, -(2**31), 2**31 - 1, -(2**31)]
    b[0, :4] = [1, -1, -1, 1]
    return a, b


@pytest.mark.parametrize("engine", ENGINES)
async def test_sum_and_difference_wrap_like_int32(engine: str) -> None:
    async with Pool(engine=engine, interpreters=2) as pool:
        info = await pool.load(spec("simple"))
        assert (info.class_name, info.tensor_format) == ("Simple", "memoryview")
        cases = [_pair(batch, seed) for seed, batch in enumerate([1, 3, 64, 1, 7, 2])]

        async def one(a: np.ndarray, b: np.ndarray) -> None:
            out = await pool.infer(
                "simple", {"INPUT0": Tensor("INT32", a.shape, a), "INPUT1": Tensor("INT32", b.shape, b)}
            )
            assert set(out) == {"OUTPUT0", "OUTPUT1"}
            for name, want in (("OUTPUT0", a + b), ("OUTPUT1", a - b)):
                t = out[name]
                assert (t.datatype, t.shape) == ("INT32", a.shape)
                got = np.frombuffer(t.data, dtype=np.int32).reshape(t.shape)
                np.testing.assert_array_equal(got, want)

        with np.errstate(over="ignore"):
            await asyncio.gather(*(one(a, b) for a, b in cases))


async def test_mismatched_inputs_are_a_model_error() -> None:
    async with Pool(engine="private", interpreters=1) as pool:
        await pool.load(spec("simple"))
        a = np.zeros((2, 16), dtype=np.int32)
        b = np.zeros((1, 16), dtype=np.int32)
        with pytest.raises(ModelError, match="INPUT0 has 32 elements, INPUT1 has 16"):
            await pool.infer(
                "simple", {"INPUT0": Tensor("INT32", a.shape, a), "INPUT1": Tensor("INT32", b.shape, b)}
            )
