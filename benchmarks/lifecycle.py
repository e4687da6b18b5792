"""`benchmarks.lifecycle`: reloads under load, and what a model's weights cost per interpreter.

    python -m benchmarks.lifecycle [--model mlp] [--seconds 10] [--interval 2] [--connections 32]
                                [--repeat 3] [--no-memory] [--json benchmarks/results/lifecycle.json]

Reloads: one `aserve serve` process (private interpreters, uvloop: what ships) serves a
model `lc` from a temporary repository, version 1 a copy of `examples/<model>`. A
closed-loop load generator (wrk when installed, else aiohttp clients) keeps
`--connections` requests in flight for `--seconds`, twice per round: once untouched
(the baseline) and once while, every `--interval` seconds, a new version folder is
written and loaded with `POST /v2/repository/models/lc/load` (the version policy is
`latest = 1`: each new version replaces the one before, which answers what it accepted
and is unloaded). Reported per round: the p99 and errors of both runs, and each
reload's latency (from the load request to its answer, when the new version is ready,
warmed up and published). Rounds alternate and the summary takes medians.

Memory: `benchmarks.weights`' PSS of a model with 200+ MB of weights on 1, 2 and 4
private interpreters, shared (the runtime's default, three ways) and not shared (each
interpreter a copy), and the PSS growth over 50 load/unload cycles, in the same run.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from typing import Any

from . import ROOT
from .http import Skip, make_cases
from .loadgen import Load, drive, have_wrk
from .servers import ServerProcess, free_port, post

EXAMPLES = ROOT / "examples"


def make_repository(root: pathlib.Path, model: str, examples: pathlib.Path) -> None:
    """`root/lc/config.toml` (the example's) and `root/lc/1/` (its other files)."""
    source = examples / model
    target = root / "lc"
    target.mkdir(parents=True)
    shutil.copy(source / "config.toml", target / "config.toml")
    add_version(root, source, 1)


def add_version(root: pathlib.Path, source: pathlib.Path, version: int) -> None:
    folder = root / "lc" / str(version)
    shutil.copytree(source, folder, ignore=shutil.ignore_patterns("__pycache__", "config.toml"))


def _load(url: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    status, _, body = post(url, b"", {}, timeout=300)
    seconds = time.perf_counter() - t0
    if status != 200:
        raise RuntimeError(f"load request answered {status}: {body[:500]!r}")
    return {"seconds": seconds}


def run_round(server: ServerProcess, repo: pathlib.Path, source: pathlib.Path, case: Any, args: argparse.Namespace,
              generator: str, next_version: int) -> tuple[dict[str, Any], int]:
    """One baseline run and one run with reloads; (their record, the next version number)."""
    def load_run() -> Load:
        return drive(generator, server.url, body=case.body, headers=case.headers, connections=args.connections,
                     seconds=args.seconds, threads=args.threads)

    baseline = load_run()
    reloads: list[dict[str, Any]] = []
    result: dict[str, Load] = {}
    runner = threading.Thread(target=lambda: result.setdefault("load", load_run()))
    started = time.monotonic()
    runner.start()
    # reload at every interval, leaving the run's last interval without one (its answers drain)
    at = args.interval
    while at < args.seconds - args.interval / 2:
        time.sleep(max(0.0, started + at - time.monotonic()))  # the schedule of the reloads
        add_version(repo, source, next_version)
        record = _load(f"{server.base}/v2/repository/models/lc/load")
        record["version"] = next_version
        record["at_s"] = round(time.monotonic() - started, 3)
        reloads.append(record)
        next_version += 1
        at += args.interval
    runner.join()
    loaded = result["load"]
    return {
        "baseline": loaded_fields(baseline),
        "reloading": loaded_fields(loaded),
        "reloads": reloads,
    }, next_version


def loaded_fields(load: Load) -> dict[str, Any]:
    return {"requests_per_s": round(load.requests_per_s, 1), "p50_ms": load.p50_ms, "p99_ms": load.p99_ms,
            "errors": load.errors, "requests": load.requests}


def reload_bench(args: argparse.Namespace) -> dict[str, Any]:
    examples = pathlib.Path(args.examples)
    try:
        case = make_cases(args.model, ["binary"], examples)["binary"]
    except Skip as e:
        raise SystemExit(f"benchmarks.lifecycle: {e}") from None
    generator = "wrk" if have_wrk() else "aiohttp"
    with tempfile.TemporaryDirectory(prefix="aserve-lifecycle-") as tmp:
        repo = pathlib.Path(tmp) / "repo"
        make_repository(repo, args.model, examples)
        port = free_port()
        argv = [sys.executable, "-m", "aserve.cli", "serve", str(repo), "--port", str(port), "--interpreters",
                str(args.interpreters), "--log-level", "warning"]
        server = ServerProcess("aserve", "lc", argv, ready="aserve")
        server.start(lambda: False)
        rounds: list[dict[str, Any]] = []
        try:
            next_version = 2
            for _ in range(args.repeat):
                record, next_version = run_round(server, repo, examples / args.model, case, args, generator,
                                                 next_version)
                rounds.append(record)
                print(json.dumps({"round": len(rounds), **record}), file=sys.stderr)
        finally:
            rc = server.stop()
    reload_s = [r["seconds"] for rnd in rounds for r in rnd["reloads"]]
    return {
        "model": args.model,
        "generator": generator,
        "connections": args.connections,
        "seconds": args.seconds,
        "interval_s": args.interval,
        "interpreters": args.interpreters,
        "server_exit": rc,
        "rounds": rounds,
        "summary": {
            "reloads": len(reload_s),
            "reload_latency_s_median": round(statistics.median(reload_s), 3) if reload_s else None,
            "reload_latency_s_max": round(max(reload_s), 3) if reload_s else None,
            "p99_ms_baseline_median": statistics.median(r["baseline"]["p99_ms"] for r in rounds),
            "p99_ms_reloading_median": statistics.median(r["reloading"]["p99_ms"] for r in rounds),
            "rps_baseline_median": statistics.median(r["baseline"]["requests_per_s"] for r in rounds),
            "rps_reloading_median": statistics.median(r["reloading"]["requests_per_s"] for r in rounds),
            "errors_baseline": sum(r["baseline"]["errors"] for r in rounds),
            "errors_reloading": sum(r["reloading"]["errors"] for r in rounds),
        },
    }


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.lifecycle", description=__doc__.split("\n\n")[0])
    have_torch = True
    try:
        import torch  # noqa: F401
    except ImportError:
        have_torch = False
    p.add_argument("--model", default="mlp" if have_torch else "simple", choices=("mlp", "simple"),
                   help="the example model versions are copies of (default mlp when torch is installed)")
    p.add_argument("--seconds", type=int, default=10, help="length of each load run")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between reloads in a reloading run")
    p.add_argument("--connections", type=int, default=32, help="requests kept in flight")
    p.add_argument("--threads", type=int, default=1, help="load generator threads (wrk) or processes (aiohttp)")
    p.add_argument("--interpreters", type=int, default=2, help="interpreters of the server's pool")
    p.add_argument("--repeat", type=int, default=3, help="rounds (baseline + reloading each)")
    p.add_argument("--memory", action=argparse.BooleanOptionalAction, default=have_torch,
                   help="also measure weight sharing and load/unload growth (needs torch)")
    p.add_argument("--megabytes", type=float, default=210.0, help="weights of the memory model")
    p.add_argument("--cycles", type=int, default=50, help="load/unload cycles of the memory growth figure")
    p.add_argument("--examples", default=str(EXAMPLES), help=argparse.SUPPRESS)
    p.add_argument("--json", help="also write the result here")
    return p.parse_args(argv)


def memory_summary(memory: dict[str, Any]) -> dict[str, Any]:
    """Per variant: MB one more interpreter adds (k = 2 and 4), and the load/unload growth."""
    added: dict[str, dict[str, float]] = {}
    for r in memory["records"]:
        if "per_added_interpreter_mb" in r:
            added.setdefault(r["variant"], {})[f"k{r['interpreters']}"] = r["per_added_interpreter_mb"]
    default = [g for g in memory["load_unload"] if g["malloc_trim"] and g["mmap_while_loading"]]
    return {
        "weights_mb": memory["weights_mb"],
        "interpreter_mb": memory["interpreter_mb"],
        "per_added_interpreter_mb": added,
        "load_unload_growth_mb": {g["variant"]: g["growth_mb"] + g["left_after_first_unload_mb"] for g in default},
        "load_unload_cycles": default[0]["cycles"] if default else 0,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.memory:
        from aserve.engine import ensure_glibc_tunables

        ensure_glibc_tunables()  # four private interpreters: re-executes with glibc's tunables
    result: dict[str, Any] = {"bench": "lifecycle", "python": platform.python_version(),
                              "reload": reload_bench(args)}
    if args.memory:
        import asyncio

        from . import weights

        result["memory"] = asyncio.run(weights.run(argparse.Namespace(
            megabytes=args.megabytes, interpreters="1,2,4", cycles=args.cycles, cycle_megabytes=32.0)))
        result["memory_summary"] = memory_summary(result["memory"])
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        pathlib.Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
