"""Everything that speaks to the kubelet over gRPC: device plugin servers, clients, bindings."""
