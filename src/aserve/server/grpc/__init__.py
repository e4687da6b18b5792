"""The gRPC front: the Open Inference Protocol's `inference.GRPCInferenceService` (with
Triton's extensions), gRPC health and reflection, on the HTTP front's event loop and data plane.

`front.py` runs the grpc.aio server; `service.py` its methods; `codec.py` the infer
messages as a data plane codec; `status.py` errors as status codes; `protos/` the proto
and its compiled descriptor set.
"""

from .front import GrpcFront

__all__ = ["GrpcFront"]
