"""Generated gRPC bindings (dra/v1); regenerate with tools/gen_proto.py."""
