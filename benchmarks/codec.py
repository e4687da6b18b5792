"""The V2 codec's cost per request on the loop: decoding the body, encoding the answer.

    python -m benchmarks.codec [--json FILE] [--rounds 15] [--before PYTHON] [--cases ...]

Each case is a request of a bundled model's shape and its answer:

- `simple-json`, `simple-binary`: two INT32 [1, 16] inputs, two INT32 [1, 16] outputs;
- `mlp-json`, `mlp-binary`: one FP32 [1, 16] input (values as clients write float32s:
  17-digit reprs), one FP32 [1, 16] output;
- `cnn-json`, `cnn-binary`: one FP32 [1, 3, 64, 64] image, ten FP32 scores;
- `simple-nested`, `mlp-nested`, `cnn-nested`: the JSON case with each input's data nested
  one list per dimension, as numpy's `tolist()` writes it;
- `simple-id`: the JSON case with the request's `id` (answered with it);
- `simple-params`: the JSON case with the input parameters MLServer's codecs add
  (`{"content_type": "np"}`), which change nothing;
- `simple-triton`: the JSON case as tritonclient sends JSON inputs with no output named:
  `parameters: {"binary_data_output": true}`, answered with binary outputs.

All but the binary cases send V2 JSON and are answered in V2 JSON (`simple-triton` asks
for binary outputs); binary cases send the binary tensor extension with
`binary_data_output` and are answered with binary outputs. Per case and build, `decode_us` times `decode_infer` on the same body (after the first, so a binary
header is remembered, as for a client that repeats it) and `encode_us` times
`encode_infer` on outputs of the declared shapes.

Builds, in the same run, rounds interleaved so that a drift of the machine weighs on all:
- `head`: this tree;
- `codec`: this tree with its C paths off (`V2Json`, `V2Binary`, `v2_json_encode`,
  `v2_binary_encode`): the Python codec alone;
- `before` (with `--before PYTHON`, an interpreter whose `aserve` is another build, e.g. a
  wrapper setting PYTHONPATH to its `src`): that build, run in a subprocess.

Each build runs in a subprocess of its own. Records: one per (case, build) with the
medians over `--rounds` and the rounds' min and max, then per case the ratios of head to
the others (three significant figures); `python`, `cpus` and the load average before the run in every record.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import random
import statistics
import struct
import subprocess
import sys
import timeit
from typing import Any

CASES = ("simple-json", "simple-binary", "simple-nested", "simple-id", "simple-params", "simple-triton",
         "mlp-json", "mlp-binary", "mlp-nested", "cnn-json", "cnn-binary", "cnn-nested")
HEADER_LENGTH = "Inference-Header-Content-Length"


def _float32s(rng: random.Random, n: int) -> list[float]:
    return [struct.unpack("<f", struct.pack("<f", rng.gauss(0, 1)))[0] for _ in range(n)]


def _case(name: str) -> dict[str, Any]:
    """The model's schema fields, the request (body, content type, header length) and the answer's outputs."""
    from aserve.protocol.arrays import nest

    rng = random.Random(7)
    model, body_kind = name.split("-")
    inputs: list[tuple[str, str, tuple[int, ...], list[Any]]]
    if model == "simple":
        inputs = [("INPUT0", "INT32", (-1, 16), [rng.randint(-100, 100) for _ in range(16)]),
                  ("INPUT1", "INT32", (-1, 16), [rng.randint(-100, 100) for _ in range(16)])]
        outputs = [("OUTPUT0", "INT32", (1, 16)), ("OUTPUT1", "INT32", (1, 16))]
        max_batch = 8
    elif model == "mlp":
        inputs = [("INPUT", "FP32", (-1, 16), _float32s(rng, 16))]
        outputs = [("OUTPUT", "FP32", (1, 16))]
        max_batch = 64
    else:
        inputs = [("INPUT", "FP32", (-1, 3, 64, 64), _float32s(rng, 3 * 64 * 64))]
        outputs = [("OUTPUT", "FP32", (1, 10))]
        max_batch = 16
    items: list[dict[str, Any]] = []
    blobs = []
    for name_, datatype, shape, values in inputs:
        real = [1, *shape[1:]]
        if body_kind in ("json", "id", "triton"):
            items.append({"name": name_, "datatype": datatype, "shape": real, "data": values})
        elif body_kind == "params":
            items.append({"name": name_, "datatype": datatype, "shape": real, "data": values,
                          "parameters": {"content_type": "np"}})
        elif body_kind == "nested":
            items.append({"name": name_, "datatype": datatype, "shape": real, "data": nest(values, real)})
        else:
            data = struct.pack(f"<{len(values)}{'i' if datatype == 'INT32' else 'f'}", *values)
            blobs.append(data)
            items.append({"name": name_, "datatype": datatype, "shape": real,
                          "parameters": {"binary_data_size": len(data)}})
    head: dict[str, Any] = {"id": "request-1", "inputs": items} if body_kind == "id" else {"inputs": items}
    if body_kind in ("binary", "triton"):
        head["parameters"] = {"binary_data_output": True}
    header = json.dumps(head).encode()
    return {
        "inputs": [(n, d, s) for n, d, s, _ in inputs],
        "input_bytes": [struct.pack(f"<{len(v)}{'i' if d == 'INT32' else 'f'}", *v) for _, d, _, v in inputs],
        "outputs": outputs,
        "max_batch_size": max_batch,
        "body": header + b"".join(blobs),
        "content_type": "application/octet-stream" if body_kind == "binary" else "application/json",
        "header_length": len(header) if body_kind == "binary" else None,
    }


def _measure(cases: list[str], number_scale: float, c_paths: bool) -> dict[str, dict[str, float]]:
    """One round of every case in this process: microseconds per decode and per encode
    (`c_paths` False: with the C encoders off while it runs)."""
    from aserve import _native

    saved = {name: getattr(_native, name) for name in ("v2_json_encode", "v2_binary_encode")
             if hasattr(_native, name)}
    if not c_paths:
        for name in saved:
            setattr(_native, name, lambda *args: None)  # v2.py looks them up per call
    try:
        return _measure_cases(cases, number_scale, c_paths)
    finally:
        for name, function in saved.items():
            setattr(_native, name, function)


def _measure_cases(cases: list[str], number_scale: float, c_paths: bool) -> dict[str, dict[str, float]]:
    from aserve import _native
    from aserve.inference import InferResponse, ModelSchema
    from aserve.protocol import decode_infer, encode_infer
    from aserve.runtime.model import TensorSpec
    from aserve.tensor import Tensor

    out = {}
    for name in cases:
        case = _case(name)
        schema = ModelSchema(name.split("-")[0], "1", inputs=[TensorSpec(*i) for i in case["inputs"]],
                             outputs=[TensorSpec(n, d, (-1, *s[1:])) for n, d, s in case["outputs"]],
                             max_batch_size=case["max_batch_size"])
        if not c_paths:
            schema.json_plan = None
            if hasattr(_native, "V2Binary"):
                schema.plans = _NoPlans()
        body, ctype, length = case["body"], case["content_type"], case["header_length"]

        def decode() -> Any:
            return decode_infer(body, content_type=ctype, header_length=length, schema=schema)  # noqa: B023

        request = decode()
        if [bytes(memoryview(t.data).cast("B")) for t in request.inputs] != case["input_bytes"]:
            raise AssertionError(f"{name}: the request decoded to other values")
        outputs = {n: Tensor(d, s, memoryview(struct.pack(f"<{_count(s)}f", *range(_count(s)))))
                   for n, d, s in case["outputs"]}
        response = InferResponse(model_name=schema.name, model_version="1", outputs=outputs, id=request.id)

        def encode() -> Any:
            return encode_infer(response, request, accept=None, content_type=ctype)  # noqa: B023

        chunks, headers = encode()
        _check_answer(name, chunks, headers, outputs, request.id)

        size = len(body)
        number = max(20, int(number_scale * 20_000_000 / (size + 2000)))
        out[name] = {
            "decode_us": timeit.timeit(decode, number=number) / number * 1e6,
            "encode_us": timeit.timeit(encode, number=number) / number * 1e6,
        }
    return out


def _check_answer(name: str, chunks: list[Any], headers: dict[str, str], outputs: dict[str, Any],
                  id_: str | None) -> None:
    """The answer carries the request's id and every output, binary after the header or as JSON
    lists, with its values."""
    body = b"".join(bytes(c) for c in chunks)
    length = int(headers.get(HEADER_LENGTH, len(body)))
    message = json.loads(body[:length])
    if message.get("id") != id_:
        raise AssertionError(f"{name}: the answer's id is {message.get('id')!r}, not the request's {id_!r}")
    data = body[length:]
    for item in message["outputs"]:
        want = bytes(outputs[item["name"]].data)
        if "data" in item:
            got = struct.pack(f"<{len(item['data'])}{'i' if item['datatype'] == 'INT32' else 'f'}", *item["data"])
        else:
            size = item["parameters"]["binary_data_size"]
            got, data = data[:size], data[size:]
        if got != want:
            raise AssertionError(f"{name}: output {item['name']} answered other values")
    if len(message["outputs"]) != len(outputs) or data:
        raise AssertionError(f"{name}: the answer does not hold exactly the outputs")


class _NoPlans:
    """`V2Binary`'s interface remembering nothing: every binary header is decoded."""

    def find(self, body: Any, header_length: int) -> None:
        return None

    def remember(self, *args: Any) -> None:
        return None

    def __len__(self) -> int:
        return 0


