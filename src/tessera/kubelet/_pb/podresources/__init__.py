"""Generated gRPC bindings (podresources); regenerate with tools/gen_proto.py."""
