"""A model's declared example request drives the adaptive batcher's warm-up measurement."""

from __future__ import annotations

import array
import pathlib

import aiohttp
import pytest

from aserve.batching.costmodel import sample_inputs
from aserve.engine import ModelSpec, Pool
from aserve.errors import ModelLoadError

from ..conftest import needs_torch
from .conftest import write_repository

# Token ids start at 1: a request of zeros (what a generated warm-up sends) is refused.
PICKY_MODEL = """
from aserve.runtime import Model, TensorSpec

class Picky(Model):
    inputs = [TensorSpec("IDS", "INT32", (-1, 3))]
    outputs = [TensorSpec("SUM", "INT32", (-1, 1))]
{example}
    def __call__(self, inputs):
        ids = inputs["IDS"].cast("B").cast("i")
        if 0 in ids:
            raise ValueError("token id 0 is reserved; ids start at 1")
        return {{"SUM": [[sum(ids[i:i + 3])] for i in range(0, len(ids), 3)]}}
"""

EXAMPLE = """
    def example_inputs(self):
        return {"IDS": [[5, 6, 7], [1, 2, 3]]}
"""

PICKY_CONFIG = """
max_batch_size = 8
[batching]
policy = "adaptive"
latency_budget_ms = 100.0
"""


def repo(tmp_path: pathlib.Path, example: str) -> pathlib.Path:
    return write_repository(tmp_path / "repo", {"picky": (PICKY_MODEL.format(example=example), PICKY_CONFIG)})


async def test_warm_up_uses_the_declared_example(start_server, http: aiohttp.ClientSession,
                                                 tmp_path: pathlib.Path) -> None:
    _, url = await start_server(repo(tmp_path, EXAMPLE))
    async with http.get(f"{url}/v2/models/picky") as r:
        meta = await r.json()
    cost = meta["parameters"]["batching"]["cost_model"]
    assert [p[0] for p in cost["points"]] == [1, 2, 4, 8]
    body = {"inputs": [{"name": "IDS", "datatype": "INT32", "shape": [1, 3], "data": [2, 3, 4]}]}
    async with http.post(f"{url}/v2/models/picky/infer", json=body) as r:
        assert r.status == 200
        assert (await r.json())["outputs"][0]["data"] == [9]


async def test_without_an_example_the_generated_warm_up_fails_and_says_why(
    start_server, http: aiohttp.ClientSession, tmp_path: pathlib.Path
) -> None:
    _, url = await start_server(repo(tmp_path, ""))
    async with http.get(f"{url}/v2/models/picky/ready") as r:
        assert r.status != 200
    async with http.get(f"{url}/v2/models/picky") as r:
        reason = (await r.json())["parameters"]["reason"]
    assert "token id 0 is reserved" in reason


async def test_batches_cycle_through_the_example_samples(model_dir) -> None:  # type: ignore[no-untyped-def]
    folder = model_dir(PICKY_MODEL.format(example=EXAMPLE))
    async with Pool(engine="main", interpreters=1) as pool:
        info = await pool.load(ModelSpec(name="picky", path=str(folder)))
        assert info.example is not None and info.example["IDS"].shape == (2, 3)
        batch = sample_inputs(info, 5)
        assert batch["IDS"].shape == (5, 3)
        assert array.array("i", bytes(batch["IDS"].view())).tolist() == [5, 6, 7, 1, 2, 3] * 2 + [5, 6, 7]
        assert sample_inputs(info, 1, batched=False)["IDS"].shape == (2, 3)
        outputs = await pool.infer("picky", batch)
        assert array.array("i", bytes(outputs["SUM"].view())).tolist() == [18, 6, 18, 6, 18]


@pytest.mark.parametrize(("example", "message"), [
    ('return {"TOKENS": [[1, 2, 3]]}', r"do not match the declared inputs \['IDS'\]"),
    ('return {"IDS": [[1, 2]]}', r"shape \[1, 2\] does not fit the declared \[-1, 3\]"),
    ("return [1, 2, 3]", "expected a dict of input name -> tensor, got list"),
])
async def test_a_bad_example_fails_the_load_naming_it(model_dir, example: str, message: str) -> None:  # type: ignore[no-untyped-def]
    source = PICKY_MODEL.format(example=f"\n    def example_inputs(self):\n        {example}\n")
    async with Pool(engine="main", interpreters=1) as pool:
        with pytest.raises(ModelLoadError, match=message) as info:
            await pool.load(ModelSpec(name="bad", path=str(model_dir(source, name="bad"))))
        assert "Picky.example_inputs()" in str(info.value)



TORCH_MODEL = """
import torch
from aserve.runtime import Model, TensorSpec

class Scale(Model):
    inputs = [TensorSpec("X", "FP32", (-1, 2))]
    outputs = [TensorSpec("Y", "FP32", (-1, 2))]
    tensor_format = "torch"

    def example_inputs(self):
        return {"X": torch.tensor([[0.5, -1.25], [3.0, 4.0]])}

    def __call__(self, inputs):
        return {"Y": inputs["X"] * 2}
"""


@needs_torch
async def test_a_torch_example_travels_as_its_bytes(model_dir) -> None:  # type: ignore[no-untyped-def]
    async with Pool(engine="private", interpreters=1) as pool:
        info = await pool.load(ModelSpec(name="scale", path=str(model_dir(TORCH_MODEL, name="scale"))))
        assert info.example is not None
        x = info.example["X"]
        assert (x.datatype, x.shape) == ("FP32", (2, 2))
        assert array.array("f", bytes(x.view())).tolist() == [0.5, -1.25, 3.0, 4.0]
        assert array.array("f", bytes(sample_inputs(info, 3)["X"].view())).tolist() == [0.5, -1.25, 3.0, 4.0, 0.5, -1.25]
