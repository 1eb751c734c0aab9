"""A real Kubernetes test cluster on loopback: control plane, and GPU nodes as real kubelets.

::

    from tessera.testing.cluster import Cluster

    with Cluster() as cluster:                      # etcd, apiserver, controller manager, scheduler
        node = cluster.add_node("gpu-node-1")       # fake runtime + kubelet, Ready and untainted
        node.device_plugin_dir                      # register device plugins here
        node.pod_resources_socket                   # the kubelet's PodResources v1 socket
        node.restart_kubelet()
        cluster.kubeconfig                          # admin kubeconfig for kubectl / helm

In pytest, ``from tessera.testing.cluster.fixtures import cluster`` provides a session-scoped
``cluster`` fixture. ``tessera dev cluster up|down`` runs the same for a developer's kubectl.
The binaries are built from ``tools/k8s/`` by ``make cluster-bins``.
"""

from tessera.testing.cluster._cluster import (
    BIN_DIR_ENV,
    BINARY_NAMES,
    DEVICE_PLUGIN_DIR,
    KEEP_ENV,
    KUBERNETES_VERSION,
    Binaries,
    BinariesMissingError,
    Cluster,
    ClusterError,
    Node,
    NodeHook,
    PortTakenError,
    default_bin_dir,
    free_ports,
    write_kubeconfig,
)
from tessera.testing.cluster._excerpts import log_excerpts
from tessera.testing.cluster._process import Process, listening_ports, live, pid_alive

__all__ = [
    "BINARY_NAMES",
    "BIN_DIR_ENV",
    "DEVICE_PLUGIN_DIR",
    "KEEP_ENV",
    "KUBERNETES_VERSION",
    "Binaries",
    "BinariesMissingError",
    "Cluster",
    "ClusterError",
    "Node",
    "NodeHook",
    "PortTakenError",
    "Process",
    "default_bin_dir",
    "free_ports",
    "listening_ports",
    "live",
    "log_excerpts",
    "pid_alive",
    "write_kubeconfig",
]
