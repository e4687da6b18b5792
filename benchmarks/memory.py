"""Where a server's memory goes, per interpreter: PSS by mapping kind from /proc/PID/smaps.

    python -m benchmarks.memory [--json FILE] [--model mlp] [--interpreters 1,2,4] [--engine private]

For each interpreter count it starts `aserve serve` on a repository holding only
`--model`, sends it a few requests, then reads the server's smaps and sums PSS by
kind:

- `libtorch_text`, `libpython_text`, `other_text`: a shared library's mappings with no
  private dirty page: its code and read-only data, shared with every other mapping of
  the same file (PSS divides them);
- `libtorch_relocations`, `libpython_relocations`, `other_relocations`: a library's
  mappings with private dirty pages: its data and relocated read-only data (RELRO),
  which each private namespace has a copy of;
- `heap_and_arenas`: anonymous memory (malloc's heap, pymalloc's arenas, tensors);
- `stacks`, `other`.

Each record also has the total PSS, and the per-interpreter cost: the difference to
the record with one interpreter fewer, divided by the interpreters added.

PSS divides a library's text between every process that maps it, so it reads lower while
other processes map the same libpython or libtorch (another Python of the same build, a
test run). `text_shared_with` counts them, apart from the server and this benchmark's own
process, and a line on stderr says so: figures taken then are not comparable with a run on
an otherwise idle machine.

The last line, `split`, divides the last record's memory: the host (the same server on an
empty repository: its event loop, HTTP, gRPC and batching, no interpreter started), the
interpreters (the rest, also per interpreter), the model's load (its `memory_bytes`
metadata: what loading it in every interpreter added, per interpreter), and a plain Python
process of the same interpreter that imports the model's framework (`tensor_format` torch or
numpy; its PSS, and its anonymous memory alone): one worker's floor in a server that runs a
process per worker. An interpreter here costs about as much as that process, since each has
its own copy of the framework.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time
from typing import Any

from aserve.cli import bundled_examples

from . import servers

_HEADER = re.compile(r"^[0-9a-f]+-[0-9a-f]+ (\S{4}) \S+ \S+ \S+\s*(.*)$")


def classify(path: str, private_dirty_kb: int) -> str:
    name = os.path.basename(path)
    lib = "libtorch" if "libtorch" in name or "libc10" in name else "libpython" if "libpython" in name else "other"
    if path.startswith("/") and ".so" in name:
        return f"{lib}_relocations" if private_dirty_kb > 0 else f"{lib}_text"
    if path.startswith("[stack"):
        return "stacks"
    if path in ("", "[heap]") or path.startswith("[anon"):
        return "heap_and_arenas"
    return "other"


def _tree(pid: int) -> set[int]:
    """`pid` and every process below it."""
    import psutil

    return {pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))}


def _mappings(pids: set[int]) -> list[dict[str, Any]]:
    """Every mapping of `pids` from /proc/PID/smaps: its path, and its Pss and Private_Dirty (kB)."""
    mappings: list[dict[str, Any]] = []
    for p in pids:
        for line in pathlib.Path(f"/proc/{p}/smaps").read_text().splitlines():
            m = _HEADER.match(line)
            if m:
                mappings.append({"path": m[2].strip()})
            elif mappings:
                key, _, value = line.partition(":")
                if key in ("Pss", "Private_Dirty"):
                    mappings[-1][key] = int(value.split()[0])
    return mappings


def sharing_text(pid: int) -> set[int]:
    """The processes outside the tree rooted at `pid` (and other than this one) that map one of
    the libpython or libtorch files the tree maps: each lowers the tree's PSS of that text."""
    import psutil

    tree = _tree(pid)
    files = {m["path"] for m in _mappings(tree) if classify(m["path"], 0) in ("libtorch_text", "libpython_text")}
    others: set[int] = set()
    for proc in psutil.process_iter():
        if proc.pid in tree or proc.pid == os.getpid():
            continue
        try:
            maps = pathlib.Path(f"/proc/{proc.pid}/maps").read_text()
        except OSError:  # gone, or not ours to read
            continue
        if any(f in maps for f in files):
            others.add(proc.pid)
    return others


def text_shared_with(pid: int, what: str) -> int:
    """How many processes `sharing_text` finds; a line on stderr when any do."""
    others = len(sharing_text(pid))
    if others:
        print(f"memory: {others} other process(es) map the libraries {what} maps: its PSS of their text "
              f"reads lower than on an otherwise idle machine", file=sys.stderr, flush=True)
    return others


def pss_by_kind(pid: int) -> dict[str, float]:
    """PSS in MB per kind of mapping, of every process of the tree rooted at `pid`."""
    out: dict[str, float] = {}
    for mapping in _mappings(_tree(pid)):
        kind = classify(mapping["path"], mapping.get("Private_Dirty", 0))
        out[kind] = out.get(kind, 0.0) + mapping.get("Pss", 0) / 1024
    return {k: round(v, 1) for k, v in sorted(out.items())}


