"""`benchmarks.scaling`: requests/s against concurrent requesters, per engine.

Reproduces Figure 5 of the torch::deploy paper on this machine: each of k requesters
sends one batch-1 request, waits for its answer and sends the next (a closed loop),
against a model served by k interpreters; k runs from 1 to N (default: the number of
CPUs). Engine `main` serves with k threads of the host interpreter (one GIL, the
paper's "global interpreter"); `private` with k private libpython copies; `subinterp`
(Python >= 3.12, pure-Python models only) with k PEP 684 subinterpreters.

Each (engine, model) pair runs in a fresh child process, so that its memory figures
hold only what that engine and model cost: PSS before the pool starts, with one
interpreter and the model loaded, and with N. `speedup` is a run's requests/s over
the same engine's 1-interpreter figure measured in the same invocation.

A model that does not load on an engine (`mlp` and `cnn` need torch, which the Python
3.13 environment lacks) is skipped, and the run goes on with the rest: a line on
stderr and a `{"model", "engine", "skipped": reason}` record after the points.

    python -m benchmarks.scaling --json scaling.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import platform
import random
import subprocess
import sys
import time
from array import array
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from aserve.engine import ModelSpec, Pool, ensure_glibc_tunables
from aserve.errors import AserveError
from aserve.repository.config import load_config
from aserve.runtime.datatypes import encode_bytes
from aserve.tensor import Tensor

from . import ROOT, child_env

MODELS = ("simple", "mlp", "cnn", "textclass")
PURE_PYTHON = ("simple", "textclass")  # the ones PEP 684 subinterpreters can run
ENGINE_ORDER = ("main", "private", "subinterp")


class Point(msgspec.Struct, kw_only=True):
    """One measured run: `requesters` closed-loop clients against `interpreters` interpreters."""

    model: str
    engine: str
    interpreters: int  # threads for engine "main"
    requesters: int
    requests: int
    duration_s: float
    requests_per_s: float
    rounds_requests_per_s: list[float]  # each round's figure: their spread shows the noise
    p50_ms: float
    p99_ms: float
    rss_mb: float
    pss_mb: float
    cpu_cores: float  # process CPU time over wall time: how many cores were busy
    host_cpu_us_per_request: float  # event-loop thread CPU per request (dispatch + completion)
    other_cores: float  # CPU other processes used meanwhile, in cores: > 0.2 means a noisy point
    speedup: float = 0.0  # requests_per_s over the same engine's 1-interpreter run
    startup_s_first: float = 0.0  # starting the first interpreter
    startup_s_per_interpreter: float = 0.0  # each further interpreter (started concurrently)
    load_s: float = 0.0  # loading the model in one interpreter (imports included)
    pss_mb_idle: float = 0.0  # the process before the pool started
    pss_mb_first: float = 0.0  # PSS added by the first interpreter with the model loaded
    pss_mb_per_interpreter: float = 0.0  # PSS added by each further interpreter with the model
    python: str = platform.python_version()
    cpus: int = os.cpu_count() or 1


class Setup(msgspec.Struct, kw_only=True):
    """What one (engine, model) child measured before its runs."""

    startup_s_first: float
    startup_s_per_interpreter: float
    load_s: float
    pss_mb_idle: float
    pss_mb_first: float
    pss_mb_per_interpreter: float


class ChildResult(msgspec.Struct, kw_only=True):
    setup: Setup | None = None
    points: list[Point] = []
    skipped: str | None = None  # why the model could not be measured on this engine


# ---- inputs --------------------------------------------------------------------

SENTENCES = (
    "The striker scored twice and the home team won the league match",
    "Install the new compiler and the python code runs faster on every core",
    "Simmer the tomato sauce with garlic, olive oil and fresh basil",
)


def _floats(n: int, rng: random.Random) -> bytes:
    return array("f", [rng.gauss(0.0, 1.0) for _ in range(n)]).tobytes()


def sample_inputs(model: str, seed: int = 0) -> dict[str, Tensor]:
    """One batch-1 request for a bundled example model."""
    rng = random.Random(seed)
    if model == "simple":
        ints = [array("i", [rng.randrange(-1000, 1000) for _ in range(16)]).tobytes() for _ in range(2)]
        return {"INPUT0": Tensor("INT32", (1, 16), ints[0]), "INPUT1": Tensor("INT32", (1, 16), ints[1])}
    if model == "mlp":
        return {"INPUT": Tensor("FP32", (1, 16), _floats(16, rng))}
    if model == "cnn":
        return {"IMAGE": Tensor("FP32", (1, 3, 64, 64), _floats(3 * 64 * 64, rng))}
    if model == "textclass":
        return {"TEXT": Tensor("BYTES", (1,), encode_bytes([rng.choice(SENTENCES).encode()]))}
    raise SystemExit(
        f"benchmarks.scaling: no sample input for model {model!r}; choose from {', '.join(MODELS)}"
    )


def model_spec(repository: pathlib.Path, name: str) -> ModelSpec:
    folder = repository / name
    config = load_config(folder / "config.toml")
    return ModelSpec(
        name=name,
        path=str(folder),
        class_name=config.class_name,
        inputs=config.input_specs,
        outputs=config.output_specs,
        parameters=dict(config.parameters),
    )


# ---- measuring -----------------------------------------------------------------


def memory_mb() -> tuple[float, float]:
    """(RSS, PSS) of this whole process in MB (PSS counts shared pages fractionally)."""
    import psutil

    info = psutil.Process().memory_full_info()
    return info.rss / 2**20, getattr(info, "pss", info.rss) / 2**20


def percentile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    i = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[i]


def busy_cpu_s() -> float:
    """CPU seconds the whole machine spent busy so far (all processes, all cores)."""
    import psutil

    t = psutil.cpu_times()
    return float(sum(t) - t.idle - getattr(t, "iowait", 0.0))


class Usage(msgspec.Struct):
    wall_s: float
    host_thread_cpu_s: float
    process_cpu_s: float
    machine_cpu_s: float


async def closed_loop(
    infer: Callable[[], Any], *, requesters: int, duration_s: float, requests: int | None
) -> tuple[list[float], Usage]:
    """Run `requesters` closed-loop clients; their latencies (s) and the CPU used meanwhile."""
    loop = asyncio.get_running_loop()
    latencies: list[float] = []
    remaining = [requests] if requests is not None else None
    clock = time.perf_counter

    async def client(deadline: float) -> None:
        while loop.time() < deadline:
            if remaining is not None:
                if remaining[0] <= 0:
                    return
                remaining[0] -= 1
            t0 = clock()
            await infer()
            latencies.append(clock() - t0)

    deadline = loop.time() + (duration_s if requests is None else 3600.0)
    machine0, cpu0, thread0, wall0 = busy_cpu_s(), time.process_time(), time.thread_time(), clock()
    await asyncio.gather(*(client(deadline) for _ in range(requesters)))
    usage = Usage(
        wall_s=clock() - wall0,
        host_thread_cpu_s=time.thread_time() - thread0,
        process_cpu_s=time.process_time() - cpu0,
        machine_cpu_s=busy_cpu_s() - machine0,
    )
    return latencies, usage


class Tally:
    """One requester count's measurements, summed over rounds."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.wall_s = self.host_thread_cpu_s = self.process_cpu_s = self.machine_cpu_s = 0.0
        self.rates: list[float] = []

    def add(self, latencies: list[float], usage: Usage) -> None:
        self.latencies += latencies
        self.wall_s += usage.wall_s
        self.host_thread_cpu_s += usage.host_thread_cpu_s
        self.process_cpu_s += usage.process_cpu_s
        self.machine_cpu_s += usage.machine_cpu_s
        self.rates.append(len(latencies) / usage.wall_s if usage.wall_s > 0 else 0.0)

    def point(self, model: str, engine: str, k: int) -> Point:
        lat = sorted(self.latencies)
        n, wall = len(lat), self.wall_s
        rss, pss = memory_mb()
        return Point(
            model=model,
            engine=engine,
            interpreters=k,
            requesters=k,
            requests=n,
            duration_s=round(wall, 3),
            requests_per_s=round(n / wall, 1) if wall > 0 else 0.0,
            rounds_requests_per_s=[round(r, 1) for r in self.rates],
            p50_ms=round(percentile(lat, 0.50) * 1e3, 4),
            p99_ms=round(percentile(lat, 0.99) * 1e3, 4),
            rss_mb=round(rss, 1),
            pss_mb=round(pss, 1),
            cpu_cores=round(self.process_cpu_s / wall, 2) if wall > 0 else 0.0,
            host_cpu_us_per_request=round(self.host_thread_cpu_s / n * 1e6, 1) if n else 0.0,
            other_cores=round(max(0.0, self.machine_cpu_s - self.process_cpu_s) / wall, 2)
            if wall > 0
            else 0.0,
        )


