"""What the kubelet has allocated, read so that a restarting kubelet cannot make a held slice
look free.

The kubelet serves PodResources from the moment it starts, before its pod manager knows any
pod: its pods are added only once the container runtime is up and the sync loop runs (after
the device manager has read its checkpoint). On the kubelet the tests build (v1.37.2), ``List``
answered successfully with *no pods* for about 0.8 s after a restart while a pod held two
devices throughout (polled every 20 ms; tests/e2e/test_gpu_node.py restarts a real kubelet
under this reader); a loaded machine stretches that window. An agent that took that answer as true
would see every slice free, report them so, and could destroy a slice a running pod holds if
a reshape were pending (the controller, reading the same report, may even plan one).

So a re-created PodResources socket (a new kubelet) opens a settling period: until ``List``
shows again every device it showed before the restart (pods still running come back with
them) or ``settle_s`` has passed (pods that ended meanwhile never will), the allocations are
unknown, and every slice counts as possibly in use, as when PodResources cannot be read at
all. A restart during a ``List`` call is caught by the socket's identity changing across it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Protocol

from tessera.kubelet.errors import PodResourcesError
from tessera.kubelet.plugins import socket_id
from tessera.kubelet.podresources import PodResources

__all__ = ["DEFAULT_SETTLE_S", "KubeletAllocations", "PodLister"]

log = logging.getLogger(__name__)

DEFAULT_SETTLE_S = 60.0
"""Longest a restarted kubelet is waited for to list the devices it listed before. Pods that
ended during the restart never come back, so this bounds how long a reshape on the node is
held back by them; a kubelet lists its pods within seconds of starting."""

Allocations = dict[str, tuple[str, ...]]


class PodLister(Protocol):
    def list(self) -> tuple[PodResources, ...]: ...


class KubeletAllocations:
    """Device id -> pods holding it, from the kubelet's PodResources; None when not known."""

    def __init__(self, client: PodLister, socket_path: str, *,
                 settle_s: float = DEFAULT_SETTLE_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._client = client
        self._socket_path = socket_path
        self._settle_s = settle_s
        self._clock = clock
        self._kubelet: tuple[int, int, int] | None = None
        """The socket the last trusted answer came from."""
        self._held: frozenset[str] = frozenset()
        """Devices held in the last trusted answer."""
        self._settling: tuple[float, frozenset[str]] | None = None
        """Since when, and which devices, a restarted kubelet has yet to list again."""

    def read(self) -> Allocations | None:
        before = socket_id(self._socket_path)
        try:
            pods = self._client.list()
        except PodResourcesError as exc:
            log.warning("cannot read the kubelet's allocations: %s", exc)
            return None
        after = socket_id(self._socket_path)
        if before != after:
            log.info("the kubelet restarted while its allocations were read; reading again")
            return None
        owners = _owners(pods)
        now = self._clock()
        if before is not None:
            if self._kubelet is not None and before != self._kubelet:
                self._settling = (now, self._held)
                log.warning("the kubelet restarted: every slice counts as possibly in use until "
                            "it lists again the %d device(s) it listed before (at most %.0f s)",
                            len(self._held), self._settle_s)
            self._kubelet = before
        if self._settling is not None:
            since, expected = self._settling
            missing = expected - owners.keys()
            if missing and now - since < self._settle_s:
                return None
            self._settling = None
            log.info("the restarted kubelet's allocations are trusted again (%s)",
                     f"{len(missing)} device(s) it listed before are no longer held"
                     if missing else "it lists every device it listed before")
        self._held = frozenset(owners)
        return owners


def _owners(pods: Iterable[PodResources]) -> Allocations:
    found: dict[str, set[str]] = {}
    for pod in pods:
        for container in pod.containers:
            for devices in container.devices:
                for device_id in devices.device_ids:
                    found.setdefault(device_id, set()).add(f"{pod.namespace}/{pod.name}")
    return {device: tuple(sorted(names)) for device, names in found.items()}
