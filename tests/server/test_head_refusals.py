"""Overload refused from a request's head: a model whose queue would refuse any request gets
503 with Retry-After before the body is read, the body is dropped undecoded, the refusal is
counted once, and the connection goes on with the next request.

The models hold their batches until the test opens a gate (a file), so that the queue is
provably full (or an interpreter provably busy) while the refused requests arrive.
"""

from __future__ import annotations

import asyncio
import json
import pathlib

import aiohttp
import pytest

from .conftest import MODELS, logged, write_repository
from .test_http_front import add_request, expected_sum, read_response
from .test_metrics import scrape, scrape_until, value

pytestmark = pytest.mark.serial  # timed against the CPU it gets: run alone (pyproject's markers)

# Y = 2 X (FP32 rows of one); a negative X holds its batch until the file `gate` exists;
# every call first sleeps `delay_ms`.
GATE_MODEL = '''
import os
import time
from array import array
from aserve.runtime import Model, TensorSpec

class Gate(Model):
    inputs = [TensorSpec("X", "FP32", (-1, 1))]
    outputs = [TensorSpec("Y", "FP32", (-1, 1))]

    def load(self):
        self.gate = self.parameters["gate"]
        self.delay = float(self.parameters.get("delay_ms", 0)) / 1000.0

    def __call__(self, inputs):
        x = inputs["X"].cast("B").cast("f")
        if self.delay:
            time.sleep(self.delay)
        if any(v < 0 for v in x):
            end = time.monotonic() + 60
            while not os.path.exists(self.gate) and time.monotonic() < end:
                time.sleep(0.001)
        return {"Y": array("f", [2 * v for v in x])}
'''

TENSORS = '''
[[inputs]]
name = "X"
datatype = "FP32"
shape = [-1, 1]
[[outputs]]
name = "Y"
datatype = "FP32"
shape = [-1, 1]
'''

# the window policy, one interpreter, one request running and one waiting at most
GATE_CONFIG = '''
interpreters = 1
max_batch_size = 1
{tensors}
[parameters]
gate = "{gate}"
[batching]
max_queue_size = 1
'''

# adaptive: a 20 ms budget, batches of 30 ms (any request that waits is predicted past the
# model's budget), and a timeout of 5 s (a V2 request may carry a budget up to it)
BUDGETED_CONFIG = '''
interpreters = 1
max_batch_size = 4
{tensors}
[parameters]
gate = "{gate}"
delay_ms = 30
[batching]
policy = "adaptive"
latency_budget_ms = 20
timeout_ms = 5000
'''

BIG = 1 << 20  # the body a refused request announces


@pytest.fixture
def gate(tmp_path: pathlib.Path) -> pathlib.Path:
    return tmp_path / "gate"


@pytest.fixture
def repo(tmp_path: pathlib.Path, gate: pathlib.Path) -> pathlib.Path:
    return write_repository(tmp_path / "repo", {
        "add": MODELS["add"],
        "gate": (GATE_MODEL, GATE_CONFIG.format(tensors=TENSORS, gate=gate)),
        "budgeted": (GATE_MODEL, BUDGETED_CONFIG.format(tensors=TENSORS, gate=gate)),
    })


def v2(x: float, **parameters: object) -> bytes:
    message: dict[str, object] = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 1], "data": [x]}]}
    if parameters:
        message["parameters"] = parameters
    return json.dumps(message).encode()


def head(model: str, length: int, *, path: str = "") -> bytes:
    target = path or f"/v2/models/{model}/infer"
    return (f"POST {target} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n\r\n").encode()


def request(model: str, x: float, **parameters: object) -> bytes:
    body = v2(x, **parameters)
    return head(model, len(body)) + body


async def infer(http: aiohttp.ClientSession, url: str, model: str, x: float,
                **parameters: object) -> tuple[int, object]:
    async with http.post(f"{url}/v2/models/{model}/infer", data=v2(x, **parameters),
                         headers={"Content-Type": "application/json"}) as r:
        answer = await r.json()
        return r.status, answer["outputs"][0]["data"] if r.status == 200 else answer["error"]


