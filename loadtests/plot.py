"""Plot a Locust run: requests/s and latency percentiles over time, from `*_stats_history.csv`.

    .venv/bin/python loadtests/plot.py results/aserve_stats_history.csv [-o run.png] [--name NAME]

Locust writes the history file with `--csv PREFIX` (one row a second; with
`--csv-full-history` also one per request name). The figure has two panels sharing the
time axis: requests/s (and failures/s), and the p50, p95 and p99 response times in ms.
Rows of `--name` are plotted (default `Aggregated`, every request); rows from before the
first response (percentiles `N/A`) are left out. Needs matplotlib (the `bench` extra).
"""

from __future__ import annotations

import argparse
import csv
import pathlib
import sys
from collections.abc import Sequence

PERCENTILES = ("50%", "95%", "99%")


def read_history(path: pathlib.Path, name: str = "Aggregated") -> dict[str, list[float]]:
    """Columns of the rows of `name`: t (seconds since the first row), rps, fps and each percentile."""
    series: dict[str, list[float]] = {"t": [], "rps": [], "fps": [], **{p: [] for p in PERCENTILES}}
    start: float | None = None
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = {"Timestamp", "Name", "Requests/s", "Failures/s", *PERCENTILES} - set(reader.fieldnames or ())
        if missing:
            raise ValueError(f"{path}: not a Locust stats history file (no column {', '.join(sorted(missing))})")
        for row in reader:
            if row["Name"] != name:
                continue
            t = float(row["Timestamp"])
            start = t if start is None else start
            if any(row[p] == "N/A" for p in PERCENTILES):
                continue
            series["t"].append(t - start)
            series["rps"].append(float(row["Requests/s"]))
            series["fps"].append(float(row["Failures/s"]))
            for p in PERCENTILES:
                series[p].append(float(row[p]))
    if not series["t"]:
        raise ValueError(f"{path}: no rows named {name!r} with response times")
    return series


def plot(series: dict[str, list[float]], out: pathlib.Path, *, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (rate, latency) = plt.subplots(2, 1, sharex=True, figsize=(9, 6), constrained_layout=True)
    rate.plot(series["t"], series["rps"], marker=".", label="requests/s")
    if any(series["fps"]):
        rate.plot(series["t"], series["fps"], label="failures/s", color="tab:red")
    rate.set_ylabel("per second")
    rate.set_ylim(bottom=0)
    rate.legend(loc="upper left")
    rate.set_title(title)
    for p in PERCENTILES:
        latency.plot(series["t"], series[p], marker=".", label=f"p{p.rstrip('%')}")
    latency.set_ylabel("response time (ms)")
    latency.set_xlabel("time since start (s)")
    latency.set_ylim(bottom=0)
    latency.legend(loc="upper left")
    for ax in (rate, latency):
        ax.grid(alpha=0.3)
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Plot a Locust *_stats_history.csv as a PNG")
    parser.add_argument("history", type=pathlib.Path, help="Locust's PREFIX_stats_history.csv")
    parser.add_argument("-o", "--output", type=pathlib.Path,
                        help="PNG to write (default: the CSV's path with _stats_history.csv replaced by .png)")
    parser.add_argument("--name", default="Aggregated", help="request name to plot (default Aggregated)")
    args = parser.parse_args(argv)
    out = args.output or args.history.with_name(args.history.name.removesuffix("_stats_history.csv")
                                                .removesuffix(".csv") + ".png")
    try:
        series = read_history(args.history, args.name)
    except (OSError, ValueError) as e:
        print(f"plot: {e}", file=sys.stderr)
        return 1
    plot(series, out, title=f"{args.history.name}: {args.name}")
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
