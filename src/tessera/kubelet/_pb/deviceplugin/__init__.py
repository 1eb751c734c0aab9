"""Generated gRPC bindings (deviceplugin); regenerate with tools/gen_proto.py."""
