"""The CPUs this process may use: what sizes the pools and decides whether polling may run.

A container under a Kubernetes CPU limit sees every core of its node in `os.cpu_count()`
and usually in its affinity too; its limit is a CFS quota in its cgroup (v2 `cpu.max`,
v1 `cpu.cfs_quota_us` over `cpu.cfs_period_us`). The quota counts here, rounded up, and so
does every ancestor's: a limit set on a parent group binds its children.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path


def available(proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> int:
    """CPUs this process may run on: its affinity, capped by its cgroup's CPU quota (rounded
    up); at least 1."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    limit = quota(proc_cgroup, root)
    if limit is not None:
        n = min(n, max(1, math.ceil(limit)))
    return max(1, n)


def quota(proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> float | None:
    """The tightest CPU quota of this process's cgroup and its ancestors, in CPUs, or None
    when there is none (or the cgroup files cannot be read)."""
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        return None
    limits: list[float] = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: 0::/path
            limits += _walk(Path(root), path, _v2)
        elif "cpu" in controllers.split(","):  # v1: N:cpu,cpuacct:/path
            for mount in (Path(root) / controllers, Path(root) / "cpu"):
                if mount.is_dir():
                    limits += _walk(mount, path, _v1)
                    break
    return min(limits) if limits else None


def _walk(mount: Path, path: str, read: Callable[[Path], float | None]) -> list[float]:
    """The quotas on `path` and its ancestors under `mount`. Inside a container the path the
    process's cgroup names is often the host's and the mount is the container's own group:
    then only the mount's root is read."""
    parts = [p for p in path.split("/") if p]
    if not (mount.joinpath(*parts)).is_dir():
        parts = []
    found = []
    for depth in range(len(parts), -1, -1):
        value = read(mount.joinpath(*parts[:depth]))
        if value is not None:
            found.append(value)
    return found


def _v2(folder: Path) -> float | None:
    try:
        limit, period = (folder / "cpu.max").read_text().split()
    except (OSError, ValueError):
        return None
    return None if limit == "max" else int(limit) / int(period)


def _v1(folder: Path) -> float | None:
    try:
        limit = int((folder / "cpu.cfs_quota_us").read_text())
        period = int((folder / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None if limit <= 0 or period <= 0 else limit / period

