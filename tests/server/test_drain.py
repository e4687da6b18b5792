"""loadtests/drain.py, short: `aserve serve` with requests queued and running gets SIGTERM,
answers every one of them 200 and exits 0 within --shutdown-timeout."""

from __future__ import annotations

import pytest

from tests.conftest import load_script


# spawns `aserve serve`: from asyncio's loop, not uvloop's (MagicStack/uvloop#650, see test_cli.py)
@pytest.mark.asyncio(loop_factories=["asyncio"])
async def test_sigterm_answers_every_request_in_flight() -> None:
    drain = load_script("drain")
    result = await drain.run(drain.parse(["--requests", "40", "--model-ms", "20", "--shutdown-timeout", "20"]))
    assert result["ok"], result
    assert result["statuses"] == {"200": 40} and result["wrong_answers"] == 0
    at = result["at_sigterm"]
    assert sum(at.values()) == 40 and at["queued"] > 0 and at["running"] > 0, at  # queued and running
    assert result["exit_status"] == 0 and result["exit_s"] <= 20
