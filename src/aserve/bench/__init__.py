"""Benchmarks, run as `aserve bench NAME [args]`: each module has `main(argv) -> int` and prints JSON records."""
