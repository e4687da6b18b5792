"""The decoders' fuzz targets, short: every seed replayed, seeded mutations of them, and a few
thousand atheris executions per target. The long form (a minute per target):
`python -m tests.fuzz.run --seconds 60` (see tests/fuzz/run.py)."""

from __future__ import annotations

import pathlib
import random
import sys
import tempfile

import pytest

from aserve.errors import InvalidInput
from aserve.server.connection import Connection

from . import run, segments, targets
from .mutate import STRUCTURED

CORPUS = pathlib.Path(__file__).resolve().parent / "corpus"
RUNS = 3000  # atheris executions per target in the suite
# ... fewer for the segmentation target: each of its executions feeds the stream cut tens of ways
RUNS_OF = {"http_segments": 600}
MUTATIONS = 300  # seeded mutations per target, without atheris


def seeds(target: str) -> list[bytes]:
    files = sorted((CORPUS / target).iterdir())
    assert files, f"no seed corpus for {target}"
    return [f.read_bytes() for f in files]


DECODERS = [t for t in run.TARGETS if not t.startswith("http_")]


@pytest.mark.parametrize("target", DECODERS)
def test_seeds_decode_to_runnable_requests(target: str) -> None:
    """Every seed is a real request of one of the fuzz schemas' models, and decodes."""
    for data in seeds(target):
        targets.TARGETS[target](data)
        accepted = []
        for schema in targets.SCHEMAS:
            try:
                targets.decode(target, data, schema)
                accepted.append(schema.name)
            except InvalidInput:
                pass
        assert len(accepted) == 1, (target, data[:80], accepted)


def test_http_seeds_are_requests_both_parsers_read() -> None:
    """Every HTTP seed is a stream of requests h11 reads whole, and the front answers each."""
    for data in seeds("http_front"):
        targets.http_front(data)
        assert targets._h11_requests(data), data


def test_the_http_target_catches_a_front_that_splits_a_stream_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    """The property holds only where the front and h11 agree on where requests end: a front
    that handed a handler a wrong body would be caught."""
    data = b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabcGET /b HTTP/1.1\r\nHost: x\r\n\r\n"
    targets.http_front(data)
    original = targets._h11_requests
    monkeypatch.setattr(targets, "_h11_requests", lambda d: [(m, t, b + b"!") for m, t, b in original(d)])
    with pytest.raises(targets.Failure, match="read the stream differently"):
        targets.http_front(data)


def test_http_segment_seeds_mean_the_same_however_cut() -> None:
    """Every seed of the segmentation target is answered the same in one read and cut every way
    `segments.segmentations` cuts it; some seeds are short enough to be cut at every byte."""
    answered = 0
    for data in seeds("http_segments"):
        before = segments._loops().cut.stats.requests
        segments.http_segments(data)
        answered += segments._loops().cut.stats.requests > before
    assert answered == len(seeds("http_segments"))
    assert any(len(data) <= segments.SHORT for data in seeds("http_segments"))


def test_the_segments_target_catches_a_front_that_reads_a_cut_stream_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    """A connection that took a method split over reads for the gap between two requests (as
    it did before it marked a request begun at its first byte) answers a known head behind
    `G` on its own: caught."""
    data = (CORPUS / "http_segments" / "known_head").read_bytes()
    segments.http_segments(data)
    begin = Connection.on_message_begin

    def on_url(self: Connection, url: bytes) -> None:  # as it was: the target's first piece begins the request
        if not self._head:
            begin(self)
        self._url += url

    monkeypatch.delattr(Connection, "on_message_begin")  # parsers made from now on do not call it
    monkeypatch.setattr(Connection, "on_url", on_url)
    with pytest.raises(segments.Failure, match="answered otherwise"):
        segments.http_segments(data)


@pytest.mark.parametrize("target", run.TARGETS)
def test_seeded_mutations_keep_the_property(target: str) -> None:
    """Without a fuzzer: structured and byte mutations of the seeds, each input checked by the
    target (a violation raises)."""
    rng = random.Random(f"aserve-{target}")
    corpus = seeds(target)
    for _ in range(MUTATIONS):
        data = rng.choice(corpus)
        for _ in range(rng.randint(1, 3)):
            if rng.random() < 0.6:
                data = STRUCTURED[target](data, rng) or data
            elif data:
                buf = bytearray(data)
                pos = rng.randrange(len(buf))
                buf[pos:pos + rng.randint(0, 4)] = rng.randbytes(rng.randint(0, 4))
                data = bytes(buf)
        targets.TARGETS[target](data)


@pytest.mark.parametrize("target", run.TARGETS)
def test_atheris_short_run(target: str) -> None:
    try:
        import atheris  # noqa: F401
    except ImportError:
        pytest.skip(f"atheris is not installed for Python {sys.version.split()[0]} (pip install atheris); "
                    "the long form is `python -m tests.fuzz.run --seconds 60`")
    with tempfile.TemporaryDirectory(prefix="aserve-fuzz-") as scratch:
        base = pathlib.Path(scratch)
        runs = RUNS_OF.get(target, RUNS)
        result = run.run_target(target, seconds=None, runs=runs, timeout=10, rss_limit_mb=2048, max_len=8192,
                                work=base / "corpus", artifacts=base / "artifacts", python=sys.executable)
        crashes = [{**f, "input_bytes": pathlib.Path(f["input"]).read_bytes()[:500]}
                   for f in result["failures"] if f.get("input")]
    assert result["crashes"] == 0, crashes or result["failures"]
    assert result["executions"] >= runs, result
