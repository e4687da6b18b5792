"""HTTP throughput, latency, memory and CPU of aserve and its peers, side by side in one run.

    python -m benchmarks.http [--json FILE] [--plot FILE] [--models simple,mlp] [--connections 1,8,32,64,256]
                              [--bodies json,binary] [--duration S] [--servers aserve,aserve-main,ceiling,inline,mosec,mosec-native]

For each model, each server and each request body it starts the server on loopback
(one at a time, so that each has the machine to itself), sends one request and checks
the answer's values against values computed here (a wrong answer is an error record,
never a number), warms up for `--warmup` seconds, then drives `POST
/v2/models/{model}/infer` at each connection count for `--duration` seconds with wrk
(`-t1 --latency`, a Lua script that sets the body and headers; a multi-process aiohttp
client when wrk is not installed) and prints one JSON record per point.

Servers (`--servers`):
- `aserve`: `aserve serve REPO --interpreters 2` with its default engine; REPO holds only
  the benchmarked model, so its memory is that model's.
- `aserve-main`: the same with `--engine main` (threads of the host interpreter).
- `aserve-nogrpc`: the same with `--no-grpc` (no gRPC server in any loop), only when named.
- `aserve-nospin`: the same with `--spin-us 0` (threads block at once rather than poll for
  work: the baseline of polling), only when named.
- `aserve-loops0` .. `aserve-loops4`, `aserve-loops6`, `aserve-loops8`, `aserve-loops10`, `aserve-loops12`: the same with
  `--loops N`; `aserve-loops2-loop`: two fronts batching with a batcher each
  (`--front-batching loop`, the baseline of one queue per model in the pool), only when named.
- `aserve-trace`, `aserve-trace1`: the same with OpenTelemetry tracing on, sampling every
  request or one in 100, sending to a local OTLP sink, only when named.
- `aserve-same`: `aserve` once more, unchanged, only when named: with `--repeat` it shows
  how far two runs of one server differ, the noise a difference is judged against.
- `ceiling`: aiohttp + uvloop answering a fixed body without decoding: what one event loop
  can do (`benchmarks.peers.ceiling`).
- `inline`: aiohttp + uvloop decoding the V2 request and running the model in the handler
  (`benchmarks.peers.inline`).
- `mosec`: MOSEC 0.9.8 (Rust front; a worker process per aserve interpreter, `--interpreters`;
  batches of up to 8, 10 ms wait) in its own virtual environment, created with pip on first
  use under `--peer-venvs` (default ~/.cache/aserve/peers; msgspec with it, torch==2.13.0
  added for mlp), its workers decoding and encoding V2 JSON with msgspec Structs
  (`benchmarks.peers.mosec_server`).
  It reads binary requests but answers V2 JSON (it cannot set the response's header-length
  header).
- `mosec-native`: the same MOSEC, serving its own minimal msgspec JSON body instead of V2
  (`benchmarks.peers.mosec_native`; simple `{"a", "b"}` -> `{"sum", "difference"}`, mlp
  `{"x"}` -> `{"y"}`), driven with a body of that format carrying the same values and
  checked against the same answers; JSON only (its point is recorded as body `json`, a
  binary point is skipped). MOSEC at its fastest: the summary compares aserve with the
  faster of the two MOSEC rows.

Bodies: `json` (V2 JSON tensors) and `binary` (the binary tensor extension, asking for
binary outputs), one sample per request; `nested` when asked for (`--bodies nested`): the
JSON body with each input's data nested one list per dimension, as numpy's `tolist()`
writes it (aserve and the ceiling only: the peers' V2 codecs read the flat data V2
specifies).

Each point's record:

| key | meaning |
| --- | --- |
| `server`, `model`, `body`, `connections` | what ran |
| `requests_per_s`, `p50_ms`, `p99_ms`, `requests`, `duration_s` | wrk's figures for the measured interval |
| `errors` = `non_2xx` + `socket_errors` | every answer counts: a non-2xx status or a connect/read/write error or timeout is an error |
| `pss_mb` | PSS of the server's whole process tree (psutil `memory_full_info().pss`, summed) after the point; `pss_mb_after_warmup` before the sweep |
| `loop_cpu_us_per_request` | CPU (utime + stime, `/proc/PID/task/TID/stat`) of the server's event-loop threads during the point (the main thread's and, under `--loops`, the front loops'), over the requests completed; for MOSEC the Rust front process's CPU (all its threads): `loop_cpu_source` says which |
| `thread_cpu_us_per_request` | the same per thread group, by thread name (`servers.thread_cpu_s`, the server's own `aserve.server.threads`): `host` (the main thread), `loops` (front loops), `interpreters` (and the threads their models start), `other`; None for MOSEC |
| `server_cpu_cores` | CPU seconds of the whole server tree over wall seconds |
| `server_cpu_us_per_request` | CPU of the whole server tree over the requests completed |
| `generator_cpu_cores` | the load generator's CPU seconds (getrusage of children) over wall seconds |
| `generator`, `threads` | `wrk` or `aiohttp`, and its threads or processes |
| `response` | whether the answer was V2 JSON or binary |

Records that are not points: `{"error": ...}` (a server that failed to start, a wrong
answer, a non-zero exit on SIGTERM; `errors` is 1), `{"skipped": ...}` (e.g. mlp without
torch, MOSEC that pip could not install), `{"generator_check": true}` (below), and last
`{"summary": ...}` with the ratios the targets are judged by, against the ceiling
measured in the same run: each server's peak requests/s over the ceiling's peak, per
model and body; aserve's peak against the faster MOSEC row's (`versus_mosec`, the headline);
aserve's p50 at one connection; aserve's server CPU per request at one connection over
the ceiling's (`server_cpu_at_1_connection_vs_ceiling`; with `--repeat`, also the median of
each round's ratio); aserve's loop CPU per request at its peak; aserve's PSS over MOSEC's
for mlp (the leaner MOSEC row's).

Is the generator the bottleneck? wrk runs on the same machine and takes CPU from the
servers. It is not the limit while `generator_cpu_cores` stays well below `--threads` (one
wrk thread is one core; default 1) when the server is saturated (`server_cpu_cores` near the
cores it can use, or its loop thread near 1.0: `loop_cpu_us_per_request` times
`requests_per_s` near 1e6). The run also measures the ceiling once more with twice the
threads at the highest connection count (the `generator_check` record, summarised at the
end): if twice the threads get no more out of the ceiling, the threads were enough.
`--no-generator-check` skips it. On many cores, where several loops serve (`--servers
aserve-loops4`), one wrk thread cannot load them: give `--threads` a core each.

`--plot FILE` writes a PNG (matplotlib, from the `bench` extra: `pip install -e '.[bench]'`):
for each model and body, requests/s and p99 against connections, per server.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import pathlib
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from array import array
from collections.abc import Iterator
from typing import Any, NamedTuple

import msgspec

from aserve.cli import bundled_examples
from aserve.protocol.arrays import nest

from . import loadgen, servers
from .peers import models as peer_models
from .peers import native, v2
from .peers.ceiling import BODY as CEILING_BODY
from .servers import ServerFailed, ServerProcess

MODELS = ("simple", "mlp", "cnn")  # cnn: aserve only (the peers serve simple and mlp)
DEFAULT_MODELS = ("simple", "mlp")
PEERS = ("inline", "mosec", "mosec-native")
MOSECS = ("mosec", "mosec-native")
# the sizing table's p99 bounds: cnn's is its example's latency budget; the others answer in
# well under a millisecond unloaded, so 10 ms is their queueing allowance
SIZING_P99_MS = {"simple": 10.0, "mlp": 10.0, "cnn": 50.0}
BODIES = ("json", "binary")
KNOWN_BODIES = (*BODIES, "nested")  # nested: asked for by name; aserve and the ceiling only
DEFAULT_CONNECTIONS = (1, 8, 32, 64, 256)
POINT_FIELDS = (
    "bench", "server", "model", "body", "connections", "requests_per_s", "p50_ms", "p99_ms", "errors",
    "non_2xx", "socket_errors", "pss_mb", "loop_cpu_us_per_request", "server_cpu_cores",
    "server_cpu_us_per_request", "generator_cpu_cores", "duration_s",
)
HEADER_LENGTH = "inference-header-content-length"


# ---- requests and the answers they must get ------------------------------------------

class Case(NamedTuple):
    model: str
    body_kind: str  # "json", "binary" or "nested"
    body: bytes
    headers: dict[str, str]
    expected: dict[str, v2.Tensor]
    native: bytes = b""  # the same values in MOSEC's own JSON body (mosec-native), where the model has one


class Skip(Exception):
    """This model cannot be benchmarked in this environment; the message says why."""


def sample_inputs(model: str, seed: int = 0) -> dict[str, v2.Tensor]:
    rng = random.Random(seed)
    if model == "simple":
        ints = [array("i", [rng.randrange(-1000, 1000) for _ in range(16)]) for _ in range(2)]
        return {f"INPUT{i}": v2.Tensor("INT32", (1, 16), a.tobytes()) for i, a in enumerate(ints)}
    if model == "mlp":
        return {"INPUT": v2.Tensor("FP32", (1, 16), array("f", [rng.gauss(0, 1) for _ in range(16)]).tobytes())}
    if model == "cnn":
        image = array("f", [rng.gauss(0, 1) for _ in range(3 * 64 * 64)])
        return {"IMAGE": v2.Tensor("FP32", (1, 3, 64, 64), image.tobytes())}
    raise ValueError(f"no sample input for model {model!r}")


def expected_outputs(model: str, inputs: dict[str, v2.Tensor], examples: pathlib.Path) -> dict[str, v2.Tensor]:
    """The right answer, computed here: simple's sums; mlp and cnn with torch and the example's own network."""
    if model == "simple":
        a, b = inputs["INPUT0"].values(), inputs["INPUT1"].values()

        def wrap(v: int) -> int:  # int32 arithmetic
            return (v + 2**31) % 2**32 - 2**31

        return {
            "OUTPUT0": v2.Tensor("INT32", (1, 16), array("i", [wrap(x + y) for x, y in zip(a, b)]).tobytes()),
            "OUTPUT1": v2.Tensor("INT32", (1, 16), array("i", [wrap(x - y) for x, y in zip(a, b)]).tobytes()),
        }
    try:
        import torch
    except ImportError as e:
        raise Skip(f"torch is not installed for Python {platform.python_version()}: mlp needs it") from e
    spec = importlib.util.spec_from_file_location(f"_benchmarks_reference_{model}", examples / model / "model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    (x_in,) = inputs.values()
    x = torch.tensor(x_in.values().tolist(), dtype=torch.float32).view(*x_in.shape)
    net = module.build() if model == "mlp" else torch.nn.Sequential(*module.build())
    with torch.inference_mode():
        y = net(x)
    out = "OUTPUT" if model == "mlp" else "SCORES"
    return {out: v2.Tensor("FP32", tuple(y.shape), array("f", y.flatten().tolist()).tobytes())}


def encode_request(inputs: dict[str, v2.Tensor], kind: str) -> tuple[bytes, dict[str, str]]:
    items: list[dict[str, Any]] = [{"name": n, "datatype": t.datatype, "shape": list(t.shape)}
                                   for n, t in inputs.items()]
    if kind in ("json", "nested"):
        for item, t in zip(items, inputs.values(), strict=True):
            values = t.values().tolist()
            item["data"] = nest(values, t.shape) if kind == "nested" else values
        return json.dumps({"inputs": items}).encode(), {"Content-Type": "application/json"}
    for item, t in zip(items, inputs.values(), strict=True):
        item["parameters"] = {"binary_data_size": len(t.data)}
    head = json.dumps({"inputs": items, "parameters": {"binary_data_output": True}}).encode()
    headers = {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(head))}
    return head + b"".join(t.data for t in inputs.values()), headers


def make_cases(model: str, bodies: list[str], examples: pathlib.Path) -> dict[str, Case]:
    inputs = sample_inputs(model)
    expected = expected_outputs(model, inputs, examples)
    own = native.request_body(model, inputs) if model in native.REQUESTS else b""
    return {kind: Case(model, kind, *encode_request(inputs, kind), expected, own) for kind in bodies}


def native_cases(cases: dict[str, Case]) -> dict[str, Case]:
    """mosec-native's requests: the JSON case's values in MOSEC's own body (it has no binary one)."""
    return {kind: case._replace(body=case.native, headers={"Content-Type": "application/json"})
            for kind, case in cases.items() if kind == "json"}


