"""`textclass`: a pure-Python topic classifier served from BYTES tensors."""

from __future__ import annotations

import array
import asyncio
import math

import pytest

from aserve.engine import Pool
from aserve.runtime.datatypes import decode_bytes, encode_bytes
from aserve.tensor import Tensor

from .helpers import ENGINES, host_module, spec

OBVIOUS = {
    "The striker scored a late goal and the team won the match": "sports",
    "Install the latest software update on your laptop": "tech",
    "Bake the cake with butter, sugar and chocolate": "food",
    "The goalkeeper saved a penalty in the final": "sports",
    "The server crashed because of a memory leak in the code": "tech",
    "Fry the onions and garlic, then add the tomato sauce": "food",
}


def test_features_are_stable_hashes() -> None:
    model = host_module("textclass")
    # zlib.crc32, not the salted built-in hash(): the same buckets in every process
    assert model.features("Hello, World") == [
        model.zlib.crc32(g) & (model.BUCKETS - 1) for g in (b"hello", b"world", b"hello world")
    ]
    assert model.tokens("It's GREAT-ish 42!") == ["it's", "great", "ish", "42"]


@pytest.mark.parametrize("engine", ENGINES)
async def test_classifies_obvious_sentences(engine: str) -> None:
    texts = list(OBVIOUS)
    async with Pool(engine=engine, interpreters=2) as pool:
        info = await pool.load(spec("textclass"))
        assert [o.name for o in info.outputs] == ["LABEL", "SCORES"]

        async def classify(batch: list[str]) -> tuple[list[str], list[list[float]]]:
            data = encode_bytes([t.encode() for t in batch])
            out = await pool.infer("textclass", {"TEXT": Tensor("BYTES", (len(batch),), data)})
            label, scores = out["LABEL"], out["SCORES"]
            assert (label.datatype, label.shape) == ("BYTES", (len(batch),))
            assert (scores.datatype, scores.shape) == ("FP32", (len(batch), 3))
            flat = array.array("f", bytes(scores.data))
            return [b.decode() for b in decode_bytes(label.data)], [
                list(flat[i * 3 : i * 3 + 3]) for i in range(len(batch))
            ]

        # one batch of all, and one request per text at once (both interpreters busy)
        labels, scores = await classify(texts)
        singles = await asyncio.gather(*(classify([t]) for t in texts))
    assert labels == list(OBVIOUS.values())
    assert [s[0][0] for s in singles] == labels
    for row, single in zip(scores, singles):
        assert math.isclose(sum(row), 1.0, rel_tol=1e-5)
        assert row == pytest.approx(single[1][0], rel=1e-6)


async def test_scores_match_the_host_reference() -> None:
    module = host_module("textclass")
    reference = module.TextClassifier()
    reference.directory = str(spec("textclass").path)
    reference.parameters = {}
    reference.load()
    text = "Chef, the robot scored a goal!"
    async with Pool(engine="private", interpreters=1) as pool:
        await pool.load(spec("textclass"))
        out = await pool.infer("textclass", {"TEXT": Tensor("BYTES", (1,), encode_bytes([text.encode()]))})
    assert list(array.array("f", bytes(out["SCORES"].data))) == pytest.approx(
        reference.classify(text), rel=1e-6
    )
