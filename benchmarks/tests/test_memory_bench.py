"""`python -m benchmarks.memory`: PSS by kind per interpreter count, and the split of the last
record into the host, the interpreters and a plain process importing the model's framework."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import sysconfig

import pytest

from benchmarks import memory


def test_the_split_divides_the_server_into_its_host_and_its_interpreters(tmp_path: pathlib.Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "memory.json"
    assert memory.main(["--model", "simple", "--interpreters", "1,2", "--json", str(out)]) == 0
    one, two, last = json.loads(out.read_text())
    assert [one["interpreters"], two["interpreters"]] == [1, 2]
    assert two["per_added_interpreter_mb"] == pytest.approx(two["pss_mb"] - one["pss_mb"], abs=0.11)
    assert two["tensor_format"] == "memoryview"
    split = last["split"]
    assert split["model"] == "simple" and split["interpreters"] == 2
    # the host alone (no model, no interpreter) is part of the server, and the rest is the interpreters'
    assert 0 < split["host_mb"] < two["pss_mb"]
    assert split["interpreters_mb"] == pytest.approx(two["pss_mb"] - split["host_mb"], abs=0.11)
    assert split["per_interpreter_mb"] == pytest.approx(split["interpreters_mb"] / 2, abs=0.11)
    # a memoryview model imports no framework: its plain process is Python alone, smaller than the host
    plain = split["plain_process"]
    assert plain["imports"] is None
    assert 0 < plain["anon_mb"] < plain["pss_mb"] < split["host_mb"]
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert printed[-1] == last


def test_a_plain_process_imports_the_framework_of_the_tensor_format() -> None:
    bare = memory.plain_process(None)
    numpy = memory.plain_process("numpy")
    assert numpy["imports"] == "numpy"
    assert numpy["anon_mb"] > bare["anon_mb"]  # importing numpy allocates


def test_other_processes_mapping_the_same_libpython_are_found() -> None:
    # two processes of this Python map the same libpython (a build with a shared libpython; a
    # static one maps its own binary's text, which is not counted)
    def started() -> subprocess.Popen[str]:
        proc = subprocess.Popen([sys.executable, "-c", "import sys; print('ready', flush=True); sys.stdin.read()"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        return proc

    one, two = started(), started()
    try:
        found = memory.sharing_text(one.pid)
        assert (two.pid in found) == bool(sysconfig.get_config_var("Py_ENABLE_SHARED"))
        assert one.pid not in found  # the tree measured is not counted, nor is this process
        assert memory.plain_process(None)["text_shared_with"] >= (2 if two.pid in found else 0)
    finally:
        one.communicate("")
        two.communicate("")