def check_answer(server: str, case: Case, status: int, headers: dict[str, str], body: bytes) -> tuple[str | None, str]:
    """(what is wrong with the answer or None, "json" | "binary")."""
    if status != 200:
        return f"status {status}: {body[:300]!r}", "json"
    if server == "ceiling":
        return (None if body == CEILING_BODY else f"unexpected body {body[:300]!r}"), "json"
    lower = {k.lower(): v for k, v in headers.items()}
    length = int(lower[HEADER_LENGTH]) if HEADER_LENGTH in lower else None
    response = "native" if server == "mosec-native" else "json" if length is None else "binary"
    try:
        outputs = native.outputs(case.model, body) if response == "native" else v2.decode_response(body, length)
    except (ValueError, KeyError, TypeError, msgspec.DecodeError) as e:
        return f"unreadable answer ({e}): {body[:300]!r}", response
    for name, want in case.expected.items():
        got = outputs.get(name)
        if got is None:
            return f"output {name} missing from {body[:300]!r}", response
        if got.datatype != want.datatype or tuple(got.shape) != tuple(want.shape):
            return f"output {name} is {got.datatype} {list(got.shape)}, expected {want.datatype} {list(want.shape)}", response
        g, w = got.values(), want.values()
        if want.datatype == "FP32":
            bad = [i for i, (a, b) in enumerate(zip(g, w)) if abs(a - b) > 1e-4 + 1e-4 * abs(b)]
        else:
            bad = [i for i, (a, b) in enumerate(zip(g, w)) if a != b]
        if bad or len(g) != len(w):
            i = bad[0] if bad else min(len(g), len(w))
            return f"output {name} is wrong at element {i}: got {list(g)[:16]}, expected {list(w)[:16]}", response
    return None, response


