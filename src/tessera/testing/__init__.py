"""Test doubles shipped with Tessera, reused by unit tests, e2e tests and the simulator.

The kubelet stand-in (:class:`KubeletStandIn`) is the one place that plays the kubelet's
device manager and PodResources server over real Unix sockets; every test of the device
plugins goes through it.
"""

from tessera.testing.kubelet import (
    AdmissionError,
    Container,
    KubeletStandIn,
    Options,
    Pod,
    Registration,
    RunOptions,
    short_socket_dir,
)

__all__ = [
    "AdmissionError",
    "Container",
    "KubeletStandIn",
    "Options",
    "Pod",
    "Registration",
    "RunOptions",
    "short_socket_dir",
]
