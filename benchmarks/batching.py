"""LBCI Figure 5 on this machine: batching policies under Poisson load.

The bundled CNN (examples/cnn) runs on a private pool of 2 interpreters behind the
real `Batcher`. After a warm-up (the cost model's ladder) the benchmark measures the
capacity (requests/s with the queue never empty), then sends Poisson arrivals at
25/50/75/100% of it, single-sample requests and multi-sample ones (k uniform in
1..10), under four policies:
  serial         every request alone (window policy, max_batch_size 0);
  fixed10        the window policy, max batch 10, a `--window-ms` window;
  adaptive       AdaptivePolicy with the warmed-up cost model under the latency budget;
  adaptive_join  the same, and waiting requests join running batches at stage
                 boundaries (layer-level joining, aserve.batching.join).
Each record: policy, requests (single|multi), load, mean_ms, p99_ms,
throughput_rps, over_budget (fraction of requests over the budget, refusals
included), refused (503s), admitted_over_budget (fraction of the admitted requests
over the budget), round_mean_ms (the mean of each round's answers: every policy gets
the same arrivals in round i, so rounds pair up). The summary gives, per adaptive
policy, `mean_vs_serial` with `mean_vs_serial_ci95` (a bootstrap interval over the
paired rounds: a ratio whose interval holds 1 is not told apart from serial by the
run) and how many rounds it was not slower than serial in.

`--queue native` runs the adaptive policies where aserve runs them when it serves: each on a
copy of the model in a data plane, batched by the pool's native queue (the C policy and join
planner) through the NativeBatcher a front loop makes; serial and fixed10, LBCI's baselines,
stay on the Python `Batcher`. The native copies keep their state from load to load, as a
server does (the host path starts each point from the warmed-up cost model).

`--simulate A_MS,C_MS` runs the same table in virtual time instead: the real Batcher
and policies on a `VirtualLoop` with a simulated engine whose batches of b take
A + C * b ms (benchmarks.sim.simulation); deterministic, seconds to run, no
interpreters or torch needed. `--fit-only` compares the cost-model fits (interp,
affine, logistic) on the bundled simple, mlp and cnn models: fitted on the ladder,
scored on held-out sizes.

    python -m benchmarks.batching --json FILE
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import dataclasses
import functools
import json
import math
import os
import pathlib
import platform
import random
import statistics
import sys
import tempfile
import tomllib
from collections.abc import Sequence
from typing import Any

from aserve.engine import ensure_glibc_tunables
from aserve.errors import AserveError, Overloaded
from aserve.repository.config import BatchingConfig

from . import ROOT
from .sim.simulation import Arrival, poisson

RESULTS = ROOT / "benchmarks" / "results"
POLICIES = ("serial", "fixed10", "adaptive", "adaptive_join")
LOADS = (0.25, 0.5, 0.75, 1.0)


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.batching", description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=str(RESULTS / "batching.json"), help="write the results here")
    ap.add_argument("--plot", default=str(RESULTS / "batching.png"), help="PNG plot ('' for none)")
    ap.add_argument("--model", default=str(ROOT / "examples" / "cnn"), help="model folder")
    ap.add_argument("--interpreters", type=int, default=2)
    ap.add_argument("--setup", choices=("aserve", "paper"), default="aserve",
                    help="aserve: --interpreters interpreters of one intra-op thread each (the model's class); "
                         "paper: LBCI's, one interpreter whose torch threads use every CPU (the model's "
                         "<class>AllCores)")
    ap.add_argument("--kinds", default="single,multi", help="request kinds: single, multi or both")
    ap.add_argument("--seconds", type=float, default=8.0, help="arrivals per point")
    ap.add_argument("--rounds", type=int, default=4,
                    help="each point's arrivals in this many consecutive windows, the policies taking turns "
                         "on each (so a burst of other load on the machine falls on all of them)")
    ap.add_argument("--capacity-seconds", type=float, default=4.0, help="closed-loop capacity measurement")
    ap.add_argument("--budget-ms", type=float, default=50.0, help="latency budget, single-sample requests")
    ap.add_argument("--multi-budget-ms", type=float, default=100.0, help="latency budget, multi-sample")
    ap.add_argument("--window-ms", type=float, default=10.0, help="fixed10's batching window")
    ap.add_argument("--loads", default=",".join(str(x) for x in LOADS), help="fractions of capacity")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--policies", default=",".join(POLICIES),
                    help="the policies to compare, of " + ", ".join(POLICIES) + " (fewer: longer turns for the same time)")
    ap.add_argument("--admission-reserve", type=float, default=BatchingConfig().admission_reserve,
                    help="adaptive: share of the budget admission keeps back under overload (default: the "
                         "server's, %(default)s)")
    ap.add_argument("--queue", choices=("host", "native"), default="host",
                    help="where the adaptive policies batch: the host loop's Python Batcher, or the pool's native "
                         "queue (the fronts' path, with the policy and the join planner in C)")
    ap.add_argument("--join-rule", choices=("budget", "benefit"), default="benefit",
                    help="adaptive_join: join only if the total latency falls (the server's default), or whenever the budgets hold (LBCI's rule)")
    ap.add_argument("--fit-only", action="store_true", help="compare cost-model fits and exit")
    ap.add_argument("--simulate", metavar="A_MS,C_MS",
                    help="run in virtual time on the curve A + C * b ms instead of the real model")
    ap.add_argument("--stage-shares", default="0.45,0.33,0.20,0.02",
                    help="--simulate: the stage shares of adaptive_join's simulated staged model")
    args = ap.parse_args(argv)
    args.kinds = tuple(k for k in args.kinds.split(",") if k)
    if not args.kinds or any(k not in ("single", "multi") for k in args.kinds):
        ap.error(f"--kinds: expected single, multi or both, got {','.join(args.kinds) or 'none'}")
    if args.setup == "paper":
        args.interpreters = 1
    args.policies = tuple(p for p in args.policies.split(",") if p)
    unknown = [p for p in args.policies if p not in POLICIES]
    if unknown or not args.policies:
        ap.error(f"--policies: expected some of {', '.join(POLICIES)}, got {','.join(args.policies) or 'none'}")
    return args


# ---- fit comparison ----


async def compare_fits(rounds: int = 7) -> dict[str, Any]:
    from aserve.batching.costmodel import (
        fit_affine,
        fit_logistic,
        interpolate,
        ladder,
        logistic_latency,
        measure,
        monotone,
    )
    from aserve.engine import ModelSpec, Pool

    out: dict[str, Any] = {}
    pool = Pool(engine="private", interpreters=1)
    await pool.start()
    try:
        for name in ("simple", "mlp", "cnn"):
            folder = ROOT / "examples" / name
            mb = tomllib.loads((folder / "config.toml").read_text()).get("max_batch_size", 0)
            info = await pool.load(ModelSpec(name=name, path=str(folder)))
            rungs = ladder(mb)
            held = [3 * b for b in rungs if 3 * b < mb and 3 * b not in rungs]
            sizes = sorted(set(rungs) | set(held))
            runs = [dict(await measure(pool, info, sizes, repeats=1)) for _ in range(rounds)]
            med = {b: statistics.median(r[b] for r in runs) for b in sizes}
            pts = [(b, med[b]) for b in rungs]
            knots, (a, c), lg = monotone(pts), fit_affine(pts), fit_logistic(pts)
            predicted = {
                "interp": [interpolate(knots, b) for b in held],
                "affine": [a + c * b for b in held],
                "logistic": [logistic_latency(lg, b) for b in held],
            }
            errors = {}
            for form, values in predicted.items():
                rel = [abs(v - med[b]) / med[b] for v, b in zip(values, held)]
                errors[form] = {
                    "mean_pct": round(100 * statistics.fmean(rel), 1),
                    "max_pct": round(100 * max(rel), 1),
                }
            out[name] = {
                "max_batch_size": mb,
                "held_out": held,
                "errors": errors,
                "median_ms": {b: round(1e3 * med[b], 3) for b in sizes},
            }
            await pool.unload(name)
    finally:
        await pool.close()
    return out


# ---- load runs ----


class Point:
    """One (policy, request kind, load) measurement."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.errors = 0  # requests not answered (refusals included)
        self.refused = 0  # refused by admission control (503)
        self.span = 0.0  # seconds from each round's start to its last answer, summed
        self.round_means: list[float | None] = []  # mean latency (s) of each round's answers (None: none)
        self.refusals: list[tuple[int, float]] = []  # (round, arrival in it) of each refused request


