"""The CPUs a process may use: affinity capped by a cgroup CPU quota (v1 and v2), and the
polling that follows from it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import msgspec
import pytest

from aserve import _native, cpus
from aserve.config import PRIVATE_NAMESPACES, ServerSettings, SettingsError
from aserve.engine import Pool


def _v2(tmp_path: Path, groups: dict[str, str], own: str) -> tuple[str, str]:
    """A cgroup v2 tree with `cpu.max` per group and a /proc/self/cgroup naming `own`."""
    root = tmp_path / "cgroup"
    for group, value in groups.items():
        folder = root / group.strip("/")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "cpu.max").write_text(value + "\n")
    (root / own.strip("/")).mkdir(parents=True, exist_ok=True)
    proc = tmp_path / "proc-cgroup"
    proc.write_text(f"0::{own}\n")
    return str(proc), str(root)


def _v1(tmp_path: Path, quota: int, period: int, own: str = "/") -> tuple[str, str]:
    root = tmp_path / "cgroup"
    folder = root / "cpu,cpuacct" / own.strip("/")
    folder.mkdir(parents=True)
    (folder / "cpu.cfs_quota_us").write_text(f"{quota}\n")
    (folder / "cpu.cfs_period_us").write_text(f"{period}\n")
    proc = tmp_path / "proc-cgroup"
    proc.write_text(f"12:pids:/\n4:cpu,cpuacct:{own}\n1:name=systemd:/\n")
    return str(proc), str(root)


def test_a_v2_quota_caps_the_affinity_rounded_up(tmp_path: Path) -> None:
    proc, root = _v2(tmp_path, {"/": "max 100000", "/pod": "150000 100000"}, "/pod")
    assert cpus.quota(proc, root) == 1.5
    assert cpus.available(proc, root) == min(2, len(os.sched_getaffinity(0)))


def test_a_parent_limit_binds_its_children(tmp_path: Path) -> None:
    proc, root = _v2(tmp_path, {"/kubepods": "50000 100000", "/kubepods/pod": "max 100000"}, "/kubepods/pod")
    assert cpus.quota(proc, root) == 0.5
    assert cpus.available(proc, root) == 1  # never below one


def test_a_host_path_missing_in_the_container_reads_the_mount_root(tmp_path: Path) -> None:
    proc, root = _v2(tmp_path, {"/": "100000 100000"}, "/")
    Path(proc).write_text("0::/kubepods/burstable/pod1234/abc\n")  # the host's path, not mounted here
    assert cpus.quota(proc, root) == 1.0


def test_v1_quota_and_no_quota(tmp_path: Path) -> None:
    proc, root = _v1(tmp_path, 300000, 100000, "/docker/abc")
    assert cpus.quota(proc, root) == 3.0
    unlimited = tmp_path / "unlimited"
    unlimited.mkdir()
    proc, root = _v1(unlimited, -1, 100000)
    assert cpus.quota(proc, root) is None
    assert cpus.available(proc, root) == len(os.sched_getaffinity(0))


def test_no_cgroup_files_means_no_quota(tmp_path: Path) -> None:
    assert cpus.quota(str(tmp_path / "absent"), str(tmp_path)) is None


@pytest.mark.parametrize(("available", "spinners"), [(1, 0), (2, 1), (4, 1), (16, 7)])
def test_polling_needs_a_cpu_besides_the_loop(monkeypatch: pytest.MonkeyPatch, available: int,
                                               spinners: int) -> None:
    monkeypatch.setattr(cpus, "available", lambda *a: available)
    pool = Pool(engine="main", spin_us=200)
    assert pool.spinners == spinners and pool.interpreters == available


@pytest.mark.parametrize(("available", "loops", "private", "subinterp"),
                         [(1, 0, 1, 1), (2, 2, 2, 2), (3, 2, 3, 3), (4, 2, 4, 4), (8, 2, 8, 8), (12, 3, 12, 12),
                          (16, 4, 11, 16), (64, 4, 11, 64)])
def test_default_interpreters_and_loops_fit_glibcs_namespaces(monkeypatch: pytest.MonkeyPatch, available: int,
                                                             loops: int, private: int, subinterp: int) -> None:
    """Every front loop and private interpreter takes a link-map namespace: by default the
    private pool takes what the loops leave, so the default server starts on any CPU count."""
    monkeypatch.setattr(cpus, "available", lambda *a: available)
    settings = ServerSettings()
    assert settings.loop_count == loops
    assert settings.pool_size("private") == private and settings.pool_size("subinterp") == subinterp
    assert settings.pool_size("main") == subinterp
    assert loops + private <= _native.MAX_NAMESPACES == PRIVATE_NAMESPACES


def test_explicit_loops_and_interpreters_are_kept_where_they_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpus, "available", lambda *a: 16)
    assert ServerSettings(loops=8).pool_size("private") == 7
    assert ServerSettings(loops=14).pool_size("private") == 1  # a light model on many CPUs: loops do the work
    assert ServerSettings(loops=12, interpreters=3).pool_size("private") == 3
    assert ServerSettings(engine="main", loops=8, interpreters=12).pool_size("main") == 12  # no namespaces taken


def test_private_interpreters_and_loops_beyond_glibcs_namespaces_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every front loop and private interpreter takes one of glibc's 15 namespaces: flags that
    need more are refused naming both and the count that fits, rather than a model's load
    failing in dlmopen once the server runs."""
    monkeypatch.setattr(cpus, "available", lambda *a: 16)
    with pytest.raises(SettingsError, match=r"^interpreters: 12 private interpreters and 8 front loops \(--loops\) "
                                            r"need 20 .* glibc allows 15: expected --interpreters of at most 7 "):
        ServerSettings(engine="private", loops=8, interpreters=12)
    if sys.version_info < (3, 12):  # auto is the private engine here
        with pytest.raises(SettingsError, match="at most 11 with 4 loops"):
            ServerSettings(interpreters=12)  # 16 CPUs: 4 loops by default
    # another default engine starts; a model that asks for the private one cannot have that pool
    settings = ServerSettings(engine="main", loops=8, interpreters=12)
    with pytest.raises(SettingsError, match="at most 7 with 8 loops"):
        settings.pool_size("private")
    with pytest.raises(msgspec.ValidationError, match=r"Expected `int` <= 14 - at `\$.loops`"):
        msgspec.convert({"loops": 15}, ServerSettings)