# ---- one run ------------------------------------------------------------------------

class Run:
    """The run's settings and what it set up once (MOSEC's environment, per-model repositories)."""

    def __init__(self, args: argparse.Namespace, examples: pathlib.Path, generator: str, tmp: pathlib.Path) -> None:
        self.args = args
        self.examples = examples
        self.generator = generator
        self.tmp = tmp
        self.seconds = max(1, math.ceil(args.duration))
        self.generator_checked = not args.generator_check or generator != "wrk"
        self._mosec: tuple[pathlib.Path, str] | ServerFailed | None = None
        self._sink: tuple[subprocess.Popen[bytes], str] | None = None

    def repository(self, model: str) -> pathlib.Path:
        """A model repository holding only `model` (a symlink to the example)."""
        repo = self.tmp / f"repository-{model}"
        if not repo.exists():
            repo.mkdir()
            (repo / model).symlink_to((self.examples / model).resolve(), target_is_directory=True)
        return repo

    def mosec(self) -> tuple[pathlib.Path, str]:
        if self._mosec is None:
            try:
                self._mosec = servers.mosec_python(self.args.peer_venvs, torch="mlp" in self.args.models)
            except ServerFailed as e:
                self._mosec = e
        if isinstance(self._mosec, ServerFailed):
            raise self._mosec
        return self._mosec

    def otlp(self) -> str:
        """The endpoint of the run's OTLP sink (started on first use, stopped by `close`)."""
        if self._sink is None:
            self._sink = servers.otlp_sink()
        return self._sink[1]

    def close(self) -> None:
        if self._sink is not None:
            self._sink[0].terminate()
            self._sink[0].wait()
            self._sink = None

    def server(self, kind: str, model: str) -> ServerProcess:
        if kind in ("aserve", "aserve-main", servers.BEFORE, *servers.TRACED, *servers.SETTINGS):
            otlp = self.otlp() if kind in servers.TRACED else None
            before = self.args.before if kind == servers.BEFORE else None
            s = servers.aserve_server(kind, model, self.repository(model), interpreters=self.args.interpreters,
                                      otlp=otlp, python=before)
            if before is not None:
                s.notes["python"] = str(before)
            s.notes["interpreters"] = self.args.interpreters
            if kind in servers.TRACED:
                s.notes["tracing_sample_ratio"] = servers.TRACED[kind]
            if kind in servers.SETTINGS:
                s.notes["arguments"] = " ".join(servers.SETTINGS[kind])
            return s
        if kind in ("ceiling", "inline"):
            return servers.aiohttp_peer(kind, model, self.examples)
        python, version = self.mosec()
        workers = self.args.interpreters  # a worker process per aserve interpreter
        s = servers.mosec_server(model, self.examples, python, native=kind == "mosec-native", workers=workers)
        s.notes.update(mosec_version=version, workers=workers, max_batch_size=8, max_wait_ms=10)
        return s


