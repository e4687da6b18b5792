"""Soak: the Locust mix at 80% of the measured capacity for 30 minutes; does memory stay flat?

Starts `aserve serve` (the bundled examples unless a repository is given; `--engine`,
`--interpreters`), measures its capacity with the Locust mix of `locustfile.py` (closed
loop, `--capacity-users` users for `--capacity-seconds`: the aggregated requests/s),
then runs the same mix headless for `--minutes` at `--load` (0.8) times that rate,
paced (Locust's `constant_throughput` per user), with `--csv`. Every `--sample-seconds`
(10) it records the server process's PSS (and USS: its private memory alone).

Prints JSON: capacity and target rate, requests, failures, the achieved rate, the PSS
after the warm-up (the median of the first three samples from `--warmup-minutes` on)
and at the end (the median of the last three before the load stops), its growth and whether that is within
`--pss-tolerance` (5%), the same for USS, and every sample. Writes the Locust CSV
files, the samples (`soak_memory.csv`) and a plot of PSS, USS and requests/s over time
(`soak.png`, matplotlib: the `bench` extra) to `--out`. The exit status is 1 when a
request failed or the PSS grew past the tolerance. PSS shares each file-backed page
among the processes that map it: another process mapping the same libraries (torch)
moves it, which USS does not see.

On demand, not in CI (it takes `--minutes`, and its figures mean something only on a
quiet machine):

    .venv/bin/python loadtests/soak.py                         # 30 minutes (+ ~1 for capacity)
    .venv/bin/python loadtests/soak.py --minutes 1 --warmup-minutes 0.25 --capacity-seconds 15
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from types import ModuleType
from typing import Any

import psutil
from served import free_port

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent

# Locust runs the mix of locustfile.py unchanged, paced: a user class of the same requests
# whose wait keeps each user at a fixed rate. Imported as a module, so that Locust sees
# only this class.
PACED = f'''
import os, sys
sys.path.insert(0, {str(HERE)!r})
from locust import constant_throughput
import locustfile

class PacedInferUser(locustfile.InferUser):
    wait_time = constant_throughput(float(os.environ["ASERVE_SOAK_USER_RPS"]))
'''


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("repository", nargs="?", help="model repository (default: the bundled examples)")
    ap.add_argument("--minutes", type=float, default=30.0, help="length of the soak")
    ap.add_argument("--load", type=float, default=0.8, help="offered rate as a share of the capacity")
    ap.add_argument("--capacity", type=float, help="requests/s to take as the capacity instead of measuring it")
    ap.add_argument("--capacity-seconds", type=float, default=30.0)
    ap.add_argument("--capacity-users", type=int, default=32)
    ap.add_argument("--users", type=int, default=32, help="Locust users during the soak")
    ap.add_argument("--sample-seconds", type=float, default=10.0, help="PSS sampling period")
    ap.add_argument("--warmup-minutes", type=float, help="PSS baseline time (default: a tenth of --minutes, "
                                                          "at most 3)")
    ap.add_argument("--pss-tolerance", type=float, default=0.05, help="largest PSS growth after the warm-up")
    ap.add_argument("--engine", default="auto")
    ap.add_argument("--interpreters", type=int, default=2)
    ap.add_argument("--weights", help="ASERVE_LOCUST_WEIGHTS (default: locustfile.py's mix)")
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "results" / "soak", help="folder for CSV and PNG")
    ap.add_argument("--ready-timeout", type=float, default=300.0)
    args = ap.parse_args(argv)
    if args.warmup_minutes is None:
        args.warmup_minutes = min(3.0, args.minutes / 10)
    return args


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"aserve_loadtests_{name}", HERE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Server:
    """`aserve serve` in a child process of its own session."""

    def __init__(self, args: argparse.Namespace, log: Any) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, "-m", "aserve.cli", "serve", "--port", str(self.port), "--engine", args.engine,
                   "--interpreters", str(args.interpreters), "--log-level", "warning"]
        if args.repository:
            command.insert(4, args.repository)
        self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.process = psutil.Process(self.proc.pid)

    def ready(self, timeout: float) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"aserve serve exited with {self.proc.returncode}")
            try:
                with urllib.request.urlopen(f"{self.url}/v2/health/ready", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        raise RuntimeError(f"the server was not ready after {timeout} s")

    def pss_mb(self) -> float:
        return float(self.process.memory_full_info().pss) / 2**20

    def memory_mb(self) -> tuple[float, float]:
        """(PSS, USS) in MiB."""
        info = self.process.memory_full_info()
        return round(info.pss / 2**20, 1), round(info.uss / 2**20, 1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def locust(locustfile: pathlib.Path, url: str, *, users: int, seconds: float, prefix: pathlib.Path,
           env: dict[str, str], log: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "locust", "-f", str(locustfile), "--headless", "--users", str(users),
         "--spawn-rate", str(users), "--run-time", f"{max(1, round(seconds))}s", "--host", url,
         "--csv", str(prefix), "--only-summary", "--loglevel", "WARNING", "--stop-timeout", "10"],
        cwd=prefix.parent, env=env, stdout=log, stderr=subprocess.STDOUT,
    )


def aggregated(prefix: pathlib.Path) -> dict[str, str]:
    with open(f"{prefix}_stats.csv", newline="") as f:
        for row in csv.DictReader(f):
            if row["Name"] == "Aggregated":
                return row
    raise RuntimeError(f"{prefix}_stats.csv has no Aggregated row")


def plot(samples: list[tuple[float, float, float]], history: pathlib.Path, out: pathlib.Path, title: str) -> bool:
    """PSS and requests/s over time; False when matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = _load("plot").read_history(history)
    fig, (pss, rate) = plt.subplots(2, 1, sharex=True, figsize=(9, 6), constrained_layout=True)
    pss.plot([t / 60 for t, _, _ in samples], [m for _, m, _ in samples], marker=".", label="server PSS")
    pss.plot([t / 60 for t, _, _ in samples], [u for _, _, u in samples], marker=".", label="server USS")
    pss.set_ylabel("MiB")
    pss.legend(loc="lower right")
    pss.grid(alpha=0.3)
    rate.plot([t / 60 for t in series["t"]], series["rps"], label="requests/s")
    if any(series["fps"]):
        rate.plot([t / 60 for t in series["t"]], series["fps"], label="failures/s", color="tab:red")
    rate.set_ylabel("per second")
    rate.set_ylim(bottom=0)
    rate.set_xlabel("minutes")
    rate.legend(loc="lower right")
    rate.grid(alpha=0.3)
    fig.suptitle(title)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return True


