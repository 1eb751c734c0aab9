"""Generated gRPC bindings (deviceplugin/v1beta1); regenerate with tools/gen_proto.py."""
