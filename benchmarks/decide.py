"""What the window policy's decision costs the loop at each arrival, by queue length.

    python -m benchmarks.decide [--json FILE] [--lengths 1,8,16,32,63] [--rounds 5] [--number 20000]

While a batch of the model runs and an interpreter is free, the host's batcher asks its
policy at every arrival whether the queue may go. `WindowPolicy.decide` needs how many
queued requests fit one batch: walking the queue costs each arrival its length (a batch of
n requests n²/2 steps); told the queue's samples (`queued=`, which the batcher counts as
requests come and go), it knows at once when they all fit. This times both on queues of
one-sample requests against `max_batch_size` 64, the rounds interleaved.

Each record: `length`, `walk_us`, `told_us` (the median of `--rounds`, each the mean of
`--number` calls) and their ratio.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import statistics
import sys
import timeit

from aserve.batching.policy import WindowPolicy
from aserve.batching.request import Request


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", help="write every record to this file")
    p.add_argument("--lengths", default="1,8,16,32,63")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--number", type=int, default=20_000)
    args = p.parse_args(argv)
    policy = WindowPolicy(max_queue_delay=0.001)
    records = []
    for n in (int(x) for x in args.lengths.split(",")):
        queue = collections.deque(Request(5.0 + i * 1e-5, 1, None, [], None, None) for i in range(n))  # type: ignore[arg-type]
        walk, told = [], []
        for _ in range(args.rounds):
            walk.append(timeit.timeit(functools.partial(policy.decide, 5.0001, queue, idle=1, running=1,
                                                        max_batch_size=64), number=args.number) / args.number * 1e6)
            told.append(timeit.timeit(functools.partial(policy.decide, 5.0001, queue, idle=1, running=1,
                                                        max_batch_size=64, queued=n),
                                      number=args.number) / args.number * 1e6)
        w, t = round(statistics.median(walk), 3), round(statistics.median(told), 3)
        records.append({"bench": "decide", "length": n, "walk_us": w, "told_us": t,
                        "told_over_walk": round(t / w, 3), "rounds": args.rounds, "python": sys.version.split()[0]})
        print(json.dumps(records[-1]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
