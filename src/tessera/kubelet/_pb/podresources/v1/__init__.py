"""Generated gRPC bindings (podresources/v1); regenerate with tools/gen_proto.py."""
