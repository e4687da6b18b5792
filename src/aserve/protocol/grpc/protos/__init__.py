"""The gRPC service's messages, from the descriptor set shipped beside `inference.proto`.

`inference.binpb` is the proto compiled once (`compile.py` beside it, with grpcio-tools;
a test checks it is current), so installing aserve needs no compiler and pins no protoc
release to the protobuf runtime. Its file is added to a descriptor pool
of aserve's own, not protobuf's default one: a client library that carries the same
`inference` package (tritonclient does) can be imported in the same process.
"""

from __future__ import annotations

import pathlib
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

HERE = pathlib.Path(__file__).resolve().parent
PROTO = HERE / "inference.proto"
DESCRIPTOR_SET = HERE / "inference.binpb"
PACKAGE = "inference"
SERVICE = "inference.GRPCInferenceService"

POOL = descriptor_pool.DescriptorPool()
_files = descriptor_pb2.FileDescriptorSet.FromString(DESCRIPTOR_SET.read_bytes())
for _file in _files.file:
    POOL.Add(_file)


def message(name: str) -> Any:
    """The class of message `inference.<name>` (nested: `Outer.Inner`)."""
    return message_factory.GetMessageClass(POOL.FindMessageTypeByName(f"{PACKAGE}.{name}"))


ServerLiveRequest = message("ServerLiveRequest")
ServerLiveResponse = message("ServerLiveResponse")
ServerReadyRequest = message("ServerReadyRequest")
ServerReadyResponse = message("ServerReadyResponse")
ModelReadyRequest = message("ModelReadyRequest")
ModelReadyResponse = message("ModelReadyResponse")
ServerMetadataRequest = message("ServerMetadataRequest")
ServerMetadataResponse = message("ServerMetadataResponse")
ModelMetadataRequest = message("ModelMetadataRequest")
ModelMetadataResponse = message("ModelMetadataResponse")
ModelInferRequest = message("ModelInferRequest")
ModelInferResponse = message("ModelInferResponse")
ModelStreamInferResponse = message("ModelStreamInferResponse")
ModelConfigRequest = message("ModelConfigRequest")
ModelConfigResponse = message("ModelConfigResponse")
ModelStatisticsRequest = message("ModelStatisticsRequest")
ModelStatisticsResponse = message("ModelStatisticsResponse")
RepositoryIndexRequest = message("RepositoryIndexRequest")
RepositoryIndexResponse = message("RepositoryIndexResponse")
RepositoryModelLoadRequest = message("RepositoryModelLoadRequest")
RepositoryModelLoadResponse = message("RepositoryModelLoadResponse")
RepositoryModelUnloadRequest = message("RepositoryModelUnloadRequest")
RepositoryModelUnloadResponse = message("RepositoryModelUnloadResponse")
TraceSettingRequest = message("TraceSettingRequest")
TraceSettingResponse = message("TraceSettingResponse")
