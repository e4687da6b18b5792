"""`benchmarks.core` end to end on the cheapest example: the codec baseline and the whole
data plane, measured in one run, and the records it writes."""

from __future__ import annotations

import json
import os
import pathlib
import platform

import pytest

from benchmarks import core


def test_measures_the_codec_baseline_beside_the_whole_plane(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "core.json"
    argv = ["--models", "simple", "--engines", "private", "--bodies", "binary,json", "--paths", "codec,plane",
            "--clients", "4", "--duration", "0.3", "--warmup", "0.1", "--json", str(out)]
    assert core.main(argv) == 0
    records = json.loads(out.read_text())
    assert [(r["body"], r["path"]) for r in records] == [
        ("binary", "codec"), ("binary", "plane"), ("json", "codec"), ("json", "plane"),
    ]
    for r in records:
        assert (r["bench"], r["engine"], r["model"], r["interpreters"], r["clients"]) == (
            "core", "private", "simple", 2, 4)
        assert r["python"] == platform.python_version() and r["cpus"] == os.cpu_count()
        assert r["requests"] > 0 and r["requests_per_s"] > 0 and r["loop_cpu_us_per_request"] > 0
        assert r["requests_per_core_s"] == pytest.approx(1e6 / r["loop_cpu_us_per_request"], rel=0.01)
    for codec, plane in zip(records[::2], records[1::2]):
        assert codec["mean_batch"] is None and "codec_us_per_request" not in codec
        assert plane["mean_batch"] >= 1.0  # the plane's requests ran in batches on the pool
        assert plane["codec_us_per_request"] == codec["loop_cpu_us_per_request"]
        assert plane["beyond_codec_us_per_request"] == pytest.approx(
            plane["loop_cpu_us_per_request"] - codec["loop_cpu_us_per_request"], abs=0.01)


def test_the_plane_alone_has_no_baseline_fields(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "core.json"
    argv = ["--models", "simple", "--engines", "main", "--bodies", "binary", "--paths", "plane", "--clients", "2",
            "--duration", "0.2", "--warmup", "0.05", "--json", str(out)]
    assert core.main(argv) == 0
    [record] = json.loads(out.read_text())
    assert record["path"] == "plane" and record["requests"] > 0
    assert "codec_us_per_request" not in record and "beyond_codec_us_per_request" not in record


@pytest.mark.parametrize(("path", "body", "clients"), [("front", "json", "4"), ("native", "binary", "8")])
def test_the_callback_paths_run_beside_the_codec_baseline(tmp_path: pathlib.Path, path: str, body: str,
                                                          clients: str) -> None:
    """The HTTP front's way (submit, a callback, the client's next request from it), on the
    host's batcher (`front`) and on a front loop's, batched in the pool's shared queue by the
    window rule in C (`native`): every answer checked as the plane's are, its batches
    counted, beside the codec baseline."""
    out = tmp_path / "core.json"
    argv = ["--models", "simple", "--engines", "private", "--bodies", body, "--paths", f"codec,{path}",
            "--clients", clients, "--duration", "0.3", "--warmup", "0.1", "--json", str(out)]
    assert core.main(argv) == 0
    codec, measured = json.loads(out.read_text())
    assert (codec["path"], measured["path"]) == ("codec", path)
    assert measured["requests"] > 0 and measured["mean_batch"] >= 1.0
    assert measured["codec_us_per_request"] == codec["loop_cpu_us_per_request"]


async def test_the_native_handle_is_a_fronts(tmp_path: pathlib.Path) -> None:
    """The handle the native path measures is the one a front makes of the model: batched in
    the pool, counting in the model's queue Counter."""
    from aserve.batching.native import NativeBatcher
    from aserve.cli import bundled_examples
    from aserve.config import ServerSettings
    from aserve.dataplane import DataPlane

    examples = bundled_examples()
    assert examples is not None
    (tmp_path / "simple").symlink_to(examples / "simple", target_is_directory=True)
    plane = DataPlane(tmp_path, ServerSettings(engine="main", interpreters=1))
    plane.registry.queue_fronts = 1
    engines: dict[str, object] = {}
    await plane.start()
    try:
        handle = core._front_handle(plane, "simple", engines)
        assert isinstance(handle.batcher, NativeBatcher) and handle.queued is not None
        assert handle.key == plane.model("simple").key and handle.ready
    finally:
        engines["link"].close()  # type: ignore[attr-defined]
        await plane.close(timeout=10)


def test_unknown_paths_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        core.main(["--paths", "codec,http"])
    assert exit_.value.code == 2
    assert "--paths: expected codec, plane, front and/or native, got http" in capsys.readouterr().err
