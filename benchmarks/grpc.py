"""gRPC against HTTP on the same models in the same run, with MLServer's gRPC as the peer.

    python -m benchmarks.grpc [--json FILE] [--models simple,mlp] [--concurrency 1,16] [--duration S]
                              [--rounds N] [--servers aserve-grpc,aserve-http,mlserver-grpc]
                              [--generator python|c]

One aserve process serves every model of `--models` (folders of `--repository`: by default
examples/simple, INT32 arithmetic, and examples/mlp, 8 x Linear(16, 16) in FP32) over both
fronts (`--interpreters 2`): the same models, batchers and interpreters answer `aserve-grpc`
(ModelInfer with raw contents, as tritonclient.grpc sends it) and `aserve-http` (the V2
binary tensor extension, binary outputs: the HTTP form closest to gRPC's raw contents). Each
request is one sample of each input the model's config.toml declares (every -1 dimension 1,
values from np.arange). The peer is MLServer from PyPI (`MLSERVER_VERSION`, with uvloop below
0.22, which its workers need), installed with pip on first use into a virtual environment of
its own under `--peer-venvs`, serving simple's arithmetic as a custom runtime
(`benchmarks.peers.mlserver_model`: a model folder with model-settings.json and `mlserver
start`, as its users set it up) with `parallel_workers` equal to aserve's interpreters, called
over its gRPC with the same message. It serves simple only: for the other models it is left
out (the summary's `left_out` says so).

Before measuring, each model's answer on each configuration is checked: simple's against
values computed here, any other's against aserve's HTTP answer bit for bit; every answer must
have the outputs config.toml declares (a wrong or missing answer is an error record, never a
number). Then, for each round, each model, each concurrency and each configuration, in an
order that rotates every round, the client warms up for `--warmup` seconds and measures for
`--duration` seconds. The client is `--generator python` (this process: grpc.aio or aiohttp
on uvloop, one request in flight per worker, `concurrency` workers) or `--generator c`: h2load
for gRPC (`concurrency` streams over at most 8 connections, the message in gRPC's
length-prefixed frame; h2load reports a mean, not percentiles, and sees HTTP/2 statuses, not
gRPC's: the answers were checked first) and wrk for HTTP (`concurrency` connections). On 2
cores a Python client is the bottleneck and hides the server's cost; the C generators do not.
Records:

| key | meaning |
| --- | --- |
| `model`, `server`, `concurrency`, `round` | what ran |
| `requests_per_s`, `p50_ms`, `p99_ms`, `requests`, `errors` | completed requests over the measured interval; any failed call is an error |
| `server_cpu_us_per_request` | CPU of the server's whole process tree (psutil, utime + stime) over the requests: the cost on the server's side, not the client's |
| `client_cpu_us_per_request` | the client's CPU over the requests (this process's, or the C generator's) |
| `generator` | `python`, `h2load` or `wrk` |

The last line is the summary: per model, configuration and concurrency the median over
rounds, and per model the ratios of aserve's gRPC to aserve's HTTP and to MLServer's gRPC.
The machine is shared by the client and the servers (2 cores here): figures are for comparing
the configurations of one run, not absolute capacities.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import os
import pathlib
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import numpy as np
import psutil

from aserve.runtime.datatypes import BY_NUMPY, DATATYPES

from . import ROOT, child_env
from .servers import ServerFailed, _imports, _pip, cpu_s, free_port, get, stop_tree

SERVERS = ("aserve-grpc", "aserve-http", "mlserver-grpc")
MODELS = ("simple", "mlp")
MLSERVER_VERSION = "1.7.1"
# MLServer 1.7.1's parallel workers call asyncio.get_event_loop() with uvloop's policy set and no
# loop running, which uvloop 0.22 made an error: with a newer uvloop its workers die at start
UVLOOP_PIN = "uvloop<0.22"
UVLOOP_CHECK = "import sys, uvloop; sys.exit(tuple(map(int, uvloop.__version__.split('.')[:2])) >= (0, 22))"
# the one model MLServer serves: its custom runtime (peers.mlserver_model.Simple) computes simple's arithmetic
PEER_MODEL = "simple"
INFER = "/inference.GRPCInferenceService/ModelInfer"


class Process:
    """A server subprocess: started, probed until ready, measured (its tree's CPU), stopped."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], ready_url: str) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self.ready_url = ready_url
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = pathlib.Path(tempfile.mkstemp(prefix=f"benchmarks-{name}-", suffix=".log")[1])

    def start(self, timeout: float = 300.0) -> None:
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(self.argv, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerFailed(f"{self.name} exited with {self.proc.returncode}: {self.tail()}")
            try:
                if get(self.ready_url, timeout=2)[0] == 200:
                    return
            except OSError:
                pass  # not listening yet
            time.sleep(0.1)  # poll the server's observable state until the deadline
        raise ServerFailed(f"{self.name} was not ready after {timeout:.0f} s: {self.tail()}")

    def tail(self, n: int = 1500) -> str:
        return self.log.read_text(errors="replace")[-n:].strip() or "(no output)"

    def cpu_s(self) -> float:
        assert self.proc is not None
        try:
            root = psutil.Process(self.proc.pid)
            return cpu_s([root, *root.children(recursive=True)])
        except psutil.NoSuchProcess:
            return 0.0

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        rc = stop_tree(self.proc)
        self.log.unlink(missing_ok=True)
        return rc


# ---- the servers ----

def aserve_process(repository: pathlib.Path, interpreters: int) -> tuple[Process, int, int]:
    """aserve serving `repository` over HTTP and gRPC; (process, HTTP port, gRPC port)."""
    port, grpc_port = free_port(), free_port()
    argv = [sys.executable, "-m", "aserve.cli", "serve", str(repository), "--interpreters", str(interpreters),
            "--port", str(port), "--grpc-port", str(grpc_port), "--log-level", "warning"]
    return Process("aserve", argv, child_env(), f"http://127.0.0.1:{port}/v2/health/ready"), port, grpc_port


def mlserver_python(folder: pathlib.Path) -> tuple[pathlib.Path, str]:
    """MLServer's virtual environment under `folder`, made with pip on first use: (its python, MLServer's version)."""
    venv = folder / "mlserver-venv"
    python = venv / "bin" / "python"
    if not python.exists():
        print(f"grpc: creating MLServer's environment in {venv} (once)", file=sys.stderr, flush=True)
        base = getattr(sys, "_base_executable", sys.executable)
        made = subprocess.run([base, "-m", "venv", "--clear", str(venv)], capture_output=True, text=True, check=False)
        if made.returncode != 0:
            raise ServerFailed(f"cannot create {venv}: {made.stderr.strip()}")
    old_uvloop = subprocess.run([str(python), "-c", UVLOOP_CHECK], capture_output=True, check=False).returncode == 0
    if not (_imports(python, "mlserver") and old_uvloop):
        print(f"grpc: installing mlserver=={MLSERVER_VERSION} into {venv}", file=sys.stderr, flush=True)
        got = _pip(python, f"mlserver=={MLSERVER_VERSION}", UVLOOP_PIN)
        if got.returncode != 0:
            raise ServerFailed(f"pip could not install mlserver into {venv}: {got.stderr.strip()[-800:]}")
    version = subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.version('mlserver'))"],
                             capture_output=True, text=True, check=False).stdout.strip()
    return python, version


