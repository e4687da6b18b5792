"""Subinterpreters with their own GIL that define their first ctypes types at once.

CPython 3.12 and 3.13 fill ctypes' process-wide table of type codes lazily, marking it
filled before filling it: two interpreters defining their first ctypes type at the same
moment crashed the process (SIGSEGV in ctypes/__init__.py) in about one server start in
twenty. Every interpreter of a pool loads its model at once, so the pool fills the table
from the host first. Each check runs in a fresh process: the table is filled once per process.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys
import textwrap

import pytest

needs_312 = pytest.mark.skipif(sys.version_info < (3, 12), reason="PEP 684 needs Python 3.12+")

CTYPES_MODEL = '''
import ctypes
from aserve.runtime import Model, TensorSpec


class Widths(Model):
    """Y[i] = the size in bytes of the ctypes type whose code is X[i]."""

    inputs = [TensorSpec("X", "UINT8", (-1,))]
    outputs = [TensorSpec("Y", "INT32", (-1,))]
    types = {ord("b"): ctypes.c_byte, ord("h"): ctypes.c_short, ord("i"): ctypes.c_int, ord("q"): ctypes.c_longlong}

    def __call__(self, inputs):
        sizes = [ctypes.sizeof(self.types[c]) for c in inputs["X"]]
        return {"Y": memoryview(ctypes.ARRAY(ctypes.c_int32, len(sizes))(*sizes)).cast("B")}
'''

SCRIPT = '''
import array, asyncio, sys
from aserve.engine.pool import Pool, ModelSpec
from aserve.tensor import Tensor

async def main():
    pool = Pool(engine="subinterp", interpreters=4)
    await pool.start()
    assert "ctypes" in sys.modules, "the host fills ctypes' table before the interpreters start"
    try:
        await pool.load(ModelSpec(name="widths", path=sys.argv[1]))
        answers = await asyncio.gather(*(pool.infer("widths", {"X": Tensor("UINT8", (4,), b"bhiq")})
                                         for _ in range(8)))
        for out in answers:
            assert array.array("i", bytes(out["Y"].data)).tolist() == [1, 2, 4, 8]
    finally:
        await pool.close()
    print("answered")

asyncio.run(main())
'''


@needs_312
@pytest.mark.parametrize("start", range(3))
def test_interpreters_loading_ctypes_at_once(model_dir, start: int) -> None:
    folder: pathlib.Path = model_dir(CTYPES_MODEL, name=f"widths{start}")
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(SCRIPT), str(folder)], check=False, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "answered", done.stderr[-3000:]
