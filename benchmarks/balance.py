"""How evenly connections spread over front loops: SO_REUSEPORT against accepting in one place.

    python -m benchmarks.balance [--json FILE] [--loops 2,4] [--connections 8,64,256] [--trials 30]

A front loop serves the connections it has; the busiest one bounds the server's peak.
Two ways to spread them, measured side by side:

- `reuseport`: one listening socket per loop, all bound to one port with SO_REUSEPORT;
  the kernel picks a listener by a hash of the connection's addresses and ports. Measured
  with plain sockets in this process: `--trials` rounds of opening the connections from
  fresh ephemeral ports and counting what each listener accepted.
- `handover` (what `aserve serve --loops N` does): the host's loop accepts every
  connection and hands it to the loop with the fewest open. Measured on a real server:
  each connection sends one infer request, then `aserve_event_loop_connections{loop}`
  is read from /metrics.

Each record: `method`, `loops`, `connections`, `imbalance_median` and `imbalance_worst`
(connections on the busiest loop over connections per loop if even: 1.0 is even, and a
loop-bound peak is about 1/imbalance of the even one), `trials`.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from . import ROOT, child_env
from .servers import free_port, get


def _reuseport_trial(loops: int, connections: int) -> float:
    listeners = []
    port = 0
    for _ in range(loops):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        s.bind(("127.0.0.1", port))
        port = s.getsockname()[1]
        s.listen(1024)
        s.setblocking(False)
        listeners.append(s)
    clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(connections)]
    counts = [0] * loops
    accepted = []
    end = time.monotonic() + 10
    while sum(counts) < connections and time.monotonic() < end:
        for i, s in enumerate(listeners):
            try:
                conn, _ = s.accept()
            except BlockingIOError:
                continue
            counts[i] += 1
            accepted.append(conn)
    for c in (*clients, *accepted, *listeners):
        c.close()
    return max(counts) / (connections / loops)


def _handover(loops: int, connections: int, repository: pathlib.Path) -> float:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "aserve.cli", "serve", str(repository), "--port", str(port),
                             "--loops", str(loops), "--interpreters", "1", "--log-level", "warning"],
                            env=child_env())
    try:
        end = time.monotonic() + 120
        while True:
            try:
                if get(f"http://127.0.0.1:{port}/v2/health/ready")[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > end or proc.poll() is not None:
                raise RuntimeError("the server did not become ready")
            time.sleep(0.2)
        body = json.dumps({"inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": list(range(16))},
            {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [1] * 16}]}).encode()
        request = (b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        clients = []
        for _ in range(connections):
            c = socket.create_connection(("127.0.0.1", port))
            c.sendall(request)
            clients.append(c)
        for c in clients:  # every one is served (so its loop counts it) before the count is read
            if b" 200 " not in c.recv(65536):
                raise RuntimeError("an infer request failed")
        text = _metrics_on(clients[0])  # on a connection already counted: the count is the clients' own
        counts = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                  if line.startswith("aserve_event_loop_connections{")]
        for c in clients:
            c.close()
        if len(counts) != loops or sum(counts) != connections:
            raise RuntimeError(f"expected {connections} connections on {loops} loops in /metrics, got {counts}")
        return max(counts) / (connections / loops)
    finally:
        proc.terminate()
        proc.wait(30)


def _metrics_on(conn: socket.socket) -> str:
    conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(next(line.split(b":", 1)[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:")))
    while len(body) < length:
        body += conn.recv(65536)
    return body.decode()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.balance", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", help="write the records to this file (a JSON list)")
    p.add_argument("--loops", default="2,4")
    p.add_argument("--connections", default="8,64,256")
    p.add_argument("--trials", type=int, default=30, help="SO_REUSEPORT rounds per point")
    args = p.parse_args(argv)
    records: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        repository = pathlib.Path(tmp)
        (repository / "simple").symlink_to(ROOT / "examples" / "simple")
        for loops in (int(x) for x in args.loops.split(",")):
            for connections in (int(x) for x in args.connections.split(",")):
                shares = [_reuseport_trial(loops, connections) for _ in range(args.trials)]
                records.append({"bench": "balance", "method": "reuseport", "loops": loops,
                                "connections": connections, "trials": args.trials,
                                "imbalance_median": round(statistics.median(shares), 3),
                                "imbalance_worst": round(max(shares), 3)})
                print(json.dumps(records[-1]), flush=True)
                share = _handover(loops, connections, repository)
                records.append({"bench": "balance", "method": "handover", "loops": loops,
                                "connections": connections, "trials": 1,
                                "imbalance_median": round(share, 3), "imbalance_worst": round(share, 3)})
                print(json.dumps(records[-1]), flush=True)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(records, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
