"""The process PSS reader (aserve.runtime.memory). What weights cost per interpreter, and that
loading and unloading does not grow the process, is tested with the weights benchmark
(benchmarks/tests/test_weights_bench.py)."""

from __future__ import annotations

from aserve.runtime import memory


def test_pss_reads_this_process() -> None:
    before, data_before = memory.pss(), memory.pss(libraries=False)
    assert 0 < data_before < before  # the interpreter's own libraries are mapped
    block = bytearray(64 << 20)
    block[::4096] = b"\1" * len(block[::4096])  # touch every page
    assert memory.pss() - before >= 60 << 20
    assert memory.pss(libraries=False) - data_before >= 60 << 20
    del block