def run(args: argparse.Namespace) -> dict[str, Any]:
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    if args.weights:
        env["ASERVE_LOCUST_WEIGHTS"] = args.weights
    result: dict[str, Any] = {"minutes": args.minutes, "engine": args.engine, "interpreters": args.interpreters,
                              "repository": args.repository or "examples (bundled)", "load": args.load,
                              "loadavg_1m_start": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory(prefix="aserve-soak-") as tmp, open(out / "soak.log", "wb") as log:
        paced = pathlib.Path(tmp) / "paced.py"
        paced.write_text(PACED)
        server = Server(args, log)
        try:
            server.ready(args.ready_timeout)
            result["pss_mb_ready"] = round(server.pss_mb(), 1)
            if args.capacity is None:
                prefix = out / "capacity"
                measure = locust(HERE / "locustfile.py", server.url, users=args.capacity_users,
                                 seconds=args.capacity_seconds, prefix=prefix, env=env, log=log)
                if measure.wait(args.capacity_seconds + 120) != 0:
                    raise RuntimeError(f"the capacity run failed (status {measure.returncode}); see {out}/soak.log")
                row = aggregated(prefix)
                capacity = float(row["Requests/s"])
                result["capacity_failures"] = int(row["Failure Count"])
            else:
                capacity = args.capacity
            target = args.load * capacity
            result["capacity_rps"] = round(capacity, 1)
            result["target_rps"] = round(target, 1)
            env["ASERVE_SOAK_USER_RPS"] = repr(target / args.users)
            prefix = out / "soak"
            seconds = args.minutes * 60
            samples: list[tuple[float, float, float]] = []
            start = time.monotonic()
            soak = locust(paced, server.url, users=args.users, seconds=seconds, prefix=prefix, env=env, log=log)
            while True:
                samples.append((round(time.monotonic() - start, 1), *server.memory_mb()))
                try:
                    soak.wait(max(0.0, start + len(samples) * args.sample_seconds - time.monotonic()))
                    break
                except subprocess.TimeoutExpired:
                    if server.proc.poll() is not None:
                        soak.terminate()
                        raise RuntimeError(f"the server exited with {server.proc.returncode} during the soak")
            samples.append((round(time.monotonic() - start, 1), *server.memory_mb()))
            result["locust_exit_status"] = soak.returncode
        finally:
            server.stop()
            result["server_exit_status"] = server.proc.returncode
    row = aggregated(prefix)
    requests, failures = int(row["Request Count"]), int(row["Failure Count"])
    result["requests"] = requests
    result["failures"] = failures
    result["achieved_rps"] = round(float(row["Requests/s"]), 1)
    result["p50_ms"], result["p99_ms"] = _number(row["50%"]), _number(row["99%"])
    # under load: from the end of the warm-up to before Locust stops
    loaded = [s for s in samples if args.warmup_minutes * 60 <= s[0] < seconds] or samples[-1:]
    result["warmup_minutes"] = args.warmup_minutes
    for column, kind in ((1, "pss"), (2, "uss")):
        warm = statistics.median(s[column] for s in loaded[:3])
        end = statistics.median(s[column] for s in loaded[-3:])
        result[f"{kind}_mb_after_warmup"] = warm
        result[f"{kind}_mb_end"] = end
        result[f"{kind}_growth"] = round((end - warm) / warm, 4)
    warm, end = result["pss_mb_after_warmup"], result["pss_mb_end"]
    result["pss_within_tolerance"] = abs(end - warm) <= args.pss_tolerance * warm
    result["pss_tolerance"] = args.pss_tolerance
    result["loadavg_1m_end"] = os.getloadavg()[0]
    with open(out / "soak_memory.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["seconds", "pss_mib", "uss_mib"])
        writer.writerows(samples)
    title = (f"aserve soak: {args.minutes:g} min at {args.load:.0%} of {capacity:.0f} req/s, "
             f"PSS {warm:.0f} -> {end:.0f} MiB")
    result["plot"] = str(out / "soak.png") if plot(samples, pathlib.Path(f"{prefix}_stats_history.csv"),
                                                   out / "soak.png", title) else None
    result["csv"] = f"{prefix}_stats.csv"
    result["samples"] = samples
    result["ok"] = failures == 0 and requests > 0 and result["pss_within_tolerance"]
    return result


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def main(argv: list[str] | None = None) -> int:
    result = run(parse(argv))
    print(json.dumps(result, indent=2))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
