"""The sampler as the OpenTelemetry SDK's samplers decide, at the start of each request."""

from __future__ import annotations

import math

from aserve.tracing import Resolved, Tracer, parse_traceparent, traceparent

LOW = 0x0000000000000000_0000000000000001  # low 64 bits far below any ratio's bound
HIGH = 0x0000000000000000_FFFFFFFFFFFFFFFF  # low 64 bits above every ratio's bound


def tracer(sampler: str, ratio: float = 1.0) -> Tracer:
    return Tracer(Resolved(sampler=sampler, ratio=ratio, exporter_env={}))


def test_roots_follow_the_ratio() -> None:
    n = 20_000
    for ratio in (0.0, 1.0, 0.25, 0.01):
        t = tracer("parentbased_traceidratio", ratio)
        t.seed(7)  # the first run of unsampled roots drawn from the seeded generator
        kept = [t.start({}) for _ in range(n)]
        count = sum(k is not None for k in kept)
        assert abs(count - n * ratio) <= 4 * math.sqrt(n * ratio * (1 - ratio)), (ratio, count)  # 4 sigma
        # each sampled root's id keeps the traceidratio rule: its low 64 bits under the ratio's bound
        assert all(k.trace_id & (2**64 - 1) < ratio * 2**64 for k in kept if k is not None)
    assert tracer("always_on", 0.0).start({}) is not None
    assert tracer("always_off", 1.0).start({}) is None


def test_parentbased_follows_the_callers_flag_and_continues_its_trace() -> None:
    t = tracer("parentbased_traceidratio", 0.0)  # roots never sampled: the flag alone decides
    trace = t.start({"traceparent": traceparent(HIGH, 0xABC, sampled=True)})
    assert trace is not None and trace.trace_id == HIGH and trace.parent_id == 0xABC and trace.remote
    assert t.start({"traceparent": traceparent(LOW, 0xABC, sampled=False)}) is None
    # a malformed header starts a root, judged by the ratio
    assert t.start({"traceparent": "00-zz-01"}) is None


def test_traceidratio_judges_the_callers_trace_id_not_its_flag() -> None:
    t = tracer("traceidratio", 0.5)
    kept = t.start({"traceparent": traceparent(LOW, 0x1, sampled=False)})
    assert kept is not None and kept.trace_id == LOW and kept.parent_id == 0x1
    assert t.start({"traceparent": traceparent(HIGH, 0x1, sampled=True)}) is None


def test_sampler_and_ratio_change_at_run_time() -> None:
    t = tracer("parentbased_always_off")
    assert t.start({}) is None
    t.sampler = "parentbased_traceidratio"
    t.set_ratio(1.0)
    assert t.start({}) is not None
    t.set_ratio(0.0)
    assert t.start({}) is None
    t.sampler = "always_on"
    assert t.start({}) is not None
    t.enabled = False
    assert t.start({}) is None


def test_traceparent_is_read_as_w3c_trace_context_defines_it() -> None:
    trace_id, span_id = 0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331
    good = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    assert parse_traceparent(good) == (trace_id, span_id, True)
    assert parse_traceparent(f"  {good}\t") == (trace_id, span_id, True)  # optional whitespace around it
    assert parse_traceparent(good[:-2] + "00") == (trace_id, span_id, False)
    assert parse_traceparent(good[:-2] + "03") == (trace_id, span_id, True)  # the sampled bit alone decides
    assert parse_traceparent("01" + good[2:] + "-later-fields") == (trace_id, span_id, True)  # a future version
    for bad in ("", "00", good + "-extra",  # version 00 has exactly four fields
                "ff" + good[2:],  # version ff is invalid
                "00-00000000000000000000000000000000-b7ad6b7169203331-01",  # all-zero trace id
                "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",  # all-zero span id
                "00-0af7651916cd43dd8448eb211c80319-cb7ad6b7169203331-01",  # a field one short
                "00-0x0f7651916cd43dd8448eb211c80319c-b7ad6b716920333-01",
                "00-+af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",  # not hex (int() would take it)
                "00-0af7651916cd43dd8448eb211c8031_c-b7ad6b7169203331-01",
                "01" + good[2:] + "x"):  # more fields must follow a dash
        assert parse_traceparent(bad) is None, bad
        assert tracer("parentbased_always_off").start({"traceparent": bad}) is None  # a root, never sampled
