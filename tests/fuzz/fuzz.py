"""One fuzz target under atheris (libFuzzer): `python -m tests.fuzz.fuzz TARGET [libFuzzer flags] [CORPUS...]`.

TARGET is one of `tests.fuzz.targets.TARGETS`. The codec (`aserve.protocol`, the gRPC
front's, and what they import of aserve) is instrumented for coverage; half the mutations are libFuzzer's,
half change the decoded message (`tests.fuzz.mutate`). Everything after TARGET goes to
libFuzzer as it is (`-runs=N`, `-max_total_time=S`, `-timeout=S`, corpus folders,
or files to replay). `python -m tests.fuzz.run` runs every target for a bounded
time and prints what happened as JSON.
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> None:
    import atheris

    if len(argv) < 2 or argv[1].startswith("-"):
        raise SystemExit(f"usage: {argv[0]} TARGET [libFuzzer flags] [CORPUS...]")
    name = argv[1]
    with atheris.instrument_imports(include=["aserve"]):
        from tests.fuzz.targets import TARGETS
    if name not in TARGETS:
        raise SystemExit(f"unknown target {name!r}; expected one of {', '.join(TARGETS)}")
    from tests.fuzz.mutate import mutator

    atheris.Setup([f"{argv[0]} {name}", *argv[2:]], TARGETS[name], custom_mutator=mutator(name))
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
