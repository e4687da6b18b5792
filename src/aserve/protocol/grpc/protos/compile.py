"""Compile inference.proto into the descriptor set shipped beside it (needs grpcio-tools):
`python src/aserve/protocol/grpc/protos/compile.py [OUTPUT]` (default: inference.binpb beside
the proto). Run by path: importing the package would load the set it makes."""

from __future__ import annotations

import pathlib
import sys


def compile_descriptor_set(output: pathlib.Path) -> None:
    """Write the FileDescriptorSet of inference.proto to `output` (SystemExit when protoc fails)."""
    from grpc_tools import protoc  # a development tool: not a dependency of the server

    here = pathlib.Path(__file__).resolve().parent
    status = protoc.main(["protoc", f"-I{here}", f"--descriptor_set_out={output}", "inference.proto"])
    if status != 0:
        raise SystemExit(f"protoc failed ({status}) on {here / 'inference.proto'}")


if __name__ == "__main__":
    out = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent / "inference.binpb"
    compile_descriptor_set(out)