def _ten(rng: random.Random) -> int:
    """Samples of a multi-sample request: uniform in 1..10."""
    return rng.randint(1, 10)


async def drive(batcher: Any, inputs: dict[int, Any], arrivals: list[Arrival], point: Point | None = None,
                round_: int = 0, budget: float | None = None) -> Point:
    """Submit each request at its arrival time (relative seconds), with `budget` (s) as its own
    latency budget; wait for all answers. With `point`, add this round's (number `round_`)
    answers to it."""
    loop = asyncio.get_running_loop()
    point = Point() if point is None else point
    start = loop.time() + 0.05
    last = start
    tasks = []

    async def one(at: float, k: int) -> None:
        try:
            await batcher.submit(inputs[k], k, budget=budget)
        except Overloaded:  # a refused request counts against the policy
            point.errors += 1
            point.refused += 1
            point.refusals.append((round_, at - start))
            return
        except AserveError:  # so does a failed one
            point.errors += 1
            return
        nonlocal last
        done = loop.time()
        point.latencies.append(done - at)
        last = max(last, done)

    def fire(at: float, k: int) -> None:
        tasks.append(loop.create_task(one(at, k)))

    for a in arrivals:
        loop.call_at(start + a.time, fire, start + a.time, a.samples)
    end = start + (arrivals[-1][0] if arrivals else 0.0)
    await asyncio.sleep(max(0.0, end - loop.time()) + 0.01)
    while len(tasks) < len(arrivals):
        await asyncio.sleep(0.005)
    await asyncio.gather(*tasks)
    point.span += last - start
    return point


