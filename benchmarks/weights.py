"""What a model costs in memory per interpreter: weight sharing, and load/unload growth.

    python -m benchmarks.weights [--json benchmarks/results/weights-sharing.json]
        [--megabytes 210] [--interpreters 1,2,4] [--cycles 50] [--cycle-megabytes 34]

It drives a private `Pool` from the host (torch is imported when called) to measure
the runtime's weight sharing (aserve.runtime.weights) and unload hygiene
(aserve.runtime.memory); `benchmarks.lifecycle` runs it with its reload figures, and
tests/runtime/test_memory.py calls `weight_sharing()` and `load_unload_growth()`.

`weight_sharing` writes a model of `megabytes` of weights (a stack of
Linear(2048, 2048)) as a torch.save checkpoint (and as a torch.package archive), and
loads each variant on 1, 2 and 4 interpreters of one pool, in turn. For each it
records the process PSS before loading, after loading, after one inference in each
interpreter, and after unloading. The differences are taken without the mappings of
shared libraries (`data_pss()`): the PSS of libtorch's text in this process moves by
tens of MB when another torch process on the machine starts or exits, which is not
this model's doing; the whole process PSS is recorded alongside. The variants:

- `none`: the same model code without weights (a ReLU): what a model costs per
  interpreter besides its weights;
- `idiom`: `net.load_state_dict(torch.load(path))`, shared by the runtime's defaults;
- `helper`: `load_weights(path, into=net)` with `net` built on the meta device;
- `package`: the network pickled in a torch.package archive, loaded from the archive
  (mapped by the runtime's importer);
- `copy`: `torch.load(path, mmap=False)`: each interpreter a private copy, the
  control that shows the measurement sees copies.

Each record's `per_added_interpreter_mb` is (PSS with k interpreters - PSS with 1) /
(k - 1) after the inferences; the test bound is: a weighted variant's figure <= the
`none` variant's + 10% of the weights. Interpreters are started (and torch imported in
each) before any variant loads, so these figures are what a *model* adds per
interpreter; `interpreter_mb` is what starting an interpreter and importing torch in
it cost, where this process started them (an earlier pool's reused interpreters: null).

`load_unload_growth` loads, infers once with and unloads one model `cycles` times
after one warm-up cycle and reports the PSS growth over the cycles (and what the
warm-up cycle left behind), with the runtime's memory measures on (malloc_trim at
unload, mmap for large allocations while loading: aserve.runtime.memory) and, for
comparison, with either or both off (each run starts from a trimmed heap; once the
runtime has set glibc's mmap threshold it stays fixed at 32 MiB outside loading, so
"off" means loading under that threshold rather than glibc's dynamic one).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import pathlib
import sys
import tempfile
from typing import Any

from aserve.runtime.memory import pss

WIDTH = 2048
LAYER_BYTES = (WIDTH * WIDTH + WIDTH) * 4
MB = 1 << 20
VARIANTS = ("none", "idiom", "helper", "package", "copy")

MODEL = '''
import torch
from aserve.runtime import Model, TensorSpec, load_weights

WIDTH = {width}


def build(layers):
    return torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(layers)])


class Weighted(Model):
    inputs = (TensorSpec("X", "FP32", (-1, WIDTH)),)
    outputs = (TensorSpec("Y", "FP32", (-1, WIDTH)),)
    tensor_format = "torch"

    def load(self):
        p = self.parameters
        mode, path, layers = p["mode"], p.get("weights"), int(p.get("layers", 1))
        if mode == "none":
            net = torch.nn.Sequential(torch.nn.ReLU())
        elif mode == "idiom":
            net = build(layers)
            net.load_state_dict(torch.load(path))
        elif mode == "helper":
            with torch.device("meta"):
                net = build(layers)
            net = load_weights(path, into=net)
        elif mode == "copy":
            net = build(layers)
            net.load_state_dict(torch.load(path, mmap=False))
        elif mode == "package":  # what [package] pickle = "model/model.pkl" does, from a model.py
            from aserve.runtime.package import open_archive
            self.importer = open_archive(path)
            net = self.importer.load_pickle("model", "model.pkl")
        else:
            raise ValueError(f"mode {{mode!r}}")
        self.net = net.eval()

    def __call__(self, inputs):
        with torch.inference_mode():
            return {{"Y": self.net(inputs["X"])}}
'''

INFER = """
from aserve.runtime import _worker
out = _worker.infer({name!r}, [("X", "FP32", (1, {width}), memoryview(bytearray({nbytes})))])
result = len(out)
"""


def layers_for(megabytes: float) -> int:
    return max(1, math.ceil(megabytes * MB / LAYER_BYTES))


def write_model(folder: pathlib.Path, megabytes: float, *, package: bool = True, seed: int = 0
                ) -> dict[str, Any]:
    """Write model.py, weights.pt (a torch.save state dict of about `megabytes`) and, with
    `package`, model.pt (the same network pickled in a torch.package archive) into
    `folder`. Returns {"folder", "weights", "archive", "layers", "weights_mb"}."""
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.py").write_text(MODEL.format(width=WIDTH))
    layers = layers_for(megabytes)
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        net = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(layers)]).eval()
    finally:
        torch.random.set_rng_state(state)
    weights = folder / "weights.pt"
    torch.save(net.state_dict(), weights)
    archive = folder / "model.pt"
    if package:
        from torch.package.package_exporter import PackageExporter

        from aserve.runtime.package import quiet

        with quiet(), PackageExporter(str(archive)) as exporter:
            exporter.extern(["torch.**", "aserve.**"])
            exporter.save_pickle("model", "model.pkl", net)
    del net
    return {"folder": str(folder), "weights": str(weights), "archive": str(archive) if package else None,
            "layers": layers, "weights_mb": round(layers * LAYER_BYTES / MB, 1)}


def spec(model: dict[str, Any], mode: str, name: str | None = None) -> Any:
    """The ModelSpec of a variant. `package` goes through the runtime's [package] loading
    (pickle = "model/model.pkl") where the host's ModelSpec has its `package` field, else
    through a model.py that opens the archive with the same runtime code."""
    from aserve.engine import ModelSpec
    from aserve.runtime.model import TensorSpec

    name = name or f"w-{mode}"
    if mode == "package" and "package" in ModelSpec.__struct_fields__:
        fields: dict[str, Any] = {
            "package": {"archive": os.path.basename(model["archive"]), "pickle": "model/model.pkl"},
            "inputs": [TensorSpec("X", "FP32", (-1, WIDTH))], "outputs": [TensorSpec("Y", "FP32", (-1, WIDTH))],
        }
        return ModelSpec(name=name, path=model["folder"], **fields)
    path = model["archive"] if mode == "package" else model["weights"]
    return ModelSpec(name=name, path=model["folder"], parameters={"mode": mode, "weights": path, "layers": model["layers"]})


async def infer_everywhere(pool: Any, name: str, interpreters: int) -> None:
    """One inference of `name` in each of the first `interpreters` interpreters."""
    code = INFER.format(name=name, width=WIDTH, nbytes=WIDTH * 4)
    for i in range(interpreters):
        await pool.execute(i, code)


async def start_interpreters(pool: Any) -> list[float | None]:
    """Start `pool` and import torch in each interpreter, one at a time; the PSS each
    cost (MB), where this call started it (None for one already running with torch)."""
    fresh = pool.stats()["ready"] == 0 and not _parked_ready(pool.engine)
    before = pss()
    await pool.start()
    started = (pss() - before) / MB / pool.interpreters if fresh else None
    costs: list[float | None] = []
    for i in range(pool.interpreters):
        had = await pool.execute(i, "import sys; result = 'torch' in sys.modules")
        before = pss()
        await pool.execute(i, "import torch; result = torch.get_num_threads()")
        imported = (pss() - before) / MB
        costs.append(None if had == "True" or started is None else round(started + imported, 1))
    return costs


def _parked_ready(engine: str) -> bool:
    from aserve.engine import pool as pool_module

    return any(p.stats()["ready"] for p in pool_module._parked.get(engine, []))


def data_pss() -> int:
    """This process's PSS without shared libraries' mappings (see memory.pss): what models change."""
    return pss(libraries=False)


async def measure(pool: Any, model: dict[str, Any], mode: str, interpreters: int) -> dict[str, Any]:
    """Load `mode` on the first `interpreters`, infer once in each, unload; PSS at each step (MB).

    The `added_*` / `left_*` figures are differences of `data_pss()`; `process_pss_*` is
    the whole process's PSS (`memory.pss()`) at that step."""
    s = spec(model, mode)
    total_before, before = pss(), data_pss()
    await pool.load(s, interpreters=interpreters)
    loaded = data_pss()
    await infer_everywhere(pool, s.name, interpreters)
    inferred, total_inferred = data_pss(), pss()
    await pool.unload(s.name)
    after = data_pss()
    return {"variant": mode, "interpreters": interpreters,
            "process_pss_before_mb": round(total_before / MB, 1),
            "process_pss_after_infer_mb": round(total_inferred / MB, 1),
            "added_after_load_mb": round((loaded - before) / MB, 1),
            "added_after_infer_mb": round((inferred - before) / MB, 1),
            "left_after_unload_mb": round((after - before) / MB, 1)}


