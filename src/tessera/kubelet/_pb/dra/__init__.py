"""Generated gRPC bindings (dra); regenerate with tools/gen_proto.py."""