def mlserver_process(python: pathlib.Path, folder: pathlib.Path, workers: int) -> tuple[Process, int]:
    """`mlserver start` over a model folder of the custom runtime; (process, gRPC port)."""
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    (folder / "settings.json").write_text(json.dumps({
        "http_port": http_port, "grpc_port": grpc_port, "metrics_port": metrics_port,
        "parallel_workers": workers, "debug": False}))
    model = folder / PEER_MODEL
    model.mkdir(exist_ok=True)
    (model / "model-settings.json").write_text(json.dumps({
        "name": PEER_MODEL, "implementation": "benchmarks.peers.mlserver_model.Simple"}))
    env = child_env()  # the repository on PYTHONPATH: the runtime's class is benchmarks.peers.mlserver_model
    argv = [str(python.parent / "mlserver"), "start", str(folder)]
    return Process("mlserver", argv, env, f"http://127.0.0.1:{http_port}/v2/models/{PEER_MODEL}/ready"), grpc_port


# ---- the models ----

Tensor = tuple[str, str, tuple[int, ...]]  # name, datatype, shape, as config.toml declares them


@dataclasses.dataclass(frozen=True)
class Spec:
    """A model's inputs and outputs, read from its config.toml."""

    name: str
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    batching: bool  # max_batch_size > 0: every shape's leading -1 is the batch dimension


