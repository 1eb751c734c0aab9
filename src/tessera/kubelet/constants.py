"""Constants of the kubelet device plugin and PodResources APIs, as upstream defines them.

Values mirror ``k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1/constants.go`` and the kubelet's
device manager; they are part of the contract, not tunables.
"""

from __future__ import annotations

from typing import Final

HEALTHY: Final = "Healthy"
"""Device.health value the kubelet counts as allocatable; any other string counts as unhealthy."""

UNHEALTHY: Final = "Unhealthy"

API_VERSION: Final = "v1beta1"
"""RegisterRequest.version a plugin sends."""

SUPPORTED_VERSIONS: Final = (API_VERSION,)
"""Versions the kubelet accepts in RegisterRequest.version."""

DEVICE_PLUGIN_DIR: Final = "/var/lib/kubelet/device-plugins"
"""Where the kubelet serves kubelet.sock and expects each plugin's own socket."""

KUBELET_SOCKET_NAME: Final = "kubelet.sock"

CHECKPOINT_NAME: Final = "kubelet_internal_checkpoint"
"""The kubelet's checkpoint file in the device-plugin directory; never a socket, never deleted."""

POD_RESOURCES_SOCKET: Final = "/var/lib/kubelet/pod-resources/kubelet.sock"

MAX_DEVICE_ID_LENGTH: Final = 63
"""Device.ID limit stated in the upstream proto."""

KUBELET_DIAL_TIMEOUT_S: Final = 10.0
"""How long the kubelet waits, inside Register, to connect back to the plugin socket."""

PRE_START_CONTAINER_TIMEOUT_S: Final = 30.0
"""KubeletPreStartContainerRPCTimeoutInSecs."""

UNIX_SOCKET_PATH_MAX: Final = 107
"""Longest path a Unix socket can bind on Linux (sun_path is 108 bytes including the NUL)."""