async def fill_the_queue(http: aiohttp.ClientSession, url: str) -> asyncio.Future[tuple[int, object]]:
    """Once the held request runs, a second one to `gate` waits: its queue of one is full.
    Returns that second request's answer to come."""
    labels = {"model": "gate", "version": "1"}
    await scrape_until(http, url, lambda m: value(m, "aserve_batches_in_flight", **labels) == 1,
                       what="the held request to run")
    waiting = asyncio.ensure_future(infer(http, url, "gate", 2.0))
    await scrape_until(http, url, lambda m: value(m, "aserve_queue_requests", **labels) == 1,
                       what="a request to wait: the queue is full")
    return waiting


def outputs(body: bytes) -> list[float]:
    data: list[float] = json.loads(body)["outputs"][0]["data"]
    return data


async def test_a_full_queue_refuses_from_the_head_and_the_connection_goes_on(
        start_server, repo: pathlib.Path, gate: pathlib.Path, http: aiohttp.ClientSession,
        caplog: pytest.LogCaptureFixture) -> None:
    server, url = await start_server(repo, access_log=True, request_timeout_s=60.0, log_level="info")
    caplog.set_level("INFO", logger="aserve.access")
    labels = {"model": "gate", "version": "1"}
    running = asyncio.ensure_future(infer(http, url, "gate", -1.0))  # held until the gate opens
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        waiting = await fill_the_queue(http, url)
        # only the head, announcing a megabyte: the answer comes before the body is sent
        writer.write(head("gate", BIG))
        status, headers, body = await read_response(reader)
        assert status == 503 and headers["retry-after"] in ("1", "2") and "connection" not in headers
        assert "max_queue_size 1" in json.loads(body)["error"]
        # the body, not JSON (decoded, it would be 400), is read and dropped; then the next request
        writer.write(b"{" * BIG)
        gate.touch()
        assert await running == (200, [-2.0]) and await waiting == (200, [4.0])
        writer.write(request("gate", 3.0))
        status, headers, body = await read_response(reader)
        assert status == 200 and outputs(body) == [6.0] and "connection" not in headers
    finally:
        gate.touch()
        writer.close()
    # counted once, as a refusal of the batcher's
    m = await scrape(http, url)
    assert value(m, "aserve_inference_refused_total", **labels) == 1
    assert value(m, "aserve_inference_request_failure_total", **labels, reason="overloaded") == 1
    assert sum(s.value for s in m.samples("aserve_inference_request_failure_total", **labels)) == 1
    assert value(m, "aserve_inference_request_success_total", **labels) == 3
    async with http.get(f"{url}/v2/models/gate/stats") as r:
        stats = (await r.json())["model_stats"][0]["inference_stats"]
    assert stats["fail"]["count"] == 1 and stats["success"]["count"] == 3
    lines = await logged(caplog, 4, lambda r: r.name == "aserve.access"
                         and r.request == "POST /v2/models/gate/infer HTTP/1.1",  # type: ignore[attr-defined]
                         "four access log lines")
    assert sorted(r.status for r in lines) == [200, 200, 200, 503]  # type: ignore[attr-defined]


