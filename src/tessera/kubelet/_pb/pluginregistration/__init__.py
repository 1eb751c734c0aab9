"""Generated gRPC bindings (pluginregistration); regenerate with tools/gen_proto.py."""
