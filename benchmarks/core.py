"""The data plane without HTTP: how many requests one core of the host loop can carry.

    python -m benchmarks.core [--json FILE] [--models simple,mlp] [--engines private,main]
                              [--bodies binary,json] [--paths codec,plane,front,native]
                              [--clients 32] [--duration 5] [--profile FILE]

An in-process client drives the whole path that `aserve serve` runs for a request,
minus HTTP: `DataPlane.infer` decodes the V2 body against the model's schema, queues
it on the model's batcher, runs the batch on the interpreter pool, splits the outputs
and encodes the V2 answer. `--clients` coroutines on one uvloop loop each send their next request as
soon as the previous answer is encoded (closed loop), for `--duration` seconds after a
warm-up. Every answer is checked against the value computed here.

Each (engine, model, body) is measured on each path in the same run (`--paths`):

- `codec`, the baseline: decode the body and encode the answer, the answer computed
  once by the data plane beforehand: what the wire format alone costs the loop;
- `plane`: the whole path above, batcher and pool included, each client a coroutine that
  awaits `DataPlane.infer` (a task wake-up per request);
- `front`: the same path as the HTTP front runs it: `DataPlane.submit` with the model's
  handle, the answer told to a callback (`Pending.then`) that sends the client's next
  request; no task or coroutine per request;
- `native`: the `front` path as a front loop (`aserve serve --loops N`) runs it: the
  model's handle is the one a front makes (`server.front_models.front_handle`), whose
  `NativeBatcher` queues each request in the pool's shared queue through a native `Link`,
  where the window rule in C batches it (the host's `Batcher` runs the other paths).

Each record: `path`, `requests_per_s`, `loop_cpu_us_per_request` (CPU of the loop
thread, `time.thread_time`, over the requests answered) and `requests_per_core_s` (1e6
/ that: what one core of the host loop would carry if the interpreters kept up), with
`engine`, `model`, `body`, `clients`, `mean_batch` (requests per batch; plane and front).
A plane or front record also has `codec_us_per_request` and `beyond_codec_us_per_request`:
the batcher, the pool's submit and completion, the futures and the split of a batch's
outputs, per request. Subtracting the front's loop CPU from `benchmarks.http`'s loop
CPU per request gives what HTTP costs.

`--profile FILE` also writes a cProfile of the loop thread (the interpreters run in
their own threads and do not appear), for `python -m pstats FILE`.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pathlib
import platform
import shutil
import sys
import tempfile
import time
from typing import Any

from aserve.cli import bundled_examples
from aserve.config import ServerSettings
from aserve.dataplane import DataPlane
from aserve.dataplane.models import ModelHandle
from aserve.engine import ensure_glibc_tunables
from aserve.inference import Answer, InferCall, InferResponse
from aserve.protocol import V2

from .http import Case, Skip, check_answer, make_cases

DEFAULT_MODELS = ("simple", "mlp")
DEFAULT_ENGINES = ("private", "main")


def _check(case: Case, chunks: list[Any], headers: dict[str, str]) -> None:
    wrong, _ = check_answer("aserve", case, 200, headers, b"".join(bytes(c) for c in chunks))
    if wrong is not None:
        raise AssertionError(f"{case.model} ({case.body_kind} body): {wrong}")


def _front_handle(plane: DataPlane, model: str, engines: dict[str, Any]) -> ModelHandle:
    """The handle a front loop (`--loops`) makes of `model`, made here on this loop: its
    NativeBatcher queues each request in the pool's shared queue through a native Link, as
    a front's does (the pool's queue Counter is laid out for one front, this one)."""
    from aserve import _native
    from aserve.server.front_models import LinkEngine, front_handle
    from aserve.server.loops import front_model

    host = plane.model(model)
    engine = engines.get("link")
    if engine is None:
        engine = engines["link"] = LinkEngine(_native.link_api(), asyncio.get_running_loop(), lambda pool, job: None)
    m = front_model(host, 1)
    handle = front_handle(m, plane, engine, engines.setdefault("schedulers", {}), 0, plane.settings)
    engine.add(m, handle, 0)
    return handle


async def _run_point(plane: DataPlane, case: Case, path: str, clients: int, duration: float,
                     warmup: float, profile: cProfile.Profile | None, engines: dict[str, Any]) -> dict[str, Any]:
    model = case.model
    handle = plane.model(model) if path != "native" else _front_handle(plane, model, engines)
    schema = handle.require_ready()
    body, headers = case.body, case.headers
    content_type = headers.get("Content-Type")
    length_header = headers.get("Inference-Header-Content-Length")
    call = InferCall(codec=V2, model=model, body=body, content_type=content_type,
                     header_length=int(length_header) if length_header is not None else None)
    loop = asyncio.get_running_loop()
    counts = {"answered": 0}
    phase = {"stop": loop.time() + warmup}
    if path == "codec":  # the baseline: the answer computed once, only the wire format per request
        first = V2.decode(call, schema)
        assert handle.batcher is not None
        outputs = await handle.batcher.submit(first.inputs, first.samples)
        computed = InferResponse(model_name=handle.name, model_version=handle.version, outputs=outputs)

        async def answer(call: InferCall) -> Answer:
            request = V2.decode(call, schema)
            return V2.encode(call, request, computed, handle.labels)
    else:
        async def answer(call: InferCall) -> Answer:
            return await plane.infer(call)

    async def client() -> None:
        while loop.time() < phase["stop"]:
            answered = await answer(call)
            if counts["answered"] % 997 == 0:
                _check(case, answered.chunks, answered.headers)
            counts["answered"] += 1

    async def front() -> None:
        """`clients` clients the HTTP front's way: `DataPlane.submit` with the handle looked up
        once (from the head), the answer told to a callback (`Pending.then`), no task or
        coroutine per request; each client sends its next request from that callback."""
        finished: asyncio.Future[None] = loop.create_future()
        live = [clients]

        def send() -> None:
            try:
                plane.submit(call, handle=handle).then(told)
            except Exception as exc:  # noqa: BLE001 - the point fails with it
                if not finished.done():
                    finished.set_exception(exc)

        def told(answered: Answer | None, error: BaseException | None) -> None:
            if error is not None or answered is None:
                if not finished.done():
                    finished.set_exception(error or AssertionError("no answer"))
                return
            if counts["answered"] % 997 == 0:
                _check(case, answered.chunks, answered.headers)
            counts["answered"] += 1
            if loop.time() < phase["stop"]:
                send()
            else:
                live[0] -= 1
                if not live[0] and not finished.done():
                    finished.set_result(None)

        for _ in range(clients):
            send()
        await finished

    async def drive() -> None:
        if path in ("front", "native"):
            await front()
        else:
            await asyncio.gather(*(client() for _ in range(clients)))

    await drive()  # warm-up
    batcher = handle.batcher
    assert batcher is not None
    batches0, requests0 = batcher.batches, batcher.requests
    counts["answered"] = 0
    phase["stop"] = loop.time() + duration
    cpu0, wall0 = time.thread_time(), time.perf_counter()
    if profile is not None:
        profile.enable()
    await drive()
    if profile is not None:
        profile.disable()
    cpu, wall = time.thread_time() - cpu0, time.perf_counter() - wall0
    n = counts["answered"]
    batches = batcher.batches - batches0
    return {
        "path": path,
        "requests_per_s": round(n / wall, 1),
        "loop_cpu_us_per_request": round(cpu / n * 1e6, 2) if n else None,
        "requests_per_core_s": round(n / cpu, 1) if cpu > 0 else None,
        "loop_cpu_cores": round(cpu / wall, 3),
        "mean_batch": round((batcher.requests - requests0) / batches, 2) if path != "codec" and batches else None,
        "requests": n,
        "duration_s": round(wall, 3),
    }


async def _run_engine(engine: str, models: list[str], args: argparse.Namespace,
                      profile: cProfile.Profile | None) -> list[dict[str, Any]]:
    examples = pathlib.Path(args.repository) if args.repository else bundled_examples()
    if examples is None:
        raise SystemExit("benchmarks.core: no --repository and no bundled examples/ folder")
    records: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        repo = pathlib.Path(tmp)
        for m in models:
            shutil.copytree(examples / m, repo / m)
        plane = DataPlane(repo, ServerSettings(engine=engine, interpreters=args.interpreters))
        if "native" in args.paths.split(","):
            plane.registry.queue_fronts = 1  # each model's queue Counter, laid out for one front loop
        engines: dict[str, Any] = {}
        await plane.start()
        try:
            for model in models:
                common = {"bench": "core", "engine": engine, "model": model, "interpreters": args.interpreters,
                          "clients": args.clients, "python": platform.python_version(), "cpus": os.cpu_count()}
                if not plane.model(model).ready:
                    records.append({**common, "skipped": plane.model(model).reason or "not ready"})
                    print(json.dumps(records[-1]), file=sys.stderr)
                    continue
                try:
                    cases = make_cases(model, args.bodies.split(","), examples)
                except Skip as e:
                    records.append({**common, "skipped": str(e)})
                    print(json.dumps(records[-1]), file=sys.stderr)
                    continue
                for body, case in cases.items():
                    codec: float | None = None
                    for path in args.paths.split(","):
                        point = await _run_point(plane, case, path, args.clients, args.duration, args.warmup,
                                                 profile, engines)
                        us = point["loop_cpu_us_per_request"]
                        if path == "codec":
                            codec = us
                        elif codec is not None and us is not None:
                            point["codec_us_per_request"] = codec
                            point["beyond_codec_us_per_request"] = round(us - codec, 2)
                        records.append({**common, "body": body, **point})
                        print(json.dumps(records[-1]), flush=True)
        finally:
            link = engines.get("link")
            if link is not None:
                link.close()
            await plane.close(timeout=10)
    return records


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.core", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", help="write the records to this file (a JSON list)")
    p.add_argument("--repository", help="model repository (default: the bundled examples/)")
    p.add_argument("--models", default=",".join(DEFAULT_MODELS))
    p.add_argument("--engines", default=",".join(DEFAULT_ENGINES))
    p.add_argument("--bodies", default="binary,json")
    p.add_argument("--paths", default="codec,plane,front",
                   help="what runs per request: codec (decode and encode, the baseline), plane (the whole data "
                        "plane, awaited), front (the same as the HTTP front runs it: submit and a callback), "
                        "native (front's way, batched in the pool's shared queue as a front loop's requests are)")
    p.add_argument("--interpreters", type=int, default=2)
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--duration", type=float, default=5.0, help="measured seconds per point")
    p.add_argument("--warmup", type=float, default=1.0, help="seconds before each point")
    p.add_argument("--profile", help="write a cProfile of the loop thread (all points) to this file")
    args = p.parse_args(argv)
    unknown = set(args.paths.split(",")) - {"codec", "plane", "front", "native"}
    if unknown:
        p.error(f"--paths: expected codec, plane, front and/or native, got {','.join(sorted(unknown))}")
    ensure_glibc_tunables()
    import uvloop

    profile = cProfile.Profile() if args.profile else None
    records: list[dict[str, Any]] = []
    for engine in args.engines.split(","):
        records.extend(uvloop.run(_run_engine(engine, args.models.split(","), args, profile)))
    if profile is not None:
        profile.dump_stats(args.profile)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(records, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