def make_batcher(
    kind: str,
    *,
    name: str,
    pool: Any,
    cost: Any,
    profile: Any,
    budget: float,
    join_rule: str,
    interpreters: int,
    window: float,
    max_batch_size: int,
    reserve: float = 0.0,
) -> Any:
    from aserve.batching.adaptive import AdaptivePolicy
    from aserve.batching.batcher import Batcher
    from aserve.batching.join import JoinPlanner
    from aserve.batching.joining import Joining
    from aserve.batching.policy import WindowPolicy

    policy: Any
    join = None
    if kind == "serial":
        policy, mb = WindowPolicy(max_queue_delay=0.0), 0
    elif kind == "fixed10":
        policy, mb = WindowPolicy(max_queue_delay=window), 10
    elif kind == "greedy":  # capacity: what is queued, up to the largest batch, never waiting
        policy, mb = WindowPolicy(max_queue_delay=0.0), max_batch_size
    else:
        policy = AdaptivePolicy(
            copy.deepcopy(cost),
            latency_budget_s=budget,
            interpreters=interpreters,
            max_queue_delay_s=budget / 2,
            overload_reserve=reserve,
        )
        mb = max_batch_size
        if kind == "adaptive_join":
            planner = JoinPlanner(policy.cost, copy.deepcopy(profile), scale=lambda: policy.slowdown_cautious)
            join = Joining(pool, planner, budget, benefit=join_rule == "benefit")
    return Batcher(
        model=name,
        run=pool.run,
        policy=policy,
        max_batch_size=mb,
        interpreters=interpreters,
        max_queue_size=1 << 30,
        join=join,
    )


def _toml(config: dict[str, Any]) -> str:
    """A model's config.toml for `config` (scalars, lists of scalars, tables, arrays of tables)."""
    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        raise TypeError(f"config value {v!r} is not one this writer knows")

    def table(items: dict[str, Any]) -> list[str]:
        return [f"{k} = {value(v)}" for k, v in items.items()]

    lines = table({k: v for k, v in config.items()
                   if not isinstance(v, dict) and not (isinstance(v, list) and v and isinstance(v[0], dict))})
    for k, v in config.items():
        if isinstance(v, dict):
            lines += [f"[{k}]", *table(v)]
        elif isinstance(v, list) and v and isinstance(v[0], dict):
            for item in v:
                lines += [f"[[{k}]]", *table(item)]
    return "\n".join(lines) + "\n"


def _feed(plane: Any, name: str, policy: str) -> Any:
    """The PlanFeed of `policy`'s native copy of model `name`."""
    return plane.model(f"{name}_{policy}").plan


def _joins(plane: Any, name: str, policy: str) -> dict[str, Any]:
    """A native copy's join counts (its Plan's)."""
    return dict(_feed(plane, name, policy).as_dict(0.0).get("join", {}))


def _plan_policy(plane: Any, name: str, policy: str) -> Any:
    """What replay_refusals reads of a policy (its curve, its slowdown), from a native copy's Plan."""
    import types

    feed = _feed(plane, name, policy)
    state = feed.as_dict(0.0)  # folds the batches that ended into the curve first
    return types.SimpleNamespace(cost=feed.policy.cost, slowdown=state["slowdown"])