def numpy_dtype(datatype: str) -> np.dtype[Any]:
    """The numpy dtype of a fixed-size V2 datatype; ValueError for the others (BYTES, BF16): this tool
    sends and reads raw elements only."""
    known = DATATYPES.get(datatype)
    if known is None or not known.itemsize or not known.numpy:
        raise ValueError(f"datatype {datatype!r}: this benchmark sends fixed-size numeric tensors only")
    return np.dtype(known.numpy)


def read_spec(folder: pathlib.Path) -> Spec:
    """`folder`'s config.toml as a Spec; ValueError when a tensor's datatype is not one this tool sends."""
    config = tomllib.loads((folder / "config.toml").read_text())

    def tensors(kind: str) -> tuple[Tensor, ...]:
        out = tuple((t["name"], t["datatype"], tuple(t["shape"])) for t in config.get(kind, []))
        for name, datatype, _ in out:
            try:
                numpy_dtype(datatype)
            except ValueError as e:
                raise ValueError(f"{folder / 'config.toml'}: {kind} {name}: {e}") from None
        return out
    return Spec(folder.name, tensors("inputs"), tensors("outputs"), config.get("max_batch_size", 0) > 0)


def sample(spec: Spec) -> dict[str, np.ndarray]:
    """One request's inputs: one sample (every -1 dimension 1), deterministic values in each declared datatype."""
    out = {}
    for k, (name, datatype, shape) in enumerate(spec.inputs):
        dims = [1 if d == -1 else d for d in shape]
        out[name] = (np.arange(math.prod(dims)) % 64 * (k + 1)).astype(numpy_dtype(datatype)).reshape(dims)
    return out