async def measure_round(
    pool: Pool, spec: ModelSpec, inputs: dict[str, Tensor], tally: Tally, *, k: int, args: argparse.Namespace
) -> None:
    """Serve the model from k interpreters, warm up, and measure k requesters for one round."""
    if pool.models.get(spec.name) is None or pool.models[spec.name].interpreters != k:
        await pool.load(spec, interpreters=k)

    async def infer() -> None:
        await pool.infer(spec.name, inputs)

    rounds = args.rounds
    await closed_loop(infer, requesters=k, duration_s=args.warmup / rounds, requests=None)
    requests = None if args.requests is None else max(1, args.requests // rounds)
    latencies, usage = await closed_loop(
        infer, requesters=k, duration_s=args.duration / rounds, requests=requests
    )
    tally.add(latencies, usage)


async def run_child(engine: str, model: str, args: argparse.Namespace) -> ChildResult:
    """Start the pool, load the model, measure every requester count (one process per call).

    Requester counts are measured in interleaved rounds (1, 2, .., N, 1, 2, ..), so that a
    change in background load while the benchmark runs falls on every count alike.
    """
    spec = model_spec(pathlib.Path(args.repository), model)
    inputs = sample_inputs(model)
    counts = requester_counts(args)
    most = max(counts)
    _, pss_idle = memory_mb()

    t0 = time.perf_counter()
    pool = Pool(engine=engine, interpreters=1)
    await pool.start()
    startup_first = time.perf_counter() - t0
    t0 = time.perf_counter()
    try:
        await pool.load(spec)
    except AserveError as e:  # the model's import or load() failed (ModelLoadError): nothing to measure
        await pool.close()
        reason = str(e).strip().splitlines()
        return ChildResult(skipped=f"{model} does not load on engine {engine}: "
                                   f"{reason[-1] if reason else type(e).__name__}")
    load_s = time.perf_counter() - t0
    _, pss_one = memory_mb()
    per_interpreter = pss_per = 0.0
    if most > 1:
        await pool.close()
        # the closed pool parks its interpreter; this one adds most - 1 to it
        t0 = time.perf_counter()
        pool = Pool(engine=engine, interpreters=most)
        await pool.start()
        per_interpreter = (time.perf_counter() - t0) / (most - 1)
        await pool.load(spec)
        _, pss_most = memory_mb()
        pss_per = (pss_most - pss_one) / (most - 1)
    tallies = {k: Tally() for k in counts}
    try:
        for _ in range(args.rounds):
            for k in counts:
                await measure_round(pool, spec, inputs, tallies[k], k=k, args=args)
    finally:
        await pool.close()
    setup = Setup(
        startup_s_first=round(startup_first, 3),
        startup_s_per_interpreter=round(per_interpreter, 3),
        load_s=round(load_s, 3),
        pss_mb_idle=round(pss_idle, 1),
        pss_mb_first=round(pss_one - pss_idle, 1),
        pss_mb_per_interpreter=round(pss_per, 1),
    )
    return ChildResult(setup=setup, points=[tallies[k].point(model, engine, k) for k in counts])


# ---- orchestration -------------------------------------------------------------


def requester_counts(args: argparse.Namespace) -> list[int]:
    if args.requesters:
        return sorted({int(x) for x in args.requesters.split(",")})
    return list(range(1, args.max_requesters + 1))


def engines_for(model: str, engines: Sequence[str]) -> list[str]:
    return [e for e in engines if e != "subinterp" or model in PURE_PYTHON]


def child_command(engine: str, model: str, args: argparse.Namespace) -> list[str]:
    cmd = [sys.executable, "-m", "benchmarks.scaling", "--child", engine, model]
    cmd += [
        "--repository",
        str(args.repository),
        "--duration",
        str(args.duration),
        "--warmup",
        str(args.warmup),
    ]
    cmd += ["--requesters", ",".join(map(str, requester_counts(args))), "--rounds", str(args.rounds)]
    if args.requests is not None:
        cmd += ["--requests", str(args.requests)]
    if not args.uvloop:
        cmd += ["--no-uvloop"]
    return cmd


def run_in_child(engine: str, model: str, args: argparse.Namespace) -> ChildResult:
    proc = subprocess.run(child_command(engine, model, args), capture_output=True, text=True, check=False,
                          env=child_env())
    sys.stderr.write(proc.stderr)
    lines = proc.stdout.strip().splitlines()
    if not lines:
        last = proc.stderr.strip().splitlines()[-1:] or ["no output"]
        return ChildResult(skipped=f"benchmark process exited with {proc.returncode} before reporting: {last[0]}")
    if proc.returncode != 0:
        # the results were complete; the process failed while shutting down
        print(
            f"scaling: warning: {engine}/{model} process exited with {proc.returncode} after reporting",
            file=sys.stderr,
        )
    return msgspec.json.decode(lines[-1], type=ChildResult)


def finish(results: list[tuple[ChildResult, str, str]]) -> list[Point]:
    """Flatten child results into records: setup figures and speedups filled in."""
    records: list[Point] = []
    for result, _, _ in results:
        if result.setup is None:
            continue
        base = next((p.requests_per_s for p in result.points if p.interpreters == 1), 0.0)
        for p in result.points:
            p.speedup = round(p.requests_per_s / base, 3) if base else 0.0
            for field in Setup.__struct_fields__:
                setattr(p, field, getattr(result.setup, field))
            records.append(p)
    return records


def spread(p: Point) -> float:
    """(max - min) / mean of a point's per-round rates."""
    rates = p.rounds_requests_per_s
    mean = sum(rates) / len(rates) if rates else 0.0
    return (max(rates) - min(rates)) / mean if mean else 0.0


def table(records: Sequence[Point]) -> str:
    head = (
        f"{'model':<10}{'engine':<10}{'k':>3}{'req/s':>10}{'speedup':>9}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'spread':>7}{'cores':>7}{'others':>7}{'host us/req':>12}{'PSS MB':>9}"
    )
    lines = [head, "-" * len(head)]
    for p in records:
        lines.append(
            f"{p.model:<10}{p.engine:<10}{p.interpreters:>3}{p.requests_per_s:>10.0f}{p.speedup:>9.2f}"
            f"{p.p50_ms:>9.3f}{p.p99_ms:>9.3f}{spread(p):>7.0%}{p.cpu_cores:>7.2f}{p.other_cores:>7.2f}{p.host_cpu_us_per_request:>12.1f}{p.pss_mb:>9.0f}"
        )
    setup_head = (
        f"{'model':<10}{'engine':<10}{'start 1st s':>12}{'start +1 s':>11}{'load s':>8}"
        f"{'PSS 1st MB':>11}{'PSS +1 MB':>10}"
    )
    lines += ["", setup_head]
    seen: set[tuple[str, str]] = set()
    for p in records:
        if (p.model, p.engine) in seen:
            continue
        seen.add((p.model, p.engine))
        lines.append(
            f"{p.model:<10}{p.engine:<10}{p.startup_s_first:>12.3f}{p.startup_s_per_interpreter:>11.3f}"
            f"{p.load_s:>8.3f}{p.pss_mb_first:>11.1f}{p.pss_mb_per_interpreter:>10.1f}"
        )
    return "\n".join(lines)


def default_repository() -> pathlib.Path:
    return ROOT / "examples"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    engines = ["main", "private"] + (["subinterp"] if sys.version_info >= (3, 12) else [])
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.scaling",
        description="Throughput against concurrent batch-1 requesters (1..N), one interpreter per requester, "
        "per engine (the torch::deploy paper's Figure 5).",
    )
    p.add_argument(
        "--models", default=",".join(MODELS), help="comma-separated example models (default: %(default)s)"
    )
    p.add_argument(
        "--engines", default=",".join(engines), help="comma-separated engines (default: %(default)s)"
    )
    p.add_argument(
        "--max-requesters",
        type=int,
        default=os.cpu_count() or 1,
        help="measure 1..N requesters, N interpreters at most (default: CPUs, %(default)s)",
    )
    p.add_argument(
        "--requesters", default="", help="explicit comma-separated requester counts (overrides the above)"
    )
    p.add_argument(
        "--duration", type=float, default=2.0, help="seconds measured per point (default: %(default)s)"
    )
    p.add_argument(
        "--requests",
        type=int,
        default=None,
        help="measure a fixed number of requests per point instead of a duration",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="interleaved rounds the duration is split into (default: %(default)s)",
    )
    p.add_argument(
        "--warmup", type=float, default=0.5, help="seconds of unmeasured load first (default: %(default)s)"
    )
    p.add_argument(
        "--repository",
        default=str(default_repository()),
        help="model repository holding the example models (default: the bundled examples/)",
    )
    p.add_argument(
        "--no-uvloop", dest="uvloop", action="store_false", help="use asyncio's default event loop"
    )
    p.add_argument("--json", metavar="FILE", help="write the records as a JSON list to FILE ('-' for stdout)")
    p.add_argument("--child", nargs=2, metavar=("ENGINE", "MODEL"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.max_requesters < 1 or args.duration <= 0 or args.warmup < 0 or args.rounds < 1:
        p.error("--max-requesters and --rounds must be >= 1, --duration > 0, --warmup >= 0")
    if args.requests is not None and args.requests < 1:
        p.error("--requests must be >= 1")
    return args


def _run(coro: Any, use_uvloop: bool) -> Any:
    if use_uvloop:
        import uvloop

        return uvloop.run(coro)
    return asyncio.run(coro)


def main(argv: list[str] | None = None) -> int:
    ensure_glibc_tunables()
    args = parse_args(argv)
    if args.child:
        engine, model = args.child
        result = _run(run_child(engine, model, args), args.uvloop)
        sys.stdout.write(msgspec.json.encode(result).decode() + "\n")
        return 0
    models = [m for m in args.models.split(",") if m]
    engines = [e for e in ENGINE_ORDER if e in args.engines.split(",")]
    unknown = set(args.engines.split(",")) - set(ENGINE_ORDER)
    if unknown:
        raise SystemExit(f"benchmarks.scaling: unknown engine(s) {', '.join(sorted(unknown))}")
    for m in models:
        sample_inputs(m)  # fail early on an unknown model
    results: list[tuple[ChildResult, str, str]] = []
    skipped: list[dict[str, str]] = []
    started = time.perf_counter()
    for model in models:
        for engine in engines_for(model, engines):
            print(f"scaling: {model} on {engine} ...", file=sys.stderr, flush=True)
            result = run_in_child(engine, model, args)
            if result.skipped is not None:
                print(f"scaling: skipping {model} on {engine}: {result.skipped}", file=sys.stderr, flush=True)
                skipped.append({"model": model, "engine": engine, "skipped": result.skipped})
                continue
            results.append((result, engine, model))
    records = finish(results)
    print(table(records), file=sys.stderr)
    for s in skipped:
        print(f"skipped: {s['model']} on {s['engine']}: {s['skipped']}", file=sys.stderr)
    print(
        f"({time.perf_counter() - started:.0f} s, {os.cpu_count()} CPUs, Python {platform.python_version()})",
        file=sys.stderr,
    )
    if args.json:
        text = json.dumps([msgspec.to_builtins(r) for r in records] + skipped, indent=1)
        if args.json == "-":
            sys.stdout.write(text + "\n")
        else:
            pathlib.Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
