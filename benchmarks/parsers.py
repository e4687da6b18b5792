"""The cost of parsing one V2 infer request: llhttp (httptools) against the former wire front's
regular-expression head parser, in the same run.

    python -m benchmarks.parsers [--json FILE] [--rounds 15] [--number 20000]

The request is what a V2 client sends for `simple`: `POST /v2/models/simple/infer` with
Host, Content-Type: application/json and Content-Length, and the ~300-byte JSON body of two
INT32 vectors of 16 (the HTTP benchmark's body). Each parser turns the message's bytes into
its target, a dict of its header fields and its body:

- `httptools`: llhttp through httptools' `HttpRequestParser`, with Python callbacks
  (`on_url`, `on_header`, `on_headers_complete`, `on_body`, `on_message_complete`) that
  collect them, one parser fed message after message as a keep-alive connection is;
- `regex_head`: `parse_head`, the former wire front's head parser (copied below as the baseline
  it is measured against), on a head it has not seen: find the head's end, decode it,
  parse it, the fields into a dict and the body sliced by Content-Length.

Each figure is the median over `--rounds` timeit rounds of `--number` messages, the two
parsers' rounds interleaved so that a drift of the machine weighs on both alike. One JSON
record per parser (`us_per_request`: median, with the rounds' min and max), then a summary
record with their ratio; `python`, `cpus` and the load average before the run in every record.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import pathlib
import platform
import re
import statistics
import sys
import timeit
from collections.abc import Callable
from typing import Any

import httptools

from .http import encode_request, sample_inputs

# ---- the baseline: the wire front's head parser ------------------------------------------
# Copied from src/aserve/server/wire.py (parse_head and the constants it reads), the regular-
# expression parser that llhttp replaced; kept here, unchanged, as the baseline measured
# in the same run now that the original is gone.

_FIELD = re.compile(r"^([!#$%&'*+.^_`|~0-9A-Za-z-]+):[ \t]*([^\x00-\x08\x0a-\x1f\x7f]*?)[ \t]*\r\n", re.MULTILINE)
_FRAMING = frozenset({"content-length", "transfer-encoding", "content-encoding", "expect", "upgrade", "connection"})
_SINGLE = frozenset({"content-length", "content-location", "content-range", "content-type", "etag", "host",
                     "max-forwards", "server", "transfer-encoding", "user-agent"})
_CHECKED = _FRAMING | _SINGLE
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH"})
MAX_FIELDS = 128


def parse_head(head: str) -> tuple[str, str, list[tuple[str, str]], int, bool] | None:
    """(method, target, fields, Content-Length (0 when absent), close) of an HTTP/1.1 request
    head whose extent the wire front knows (without its final CRLF CRLF), or None when
    aiohttp must read the connection from here on."""
    line, _, block = head.partition("\r\n")
    parts = line.split(" ")
    if len(parts) != 3 or parts[2] != "HTTP/1.1":
        return None
    method, target = parts[0], parts[1]
    if method not in _METHODS:
        return None
    if not target.startswith("/") or not target.isascii() or not target.isprintable():
        return None  # origin-form only
    if block:
        block += "\r\n"
        fields: list[tuple[str, str]] = _FIELD.findall(block)
        if len(fields) != block.count("\n") or len(fields) > MAX_FIELDS:
            return None
    else:
        fields = []
    length = 0
    close = False
    seen: set[str] = set()
    for name, value in fields:
        lower = name.lower()
        if lower in _CHECKED:
            if lower in seen:
                return None
            seen.add(lower)
            if lower == "content-length":
                if not value.isdigit() or not value.isascii() or len(value) > 18:
                    return None  # aiohttp refuses a length past 2**63 - 1
                length = int(value)
            elif lower == "connection":
                token = value.lower()
                if token == "close":
                    close = True
                elif token != "keep-alive":
                    return None
            elif lower in _FRAMING:
                return None
    if "host" not in seen:  # HTTP/1.1 requires Host (aiohttp answers 400 without it)
        return None
    return method, target, fields, length, close


# ---- the message and the two ways of reading it ------------------------------------------

Parsed = tuple[str, dict[str, str], bytes]  # target, header fields, body


def infer_request() -> bytes:
    """A V2 infer request for `simple`, as a client puts it on the wire."""
    body, _ = encode_request(sample_inputs("simple"), "json")
    head = ("POST /v2/models/simple/infer HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
    return head.encode() + body


def regex_reader() -> Callable[[bytes], Parsed]:
    def read(data: bytes) -> Parsed:
        end = data.find(b"\r\n\r\n")
        parsed = parse_head(data[:end].decode("utf-8", "surrogateescape"))
        if parsed is None:
            raise ValueError("parse_head refused the request")
        _, target, fields, length, _ = parsed
        start = end + 4
        return target, dict(fields), data[start:start + length]

    return read


class _Collector:
    """httptools' callbacks, collecting one message's target, header fields and body."""

    def __init__(self) -> None:
        self.url = b""
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []
        self.done: Parsed | None = None

    def on_message_begin(self) -> None:
        self.url = b""
        self.headers = {}
        self.body = []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1")] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        pass

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        body = self.body[0] if len(self.body) == 1 else b"".join(self.body)
        self.done = (self.url.decode("latin-1"), self.headers, body)


def httptools_reader() -> Callable[[bytes], Parsed]:
    collector = _Collector()
    parser = httptools.HttpRequestParser(collector)

    def read(data: bytes) -> Parsed:
        parser.feed_data(data)
        done = collector.done
        if done is None:
            raise ValueError("httptools did not complete the message")
        collector.done = None
        return done

    return read


READERS: dict[str, Callable[[], Callable[[bytes], Parsed]]] = {
    "httptools": httptools_reader, "regex_head": regex_reader,
}


# ---- measuring ---------------------------------------------------------------------------

def measure(rounds: int, number: int) -> list[dict[str, Any]]:
    load = os.getloadavg()[0]  # other work on the machine moves the medians: say how busy it was
    message = infer_request()
    readers = {name: make() for name, make in READERS.items()}
    answers = {name: read(message) for name, read in readers.items()}
    first = next(iter(answers.values()))
    for name, answer in answers.items():  # every parser reads the same request
        if answer != first:
            raise AssertionError(f"{name} read {answer!r}, another parser {first!r}")
    seconds: dict[str, list[float]] = {name: [] for name in readers}
    for _ in range(rounds):
        for name, read in readers.items():
            seconds[name].append(timeit.timeit(functools.partial(read, message), number=number) / number)
    base: dict[str, Any] = {"bench": "parsers", "message_bytes": len(message), "body_bytes": len(first[2]),
            "rounds": rounds, "number": number, "python": platform.python_version(), "cpus": os.cpu_count(),
            "load_1min_before": round(load, 2)}
    records: list[dict[str, Any]] = []
    for name, values in seconds.items():
        us = [v * 1e6 for v in values]
        record: dict[str, Any] = {**base, "parser": name, "us_per_request": round(statistics.median(us), 3),
                  "us_min": round(min(us), 3), "us_max": round(max(us), 3)}
        if name == "httptools":
            record["httptools_version"] = httptools.__version__
        records.append(record)
    by = {r["parser"]: r["us_per_request"] for r in records}
    records.append({**base, "summary": {
        "httptools_us": by["httptools"], "regex_head_us": by["regex_head"],
        "httptools_vs_regex_head": round(by["httptools"] / by["regex_head"], 3),
    }})
    return records


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.parsers", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", metavar="FILE", help="write the records to FILE (a JSON list)")
    p.add_argument("--rounds", type=int, default=15, help="timeit rounds per parser (default %(default)s)")
    p.add_argument("--number", type=int, default=20000, help="messages per round (default %(default)s)")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.number < 1:
        p.error("--rounds and --number must be at least 1")
    records = measure(args.rounds, args.number)
    for record in records:
        print(json.dumps(record), flush=True)
    s = records[-1]["summary"]
    print(f"httptools {s['httptools_us']} us, regex head parser {s['regex_head_us']} us per request "
          f"({s['httptools_vs_regex_head']}x; {records[0]['message_bytes']} bytes, Python "
          f"{platform.python_version()})", file=sys.stderr)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(records, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
