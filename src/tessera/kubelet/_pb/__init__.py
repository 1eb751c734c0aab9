"""Generated gRPC bindings (kubelet APIs); regenerate with tools/gen_proto.py."""