async def test_a_refusal_pipelined_between_admitted_requests_is_answered_in_order(
        start_server, repo: pathlib.Path, gate: pathlib.Path, http: aiohttp.ClientSession) -> None:
    server, url = await start_server(repo, request_timeout_s=60.0)
    labels = {"model": "gate", "version": "1"}
    running = asyncio.ensure_future(infer(http, url, "gate", -1.0))
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        await scrape_until(http, url, lambda m: value(m, "aserve_batches_in_flight", **labels) == 1,
                           what="the held request to run")
        # on one connection: a request that is admitted and fills the queue, then one refused
        # from its head (its body still on the way), then one to another model
        writer.write(request("gate", 5.0))
        await scrape_until(http, url, lambda m: value(m, "aserve_queue_requests", **labels) == 1,
                           what="the first request to wait: the queue is full")
        writer.write(head("gate", BIG) + b"[" * (BIG // 2))
        await scrape_until(http, url, lambda m: value(m, "aserve_inference_refused_total", **labels) == 1,
                           what="the second request refused from its head", timeout=10.0)
        writer.write(b"[" * (BIG - BIG // 2) + add_request(7))
        gate.touch()
        assert await running == (200, [-2.0])
        status, _, body = await read_response(reader)
        assert status == 200 and outputs(body) == [10.0]
        status, headers, body = await read_response(reader)
        assert status == 503 and headers["retry-after"] in ("1", "2")
        status, _, body = await read_response(reader)
        assert status == 200 and outputs(body) == expected_sum(7)
    finally:
        gate.touch()
        writer.close()


async def test_the_head_allows_for_the_loosest_budget_a_request_may_carry(
        start_server, repo: pathlib.Path, gate: pathlib.Path, http: aiohttp.ClientSession) -> None:
    """Behind a busy interpreter, a request is predicted past the model's 20 ms budget, but
    not past a budget of 2 s of its own. TF-Serving requests carry none: refused from the
    head. A V2 request may carry one up to the model's timeout: its head is let on, and its
    body decides (admitted with 2 s, refused without). Each refusal counts once."""
    server, url = await start_server(repo, request_timeout_s=60.0)
    labels = {"model": "budgeted", "version": "1"}
    running = asyncio.ensure_future(infer(http, url, "budgeted", -1.0))
    conns = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(2)]
    try:
        await scrape_until(http, url, lambda m: value(m, "aserve_batches_in_flight", **labels) == 1,
                           what="the held request to run")
        # TF-Serving predict: the model's own budget; refused before its body is sent
        (reader, writer), (loose_reader, loose_writer) = conns
        writer.write(head("budgeted", BIG, path="/v1/models/budgeted:predict"))
        status, headers, body = await read_response(reader)
        assert status == 503 and headers["retry-after"] and "latency budget" in json.loads(body)["error"]
        writer.write(b"{" * BIG)
        # V2 with a budget of its own: let on from its head, admitted with its body
        loose = v2(4.0, latency_budget_ms=2000)
        loose_writer.write(head("budgeted", len(loose)))
        await loose_writer.drain()
        loose_writer.write(loose)
        await scrape_until(http, url, lambda m: value(m, "aserve_queue_requests", **labels) == 1,
                           what="the request with its own budget to wait")
        # V2 without one: let on from its head too (a body that is not JSON is read: 400), and
        # refused by the exact rule once its body says it carries no budget
        async with http.post(f"{url}/v2/models/budgeted/infer", data=b"{",
                             headers={"Content-Type": "application/json"}) as r:
            assert r.status == 400
        status, error = await infer(http, url, "budgeted", 1.0)
        assert status == 503 and "latency budget" in str(error)
        m = await scrape(http, url)
        assert value(m, "aserve_inference_refused_total", **labels) == 2
        gate.touch()
        assert await running == (200, [-2.0])
        status, _, body = await read_response(loose_reader)
        assert status == 200 and outputs(body) == [8.0]
        # the connection refused from its head goes on
        writer.write(request("budgeted", 1.5))
        status, _, body = await read_response(reader)
        assert status == 200 and outputs(body) == [3.0]
    finally:
        gate.touch()
        for _, w in conns:
            w.close()
    m = await scrape(http, url)
    assert value(m, "aserve_inference_refused_total", **labels) == 2
    assert value(m, "aserve_inference_request_failure_total", **labels, reason="overloaded") == 2


async def test_a_client_that_ignores_retry_after_is_held_and_one_that_waits_is_not(
        start_server, repo: pathlib.Path, gate: pathlib.Path, http: aiohttp.ClientSession) -> None:
    """Refused for overload and sending again at once, a client's next request is read only
    after a hold (here, a full queue's Retry-After of 1 s, less a random half at most); a
    client that waited as told is answered at once. Every refusal counts once."""
    server, url = await start_server(repo, request_timeout_s=60.0)
    labels = {"model": "gate", "version": "1"}
    running = asyncio.ensure_future(infer(http, url, "gate", -1.0))
    eager, patient = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(2)]
    loop = asyncio.get_running_loop()

    async def refused(conn: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> tuple[float, int]:
        """Send one request; (seconds until its 503, its Retry-After)."""
        reader, writer = conn
        sent = loop.time()
        writer.write(request("gate", 1.0))
        status, headers, _ = await read_response(reader)
        assert status == 503, status
        return loop.time() - sent, int(headers["retry-after"])

    try:
        waiting = await fill_the_queue(http, url)
        # the eager client: the first refusal holds nothing; the second came early, and holds
        # the connection: the third is read only after the hold
        await refused(eager)
        await refused(eager)
        took, _ = await refused(eager)
        assert took >= 0.45, took
        # the patient client waits as told each time: never held
        _, told = await refused(patient)
        await asyncio.sleep(told)
        took, told = await refused(patient)
        assert took < 0.45, took
        m = await scrape(http, url)
        assert value(m, "aserve_inference_refused_total", **labels) == 5
        gate.touch()
        assert await running == (200, [-2.0]) and await waiting == (200, [4.0])
        # once the queue has room, the held connection serves as before
        reader, writer = eager
        writer.write(request("gate", 3.0))
        status, _, body = await read_response(reader)
        assert status == 200 and outputs(body) == [6.0]
    finally:
        gate.touch()
        for _, w in (eager, patient):
            w.close()


async def test_a_refused_request_sent_again_byte_for_byte_is_judged_by_admission_alone(
        start_server, repo: pathlib.Path, gate: pathlib.Path, http: aiohttp.ClientSession,
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client that sends the very bytes of a request its model's admission refused, again at
    once: each time refused as the first was (503, Retry-After, the queue's message), held as
    any early client is, counted once and access-logged, with its body not decoded again (on
    the host's loop, where the test sees the codec); once the queue has room, the same bytes
    are admitted and answered."""
    from aserve.protocol.v2 import V2Codec

    decoded = []
    decode = V2Codec.decode

    def counting(self: V2Codec, call: object, schema: object) -> object:
        decoded.append(call)
        return decode(self, call, schema)  # type: ignore[arg-type]

    monkeypatch.setattr(V2Codec, "decode", counting)
    server, url = await start_server(repo, access_log=True, request_timeout_s=60.0, log_level="info")
    caplog.set_level("INFO", logger="aserve.access")
    labels = {"model": "gate", "version": "1"}
    running = asyncio.ensure_future(infer(http, url, "gate", -1.0))
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    data = request("gate", 1.5)
    try:
        waiting = await fill_the_queue(http, url)
        before = len(decoded)
        for _ in range(3):
            writer.write(data)
            status, headers, body = await read_response(reader)
            assert status == 503 and headers["retry-after"] in ("1", "2") and "connection" not in headers
            assert "max_queue_size 1" in json.loads(body)["error"]
        if server.loops is None:
            assert len(decoded) - before == 1, "the same bytes were decoded again"
        m = await scrape(http, url)
        assert value(m, "aserve_inference_refused_total", **labels) == 3
        assert value(m, "aserve_inference_request_failure_total", **labels, reason="overloaded") == 3
        gate.touch()
        assert await running == (200, [-2.0]) and await waiting == (200, [4.0])
        writer.write(data)
        status, _, body = await read_response(reader)
        assert status == 200 and outputs(body) == [3.0]
    finally:
        gate.touch()
        writer.close()
    m = await scrape(http, url)
    assert value(m, "aserve_inference_refused_total", **labels) == 3
    assert value(m, "aserve_inference_request_success_total", **labels) == 3
    lines = await logged(caplog, 6, lambda r: r.name == "aserve.access"
                         and r.request == "POST /v2/models/gate/infer HTTP/1.1",  # type: ignore[attr-defined]
                         "six access log lines")
    assert sorted(r.status for r in lines) == [200, 200, 200, 503, 503, 503]  # type: ignore[attr-defined]