async def native_queues(folder: pathlib.Path, config: dict[str, Any], class_name: str | None, policies: Sequence[str],
                        args: argparse.Namespace, repo: pathlib.Path) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """The adaptive `policies`, each on a copy of the model (`<name>_<policy>`) in a data plane of
    `args.interpreters` private interpreters per copy, batched by the pool's native queue: the
    data plane, each policy's NativeBatcher (a front loop's, made here), the engines to close."""
    import shutil

    from aserve.config import ServerSettings
    from aserve.dataplane import DataPlane

    from .core import _front_handle

    for policy in policies:
        copy_ = repo / f"{folder.name}_{policy}"
        shutil.copytree(folder, copy_)
        batching = {**config.get("batching", {}), "policy": "adaptive", "latency_budget_ms": args.budget_ms,
                    "admission_reserve": args.admission_reserve, "layer_join": policy == "adaptive_join",
                    "join_rule": args.join_rule}
        (copy_ / "config.toml").write_text(_toml({**config, "class": class_name, "batching": batching}))
    plane = DataPlane(repo, ServerSettings(engine="private", interpreters=args.interpreters))
    plane.registry.queue_fronts = 1  # each model's queue Counter, laid out for one front loop
    engines: dict[str, Any] = {}
    await plane.start()
    batchers = {}
    for policy in policies:
        name = f"{folder.name}_{policy}"
        handle = plane.model(name)
        if not handle.ready:
            raise SystemExit(f"--queue native: {name} did not load: {handle.reason}")
        batchers[policy] = _front_handle(plane, name, engines).batcher
    return plane, batchers, engines


