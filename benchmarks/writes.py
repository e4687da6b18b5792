"""What one small answer in several buffers costs uvloop: joined into one write, or written as they are.

    python -m benchmarks.writes [--json FILE] [--answers 100000] [--rounds 5]

A binary V2 answer is three buffers: the HTTP head, the JSON header and the tensor's
bytes. `transport.write` of one buffer goes out at once; `transport.writelines` of
several queues a write request whose completion runs later. This writes `--answers`
answers of `simple`'s size, one per loop iteration (as a server answers a request), over
a socket pair read on the same loop, both ways in alternating rounds, and reports the
loop thread's CPU per answer (`time.thread_time`, the write and the read together).

Each record: `mode` ("join": `b"".join(buffers)` then `write`; "writelines"), `round`,
`us_per_answer`; the last line has the medians and their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import sys
import time

import uvloop

HEAD = (b"HTTP/1.1 200 OK\r\nServer: aserve\r\nContent-Length: 254\r\nContent-Type: application/octet-stream\r\n"
        b"Inference-Header-Content-Length: 126\r\n\r\n")
HEADER = (b'{"model_name":"simple","outputs":[{"name":"OUTPUT0","datatype":"INT32","shape":[1,16],'
          b'"parameters":{"binary_data_size":64}}]}')
DATA = memoryview(bytearray(128))


class _Sink(asyncio.Protocol):
    def __init__(self) -> None:
        self.received = 0

    def data_received(self, data: bytes) -> None:
        self.received += len(data)


class _Source(asyncio.Protocol):
    transport: asyncio.Transport

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]


async def _round(mode: str, answers: int) -> float:
    loop = asyncio.get_running_loop()
    a, b = socket.socketpair()
    _, source = await loop.create_connection(_Source, sock=a)
    _, sink = await loop.create_connection(_Sink, sock=b)
    transport = source.transport
    size = len(HEAD) + len(HEADER) + len(DATA)
    began = time.thread_time()
    for _ in range(answers):
        buffers: list[bytes | memoryview] = [HEAD, HEADER, DATA]
        if mode == "join":
            transport.write(b"".join(buffers))
        else:
            transport.writelines(buffers)
        await asyncio.sleep(0)  # one answer per loop iteration
    while sink.received < answers * size:
        await asyncio.sleep(0)
    spent = time.thread_time() - began
    transport.close()
    return spent / answers * 1e6


async def _main(args: argparse.Namespace) -> list[dict[str, object]]:
    records: list[dict[str, object]] = []
    for r in range(args.rounds):
        for mode in ("join", "writelines"):
            us = await _round(mode, args.answers)
            records.append({"bench": "writes", "mode": mode, "round": r + 1, "us_per_answer": round(us, 3)})
            print(json.dumps(records[-1]), flush=True)
    return records


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", help="write every record to this file")
    p.add_argument("--answers", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    records = uvloop.run(_main(args))
    medians = {mode: statistics.median(float(r["us_per_answer"]) for r in records if r["mode"] == mode)  # type: ignore[arg-type]
               for mode in ("join", "writelines")}
    summary = {"bench": "writes", "summary": {"median_us_per_answer": medians,
                                              "join_over_writelines": round(medians["join"] / medians["writelines"], 3),
                                              "python": sys.version.split()[0]}}
    print(json.dumps(summary))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([*records, summary], f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
