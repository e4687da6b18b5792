"""KServe's gRPC inference protocol: its messages (`protos`, from the shipped descriptor set)
and its infer messages as a codec of the data plane (`codec`). Imported only where gRPC is
served: it needs protobuf."""