def _count(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _round(python: str, cases: list[str], scale: float, c_paths: bool) -> dict[str, dict[str, float]]:
    """One round in a fresh subprocess of `python` (this tree's benchmarks, its own aserve)."""
    code = ("import json, sys; from benchmarks.codec import _measure; "
            f"print(json.dumps(_measure({cases!r}, {scale!r}, {c_paths!r})))")
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True,
                          cwd=pathlib.Path(__file__).resolve().parent.parent)
    result: dict[str, dict[str, float]] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", help="write the records to this file (a JSON list)")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--scale", type=float, default=1.0, help="timeit numbers scaled by this")
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--before", metavar="PYTHON", help="an interpreter whose aserve is the build to compare with")
    args = p.parse_args(argv)
    cases = [c for c in args.cases.split(",") if c]
    unknown = set(cases) - set(CASES)
    if unknown:
        p.error(f"--cases: unknown {sorted(unknown)}; expected some of {', '.join(CASES)}")
    builds: dict[str, tuple[str, bool]] = {"head": (sys.executable, True), "codec": (sys.executable, False)}
    if args.before:
        builds["before"] = (args.before, True)
    common = {"bench": "codec", "python": platform.python_version(), "cpus": os.cpu_count(),
              "loadavg_1m_start": os.getloadavg()[0]}
    rounds: dict[str, list[dict[str, dict[str, float]]]] = {b: [] for b in builds}
    for _ in range(args.rounds):
        for build, (python, c_paths) in builds.items():
            rounds[build].append(_round(python, cases, args.scale, c_paths))
    records: list[dict[str, Any]] = []
    for case in cases:
        medians = {}
        for build in builds:
            rec: dict[str, Any] = {**common, "case": case, "build": build, "rounds": args.rounds}
            for field in ("decode_us", "encode_us"):
                values = [r[case][field] for r in rounds[build]]
                rec[field] = round(statistics.median(values), 3)
                rec[field + "_range"] = [round(min(values), 3), round(max(values), 3)]
            medians[build] = rec
            records.append(rec)
        for other in builds:
            if other != "head":
                records.append({**common, "case": case, "summary": f"head / {other}",
                                **{f"{field}_ratio": float(f"{medians['head'][field] / medians[other][field]:.3g}")
                                   for field in ("decode_us", "encode_us")}})
    for rec in records:
        print(json.dumps(rec))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(records, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