def measure(model: str, interpreters: int, engine: str, examples: pathlib.Path) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="benchmarks-memory-") as tmp:
        repo = pathlib.Path(tmp)
        (repo / model).symlink_to((examples / model).resolve(), target_is_directory=True)
        server = servers.aserve_server("aserve" if engine != "main" else "aserve-main", model, repo,
                                       interpreters=interpreters)
        from .http import make_cases

        case = make_cases(model, ["binary"], examples)["binary"]

        def probe() -> bool:
            return servers.post(server.url, case.body, case.headers, timeout=10)[0] == 200

        server.start(probe)
        try:
            for _ in range(50):
                servers.post(server.url, case.body, case.headers)
            time.sleep(0.5)  # let the interpreters give back the outputs' owners before reading smaps
            assert server.proc is not None
            kinds = pss_by_kind(server.proc.pid)
            shared = text_shared_with(server.proc.pid, "the server")
            status, text = servers.get(f"{server.base}/v2/models/{model}")
            meta = json.loads(text) if status == 200 else {}
        finally:
            server.stop()
    parameters = meta.get("parameters", {})
    return {"bench": "memory", "model": model, "engine": engine, "interpreters": interpreters,
            "pss_mb": round(sum(kinds.values()), 1), "pss_mb_by_kind": kinds, "text_shared_with": shared,
            "model_load_mb": round(parameters.get("memory_bytes", 0) / 2**20, 1),
            "tensor_format": parameters.get("tensor_format")}


FRAMEWORKS = ("torch", "numpy")  # the tensor_formats a worker imports a module of that name for


def plain_process(tensor_format: str | None) -> dict[str, Any]:
    """PSS of a plain Python process (this interpreter, no aserve) that imports the framework
    of `tensor_format`: one worker's floor in a server that runs a process per worker; its
    anonymous memory alone too (`heap_and_arenas`)."""
    module = tensor_format if tensor_format in FRAMEWORKS else None
    code = f"{f'import {module}; ' if module else ''}import sys; print('ready', flush=True); sys.stdin.read()"
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n", "the plain process did not start"
        kinds = pss_by_kind(proc.pid)
        shared = text_shared_with(proc.pid, "the plain process")
    finally:
        proc.communicate("")  # its stdin closes: it ends
    return {"imports": module, "pss_mb": round(sum(kinds.values()), 1), "anon_mb": kinds.get("heap_and_arenas", 0.0),
            "text_shared_with": shared}


def host_only(engine: str) -> float:
    """PSS in MB of the server on an empty repository (no model: no interpreter started)."""
    with tempfile.TemporaryDirectory(prefix="benchmarks-memory-") as tmp:
        server = servers.aserve_server("aserve" if engine != "main" else "aserve-main", "", pathlib.Path(tmp),
                                       interpreters=1)
        server.ready = "probe"
        server.start(lambda: servers.get(f"{server.base}/v2/health/live", timeout=5)[0] == 200)
        try:
            assert server.proc is not None
            return round(sum(pss_by_kind(server.proc.pid).values()), 1)
        finally:
            server.stop()


def split(records: list[dict[str, Any]], engine: str) -> dict[str, Any]:
    """The last record's memory divided into the host, the interpreters, the model's load, and a
    plain process importing its framework (see the module's docstring)."""
    last = records[-1]
    k = last["interpreters"]
    host = host_only(engine)
    interpreters = last["pss_mb"] - host
    return {"bench": "memory", "split": {
        "model": last["model"], "interpreters": k, "pss_mb": last["pss_mb"], "host_mb": host,
        "interpreters_mb": round(interpreters, 1), "per_interpreter_mb": round(interpreters / k, 1),
        "model_load_per_interpreter_mb": round(last["model_load_mb"] / k, 1),
        "plain_process": plain_process(last.get("tensor_format")),
    }}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.memory", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", help="write the records to this file (a JSON list)")
    p.add_argument("--model", default="mlp")
    p.add_argument("--engine", default="private", choices=("private", "main"))
    p.add_argument("--interpreters", default="1,2,4")
    args = p.parse_args(argv)
    examples = bundled_examples()
    if examples is None:
        p.error("no bundled examples/ folder")
    records: list[dict[str, Any]] = []
    for k in sorted(int(x) for x in args.interpreters.split(",")):
        record = measure(args.model, k, args.engine, examples)
        if records:
            prev = records[-1]
            added = k - prev["interpreters"]
            record["per_added_interpreter_mb"] = round((record["pss_mb"] - prev["pss_mb"]) / added, 1)
            record["per_added_interpreter_mb_by_kind"] = {
                kind: round((mb - prev["pss_mb_by_kind"].get(kind, 0.0)) / added, 1)
                for kind, mb in record["pss_mb_by_kind"].items()
            }
        records.append(record)
        print(json.dumps(record), flush=True)
    records.append(split(records, args.engine))
    print(json.dumps(records[-1]), flush=True)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(records, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
