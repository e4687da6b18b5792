"""`_native.Counter`: one number every event loop adds to, a slot each (a model's queued
samples under `--loops`)."""

from __future__ import annotations

import pytest

from aserve import _native
from aserve.dataplane.models import queue_layout


def test_views_add_to_their_own_slot_and_read_the_whole() -> None:
    host = _native.Counter(3)
    fronts = [_native.Counter.at(host.address, slot) for slot in (1, 2)]
    host.add(2)
    fronts[0].add(5)
    fronts[1].add(7)
    fronts[1].add(-3)
    assert (host.own, fronts[0].own, fronts[1].own) == (2, 5, 4)
    assert host.total() == fronts[0].total() == fronts[1].total() == 11
    host.clear(1)  # the front of slot 1 ended: what it held is taken back
    assert host.total() == fronts[1].total() == 6 and fronts[0].own == 0
    assert host.slots == 3 and fronts[0].address == host.address


@pytest.mark.parametrize("args", [(0, 1), (64 * 3 + 8, 1)])
def test_a_view_of_no_counter_is_refused(args: tuple[int, int]) -> None:
    with pytest.raises(ValueError, match="is not a counter's address"):
        _native.Counter.at(*args)


def test_slots_out_of_range_are_refused() -> None:
    host = _native.Counter(2)
    with pytest.raises(ValueError, match="slot 2 of 2 is out of range"):
        _native.Counter.at(host.address, 2)
    with pytest.raises(ValueError, match="slot -1 of 2 is out of range"):
        host.clear(-1)
    with pytest.raises(ValueError, match=r"slots must be in \[1, 128\], got 0"):
        _native.Counter(0)
    slots, summed = queue_layout(14)  # the most front loops: a model's queue Counter still fits
    assert _native.Counter(slots, summed=summed).get(slots - 1) == 0
    with pytest.raises(ValueError, match=r"summed must be in \[1, slots=2\], got 3"):
        _native.Counter(2, summed=3)
    with pytest.raises(ValueError, match="slot 2 of 2 is out of range"):
        host.get(2)


def test_slots_past_summed_are_kept_beside_the_total() -> None:
    # a pool's own slots (what waits in its queue) are read one by one, not summed
    host = _native.Counter(4, summed=3)
    view = _native.Counter.at(host.address, 3)
    host.add(2)
    view.add(5)
    assert host.total() == view.total() == 2
    assert (view.get(3), host.get(0), host.slots) == (5, 2, 4)
