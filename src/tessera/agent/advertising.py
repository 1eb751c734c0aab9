"""What the node's device plugins advertise, derived from an observation of its cards.

Resource names follow NVIDIA's "mixed" MIG strategy so pod specs written for NVIDIA's plugin
work unchanged: every complete MIG device is ``nvidia.com/mig-<profile>`` (``+`` becomes ``.``),
a GPU not in MIG mode is ``nvidia.com/gpu``, a GPU running MPS offers its shares as
``nvidia.com/gpu.shared`` (the name NVIDIA's plugin gives shared GPUs), each share a
``<uuid>::<n>`` device, and a time-sliced GPU offers its replicas the same way (or under
``nvidia.com/gpu`` when its spec keeps the name, as NVIDIA's ``renameByDefault: false``). A
slice being drained for destruction is withheld, so the kubelet cannot
hand it out while the agent removes it.

:class:`Advertiser` keeps the inventory in step and remembers each GPU's last devices: a card
that falls off the bus keeps its devices listed, unhealthy, as the kubelet expects, instead of
silently vanishing.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass

from tessera.agent.observation import GpuObservation, NodeObservation
from tessera.core import catalogue
from tessera.kubelet.health import XidFilter, record_xid
from tessera.kubelet.inventory import Inventory, MpsShare, PluginDevice

__all__ = ["MPS_SHARED_RESOURCE", "Advertiser", "MpsAdvert", "TimesliceAdvert", "devices_for"]

MPS_SHARED_RESOURCE = catalogue.MPS_SHARED_RESOURCE


@dataclass(frozen=True)
class MpsAdvert:
    """A running MPS daemon's shares, as the device plugin hands them to containers."""

    shares: int
    resource: str
    """What a whole GPU's shares are advertised as (a MIG device's are always
    ``nvidia.com/mig-<profile>.shared``)."""
    share: MpsShare


@dataclass(frozen=True)
class TimesliceAdvert:
    """A time-sliced GPU: ``replicas`` devices under ``resource``, as NVIDIA's plugin offers."""

    replicas: int
    resource: str


def devices_for(gpu: GpuObservation, mps: Mapping[str, MpsAdvert] | None = None,
                withheld: frozenset[str] = frozenset(),
                timeslice: TimesliceAdvert | None = None) -> dict[str, list[PluginDevice]]:
    """The devices one GPU offers right now. ``mps``: the running MPS daemons by device UUID;
    a MIG device running MPS offers its shares instead of itself."""
    info = gpu.info
    daemons = mps or {}
    whole = daemons.get(info.uuid)
    resources: dict[str, list[PluginDevice]] = {}
    if info.mig_current:
        for instance in gpu.instances:
            if instance.mig_uuid is None or instance.mig_uuid in withheld:
                continue
            inner = daemons.get(instance.mig_uuid)
            if inner is not None:
                name = catalogue.shared_mig_resource_name(instance.profile)
                resources.setdefault(name, []).extend(
                    PluginDevice.mps_share(instance.mig_uuid, n, info.uuid, info.index,
                                           inner.share) for n in range(inner.shares))
                continue
            resources.setdefault(catalogue.mig_resource_name(instance.profile), []).append(
                PluginDevice.mig(instance.mig_uuid, info.uuid, info.index))
    elif whole is not None:
        resources[whole.resource] = [
            PluginDevice.mps_share(info.uuid, n, info.uuid, info.index, whole.share)
            for n in range(whole.shares)]
    elif timeslice is not None:
        resources[timeslice.resource] = [
            PluginDevice.replica(info.uuid, n, info.index) for n in range(timeslice.replicas)]
    else:
        resources[catalogue.WHOLE_GPU_RESOURCE] = [PluginDevice.gpu(info.uuid, info.index)]
    return resources


class Advertiser:
    """Feeds an :class:`Inventory` from observations and Xid events; thread-safe."""

    def __init__(self, inventory: Inventory, xid_filter: XidFilter | None = None) -> None:
        self.inventory = inventory
        self.xid_filter = xid_filter or XidFilter()
        self._lock = threading.Lock()
        self._last: dict[int, tuple[str, dict[str, list[PluginDevice]]]] = {}
        self._withheld: set[str] = set()

    def known_gpus(self) -> set[str]:
        """UUIDs of every GPU this advertiser has published devices for."""
        with self._lock:
            return {uuid for uuid, _ in self._last.values()}

    def withhold(self, uuid: str) -> None:
        with self._lock:
            self._withheld.add(uuid)

    def release(self, uuid: str) -> None:
        with self._lock:
            self._withheld.discard(uuid)

    def withheld(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._withheld)

    def publish(self, observation: NodeObservation,
                mps: Mapping[str, MpsAdvert] | None = None,
                timeslices: Mapping[str, TimesliceAdvert] | None = None,
                ) -> dict[str, list[PluginDevice]]:
        """Advertise what ``observation`` shows; returns the resource map it published."""
        mps = mps or {}
        timeslices = timeslices or {}
        resources: dict[str, list[PluginDevice]] = {}
        with self._lock:
            withheld = frozenset(self._withheld)
            for gpu in observation.gpus:
                if gpu.info.lost:
                    uuid, last = self._last.get(gpu.index, ("", {}))
                    if uuid:
                        self.inventory.set_health(uuid, healthy=False,
                                                  reason="GPU has fallen off the bus")
                    offered = last
                else:
                    offered = devices_for(gpu, mps, withheld, timeslices.get(gpu.info.uuid))
                    self._last[gpu.index] = (gpu.info.uuid, offered)
                for name, devices in offered.items():
                    resources.setdefault(name, []).extend(devices)
        self.inventory.set_layout(resources)
        return resources

    def xid(self, uuid: str, xid: int) -> bool:
        """An Xid on a GPU or MIG device; True if it made something unhealthy."""
        return record_xid(self.inventory, uuid, xid, self.xid_filter)

    def recovered(self, uuid: str) -> None:
        self.inventory.set_health(uuid, healthy=True)
