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
from aserve.server.grpc import h2 as grpc_h2

from . import grpc_front, run, segments, targets
from .mutate import STRUCTURED

CORPUS = pathlib.Path(__file__).resolve().parent / "corpus"
RUNS = 3000  # atheris executions per target in the suite
# ... fewer for the segmentation target: each of its executions feeds the stream cut tens of ways
RUNS_OF = {"http_segments": 600, "grpc_segments": 300}
MUTATIONS = 300  # seeded mutations per target, without atheris


def seeds(target: str) -> list[bytes]:
    files = sorted((CORPUS / target).iterdir())
    assert files, f"no seed corpus for {target}"
    return [f.read_bytes() for f in files]


DECODERS = [t for t in run.TARGETS if not t.startswith(("http_", "grpc_"))]


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


def test_grpc_seeds_are_calls_both_readers_read() -> None:
    """Every gRPC seed keeps the property, and most carry calls that the handlers receive and h2
    reads alike: the comparison is not vacuous."""
    compared = 0
    for data in seeds("grpc_front"):
        grpc_front.grpc_front(data)
        stream = data[1:]
        served = grpc_front.serve(stream, [])
        reading = grpc_front.read_reference(stream, grpc_front.sent(stream))
        compared += bool(served.calls) and all(s in reading.requests for s in served.calls)
    assert compared >= len(seeds("grpc_front")) // 2


def test_grpc_segment_seeds_are_steady() -> None:
    """Every seed of the gRPC segmentation target is one whose meaning cannot depend on when the
    server answers, so its cuts are compared; one is short enough to be cut at every byte."""
    for data in seeds("grpc_segments"):
        client = grpc_front.sent(data)
        served = grpc_front.serve(data, [])
        answers = grpc_front.read_answers(served.writes, client)
        assert grpc_front.steady(client, grpc_front.read_reference(data, client), answers), data[:80]
        grpc_front.grpc_segments(data)
    assert any(len(data) <= grpc_front.SHORT for data in seeds("grpc_segments"))


def test_the_grpc_target_catches_a_front_that_hands_a_handler_other_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A connection that handed its handlers a message h2 does not read in the stream is caught."""
    data = (CORPUS / "grpc_front" / "stream").read_bytes()
    grpc_front.grpc_front(data)
    message = grpc_h2.Connection.message
    monkeypatch.setattr(grpc_h2.Connection, "message", lambda self, stream, data, compressed: message(
        self, stream, data + b"!", compressed))
    with pytest.raises(grpc_front.Failure, match="where h2 reads"):
        grpc_front.grpc_front(data)


def test_the_grpc_target_catches_malformed_trailers(monkeypatch: pytest.MonkeyPatch) -> None:
    """A grpc-message sent as it is (a newline, non-ASCII) is an answer h2 refuses: caught."""
    data = (CORPUS / "grpc_front" / "abort").read_bytes()
    grpc_front.grpc_front(data)
    monkeypatch.setattr("aserve.server.grpc.h2.percent", lambda text: text)
    with pytest.raises(grpc_front.Failure, match="h2 refuses what the server wrote"):
        grpc_front.grpc_front(data)


def test_the_grpc_segments_target_catches_a_front_that_reads_a_cut_stream_otherwise(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A connection that took a read's END events before its messages answers a stream that
    arrives in one read otherwise than one cut between them: caught."""
    data = (CORPUS / "grpc_segments" / "stream").read_bytes()
    grpc_front.grpc_segments(data)

    class EndsFirst:
        def __init__(self, h2: object) -> None:
            self.h2 = h2

        def __getattr__(self, name: str) -> object:
            return getattr(self.h2, name)

        def feed(self, data: bytes) -> list[tuple[object, ...]]:
            return sorted(self.h2.feed(data), key=lambda event: event[0] != grpc_h2.END)  # type: ignore[attr-defined]

    init = grpc_h2.Connection.__init__

    def ends_first(self: grpc_h2.Connection, server: grpc_h2.GrpcServer) -> None:
        init(self, server)
        self.h2 = EndsFirst(self.h2)  # type: ignore[assignment]

    monkeypatch.setattr(grpc_h2.Connection, "__init__", ends_first)
    with pytest.raises(grpc_front.Failure, match="answered otherwise"):
        grpc_front.grpc_segments(data)


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