async def capacity(batcher: Any, inputs: dict[int, Any], multi: bool, seconds: float, seed: int) -> float:
    """Requests/s served with the queue never empty (closed loop, many clients), through a
    batcher without admission control that takes whatever is queued up to its largest batch."""
    loop = asyncio.get_running_loop()
    rng = random.Random(seed)
    done = 0
    stop = loop.time() + seconds

    async def client() -> None:
        nonlocal done
        while loop.time() < stop:
            k = _ten(rng) if multi else 1
            await batcher.submit(inputs[k], k)
            done += 1

    start = loop.time()
    await asyncio.gather(*(client() for _ in range(64 if not multi else 16)))
    return done / (loop.time() - start)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from aserve.batching.costmodel import sample_inputs, warmup
    from aserve.batching.join import measure_stages
    from aserve.engine import ModelSpec, Pool

    folder = pathlib.Path(args.model)
    config = tomllib.loads((folder / "config.toml").read_text())
    max_batch_size = int(config.get("max_batch_size", 0))
    class_name = config.get("class")
    if args.setup == "paper":
        if not class_name:
            raise SystemExit(f"--setup paper: {folder}/config.toml names no class to take <class>AllCores of")
        class_name += "AllCores"
    loads = [float(x) for x in args.loads.split(",") if x]
    load_start = os.getloadavg()[0]  # other work on the machine skews every number
    pool = Pool(engine="private", interpreters=args.interpreters)
    await pool.start()
    records: list[dict[str, Any]] = []
    caps: dict[str, float] = {}
    tmp = tempfile.TemporaryDirectory()  # --queue native: the model's copies
    plane: Any = None
    engines: dict[str, Any] = {}
    try:
        info = await pool.load(ModelSpec(name=folder.name, path=str(folder), class_name=class_name))
        cost = await warmup(pool, info, max_batch_size)
        profile = await measure_stages(pool, info, 4)
        print(f"# cost model: {json.dumps(cost.as_dict())}", file=sys.stderr, flush=True)
        print(f"# stages: {json.dumps(profile.as_dict())}", file=sys.stderr, flush=True)
        inputs = {k: [sample_inputs(info, k)[s.name] for s in info.inputs] for k in range(1, 11)}
        natives: dict[str, Any] = {}
        if args.queue == "native":
            adaptive = [p for p in args.policies if p.startswith("adaptive")]
            plane, natives, engines = await native_queues(folder, config, class_name, adaptive, args,
                                                          pathlib.Path(tmp.name))
        for kind in args.kinds:
            multi = kind == "multi"
            budget = (args.multi_budget_ms if multi else args.budget_ms) / 1e3
            common: dict[str, Any] = {
                "name": info.name,
                "pool": pool,
                "cost": cost,
                "profile": profile,
                "budget": budget,
                "join_rule": args.join_rule,
                "reserve": args.admission_reserve,
                "interpreters": args.interpreters,
                "window": args.window_ms / 1e3,
                "max_batch_size": max_batch_size,
            }
            # the best of three short runs: other load on the machine only ever lowers it
            greedy = make_batcher("greedy", **common)
            cap = max([await capacity(greedy, inputs, multi, args.capacity_seconds / 3, args.seed + i)
                       for i in range(3)])
            caps[kind] = cap
            print(f"# {kind}: capacity {cap:.1f} requests/s", file=sys.stderr, flush=True)
            for load in loads:
                arrivals = poisson(load * cap, args.seconds, args.seed, _ten if multi else None)
                rounds = max(1, args.rounds)
                window = args.seconds / rounds
                policies = args.policies
                batchers = {policy: natives[policy] if policy in natives else make_batcher(policy, **common) for policy in policies}
                # the native batchers count from load to load: this point's are the differences
                counted = {policy: (b.requests, b.batches, _joins(plane, folder.name, policy) if policy in natives else {})
                           for policy, b in batchers.items()}
                points = {policy: Point() for policy in policies}
                for r in range(rounds):  # the same arrivals for every policy, in turns that rotate
                    part = [Arrival(a.time - r * window, a.samples) for a in arrivals
                            if r * window <= a.time < (r + 1) * window]
                    for policy in policies[r % len(policies):] + policies[:r % len(policies)]:
                        point = points[policy]
                        before = len(point.latencies)
                        await drive(batchers[policy], inputs, part, point, r, budget)
                        answered = point.latencies[before:]
                        point.round_means.append(statistics.fmean(answered) if answered else None)
                for policy in policies:
                    batcher, point = batchers[policy], points[policy]
                    lat = sorted(point.latencies)
                    requests0, batches0, joins0 = counted[policy]
                    rec = record(policy, kind, load, arrivals, args.seconds, lat, point.errors, point.span,
                                 (batcher.requests - requests0) / max(1, batcher.batches - batches0), budget,
                                 point.refused)
                    rec["round_mean_ms"] = [None if m is None else round(1e3 * m, 3) for m in point.round_means]
                    rec["queue"] = "native" if policy in natives else "host"
                    # the policy that decided: the host's Batcher's, or a native copy's Plan (its refined
                    # curve and its own slowdown)
                    decided = _plan_policy(plane, folder.name, policy) if policy in natives else batcher.policy
                    if policy == "adaptive_join":
                        stats = _joins(plane, folder.name, policy) if policy in natives else batcher.stats()
                        for key in ("joins", "joined_requests", "offers_turned_away"):
                            rec[key] = stats.get(key, 0) - joins0.get(key, 0)
                    if policy.startswith("adaptive"):
                        rec["cost_after"] = decided.cost.as_dict()
                        rec["refused_in_time"] = await asyncio.to_thread(  # a virtual loop of its own
                            replay_refusals, point.refusals, arrivals, window, decided, cost, budget=budget,
                            interpreters=args.interpreters, max_batch_size=max_batch_size,
                            reserve=args.admission_reserve)
                    records.append(rec)
                    print(
                        json.dumps({k: v for k, v in rec.items() if k != "cost_after"}),
                        file=sys.stderr,
                        flush=True,
                    )
    finally:
        if natives:
            link = engines.get("link")
            if link is not None:
                link.close()
            await plane.close(timeout=10)
        tmp.cleanup()
        await pool.close()
    return {
        "benchmark": "batching",
        "queue": args.queue,
        "model": folder.name,
        "class": info.class_name,
        "setup": args.setup,
        "engine": "private",
        "interpreters": args.interpreters,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "loadavg_1m_start": load_start,
            "loadavg_1m_end": os.getloadavg()[0],
        },
        "seconds_per_point": args.seconds,
        "join_rule": args.join_rule,
        "admission_reserve": args.admission_reserve,
        "capacity_rps": {k: round(v, 1) for k, v in caps.items()},
        "cost_model": cost.as_dict(),
        "stage_profile": profile.as_dict(),
        "records": records,
        "summary": summarize(records),
        "notes": [
            "driven through the real Batcher (aserve.batching.batcher) on a private Pool"
            + ("; adaptive and adaptive_join on the pool's native queue instead: copies of the model in a data "
               "plane, each batched in C by its Plan through a front loop's NativeBatcher, keeping its state from "
               "load to load" if args.queue == "native" else ""),
            f"fixed10: window policy, max batch 10, {args.window_ms} ms window; serial: every request alone",
            (
                f"adaptive: budget {args.budget_ms} ms (single), {args.multi_budget_ms} ms (multi); "
                "max_queue_delay = budget / 2; a fresh copy of the warmed-up cost model per point"
            ),
            (
                "capacity: closed loop (64 clients single, 16 multi), queue never empty, batches of what is "
                "queued up to max_batch_size, no admission control; the best of three short runs"
            ),
            (
                f"each point: {args.seconds} s of arrivals in {args.rounds} consecutive windows, the policies "
                "taking turns on each (rotating), each policy keeping its batcher across its turns"
            ),
            (
                "adaptive_join: AdaptivePolicy plus joining at stage boundaries; mean_batch_requests counts "
                "dispatched batches only, joins are in joins/joined_requests"
            ),
            "latency: from the scheduled arrival to the answer, on the same event loop as the batcher",
        ],
    }


