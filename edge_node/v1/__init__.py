"""Generated protobuf and gRPC modules of protos/edge_node/v1 (by protos/generate.py; do not edit)."""
