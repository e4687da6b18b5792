"""The servers `benchmarks.http` measures aserve against, each run as its own process.

- `ceiling`: aiohttp + uvloop, one POST route that reads the body and answers a fixed
  small JSON body: what one event loop can do with nothing else to do.
- `inline`: aiohttp + uvloop decoding the same V2 request (JSON and the binary tensor
  extension) and running the model in the handler, on the loop's thread.
- `mosec_server`: MOSEC (Rust HTTP front, Python worker processes with dynamic
  batching) serving the same models over V2, its workers decoding with msgspec Structs
  (`v2_structs`); `mosec_native`: the same MOSEC serving its own minimal msgspec JSON
  body (`native`). Both run in MOSEC's own virtual environment.

`v2` (the request/response codec) and `models` (the two benchmarked models) are shared
by the peers. Everything here imports only the standard library and msgspec at module
level, so that it loads in MOSEC's environment too (where aserve is not installed: the
benchmark puts the repository on its `PYTHONPATH`); torch is imported only by the `mlp`
model.
"""