def _record(server: str, model: str, body: str | None, **fields: Any) -> dict[str, Any]:
    return {"bench": "http", "server": server, "model": model, "body": body, **fields}


def measure(run: Run, server: ServerProcess, case: Case, connections: int, *, threads: int | None = None,
            ) -> dict[str, Any]:
    threads0 = server.threads_cpu_s() if server.front == "main-thread" else None
    front0 = threads0["host"] + threads0["loops"] if threads0 is not None else server.front_cpu_s()
    tree0, t0 = server.tree_cpu_s(), time.perf_counter()
    load = loadgen.drive(run.generator, server.url, body=case.body, headers=case.headers,
                         connections=connections, seconds=run.seconds,
                         threads=run.args.threads if threads is None else threads)
    wall = time.perf_counter() - t0
    tree = server.tree_cpu_s() - tree0
    per_thread = None
    if threads0 is not None:
        after = server.threads_cpu_s()
        front = after["host"] + after["loops"] - front0
        if load.requests:
            per_thread = {g: round(max(0.0, after[g] - threads0[g]) / load.requests * 1e6, 1) for g in after}
    else:
        front = server.front_cpu_s() - front0
    return _record(
        server.name, case.model, case.body_kind,
        connections=connections,
        requests_per_s=round(load.requests_per_s, 1),
        p50_ms=round(load.p50_ms, 3),
        p99_ms=round(load.p99_ms, 3),
        errors=load.errors,
        non_2xx=load.non_2xx,
        socket_errors=load.socket_errors,
        pss_mb=round(server.pss_mb(), 1),
        loop_cpu_us_per_request=round(front / load.requests * 1e6, 1) if load.requests else None,
        server_cpu_cores=round(tree / wall, 3),
        server_cpu_us_per_request=round(tree / load.requests * 1e6, 1) if load.requests else None,
        generator_cpu_cores=round(load.generator_cpu_s / wall, 3),
        duration_s=round(load.wall_s, 3),
        requests=load.requests,
        generator=load.generator,
        threads=load.threads,
        loop_cpu_source=server.front_source,
        thread_cpu_us_per_request=per_thread,
    )


def post_check(url: str, case: Case, *, patience_s: float = 30.0) -> tuple[int, dict[str, str], bytes]:
    """The check request, sent again as a client would while the server answers 503 with
    Retry-After (admission control still draining the previous sweep's queue)."""
    deadline = time.monotonic() + patience_s
    while True:
        status, headers, answer = servers.post(url, case.body, case.headers)
        retry = {k.lower(): v for k, v in headers.items()}.get("retry-after")
        if status != 503 or retry is None or time.monotonic() > deadline:
            return status, headers, answer
        time.sleep(min(max(float(retry), 0.01), 1.0))


def bench_server(run: Run, kind: str, model: str, cases: dict[str, Case]) -> Iterator[dict[str, Any]]:
    """Start one server, check and measure every body and connection count, stop it."""
    bodies = list(cases)
    if kind in PEERS and model not in peer_models.MODELS:
        for body in bodies:
            yield _record(kind, model, body, skipped=f"{kind} serves only {', '.join(peer_models.MODELS)}", errors=0)
        return
    if kind in PEERS and "nested" in cases:  # their V2 codecs take the flat data V2 specifies
        yield _record(kind, model, "nested", skipped=f"{kind}'s V2 codec reads flat data only", errors=0)
        cases = {body: case for body, case in cases.items() if body != "nested"}
        bodies = list(cases)
        if not bodies:
            return
    if kind == "mosec-native":
        for body in bodies:
            if body != "json":
                yield _record(kind, model, body, skipped="mosec-native serves MOSEC's own JSON body only", errors=0)
        cases = native_cases(cases)
        bodies = list(cases)
        if not bodies:
            return
    try:
        server = run.server(kind, model)
    except ServerFailed as e:
        for body in bodies:
            yield _record(kind, model, body, skipped=str(e), errors=0)
        return
    first = cases[bodies[0]]

    def probe() -> bool:
        status, _, _ = servers.post(server.url, first.body, first.headers, timeout=10)
        return status == 200

    try:
        try:
            server.start(probe)
        except ServerFailed as e:
            yield _record(kind, model, None, error=str(e), errors=1)
            return
        extra = {**server.notes, "python": platform.python_version(), "cpus": os.cpu_count()}
        if kind == "mosec":
            extra["note"] = "binary requests are read; answers are V2 JSON (MOSEC cannot set header-length)"
        if kind == "mosec-native":
            extra["note"] = ("MOSEC's own msgspec JSON body on /inference, not V2 (simple {a, b} -> {sum, "
                             "difference}, mlp {x} -> {y}), carrying the json case's values")
        for body in bodies:
            case = cases[body]
            status, headers, answer = post_check(server.url, case)
            problem, response = check_answer(kind, case, status, headers, answer)
            if problem:
                yield _record(kind, model, body, error=f"wrong answer to the check request: {problem}", errors=1)
                continue
            try:
                if run.args.warmup > 0:
                    loadgen.drive(run.generator, server.url, body=case.body, headers=case.headers,
                                  connections=max(run.args.connections), threads=run.args.threads,
                                  seconds=max(1, math.ceil(run.args.warmup)))
                warm = round(server.pss_mb(), 1)
                for connections in run.args.connections:
                    yield {**measure(run, server, case, connections), "pss_mb_after_warmup": warm,
                           "response": response, **extra}
                if kind == "ceiling" and not run.generator_checked and max(run.args.connections) >= 2:
                    run.generator_checked = True
                    yield {**measure(run, server, case, max(run.args.connections), threads=2 * run.args.threads),
                           "generator_check": True, **extra}
            except (OSError, RuntimeError) as e:  # the server died under load, or wrk failed
                yield _record(kind, model, body, error=f"measuring failed: {e}; server log: {server.log_tail()}",
                              errors=1)
    finally:
        rc = server.stop()
    if rc not in (0, None):
        yield _record(kind, model, None, error=f"{kind} exited with {rc} on SIGTERM", errors=1)


