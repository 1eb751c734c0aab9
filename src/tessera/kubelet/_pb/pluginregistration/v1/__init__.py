"""Generated gRPC bindings (pluginregistration/v1); regenerate with tools/gen_proto.py."""
