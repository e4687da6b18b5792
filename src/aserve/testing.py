"""pytest plugin for suites that run private interpreters (`-p aserve.testing`).

glibc reads its tunables only at process start, and pytest captures the standard
streams before it imports conftest files; loaded as an early plugin, this module
re-executes pytest with the tunables before any capture begins.
"""

from __future__ import annotations

from .engine.tunables import ensure_glibc_tunables

ensure_glibc_tunables()
