"""Runs the fuzz targets (the decoders, the HTTP and gRPC fronts' connections) for a bounded time and prints JSON.

    python -m tests.fuzz.run --seconds 60                 # every target, 60 s each
    python -m tests.fuzz.run --runs 3000 --targets msgpack

Each target runs under atheris (`tests.fuzz.fuzz`) in a process of its own (`--jobs` at
once, one per core by default), seeded
with its corpus (tests/fuzz/corpus/<target>/, read only: what the fuzzer adds goes to
a scratch folder, or to `--keep DIR`/<target>). A crash (an input that breaks the
property in `tests.fuzz.targets`), a hang (`--timeout` seconds on one input) or an
out-of-memory stops libFuzzer: the runner records it, with the input written under
`--artifacts`, and starts the target again until its time is spent. The JSON names
each target's executions, crashes (the exception and the input's file) and coverage;
the exit status is 1 when anything crashed, 2 when atheris is not installed.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import pathlib
import platform
import re
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[2]
CORPUS = pathlib.Path(__file__).resolve().parent / "corpus"
TARGETS = ("v2_json", "v2_binary", "msgpack", "tfserving", "grpc", "http_front", "http_segments", "grpc_front",
           "grpc_segments")
MAX_RESTARTS = 20  # crashes recorded per target before it is given up

_STAT = re.compile(r"^stat::(\w+):\s+(\d+)", re.MULTILINE)
_COV = re.compile(r"^#\d+\s+\w+\s+cov: (\d+) ft: (\d+)", re.MULTILINE)
_ARTIFACT = re.compile(r"Test unit written to (\S+)")


def _atheris_version() -> str | None:
    try:
        from importlib.metadata import version

        import atheris  # noqa: F401
    except ImportError:
        return None
    return version("atheris")


def _what(output: str) -> str:
    """What stopped libFuzzer: the Python exception's last line, or libFuzzer's reason."""
    lines = output.splitlines()
    for i, line in enumerate(lines):
        if "Uncaught Python exception" in line:
            # The exception line comes first and again after the traceback.
            return lines[i + 1].strip()[:500] if i + 1 < len(lines) else "uncaught Python exception"
    for marker in ("ERROR: libFuzzer: timeout", "ERROR: libFuzzer: out-of-memory", "ERROR: libFuzzer: "):
        for line in lines:
            if marker in line:
                return line.split("ERROR: ", 1)[1].strip()
    return "libFuzzer stopped (see its output)"


def run_target(name: str, *, seconds: float | None, runs: int | None, timeout: int, rss_limit_mb: int,
               max_len: int, work: pathlib.Path, artifacts: pathlib.Path, python: str) -> dict[str, Any]:
    """Fuzz one target for `seconds` (or `runs` executions); restart after each crash."""
    work.mkdir(parents=True, exist_ok=True)
    artifacts.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"executions": 0, "seconds": 0.0, "crashes": 0, "failures": [], "coverage": 0,
                              "features": 0, "new_units": 0}
    start = time.monotonic()
    done_runs = 0
    stillborn = False  # a start that died before libFuzzer printed anything was retried
    for _ in range(MAX_RESTARTS + 1):
        # -len_control=0: inputs up to max_len from the start (the structured mutator re-encodes
        # whole messages, which libFuzzer's slowly growing length limit would mostly refuse)
        flags = [f"-timeout={timeout}", f"-rss_limit_mb={rss_limit_mb}", f"-max_len={max_len}", "-len_control=0",
                 "-print_final_stats=1", f"-artifact_prefix={artifacts}/{name}-"]
        if runs is not None:
            flags.append(f"-runs={max(runs - done_runs, 1)}")
        if seconds is not None:
            left = seconds - (time.monotonic() - start)
            flags.append(f"-max_total_time={max(round(left), 1)}")
        command = [python, "-m", "tests.fuzz.fuzz", name, *flags, str(work), str(CORPUS / name)]
        limit = seconds + timeout + 120 if seconds is not None else 600
        proc = subprocess.run(command, check=False, cwd=ROOT, capture_output=True, text=True,
                              errors="replace", timeout=limit)
        output = proc.stderr + proc.stdout
        stats = {k: int(v) for k, v in _STAT.findall(output)}
        executed = stats.get("number_of_executed_units", 0)
        result["executions"] += executed
        result["new_units"] += stats.get("new_units_added", 0)
        done_runs += executed
        for cov, ft in _COV.findall(output):
            result["coverage"] = max(result["coverage"], int(cov))
            result["features"] = max(result["features"], int(ft))
        written = _ARTIFACT.findall(output)
        if proc.returncode == 0 and not written:
            break
        if proc.returncode < 0 and not executed and not written and not output.strip() and not stillborn:
            # killed by a signal before libFuzzer said a word (its banner comes before any input
            # runs): nothing of the target ran, so it is started again once rather than counted
            stillborn = True
            result["restarts"] = result.get("restarts", 0) + 1
            continue
        result["crashes"] += 1
        result["failures"].append({"error": _what(output), "input": written[0] if written else None,
                                   "exit_status": proc.returncode})
        if (seconds is not None and time.monotonic() - start >= seconds) or (runs is not None and done_runs >= runs):
            break
        if not written:  # it did not start, or died without saying what on: running again would do the same
            result["failures"][-1]["output"] = output[-2000:]
            break
    result["seconds"] = round(time.monotonic() - start, 1)
    result["exec_per_s"] = round(result["executions"] / result["seconds"]) if result["seconds"] else 0
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, help="time per target (default 60 unless --runs is given)")
    parser.add_argument("--runs", type=int, help="executions per target")
    parser.add_argument("--targets", default=",".join(TARGETS), help=f"comma-separated (default {','.join(TARGETS)})")
    parser.add_argument("--timeout", type=int, default=10, help="seconds one input may take before it is a hang")
    parser.add_argument("--rss-limit-mb", type=int, default=2048)
    parser.add_argument("--max-len", type=int, default=8192, help="largest input the fuzzer makes, in bytes")
    parser.add_argument("--keep", type=pathlib.Path, help="keep the inputs the fuzzer adds in DIR/<target>")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="targets fuzzed at once (default: the cores)")
    parser.add_argument("--artifacts", type=pathlib.Path, help="crash inputs go here (default: a scratch folder)")
    args = parser.parse_args(argv)
    if args.seconds is None and args.runs is None:
        args.seconds = 60.0
    names = [n.strip() for n in args.targets.split(",") if n.strip()]
    unknown = [n for n in names if n not in TARGETS]
    if unknown:
        parser.error(f"unknown targets {unknown}; expected some of {', '.join(TARGETS)}")
    report: dict[str, Any] = {"python": platform.python_version(), "atheris": _atheris_version(),
                              "seconds_per_target": args.seconds, "runs_per_target": args.runs}
    if report["atheris"] is None:
        report["error"] = f"atheris is not installed for {sys.executable} (pip install atheris)"
        print(json.dumps(report, indent=2))
        return 2
    with tempfile.TemporaryDirectory(prefix="aserve-fuzz-") as scratch:
        base = pathlib.Path(scratch)
        artifacts = (args.artifacts or base / "artifacts").resolve()

        def run(name: str) -> dict[str, Any]:
            work = (args.keep / name if args.keep else base / "corpus" / name).resolve()
            return run_target(name, seconds=args.seconds, runs=args.runs, timeout=args.timeout,
                              rss_limit_mb=args.rss_limit_mb, max_len=args.max_len, work=work,
                              artifacts=artifacts, python=sys.executable)

        with concurrent.futures.ThreadPoolExecutor(max(args.jobs, 1)) as pool:  # each target is a process
            results = dict(zip(names, pool.map(run, names)))
        for name in names:
            if args.artifacts is None:  # the scratch folder goes: keep the inputs in the report
                for failure in results[name]["failures"]:
                    path = failure.get("input")
                    if path and pathlib.Path(path).exists():
                        failure["input_bytes"] = repr(pathlib.Path(path).read_bytes()[:2000])
        report["targets"] = results
        report["executions"] = sum(r["executions"] for r in results.values())
        report["crashes"] = sum(r["crashes"] for r in results.values())
    print(json.dumps(report, indent=2))
    return 1 if report["crashes"] else 0


if __name__ == "__main__":
    sys.exit(main())
