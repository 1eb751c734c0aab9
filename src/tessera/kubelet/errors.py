"""Errors of the kubelet adapters, in the project's one error family.

::

    TesseraError (tessera.core.errors)
    ├── InvalidInputError
    │   ├── InvalidResourceNameError   not a Kubernetes extended resource name
    │   └── AllocationRefusedError     Allocate asked for unknown or unhealthy device ids
    └── KubeletError                   a kubelet socket could not be used
        ├── RegistrationError          Register failed or was refused by the kubelet
        └── PodResourcesError          a PodResources call failed
"""

from __future__ import annotations

from collections.abc import Iterable

from tessera.core.errors import InvalidInputError, TesseraError


class InvalidResourceNameError(InvalidInputError):
    """A resource name the kubelet would refuse (``IsExtendedResourceName`` is false)."""


class AllocationRefusedError(InvalidInputError):
    """An Allocate request naming device ids that are unknown or unhealthy.

    The plugin server turns it into ``INVALID_ARGUMENT``; ``device_ids`` lists the offenders so
    the pod's admission error names them.
    """

    def __init__(self, field: str, problem: str, device_ids: Iterable[str]) -> None:
        self.device_ids = tuple(device_ids)
        super().__init__(field, problem)


class KubeletError(TesseraError):
    """A kubelet socket that could not be reached, or an RPC on it that failed."""

    def __init__(self, socket_path: str, message: str) -> None:
        self.socket_path = socket_path
        super().__init__(f"{socket_path}: {message}")


class RegistrationError(KubeletError):
    """Register on kubelet.sock failed: kubelet not there yet, or it refused the request."""


class PodResourcesError(KubeletError):
    """A PodResources List/Get/GetAllocatableResources call failed."""
