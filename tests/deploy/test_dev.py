"""`./dev setup` on a checkout it set up moments before does nothing: both venvs are up to date.

It runs only under `./dev test` (which set both venvs up and says so in the environment):
elsewhere the stamps may be stale, and a build in place would replace the native libraries
under the running suite.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from .conftest import ROOT


@pytest.mark.skipif(os.environ.get("ASERVE_DEV_SET_UP") != "1", reason="runs under ./dev test, which set up both "
                                                                       "venvs just now")
def test_dev_setup_with_nothing_changed_installs_and_builds_nothing() -> None:
    stamps = {venv: (ROOT / venv / ".aserve-setup").read_text() for venv in (".venv", ".venv313")
              if (ROOT / venv / ".aserve-setup").exists()}
    assert ".venv" in stamps
    done = subprocess.run([str(ROOT / "dev"), "setup"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert "installing" not in done.stderr and "building" not in done.stderr and "creating" not in done.stderr, \
        done.stderr
    assert {venv: (ROOT / venv / ".aserve-setup").read_text() for venv in stamps} == stamps