def computed(model: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
    """The answer computed here, for the model whose arithmetic this tool knows (simple); None for the others."""
    if model != "simple":
        return None
    a, b = inputs["INPUT0"], inputs["INPUT1"]
    return {"OUTPUT0": a + b, "OUTPUT1": a - b}


def undeclared(spec: Spec, answer: dict[str, np.ndarray]) -> str | None:
    """How `answer` differs from the outputs `spec` declares (names, datatypes, shapes); None if it does not."""
    declared = {name: (datatype, shape) for name, datatype, shape in spec.outputs}
    if set(answer) != set(declared):
        return f"outputs {sorted(answer)}, config.toml declares {sorted(declared)}"
    for name, (datatype, shape) in declared.items():
        got = answer[name]
        want = (1, *shape[1:]) if spec.batching else shape  # one sample; any other -1 is any size
        if got.dtype != numpy_dtype(datatype) or len(got.shape) != len(want) or any(
                d not in (-1, g) for d, g in zip(want, got.shape)):
            return f"{name} is {got.dtype} {list(got.shape)}, config.toml declares {datatype} {list(shape)}"
    return None


def differs(answer: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> str | None:
    """The first output of `want` that `answer` lacks or holds other bits for (dtype, shape, bytes); None if none."""
    for key, value in want.items():
        got = answer.get(key)
        if got is None:
            return f"no {key}"
        if got.dtype != value.dtype or got.shape != value.shape or got.tobytes() != value.tobytes():
            return f"{key} = {got.dtype} {got.tolist()}, expected {value.dtype} {value.tolist()}"
    return None


# ---- the clients ----

def grpc_message(model: str, inputs: dict[str, np.ndarray]) -> bytes:
    from aserve.protocol.grpc import protos

    request = protos.ModelInferRequest(model_name=model)
    for name, value in inputs.items():
        request.inputs.add(name=name, datatype=BY_NUMPY[value.dtype.name], shape=list(value.shape))
        request.raw_input_contents.append(value.tobytes())
    data: bytes = request.SerializeToString()
    return data


def grpc_outputs(data: bytes) -> dict[str, np.ndarray]:
    """The outputs of a ModelInferResponse, raw or typed (MLServer answers typed contents)."""
    from aserve.protocol.grpc import protos
    from aserve.protocol.grpc.codec import CONTENTS

    response = protos.ModelInferResponse.FromString(data)
    out = {}
    for i, o in enumerate(response.outputs):
        dtype = numpy_dtype(o.datatype)
        values = (np.frombuffer(response.raw_output_contents[i], dtype) if response.raw_output_contents
                  else np.array(getattr(o.contents, CONTENTS[o.datatype]), dtype))
        out[o.name] = values.reshape(list(o.shape))
    return out


def http_body(inputs: dict[str, np.ndarray]) -> tuple[bytes, dict[str, str]]:
    head = json.dumps({"inputs": [
        {"name": name, "datatype": BY_NUMPY[v.dtype.name], "shape": list(v.shape),
         "parameters": {"binary_data_size": v.nbytes}}
        for name, v in inputs.items()], "parameters": {"binary_data_output": True}}).encode()
    return head + b"".join(v.tobytes() for v in inputs.values()), {
        "Inference-Header-Content-Length": str(len(head)), "Content-Type": "application/octet-stream"}


def http_outputs(body: bytes, header_length: int) -> dict[str, np.ndarray]:
    head = json.loads(body[:header_length])
    out, offset = {}, header_length
    for o in head["outputs"]:
        size = o["parameters"]["binary_data_size"]
        out[o["name"]] = np.frombuffer(body[offset:offset + size], numpy_dtype(o["datatype"])).reshape(o["shape"])
        offset += size
    return out


Send = Callable[[], Awaitable[dict[str, np.ndarray]]]


class Clients:
    """One sender per configuration and model, over a channel or session opened once per configuration."""

    def __init__(self, targets: dict[str, str], samples: dict[str, dict[str, np.ndarray]]) -> None:
        import grpc

        self.channels = {name: grpc.aio.insecure_channel(target) for name, target in targets.items()
                         if name.endswith("-grpc")}
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        self.targets = targets  # gRPC: host:port; HTTP: the server's http://host:port
        self.samples = samples
        self.messages = {model: grpc_message(model, inputs) for model, inputs in samples.items()}
        self.bodies = {model: http_body(inputs) for model, inputs in samples.items()}

    def url(self, name: str, model: str) -> str:
        return f"{self.targets[name]}/v2/models/{model}/infer"

    def sender(self, name: str, model: str) -> Send:
        if name.endswith("-grpc"):
            call = self.channels[name].unary_unary(INFER, request_serializer=None, response_deserializer=None)
            message = self.messages[model]

            async def send_grpc() -> dict[str, np.ndarray]:
                return grpc_outputs(await call(message))
            return send_grpc
        url, (body, headers) = self.url(name, model), self.bodies[model]
        session = self.session

        async def send_http() -> dict[str, np.ndarray]:
            async with session.post(url, data=body, headers=headers) as r:
                data = await r.read()
                if r.status != 200:
                    raise RuntimeError(f"HTTP {r.status}: {data[:200]!r}")
                return http_outputs(data, int(r.headers["Inference-Header-Content-Length"]))
        return send_http

    async def close(self) -> None:
        for channel in self.channels.values():
            await channel.close()
        await self.session.close()


async def check(clients: Clients, spec: Spec, names: list[str]) -> None:
    """ServerFailed unless every configuration in `names` answers `spec`'s sample right: as computed here
    (simple), else as aserve's HTTP front answers, bit for bit; and with the outputs config.toml declares."""
    import grpc

    want = computed(spec.name, clients.samples[spec.name])
    asked = names if want is not None else list(dict.fromkeys([*names, "aserve-http"]))  # with the reference
    answers = {}
    for name in asked:
        try:
            answers[name] = await clients.sender(name, spec.name)()
        except Exception as e:  # any failure (gRPC status, HTTP status, decoding) is reported, never measured
            why = f"{e.code().name}: {e.details()}" if isinstance(e, grpc.aio.AioRpcError) else f"{type(e).__name__}: {e}"
            raise ServerFailed(f"{spec.name} on {name}: no answer: {why}") from e
        problem = undeclared(spec, answers[name])
        if problem:
            raise ServerFailed(f"{spec.name} on {name}: {problem}")
    against = "computed here"
    if want is None:
        want, against = answers["aserve-http"], "aserve-http's answer"
    for name in names:
        problem = differs(answers[name], want)
        if problem:
            raise ServerFailed(f"{spec.name} on {name}: {problem} ({against})")


async def drive(send: Send, concurrency: int, seconds: float) -> tuple[int, int, list[float]]:
    """`concurrency` workers, each with one request in flight, for `seconds`: (answered, errors, latencies in s)."""
    loop = asyncio.get_running_loop()
    stop = loop.time() + seconds
    latencies: list[float] = []
    errors = 0

    async def worker() -> None:
        nonlocal errors
        while loop.time() < stop:
            t0 = time.perf_counter()
            try:
                await send()
            except Exception:  # noqa: BLE001 - counted: every failed call is an error
                errors += 1
                continue
            latencies.append(time.perf_counter() - t0)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return len(latencies), errors, latencies


def own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


H2LOAD_CONNECTIONS = 8  # at most this many connections; the rest of the concurrency is streams on them


def run_h2load(target: str, message: bytes, concurrency: int, seconds: float) -> tuple[int, int, float | None]:
    """h2load posting `message` as one gRPC call per request: (answered, errors, mean latency in ms)."""
    connections = min(concurrency, H2LOAD_CONNECTIONS)
    streams = -(-concurrency // connections)
    with tempfile.TemporaryDirectory(prefix="benchmarks-h2load-") as tmp:
        body = pathlib.Path(tmp) / "message"
        body.write_bytes(b"\0" + len(message).to_bytes(4, "big") + message)  # gRPC's frame: uncompressed, length
        argv = ["h2load", "-c", str(connections), "-m", str(streams), "-D", str(max(1, round(seconds))),
                "-d", str(body), "-H", "content-type: application/grpc", "-H", "te: trailers",
                f"http://{target}{INFER}"]
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ServerFailed(f"h2load exited with {proc.returncode}: {proc.stderr.strip() or proc.stdout.strip()}")
    done = re.search(r"requests: \d+ total, \d+ started, \d+ done, (\d+) succeeded, (\d+) failed, (\d+) errored, "
                     r"(\d+) timeout", proc.stdout)
    mean = re.search(r"time for request:\s+\S+\s+\S+\s+(\S+)", proc.stdout)
    if done is None:
        raise ServerFailed(f"h2load printed no request counts: {proc.stdout[-500:]}")
    succeeded, *failures = map(int, done.groups())
    return succeeded, sum(failures), _ms(mean.group(1)) if mean else None


def _ms(text: str) -> float:
    """h2load's time (`712us`, `1.2ms`, `3s`) in ms."""
    for unit, scale in (("us", 1e-3), ("ms", 1.0), ("s", 1e3)):
        if text.endswith(unit):
            return round(float(text[:-len(unit)]) * scale, 3)
    return float(text)


async def drive_c(name: str, model: str, clients: Clients, concurrency: int, seconds: float) -> dict[str, Any]:
    """One point with a C generator (h2load for gRPC, wrk for HTTP), run off the event loop."""
    if name.endswith("-grpc"):
        answered, errors, mean = await asyncio.to_thread(run_h2load, clients.targets[name], clients.messages[model],
                                                         concurrency, seconds)
        return {"requests": answered, "errors": errors, "p50_ms": None, "p99_ms": None, "mean_ms": mean,
                "generator": "h2load"}
    from .loadgen import run_wrk

    body, headers = clients.bodies[model]
    load = await asyncio.to_thread(run_wrk, clients.url(name, model), body=body, headers=headers,
                                   connections=concurrency, seconds=max(1, round(seconds)))
    return {"requests": load.requests, "errors": load.errors, "p50_ms": load.p50_ms, "p99_ms": load.p99_ms,
            "generator": "wrk"}


async def measure(args: argparse.Namespace, clients: Clients, processes: dict[str, Process],
                  plan: dict[str, list[str]]) -> list[dict[str, Any]]:
    """Every configuration of `plan` ({model: configurations}) for every round and concurrency; a model
    whose answer is wrong somewhere gets an error record instead of points."""
    records: list[dict[str, Any]] = []
    checked: dict[str, list[str]] = {}
    for model, names in plan.items():  # every answer is checked before anything is measured
        try:
            await check(clients, args.specs[model], names)
            checked[model] = names
        except ServerFailed as e:
            records.append({"model": model, "error": str(e), "errors": 1})
            print(json.dumps(records[-1]), flush=True)
    for round_ in range(args.rounds):
        for model, names in checked.items():
            order = names[round_ % len(names):] + names[:round_ % len(names)]
            for concurrency in args.concurrency:
                for name in order:
                    record = {"model": model, "server": name, "concurrency": concurrency, "round": round_,
                              **await measure_point(args, clients, processes[name], name, model, concurrency)}
                    print(json.dumps(record), flush=True)
                    records.append(record)
    return records


async def measure_point(args: argparse.Namespace, clients: Clients, server: Process, name: str, model: str,
                        concurrency: int) -> dict[str, Any]:
    """One measured point: warm-up, then `args.duration` seconds with the server's and the client's CPU."""
    if args.generator == "c":
        await drive_c(name, model, clients, concurrency, args.warmup)
        cpu0, own0, t0 = server.cpu_s(), children_cpu_s(), time.perf_counter()
        result = await drive_c(name, model, clients, concurrency, args.duration)
        wall = time.perf_counter() - t0
        cpu1, own1 = server.cpu_s(), children_cpu_s()
        answered = result["requests"]
    else:
        send = clients.sender(name, model)
        await drive(send, concurrency, args.warmup)
        cpu0, own0, t0 = server.cpu_s(), own_cpu_s(), time.perf_counter()
        answered, errors, latencies = await drive(send, concurrency, args.duration)
        wall = time.perf_counter() - t0
        cpu1, own1 = server.cpu_s(), own_cpu_s()
        latencies.sort()
        result = {
            "requests": answered, "errors": errors, "generator": "python",
            "p50_ms": round(latencies[len(latencies) // 2] * 1e3, 3) if latencies else None,
            "p99_ms": round(latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1e3, 3)
            if latencies else None,
        }
    return {**result, "duration_s": round(wall, 3), "requests_per_s": round(answered / wall, 1),
            "server_cpu_us_per_request": round((cpu1 - cpu0) / max(answered, 1) * 1e6, 1),
            "client_cpu_us_per_request": round((own1 - own0) / max(answered, 1) * 1e6, 1)}


def left_out(models: list[str], servers: list[str]) -> dict[str, dict[str, str]]:
    """{model: {configuration: why}} for the configurations asked for that do not serve a model."""
    if "mlserver-grpc" not in servers:
        return {}
    why = f"MLServer's custom runtime serves only {PEER_MODEL}"
    return {model: {"mlserver-grpc": why} for model in models if model != PEER_MODEL}


def summarize(records: list[dict[str, Any]], /, *,
              left_out: dict[str, dict[str, str]] | None = None) -> dict[str, Any]:
    points: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for r in records:
        points.setdefault((r["model"], r["server"], r["concurrency"]), []).append(r)
    table: dict[str, dict[str, dict[str, Any]]] = {}
    for (model, server, concurrency), rows in sorted(points.items(), key=lambda item: item[0][1:]):  # models in run order
        table.setdefault(model, {}).setdefault(server, {})[str(concurrency)] = {
            key: statistics.median(r[key] for r in rows) if all(r.get(key) is not None for r in rows) else None
            for key in ("requests_per_s", "p50_ms", "p99_ms", "mean_ms", "server_cpu_us_per_request",
                        "client_cpu_us_per_request")
        } | {"errors": sum(r["errors"] for r in rows), "rounds": len(rows)}
    ratios: dict[str, dict[str, dict[str, Any]]] = {}
    for model, servers in table.items():
        ours = servers.get("aserve-grpc", {})
        for other in ("aserve-http", "mlserver-grpc"):
            theirs = servers.get(other, {})
            for level, point in ours.items():
                base = theirs.get(level)
                if base and base["requests_per_s"] and base["server_cpu_us_per_request"]:
                    ratios.setdefault(model, {}).setdefault(f"aserve-grpc/{other}", {})[level] = {
                        "requests_per_s": round(point["requests_per_s"] / base["requests_per_s"], 3),
                        "server_cpu_per_request": round(
                            point["server_cpu_us_per_request"] / base["server_cpu_us_per_request"], 3),
                    }
    return {"summary": table, "ratios": ratios, **({"left_out": left_out} if left_out else {})}


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    work = pathlib.Path(tempfile.mkdtemp(prefix="benchmarks-grpc-"))
    processes: dict[str, Process] = {}
    started: list[Process] = []
    targets: dict[str, str] = {}
    skipped = left_out(list(args.specs), args.servers)
    plan = {model: names for model in args.specs
            if (names := [s for s in args.servers if s not in skipped.get(model, {})])}
    try:
        repository = work / "repo"
        for model in args.specs:
            shutil.copytree(args.repository / model, repository / model,
                            ignore=shutil.ignore_patterns("__pycache__"))
        if {"aserve-grpc", "aserve-http"} & set(args.servers):
            aserve, port, grpc_port = aserve_process(repository, args.interpreters)
            started.append(aserve)
            aserve.start()
            processes["aserve-grpc"] = processes["aserve-http"] = aserve
            targets["aserve-grpc"] = f"127.0.0.1:{grpc_port}"
            targets["aserve-http"] = f"http://127.0.0.1:{port}"  # also the reference answer for models but simple
        if any("mlserver-grpc" in names for names in plan.values()):
            python, version = mlserver_python(args.peer_venvs)
            folder = work / "mlserver"
            folder.mkdir()
            mlserver, grpc_port = mlserver_process(python, folder, args.interpreters)
            started.append(mlserver)
            mlserver.start()
            processes["mlserver-grpc"] = mlserver
            targets["mlserver-grpc"] = f"127.0.0.1:{grpc_port}"
            records.append({"peer": "mlserver", "version": version, "parallel_workers": args.interpreters})
            print(json.dumps(records[-1]), flush=True)
        clients = Clients(targets, {model: sample(spec) for model, spec in args.specs.items()})
        try:
            records += await measure(args, clients, processes, plan)
        finally:
            await clients.close()
    except ServerFailed as e:
        records.append({"error": str(e), "errors": 1})
        print(json.dumps(records[-1]), flush=True)
    finally:
        for p in started:
            rc = p.stop()
            if rc not in (0, None, -15):
                records.append({"error": f"{p.name} exited with {rc} on SIGTERM", "errors": 1})
        shutil.rmtree(work, ignore_errors=True)
    return records


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.grpc", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", help="also write every record, and the summary last, to this file")
    p.add_argument("--servers", default=",".join(SERVERS), help="comma-separated (default %(default)s)")
    p.add_argument("--models", default=",".join(MODELS),
                   help="comma-separated folders of --repository, all served by one aserve (default %(default)s)")
    p.add_argument("--concurrency", type=_ints, default=[1, 16], help="requests in flight (default 1,16)")
    p.add_argument("--duration", type=float, default=5.0, help="seconds measured per point (default %(default)s)")
    p.add_argument("--warmup", type=float, default=1.0, help="seconds before each point (default %(default)s)")
    p.add_argument("--rounds", type=int, default=2, help="rounds, the order rotating (default %(default)s)")
    p.add_argument("--interpreters", type=int, default=2,
                   help="aserve's interpreters and MLServer's parallel workers (default %(default)s)")
    p.add_argument("--peer-venvs", type=pathlib.Path,
                   default=pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache"))
                   / "aserve" / "peers", help="where MLServer's virtual environment is kept (default %(default)s)")
    p.add_argument("--repository", type=pathlib.Path, default=ROOT / "examples",
                   help="folder with the example models (default: examples/)")
    p.add_argument("--generator", choices=("python", "c"), default="python",
                   help="python: grpc.aio and aiohttp in this process; c: h2load for gRPC, wrk for HTTP "
                        "(default %(default)s)")
    args = p.parse_args(argv)
    args.servers = [s for s in args.servers.split(",") if s]
    unknown = sorted(set(args.servers) - set(SERVERS))
    if unknown:
        p.error(f"unknown servers {unknown}; expected some of {', '.join(SERVERS)}")
    models = list(dict.fromkeys(m for m in args.models.split(",") if m))
    if not models:
        p.error("--models: name at least one model")
    try:
        args.specs = {model: read_spec(args.repository / model) for model in models}
    except (OSError, ValueError) as e:  # tomllib.TOMLDecodeError is a ValueError
        p.error(f"--models: {e}")
    import uvloop

    records = uvloop.run(run(args))
    summary = summarize([r for r in records if "requests_per_s" in r], left_out=left_out(models, args.servers))
    print(json.dumps(summary), flush=True)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps([*records, summary], indent=1) + "\n")
    return 1 if any(r.get("errors") for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
