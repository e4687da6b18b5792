"""`benchmarks.image`: the container image's size, and the seconds from `run` to ready, to
healthy, and from SIGTERM to the exit; for one image, or several side by side.

    python -m benchmarks.image [--image aserve:latest ...] [--runs 3] [--engine podman]
                               [--json benchmarks/results/image.json]

Each run starts the image as it ships (the bundled examples, its user, its settings) with
its port published on 127.0.0.1 and measures, from `run -d`: ready, when
/v2/health/ready first answers 200 (polled every 20 ms: every model loaded); healthy, when
the engine reports the image's HEALTHCHECK healthy (podman without systemd runs no health
timers: the check is run on demand, `podman healthcheck run`, so healthy is ready plus
one check; docker runs it every 10 s, the image's interval). Then SIGTERM, and the seconds
until the container exits, whose status must be 0; the container is removed. Runs
alternate between the images and the summary takes medians. `./dev image` prints the
build's own timings (its last line, JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import shutil
import statistics
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from typing import Any


def find_engine() -> str:
    """docker when its daemon answers, else podman (docker/image.sh's choice)."""
    if shutil.which("docker") and subprocess.run(["docker", "info"], check=False, capture_output=True).returncode == 0:
        return "docker"
    if shutil.which("podman"):
        return "podman"
    raise SystemExit("no container engine (docker with its daemon, or podman)")


class Engine:
    def __init__(self, name: str) -> None:
        self.name = name
        self.drives_health = name == "podman" and not pathlib.Path("/run/systemd/system").is_dir()

    def __call__(self, *args: str, check: bool = True) -> str:
        done = subprocess.run([self.name, *args], check=False, capture_output=True, text=True)
        if check and done.returncode != 0:
            raise RuntimeError(f"{self.name} {' '.join(args)}: exit status {done.returncode}: {done.stderr}")
        return done.stdout

    def inspect(self, what: str) -> dict[str, Any]:
        [found] = json.loads(self("inspect", what))
        return found  # type: ignore[no-any-return]


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200  # type: ignore[no-any-return]
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def one_run(engine: Engine, image: str, timeout: float) -> dict[str, Any]:
    name = f"aserve-bench-{uuid.uuid4().hex[:12]}"
    started = time.monotonic()
    engine("run", "-d", "--name", name, "-p", "127.0.0.1::8000", image)
    try:
        address = engine("port", name, "8000/tcp").split()[0]
        end = started + timeout
        while not answers(f"http://{address}/v2/health/ready"):
            if time.monotonic() > end or not engine.inspect(name)["State"]["Running"]:
                raise RuntimeError(f"{image} not ready: {engine('logs', name, check=False)[-2000:]}")
            time.sleep(0.02)
        ready = time.monotonic() - started
        while True:
            state = engine.inspect(name)["State"]
            health = (state.get("Health") or state.get("Healthcheck") or {}).get("Status")
            if health == "healthy":
                break
            if time.monotonic() > end or health == "unhealthy":
                raise RuntimeError(f"{image}: health {health}")
            if engine.drives_health:
                engine("healthcheck", "run", name, check=False)
            else:
                time.sleep(0.1)
        healthy = time.monotonic() - started
        signalled = time.monotonic()
        engine("kill", "--signal", "TERM", name)
        status = int(engine("wait", name).split()[0])
        return {"ready_s": round(ready, 2), "healthy_s": round(healthy, 2),
                "sigterm_to_exit_s": round(time.monotonic() - signalled, 2), "exit_status": status}
    finally:
        engine("rm", "-f", "-t", "0", name, check=False)


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--image", action="append", help="an image to measure (repeatable; default aserve:latest)")
    ap.add_argument("--runs", type=int, default=3, help="runs per image, alternating between the images")
    ap.add_argument("--engine", help="docker or podman (default: docker when its daemon answers, else podman)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds a run may take to be healthy")
    ap.add_argument("--json", help="also write the result here")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    engine = Engine(args.engine or find_engine())
    images = args.image or ["aserve:latest"]
    runs: dict[str, list[dict[str, Any]]] = {image: [] for image in images}
    for _ in range(args.runs):
        for image in images:
            runs[image].append(one_run(engine, image, args.timeout))
    result: dict[str, Any] = {
        "benchmark": "image", "engine": engine.name, "health_checks_run_on_demand": engine.drives_health,
        "machine": {"cpus": len(os.sched_getaffinity(0)), "platform": platform.platform()},
        "images": {},
    }
    for image in images:
        described = engine.inspect(image)
        result["images"][image] = {
            "id": described["Id"][:12], "size_bytes": described["Size"],
            **{key: statistics.median(r[key] for r in runs[image])
               for key in ("ready_s", "healthy_s", "sigterm_to_exit_s")},
            "exit_statuses": sorted({r["exit_status"] for r in runs[image]}),
            "runs": runs[image],
        }
    text = json.dumps(result, indent=2)
    if args.json:
        pathlib.Path(args.json).write_text(text + "\n")
    print(text)
    return 0 if all(s == [0] for s in (i["exit_statuses"] for i in result["images"].values())) else 1


if __name__ == "__main__":
    raise SystemExit(main())
