"""The server's wire codec: V2 (KServe/Triton) and TF-Serving messages, JSON and msgpack.

Pure functions from request bodies to validated tensors and from output tensors to
response bodies; no web framework, no I/O. Every malformed request raises
`aserve.errors.InvalidInput` with a message naming the field, the expected and the
received value.
"""

from ..inference import InferRequest, RequestedOutput
from .formats import (
    CONTENT_TYPES,
    Format,
    content_type,
    encode_error,
    encode_message,
    negotiate,
    request_format,
)
from .metadata import ModelMetadata, ServerMetadata, TensorMetadata, model_metadata
from .tfserving import PREDICT, decode_predict, encode_predict
from .tfsignature import CLASSIFY, REGRESS
from .v2 import HEADER_LENGTH, V2, decode_infer, encode_infer

__all__ = [
    "CLASSIFY",
    "CONTENT_TYPES",
    "HEADER_LENGTH",
    "PREDICT",
    "REGRESS",
    "V2",
    "Format",
    "InferRequest",
    "ModelMetadata",
    "RequestedOutput",
    "ServerMetadata",
    "TensorMetadata",
    "content_type",
    "decode_infer",
    "decode_predict",
    "encode_error",
    "encode_infer",
    "encode_message",
    "encode_predict",
    "model_metadata",
    "negotiate",
    "request_format",
]