async def weight_sharing(pool: Any, model: dict[str, Any], *, counts: tuple[int, ...] = (1, 2, 4),
                         variants: tuple[str, ...] = VARIANTS) -> dict[str, Any]:
    """Every variant on each interpreter count (see the module docstring); `pool` is a
    private pool with at least max(counts) interpreters, started."""
    records = []
    for mode in variants:
        rows = [await measure(pool, model, mode, k) for k in counts]
        first = rows[0]
        for row in rows[1:]:
            extra = row["interpreters"] - first["interpreters"]
            row["per_added_interpreter_mb"] = round(
                (row["added_after_infer_mb"] - first["added_after_infer_mb"]) / extra, 1)
        records.extend(rows)
    return {"weights_mb": model["weights_mb"], "layers": model["layers"], "records": records}


def per_added(result: dict[str, Any], variant: str, interpreters: int) -> float:
    for r in result["records"]:
        if r["variant"] == variant and r["interpreters"] == interpreters:
            return float(r["per_added_interpreter_mb"])
    raise KeyError((variant, interpreters))


async def load_unload_growth(pool: Any, model: dict[str, Any], mode: str = "copy", *, cycles: int = 50,
                             interpreters: int = 1, trim: bool = True, mmap_while_loading: bool = True,
                             every: int = 10) -> dict[str, Any]:
    """Load, infer and unload `mode` `cycles` times after a warm-up cycle; PSS growth (MB).
    `trim` / `mmap_while_loading` False turn off the runtime's malloc_trim at unload /
    its mmap threshold while loading (aserve.runtime.memory) in those interpreters meanwhile:
    the runtime calls both through the module, so the measurement replaces them there with
    ones that do nothing, and reloads the module afterwards to put them back."""
    s = spec(model, mode, name=f"cycle-{mode}")
    off = [*([] if trim else ["memory.trim = lambda: False"]),
           *([] if mmap_while_loading else ["memory.loading = contextlib.nullcontext"])]
    for i in range(interpreters):
        # start from a trimmed heap whatever an earlier measurement left, then switch
        await pool.execute(i, "from aserve.runtime import memory\nlibc = memory._c_library()\n"
                              "result = bool(libc) and libc.malloc_trim(0)")
        if off:
            await pool.execute(i, "\n".join(["import contextlib", "from aserve.runtime import memory", *off,
                                              "result = 1"]))
    try:
        series = []
        start = data_pss()
        for n in range(cycles + 1):
            await pool.load(s, interpreters=interpreters)
            await infer_everywhere(pool, s.name, interpreters)
            await pool.unload(s.name)
            if n == 0:
                base = data_pss()
            elif n % every == 0 or n == cycles:
                series.append({"cycles": n, "growth_mb": round((data_pss() - base) / MB, 1)})
    finally:
        for i in range(interpreters if off else 0):
            await pool.execute(i, "import importlib\nfrom aserve.runtime import memory\n"
                                  "importlib.reload(memory)\nresult = 1")
    return {"variant": mode, "weights_mb": model["weights_mb"], "interpreters": interpreters, "cycles": cycles,
            "malloc_trim": trim, "mmap_while_loading": mmap_while_loading,
            "left_after_first_unload_mb": round((base - start) / MB, 1), "growth_mb": series[-1]["growth_mb"],
            "series": series}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from aserve.engine import Pool

    counts = tuple(sorted(int(x) for x in args.interpreters.split(",")))
    with tempfile.TemporaryDirectory(prefix="aserve-weights-") as tmp:
        big = write_model(pathlib.Path(tmp) / "big", args.megabytes)
        small = write_model(pathlib.Path(tmp) / "small", args.cycle_megabytes, package=False, seed=1)
        pool = Pool(engine="private", interpreters=max(counts))
        try:
            costs = await start_interpreters(pool)
            sharing = await weight_sharing(pool, big, counts=counts)
            growth = [await load_unload_growth(pool, small, mode, cycles=args.cycles, trim=trim,
                                               mmap_while_loading=mapped)
                      for mode in ("copy", "idiom") for trim, mapped in ((True, True), (True, False), (False, False))]
        finally:
            await pool.close()
    return {"bench": "weights-sharing", "python": sys.version.split()[0], "engine": "private",
            "interpreter_mb": costs, **sharing, "load_unload": growth}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.weights", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", help="write the result to this file")
    p.add_argument("--megabytes", type=float, default=210.0)
    p.add_argument("--interpreters", default="1,2,4")
    p.add_argument("--cycles", type=int, default=50)
    p.add_argument("--cycle-megabytes", type=float, default=32.0)
    args = p.parse_args(argv)
    from aserve.engine import ensure_glibc_tunables

    ensure_glibc_tunables()
    result = asyncio.run(run(args))
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        pathlib.Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("ASERVE_LOG_LEVEL", "warning")
    sys.exit(main())