def replay_refusals(refusals: Sequence[tuple[int, float]], arrivals: Sequence[Arrival], window: float, policy: Any,
                    cost: Any, *, budget: float, interpreters: int, max_batch_size: int, reserve: float) -> int:
    """How many of a measured point's refused requests would have been answered within their
    budget: each replayed, admitted, in the simulator on its round's arrivals, with the
    engine's batches as long as the policy's curve and slowdown said at the point's end
    (benchmarks.sim.simulation.refused_in_time)."""
    from aserve.batching.adaptive import AdaptivePolicy

    from .sim.simulation import refused_in_time, simulate

    slowdown, curve = policy.slowdown, copy.deepcopy(policy.cost)

    def truth(b: int) -> float:
        return float(slowdown * curve.predict(b))

    def fresh() -> tuple[AdaptivePolicy, None]:
        return AdaptivePolicy(copy.deepcopy(cost), latency_budget_s=budget, interpreters=interpreters,
                              max_queue_delay_s=budget / 2, overload_reserve=reserve), None

    made = 0
    for r in sorted({r for r, _ in refusals}):
        part = [Arrival(a.time - r * window, a.samples) for a in arrivals if r * window <= a.time < (r + 1) * window]
        refused = [next(i for i, a in enumerate(part) if abs(a.time - at) < 1e-6) for rr, at in refusals if rr == r]
        mine = simulate(fresh()[0], part, truth, interpreters=interpreters, max_batch_size=max_batch_size,
                        budget=budget)
        replayed = dataclasses.replace(mine, refused=refused)
        made += len(refused_in_time(fresh, part, truth, replayed, interpreters=interpreters,
                                    max_batch_size=max_batch_size, budget=budget))
    return made


def record(policy: str, kind: str, load: float, arrivals: Sequence[Arrival], seconds: float, lat: list[float],
           errors: int, span: float, batch_requests: float, budget: float, refused: int) -> dict[str, Any]:
    """One point's record; `lat`: the sorted latencies of the answered requests."""
    n = len(lat)
    late = sum(1 for x in lat if x > budget)
    admitted = len(arrivals) - refused
    return {
        "policy": policy,
        "requests": kind,
        "load": load,
        "offered_rps": round(len(arrivals) / seconds, 1),
        "mean_ms": round(1e3 * statistics.fmean(lat), 2) if n else None,
        "p99_ms": round(1e3 * lat[max(0, math.ceil(0.99 * n) - 1)], 2) if n else None,
        "throughput_rps": round(n / span, 1) if span > 0 else None,
        "over_budget": round((late + errors) / max(1, len(arrivals)), 4),
        "refused": refused,
        "admitted_over_budget": round((late + errors - refused) / max(1, admitted), 4),
        "mean_batch_requests": round(batch_requests, 2),
        "budget_ms": budget * 1e3,
        "errors": errors,
    }


