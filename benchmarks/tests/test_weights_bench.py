"""Memory, with the weights benchmark (benchmarks.weights): weights count once however many
private interpreters run a model, and loading and unloading a model over and over does not grow
the process.

Measured as the process PSS (/proc/self/smaps), without shared libraries' mappings whose
share moves with other processes, as `python -m benchmarks.weights` measures it (and
`benchmarks.lifecycle` with the full set of figures). Set ASERVE_WEIGHTS_JSON=FILE to have
these tests write theirs.
"""

from __future__ import annotations

import json
import os
import pathlib
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

from aserve.engine import Pool
from benchmarks import weights as memory_bench

from .conftest import needs_torch


@pytest.fixture
def scratch() -> Iterator[pathlib.Path]:
    # not tmp_path: pytest keeps those, and these hold hundreds of MB
    with tempfile.TemporaryDirectory(prefix="aserve-test-weights-") as tmp:
        yield pathlib.Path(tmp)


def _write(name: str, result: dict[str, Any]) -> None:
    target = os.environ.get("ASERVE_WEIGHTS_JSON")
    if target:
        path = pathlib.Path(target)
        data = json.loads(path.read_text()) if path.exists() else {}
        data[name] = result
        path.write_text(json.dumps(data, indent=1) + "\n")


@needs_torch
async def test_weights_count_once_on_1_2_and_4_interpreters(scratch: pathlib.Path) -> None:
    model = memory_bench.write_model(scratch / "big", 200)
    weights = model["weights_mb"]
    assert weights >= 200
    async with Pool(engine="private", interpreters=4) as pool:
        await memory_bench.start_interpreters(pool)  # torch in all four first: only the model differs below
        result = await memory_bench.weight_sharing(pool, model, counts=(1, 2, 4))
    _write("weight_sharing", result)
    print(json.dumps(result, indent=1))
    for k in (2, 4):
        bare = memory_bench.per_added(result, "none", k)  # the model's own cost per interpreter, no weights
        for variant in ("idiom", "helper", "package"):
            added = memory_bench.per_added(result, variant, k)
            assert added <= bare + 0.1 * weights, (variant, k, added, bare, weights)
        # the control: private copies cost their size in every interpreter, and the measurement sees it
        assert memory_bench.per_added(result, "copy", k) >= 0.9 * weights
    for record in result["records"]:
        if record["variant"] != "none":
            assert record["added_after_infer_mb"] >= 0.9 * weights  # one copy is there, counted once
        assert record["left_after_unload_mb"] < 0.1 * weights, record  # and unloading gives it back


@needs_torch
async def test_fifty_load_unload_cycles_do_not_grow_the_process(scratch: pathlib.Path) -> None:
    model = memory_bench.write_model(scratch / "small", 32, package=False)
    async with Pool(engine="private", interpreters=1) as pool:
        # "copy": weights in the interpreter's own heap, the case the allocator must give back
        result = await memory_bench.load_unload_growth(pool, model, "copy", cycles=50)
    _write("load_unload", result)
    print(json.dumps(result, indent=1))
    assert result["growth_mb"] < model["weights_mb"], result
    assert result["left_after_first_unload_mb"] < model["weights_mb"], result