def repeated(run: Run, kinds: list[str], model: str, cases: dict[str, Case], times: int,
             ) -> Iterator[dict[str, Any]]:
    """bench_server for each server `times` times, in rounds (every server once per round, each
    on a freshly started server), each point reported as the median of its runs with every
    run's requests/s kept. Rounds, not one server's runs back to back: where the scheduler
    puts the loop and the interpreters' threads on a 2-core VM moves a single run by 20-30%,
    and the VM's speed drifts over minutes; interleaved, a drift weighs on every server alike.
    Each round starts one server later in the list than the round before, so no server is
    always the first after a pause or always the one after the heaviest."""
    if times <= 1:
        for kind in kinds:
            print(f"http: {model} on {kind} ...", file=sys.stderr, flush=True)
            yield from bench_server(run, kind, model, cases)
        return
    runs: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for round_ in range(times):
        shift = round_ % len(kinds)
        for kind in kinds[shift:] + kinds[:shift]:
            print(f"http: {model} on {kind} (round {round_ + 1} of {times}) ...", file=sys.stderr, flush=True)
            for record in bench_server(run, kind, model, cases):
                if "requests_per_s" not in record:
                    yield record
                    continue
                key = (kind, record.get("body"), record.get("connections"), record.get("generator_check", False))
                runs.setdefault(key, []).append(record)
    for group in runs.values():
        by_rps = sorted(group, key=lambda r: r["requests_per_s"])
        median = dict(by_rps[len(by_rps) // 2])
        for field in ("p50_ms", "p99_ms", "loop_cpu_us_per_request", "pss_mb", "server_cpu_cores",
                      "server_cpu_us_per_request"):
            values = sorted(r[field] for r in group if isinstance(r.get(field), (int, float)))
            if values:
                median[field] = values[len(values) // 2]
        median["errors"] = sum(r["errors"] for r in group)
        median["runs"] = len(group)
        median["requests_per_s_runs"] = [r["requests_per_s"] for r in group]
        median["server_cpu_us_per_request_runs"] = [r.get("server_cpu_us_per_request") for r in group]
        yield median


# ---- summary and plot ---------------------------------------------------------------

def points(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if "requests_per_s" in r and not r.get("generator_check")]


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    pts = points(records)
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in pts:
        groups.setdefault((r["model"], r["body"]), []).append(r)
    peaks = []
    aserve: dict[str, Any] = {"p50_ms_at_1_connection": {}, "loop_cpu_us_per_request_at_peak": {},
                              "server_cpu_at_1_connection_vs_ceiling": {}}
    for (model, body), rs in groups.items():
        ceiling = max((r["requests_per_s"] for r in rs if r["server"] == "ceiling"), default=None)
        for name in dict.fromkeys(r["server"] for r in rs):
            best = max((r for r in rs if r["server"] == name), key=lambda r: r["requests_per_s"])
            peaks.append({
                "model": model, "body": body, "server": name, "peak_requests_per_s": best["requests_per_s"],
                "at_connections": best["connections"], "p99_ms_at_peak": best["p99_ms"],
                "vs_ceiling": round(best["requests_per_s"] / ceiling, 3) if ceiling else None,
            })
            if name == "aserve":
                key = f"{model}/{body}"
                one = [r for r in rs if r["server"] == name and r["connections"] == 1]
                if one:
                    aserve["p50_ms_at_1_connection"][key] = one[0]["p50_ms"]
                    ceiling_one = [r for r in rs if r["server"] == "ceiling" and r["connections"] == 1]
                    if ceiling_one:
                        versus = cpu_versus_ceiling(one[0], ceiling_one[0])
                        if versus is not None:
                            aserve["server_cpu_at_1_connection_vs_ceiling"][key] = versus
                aserve["loop_cpu_us_per_request_at_peak"][key] = best["loop_cpu_us_per_request"]
    pss = {name: max((r["pss_mb"] for r in pts if r["model"] == "mlp" and r["server"] == name), default=None)
           for name in ("aserve", *MOSECS)}
    leaner = min((name for name in MOSECS if pss[name]), key=lambda name: pss[name] or 0.0, default=None)
    mosec_pss = pss[leaner] if leaner else None
    aserve["mlp_pss_mb"] = pss["aserve"]
    aserve["mosec_mlp_pss_mb"] = mosec_pss  # the leaner MOSEC row's
    aserve["mosec_mlp_pss_server"] = leaner
    aserve["mlp_pss_vs_mosec"] = round(pss["aserve"] / mosec_pss, 3) if pss["aserve"] and mosec_pss else None
    checks = [r for r in records if r.get("generator_check")]
    generator: dict[str, Any] = {}
    for c in checks:
        t1 = next((r for r in pts if r["server"] == "ceiling" and r["model"] == c["model"]
                   and r["body"] == c["body"] and r["connections"] == c["connections"]), None)
        generator = {"ceiling_t1_requests_per_s": t1["requests_per_s"] if t1 else None,
                     "ceiling_t2_requests_per_s": c["requests_per_s"], "connections": c["connections"],
                     "t1_generator_cpu_cores": t1["generator_cpu_cores"] if t1 else None}
    errors = sum(int(r.get("errors") or 0) for r in records)
    return {"bench": "http", "summary": {"peaks": peaks, "aserve": aserve, "generator_check": generator,
                                         "sizing": sizing(pts), "versus_aserve": versus_aserve(pts),
                                         "versus_mosec": versus_mosec(peaks), "errors": errors}}


def cpu_versus_ceiling(mine: dict[str, Any], ceiling: dict[str, Any]) -> dict[str, Any] | None:
    """aserve's server CPU per request over the ceiling's at one point: the medians' ratio and,
    when both ran in rounds (`--repeat`), the median, least and most of each round's ratio (the
    two ran one after the other in a round, so a spell of the host's weighs on both alike)."""
    a, c = mine.get("server_cpu_us_per_request"), ceiling.get("server_cpu_us_per_request")
    if not a or not c:
        return None
    out: dict[str, Any] = {"aserve_us": a, "ceiling_us": c, "ratio": round(a / c, 3)}
    runs = list(zip(mine.get("server_cpu_us_per_request_runs") or [],
                    ceiling.get("server_cpu_us_per_request_runs") or []))
    paired = sorted(x / y for x, y in runs if x and y)
    if len(paired) > 1:
        out.update(rounds=len(paired), paired_median=round(paired[len(paired) // 2], 3),
                   paired_min=round(paired[0], 3), paired_max=round(paired[-1], 3))
    return out


def versus_mosec(peaks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The headline: per model and body, aserve's peak requests/s against the faster of the
    MOSEC rows measured for it (mosec on V2, mosec-native on its own body, recorded as json)."""
    out = []
    for a in peaks:
        if a["server"] != "aserve":
            continue
        rivals = [p for p in peaks if p["server"] in MOSECS and (p["model"], p["body"]) == (a["model"], a["body"])]
        if not rivals:
            continue
        best = max(rivals, key=lambda p: p["peak_requests_per_s"])
        out.append({"model": a["model"], "body": a["body"], "aserve_requests_per_s": a["peak_requests_per_s"],
                    "mosec_server": best["server"], "mosec_requests_per_s": best["peak_requests_per_s"],
                    "ratio": round(a["peak_requests_per_s"] / best["peak_requests_per_s"], 3)
                    if best["peak_requests_per_s"] else None})
    return out


def versus_aserve(pts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each variant of aserve (another build, traced, settings changed, or aserve-same) against `aserve` at
    the same point: the change of the median requests/s and, when both ran in rounds
    (`--repeat`), of each round's pair (they ran one after the other, so a drift of the
    machine's speed weighs on both alike)."""
    out = []
    for r in pts:
        if r["server"] not in (servers.BEFORE, *servers.TRACED, *servers.SETTINGS):
            continue
        base = next((b for b in pts if b["server"] == "aserve" and b["model"] == r["model"]
                     and b["body"] == r["body"] and b["connections"] == r["connections"]), None)
        if base is None or not base["requests_per_s"]:
            continue
        item: dict[str, Any] = {"server": r["server"], "model": r["model"], "body": r["body"],
                                "connections": r["connections"],
                                "change": round(r["requests_per_s"] / base["requests_per_s"] - 1, 4)}
        mine, theirs = r.get("requests_per_s_runs"), base.get("requests_per_s_runs")
        if mine and theirs and len(mine) == len(theirs):
            paired = sorted(a / b - 1 for a, b in zip(mine, theirs, strict=True) if b)
            item.update(rounds=len(paired), paired_median=round(paired[len(paired) // 2], 4),
                        paired_min=round(paired[0], 4), paired_max=round(paired[-1], 4))
        out.append(item)
    return out


def sizing(pts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per model and body, aserve's best requests/s with p99 within the model's bound
    (SIZING_P99_MS) and no errors, and that per core of CPU the whole server used (loop
    and interpreters)."""
    out = []
    for model, body in dict.fromkeys((r["model"], r["body"]) for r in pts if r["server"] == "aserve"):
        bound = SIZING_P99_MS.get(model, 50.0)
        ok = [r for r in pts if r["server"] == "aserve" and r["model"] == model and r["body"] == body
              and r["p99_ms"] <= bound and not r["errors"]]
        if not ok:
            out.append({"model": model, "body": body, "p99_bound_ms": bound, "requests_per_s": None})
            continue
        best = max(ok, key=lambda r: r["requests_per_s"])
        cores = best.get("server_cpu_cores") or None
        out.append({"model": model, "body": body, "p99_bound_ms": bound,
                    "requests_per_s": best["requests_per_s"], "at_connections": best["connections"],
                    "p99_ms": best["p99_ms"], "server_cpu_cores": cores,
                    "requests_per_s_per_core": round(best["requests_per_s"] / cores, 1) if cores else None})
    return out


def summary_text(summary: dict[str, Any]) -> str:
    s = summary["summary"]
    lines = [f"{'model':<8}{'body':<8}{'server':<13}{'peak req/s':>11}{'at conns':>9}{'p99 ms':>9}{'/ ceiling':>10}"]
    for p in s["peaks"]:
        ratio = f"{p['vs_ceiling']:.2f}" if p["vs_ceiling"] is not None else "-"
        lines.append(f"{p['model']:<8}{p['body']:<8}{p['server']:<13}{p['peak_requests_per_s']:>11.0f}"
                     f"{p['at_connections']:>9}{p['p99_ms_at_peak']:>9.2f}{ratio:>10}")
    a = s["aserve"]
    lines.append("")
    for v in s.get("versus_mosec", []):
        lines.append(f"aserve against the faster MOSEC ({v['mosec_server']}), {v['model']}/{v['body']}: "
                     f"{v['aserve_requests_per_s']:.0f} against {v['mosec_requests_per_s']:.0f} req/s, "
                     f"{v['ratio']}x")
    for key, v in a["p50_ms_at_1_connection"].items():
        lines.append(f"aserve p50 at 1 connection, {key}: {v} ms")
    for key, v in a.get("server_cpu_at_1_connection_vs_ceiling", {}).items():
        line = (f"aserve server CPU per request at 1 connection, {key}: {v['aserve_us']} us, the ceiling's "
                f"{v['ceiling_us']} us: {v['ratio']}x")
        if "rounds" in v:
            line += f" (paired rounds: median {v['paired_median']}x, {v['paired_min']}x to {v['paired_max']}x " \
                    f"over {v['rounds']})"
        lines.append(line)
    for key, v in a["loop_cpu_us_per_request_at_peak"].items():
        lines.append(f"aserve loop CPU per request at peak, {key}: {v} us")
    if a["mlp_pss_mb"] is not None or a["mosec_mlp_pss_mb"] is not None:
        lines.append(f"mlp PSS: aserve {a['mlp_pss_mb']} MB, MOSEC {a['mosec_mlp_pss_mb']} MB "
                     f"({a.get('mosec_mlp_pss_server')}), ratio {a['mlp_pss_vs_mosec']}")
    g = s["generator_check"]
    if g:
        lines.append(f"generator check: ceiling at {g['connections']} connections, wrk -t1 "
                     f"{g['ceiling_t1_requests_per_s']} req/s ({g['t1_generator_cpu_cores']} cores), "
                     f"-t2 {g['ceiling_t2_requests_per_s']} req/s")
    for z in s.get("sizing", []):
        if z["requests_per_s"] is not None:
            lines.append(f"sizing {z['model']}/{z['body']}: {z['requests_per_s']:.0f} req/s at p99 {z['p99_ms']} ms "
                         f"(<= {z['p99_bound_ms']:g}), {z['requests_per_s_per_core']} req/s per server core")
    for v in s.get("versus_aserve", []):
        line = (f"{v['server']} against aserve, {v['model']}/{v['body']} at {v['connections']} connections: "
                f"{v['change'] * 100:+.1f}% req/s")
        if "rounds" in v:
            line += (f" (paired rounds: median {v['paired_median'] * 100:+.1f}%, "
                     f"{v['paired_min'] * 100:+.1f}% to {v['paired_max'] * 100:+.1f}% over {v['rounds']})")
        lines.append(line)
    lines.append(f"errors: {s['errors']}")
    return "\n".join(lines)


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise SystemExit("benchmarks.http: --plot needs matplotlib, which is not installed: "
                         "pip install -e '.[bench]' (./dev setup installs it)") from None


def title(records: list[dict[str, Any]]) -> str:
    """The plot's title: the machine the records were measured on, which may not be this one (a
    plot made from another machine's JSON)."""
    cpus = next((r["cpus"] for r in records if "cpus" in r), os.cpu_count())
    python = next((r["python"] for r in records if "python" in r), platform.python_version())
    return f"benchmarks.http ({cpus} CPUs, Python {python})"


def plot(records: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

    pts = points(records)
    groups = list(dict.fromkeys((r["model"], r["body"]) for r in pts))
    colors = {name: f"C{i}" for i, name in enumerate(dict.fromkeys(r["server"] for r in pts))}
    fig, axes = plt.subplots(max(1, len(groups)), 2, figsize=(12, 3.8 * max(1, len(groups))), squeeze=False)
    for row, (model, body) in enumerate(groups):
        rps_ax, p99_ax = axes[row]
        for name, color in colors.items():
            rs = sorted((r for r in pts if (r["model"], r["body"], r["server"]) == (model, body, name)),
                        key=lambda r: r["connections"])
            if not rs:
                continue
            conns = [r["connections"] for r in rs]
            rps_ax.plot(conns, [r["requests_per_s"] for r in rs], marker="o", color=color, label=name)
            p99_ax.plot(conns, [r["p99_ms"] for r in rs], marker="o", color=color, label=name)
        ticks = sorted({r["connections"] for r in pts if (r["model"], r["body"]) == (model, body)})
        for ax, what in ((rps_ax, "requests/s"), (p99_ax, "p99 latency (ms)")):
            ax.set_xscale("log", base=2)
            ax.set_xticks(ticks, [str(t) for t in ticks])
            ax.minorticks_off()
            ax.set_xlabel("connections")
            ax.set_ylabel(what)
            ax.set_title(f"{model}, {body} body: {what}")
            ax.grid(True, alpha=0.3)
        p99_ax.set_yscale("log")
        p99_ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        p99_ax.yaxis.set_major_formatter(ScalarFormatter())
        p99_ax.yaxis.set_minor_formatter(NullFormatter())
        rps_ax.set_ylim(bottom=0)
        rps_ax.legend(fontsize="small")
    fig.suptitle(title(records))
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ---- command line ---------------------------------------------------------------------

def _list(text: str, choices: tuple[str, ...], what: str, p: argparse.ArgumentParser) -> list[str]:
    items = [x for x in text.split(",") if x]
    unknown = [x for x in items if x not in choices]
    if unknown or not items:
        p.error(f"--{what}: {', '.join(unknown) or 'nothing'} not among {', '.join(choices)}")
    return items


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.http", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", metavar="FILE", help="write the records to FILE (a JSON list)")
    p.add_argument("--plot", metavar="FILE", help="write a PNG: requests/s and p99 against connections")
    p.add_argument("--models", default=",".join(DEFAULT_MODELS),
                   help="default: %(default)s; cnn too (aserve only: the peers serve simple and mlp)")
    p.add_argument("--connections", default=",".join(map(str, DEFAULT_CONNECTIONS)), help="default: %(default)s")
    p.add_argument("--bodies", default=",".join(BODIES), help="default: %(default)s")
    p.add_argument("--servers", default=",".join(servers.SERVERS),
                   help="default: %(default)s; also aserve-trace and aserve-trace1 (OpenTelemetry tracing on, "
                        "sampling every request or one in 100, to a local OTLP sink), aserve-nospin "
                        "(--spin-us 0) and aserve-same (aserve again: the noise of a comparison)")
    p.add_argument("--before", type=pathlib.Path, metavar="PYTHON",
                   help=f"the Python of another build of aserve (a checkout's .venv/bin/python): served as "
                        f"{servers.BEFORE!r}, a change's baseline measured in the same run (added to --servers "
                        f"after aserve when not named there)")
    p.add_argument("--repeat", type=int, default=1,
                   help="start each server this many times, in rounds (every server once per round), and report "
                        "each point's median (default %(default)s)")
    p.add_argument("--duration", type=float, default=5.0,
                   help="seconds per point, whole seconds (wrk's unit; default %(default)s)")
    p.add_argument("--warmup", type=float, default=1.0, help="seconds of warm-up per server, model and body "
                   "(0: none; default %(default)s)")
    p.add_argument("--interpreters", type=int, default=2, help="aserve's interpreters (default %(default)s)")
    p.add_argument("--generator", choices=("auto", "wrk", "aiohttp"), default="auto",
                   help="load generator (auto: wrk when installed)")
    p.add_argument("--threads", type=int, default=1,
                   help="wrk threads (aiohttp: processes) per point: one core each; more where one cannot load "
                        "the servers, as on many cores (default %(default)s)")
    p.add_argument("--no-generator-check", dest="generator_check", action="store_false",
                   help="skip the ceiling's extra point with twice --threads")
    p.add_argument("--peer-venvs", type=pathlib.Path,
                   default=pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache"))
                   / "aserve" / "peers", help="where MOSEC's virtual environment is kept (default %(default)s)")
    p.add_argument("--repository", type=pathlib.Path, help="folder with the example models (default: examples/)")
    args = p.parse_args(argv)
    args.models = _list(args.models, MODELS, "models", p)
    args.bodies = _list(args.bodies, KNOWN_BODIES, "bodies", p)
    args.servers = _list(args.servers, (*servers.SERVERS, servers.BEFORE, *servers.TRACED, *servers.SETTINGS),
                         "servers", p)
    if args.before is not None and servers.BEFORE not in args.servers:
        # the baseline is what --before is for: it runs next to the build it is compared with
        at = args.servers.index("aserve") + 1 if "aserve" in args.servers else len(args.servers)
        args.servers.insert(at, servers.BEFORE)
    if servers.BEFORE in args.servers and args.before is None:
        p.error(f"--servers {servers.BEFORE} needs --before PYTHON (the interpreter of the build to compare with)")
    try:
        args.connections = sorted({int(c) for c in args.connections.split(",") if c})
    except ValueError:
        p.error("--connections takes comma-separated integers")
    if not args.connections or min(args.connections) < 1 or args.duration <= 0 or args.warmup < 0:
        p.error("--connections must be >= 1, --duration > 0, --warmup >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.plot:
        require_matplotlib()  # before minutes of measuring, not after
    examples = args.repository or bundled_examples()
    if examples is None:
        raise SystemExit("benchmarks.http: no --repository and no bundled examples/ folder")
    generator = args.generator
    if generator == "auto":
        generator = "wrk" if loadgen.have_wrk() else "aiohttp"
        if generator == "aiohttp":
            print("http: wrk is not installed: using the multi-process aiohttp client (records say "
                  "\"generator\": \"aiohttp\"; it needs far more CPU per request than wrk)", file=sys.stderr)
    elif generator == "wrk" and not loadgen.have_wrk():
        raise SystemExit("benchmarks.http: --generator wrk, but wrk is not installed (apt-get install wrk)")
    records: list[dict[str, Any]] = []

    def emit(record: dict[str, Any]) -> None:
        records.append(record)
        print(json.dumps(record), flush=True)
        if "skipped" in record or "error" in record:
            what = "skipped" if "skipped" in record else "error"
            print(f"http: {record['server']}/{record['model']}/{record['body']}: {what}: {record[what]}",
                  file=sys.stderr, flush=True)

    tmp = pathlib.Path(tempfile.mkdtemp(prefix="benchmarks-http-"))
    started = time.perf_counter()
    run = Run(args, examples, generator, tmp)
    try:
        for model in args.models:
            try:
                cases = make_cases(model, args.bodies, examples)
            except Skip as e:
                for kind in args.servers:
                    emit(_record(kind, model, None, skipped=str(e), errors=0))
                continue
            for record in repeated(run, args.servers, model, cases, args.repeat):
                emit(record)
    finally:
        run.close()
        shutil.rmtree(tmp, ignore_errors=True)
    summary = summarize(records)
    records.append(summary)
    print(json.dumps(summary), flush=True)
    print(summary_text(summary), file=sys.stderr)
    print(f"({time.perf_counter() - started:.0f} s, generator {generator})", file=sys.stderr)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(records, indent=1) + "\n")
    if args.plot:
        plot(records, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