def simulate_run(args: argparse.Namespace) -> dict[str, Any]:
    """The same points in virtual time: the real Batcher and policies, a simulated engine
    on the affine curve of `--simulate`, capacity computed from that curve."""
    from aserve.batching.adaptive import AdaptivePolicy
    from aserve.batching.costmodel import CostModel, ladder
    from aserve.batching.join import JoinPlanner, StageProfile
    from aserve.batching.policy import WindowPolicy

    from .sim.simulation import refused_in_time, simulate

    try:
        a_ms, c_ms = (float(x) for x in args.simulate.split(","))
        shares = [float(x) for x in args.stage_shares.split(",") if x]
    except ValueError:
        raise SystemExit(f"--simulate: expected A_MS,C_MS (e.g. 2.7,3.1), got {args.simulate!r}") from None
    folder = pathlib.Path(args.model)
    max_batch_size = int(tomllib.loads((folder / "config.toml").read_text()).get("max_batch_size", 32)) \
        if (folder / "config.toml").exists() else 32

    def cost(b: int) -> float:
        return (a_ms + c_ms * b) / 1e3

    def adaptive(joining: bool, budget: float) -> tuple[AdaptivePolicy, JoinPlanner | None]:
        model = CostModel([(b, cost(b)) for b in ladder(max_batch_size)], max_batch_size=max_batch_size)
        policy = AdaptivePolicy(model, latency_budget_s=budget, interpreters=args.interpreters,
                                max_queue_delay_s=budget / 2, overload_reserve=args.admission_reserve)
        planner = JoinPlanner(model, StageProfile(len(shares), shares), scale=lambda: policy.slowdown_cautious)
        return policy, planner if joining else None

    loads = [float(x) for x in args.loads.split(",") if x]
    records: list[dict[str, Any]] = []
    caps: dict[str, float] = {}
    for kind in args.kinds:
        multi = kind == "multi"
        budget = (args.multi_budget_ms if multi else args.budget_ms) / 1e3
        cap = args.interpreters * max_batch_size / cost(max_batch_size) / (5.5 if multi else 1.0)
        caps[kind] = cap
        for load in loads:
            arrivals = poisson(load * cap, args.seconds, args.seed, _ten if multi else None)
            for policy in args.policies:
                join = None
                mb = max_batch_size
                if policy == "serial":
                    p: Any = WindowPolicy(max_queue_delay=0.0)
                    mb = 0
                elif policy == "fixed10":
                    p, mb = WindowPolicy(max_queue_delay=args.window_ms / 1e3), 10
                else:
                    p, join = adaptive(policy == "adaptive_join", budget)
                result = simulate(p, arrivals, cost, interpreters=args.interpreters, max_batch_size=mb, join=join,
                                  stages=shares if join else None, budget=budget,
                                  benefit=args.join_rule == "benefit")
                lat = sorted(result.served())
                span = result.end - min(result.arrivals, default=0.0)
                batches = len(result.batches)
                per_batch = sum(len(b.requests) for b in result.batches) / max(1, batches)
                rec = record(policy, kind, load, arrivals, args.seconds, lat, len(result.latencies) - len(lat), span,
                             per_batch, budget, len(result.refused))
                if policy == "adaptive_join":
                    rec["joins"] = len(result.joins)
                    rec["joined_requests"] = sum(len(j.requests) for j in result.joins)
                if policy.startswith("adaptive"):
                    rec["refused_in_time"] = len(refused_in_time(
                        functools.partial(adaptive, policy == "adaptive_join", budget), arrivals, cost, result,
                        interpreters=args.interpreters, max_batch_size=mb, budget=budget,
                        stages=shares if join else None, benefit=args.join_rule == "benefit"))
                records.append(rec)
    return {
        "benchmark": "batching",
        "mode": "simulated",
        "model": f"affine {a_ms} ms + {c_ms} ms/sample",
        "engine": "simulated (benchmarks.sim.simulation)",
        "interpreters": args.interpreters,
        "seconds_per_point": args.seconds,
        "join_rule": args.join_rule,
        "admission_reserve": args.admission_reserve,
        "capacity_rps": {k: round(v, 1) for k, v in caps.items()},
        "records": records,
        "summary": summarize(records),
        "notes": [
            (
                "virtual time: the real Batcher and policies on a VirtualLoop, a simulated engine whose batch "
                f"of b samples takes {a_ms} + {c_ms} * b ms; deterministic (seed {args.seed})"
            ),
            "capacity: interpreters x max_batch_size / L(max_batch_size) (multi: / 5.5 for requests)",
        ],
    }


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Adaptive and adaptive_join against the other policies per request kind and load:
    mean-latency cut and throughput ratio against fixed10, over-budget share, and the mean
    over serial's, fixed10's and (for adaptive_join) adaptive's with a paired 95% interval
    (`mean_vs_X_ci95`; `slower_than_X`: the whole interval lies above 1)."""
    out: dict[str, Any] = {}
    by = {(r["policy"], r["requests"], r["load"]): r for r in records}
    for (policy, kind, load), r in by.items():
        if not policy.startswith("adaptive") or not r["mean_ms"]:
            continue
        entry: dict[str, Any] = {"over_budget": r["over_budget"]}
        f = by.get(("fixed10", kind, load))
        if f is not None and f["mean_ms"] and r["throughput_rps"] and f["throughput_rps"]:
            entry["mean_cut_vs_fixed10"] = round(1 - r["mean_ms"] / f["mean_ms"], 3)
            entry["throughput_ratio_vs_fixed10"] = round(r["throughput_rps"] / f["throughput_rps"], 3)
        for other in ("serial", "fixed10", "adaptive"):
            o = by.get((other, kind, load))
            if o is None or other == policy or not o["mean_ms"]:
                continue
            entry[f"mean_vs_{other}"] = round(r["mean_ms"] / o["mean_ms"], 3)
            ours, theirs = r.get("round_mean_ms"), o.get("round_mean_ms")
            if ours and theirs and len(ours) == len(theirs) and len(ours) > 1:
                paired = _paired(ours, theirs)
                lo, hi = paired_ratio_ci(ours, theirs)
                entry[f"mean_vs_{other}_ci95"] = [round(lo, 3), round(hi, 3)]
                entry[f"slower_than_{other}"] = bool(lo > 1.0)
                entry[f"rounds_not_slower_than_{other}"] = f"{sum(a <= b for a, b in paired)}/{len(paired)}"
        out.setdefault(f"{kind}@{load}", {})[policy] = entry
    return out


def _paired(ours: Sequence[float | None], theirs: Sequence[float | None]) -> list[tuple[float, float]]:
    """The rounds where both answered something (None: a round without an answer)."""
    return [(a, b) for a, b in zip(ours, theirs) if a is not None and b is not None]


def paired_ratio_ci(ours: Sequence[float | None], theirs: Sequence[float | None], *, resamples: int = 4000,
                    seed: int = 0) -> tuple[float, float]:
    """95% bootstrap interval of sum(ours) / sum(theirs) over paired rounds (the same arrivals
    in round i for both): rounds are resampled whole, so what drifts from one round to the
    next (other load on the machine) stays paired. Rounds where either answered nothing are left out."""
    pairs = _paired(ours, theirs)
    if not pairs:
        return math.nan, math.nan
    rng = random.Random(seed)
    n = len(pairs)
    ratios = []
    for _ in range(resamples):
        pick = [pairs[rng.randrange(n)] for _ in range(n)]
        below = sum(b for _, b in pick)
        if below > 0:
            ratios.append(sum(a for a, _ in pick) / below)
    ratios.sort()
    if not ratios:
        return math.nan, math.nan
    return ratios[int(0.025 * (len(ratios) - 1))], ratios[int(0.975 * (len(ratios) - 1))]


def require_matplotlib() -> None:
    """Fail before measuring anything when a plot is asked for and cannot be drawn."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise SystemExit(
            "benchmarks.batching: --plot needs matplotlib, which is not installed: install the "
            "bench extra (pip install -e '.[bench]'), or pass --plot '' for no plot"
        ) from None


