"""engine='auto': probing models in an isolated subinterpreter."""

from __future__ import annotations

import sys

import pytest

from aserve.engine import choose_engine
from aserve.engine.choose import close_probe
from aserve.errors import EngineError

PURE = "import re, zlib\nfrom aserve.runtime import Model\nclass P(Model):\n    pass\n"
REFUSING = "import msgspec\nfrom aserve.runtime import Model\nclass R(Model):\n    pass\n"

needs_312 = pytest.mark.skipif(sys.version_info < (3, 12), reason="PEP 684 needs Python 3.12+")


@needs_312
async def test_auto_picks_subinterp_for_pure_python_and_private_for_refusing_extensions(model_dir) -> None:
    try:
        pure = await choose_engine("auto", str(model_dir(PURE, name="pure")))
        assert pure.engine == "subinterp"
        assert "isolated subinterpreter" in pure.reason
        refusing = await choose_engine("auto", str(model_dir(REFUSING, name="refusing")))
        assert refusing.engine == "private"
        assert refusing.reason.startswith("module msgspec")
        with pytest.raises(EngineError, match=r"module msgspec\S* refuses isolated subinterpreters"):
            await choose_engine("subinterp", str(model_dir(REFUSING, name="refusing")))
    finally:
        await close_probe()


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="3.11 has no PEP 684")
async def test_before_312_auto_is_private_and_subinterp_is_an_error(model_dir) -> None:
    choice = await choose_engine("auto", str(model_dir(PURE)))
    assert choice.engine == "private" and "3.12" in choice.reason
    with pytest.raises(EngineError, match=r"Python >= 3.12\); this is Python 3\.11"):
        await choose_engine("subinterp", str(model_dir(PURE)))


async def test_explicit_engines_are_kept(model_dir) -> None:
    assert (await choose_engine("private", str(model_dir(PURE)))).engine == "private"
    assert (await choose_engine("main", str(model_dir(PURE)))).engine == "main"