def mean_ci(round_means: Sequence[float | None], *, resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% bootstrap interval of the mean of a policy's round means (None: a round without answers)."""
    xs = [x for x in round_means if x is not None]
    if len(xs) < 2:
        return math.nan, math.nan
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choice(xs) for _ in xs) for _ in range(resamples))
    return means[int(0.025 * (resamples - 1))], means[int(0.975 * (resamples - 1))]


def plot(result: dict[str, Any], path: str) -> None:
    """The shape of LBCI's Figure 5: mean delay per policy at each load, as grouped bars,
    with the 95% interval over rounds, one panel per request kind."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = [k for k in ("single", "multi") if any(r["requests"] == k for r in result["records"])]
    fig, axes = plt.subplots(1, len(kinds), figsize=(5.5 * len(kinds), 4.2), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        recs = [r for r in result["records"] if r["requests"] == kind]
        loads = sorted({r["load"] for r in recs})
        present = [p for p in POLICIES if any(r["policy"] == p for r in recs)]
        width = 0.8 / max(1, len(present))
        for i, policy in enumerate(present):
            xs, ys, lo, hi = [], [], [], []
            for j, load in enumerate(loads):
                r = next((r for r in recs if r["policy"] == policy and r["load"] == load), None)
                if r is None or r["mean_ms"] is None:
                    continue
                low, high = mean_ci(r.get("round_mean_ms") or [])
                xs.append(j + (i - (len(present) - 1) / 2) * width)
                ys.append(r["mean_ms"])
                lo.append(0.0 if math.isnan(low) else r["mean_ms"] - low)
                hi.append(0.0 if math.isnan(high) else high - r["mean_ms"])
            name = f"{policy} ({result['join_rule']} rule)" if policy == "adaptive_join" else policy
            ax.bar(xs, ys, width, label=name, yerr=[[max(0.0, x) for x in lo], [max(0.0, x) for x in hi]],
                   capsize=2)
        ax.set_xticks(range(len(loads)), [f"{100 * x:g}%" for x in loads])
        ax.set_xlabel("load (% of capacity)")
        ax.set_ylabel("mean delay (ms)")
        ax.set_title(f"{kind}-sample requests, {result['interpreters']} interpreter(s)", fontsize=10)
        ax.legend(fontsize=7)
    fig.suptitle(f"{result['model']} ({result.get('class', '')}, {result.get('setup', 'aserve')} set-up, "
                 f"{result.get('mode', 'measured')})", fontsize=10)
    fig.tight_layout()
    pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    if not args.simulate:
        ensure_glibc_tunables()
    if args.fit_only:
        print(json.dumps(asyncio.run(compare_fits()), indent=2))
        return 0
    if args.plot:
        require_matplotlib()
    result = simulate_run(args) if args.simulate else asyncio.run(run(args))
    if args.plot:
        plot(result, args.plot)
    text = json.dumps(result, indent=2)
    if args.json:
        pathlib.Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(args.json).write_text(text + "\n")
    print(json.dumps(result["summary"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
