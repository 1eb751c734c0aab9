"""What the device plugins advertise: devices per resource name, their health, and change events.

The plugin servers never look at NVML. They read a :class:`DeviceInventory`: for each resource
name, the devices to advertise, each carrying everything Allocate must hand to a container
(which UUID to expose, the parent GPU, MPS limits, device nodes). The agent feeds the inventory
from the NVML backend (a new layout, Xid events); the servers subscribe to its change
notification so ListAndWatch pushes a new list the moment it changes, with nothing restarted.

:class:`Inventory` is the thread-safe in-memory implementation the agent and the tests use.
Health has two inputs that compose: the health the feeder reports with each device, and
overrides set by :meth:`Inventory.set_health` (from Xid events). An override on a GPU UUID
covers every device on that GPU (its MIG devices and MPS shares), and overrides survive a
layout change, so a repartition never silently revives a broken GPU.
"""

from __future__ import annotations

import dataclasses
import enum
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

from tessera.core.errors import InvalidInputError
from tessera.kubelet.constants import MAX_DEVICE_ID_LENGTH
from tessera.kubelet.resourcenames import validate_resource_name

Listener = Callable[[], None]
"""Called, without arguments and without any inventory lock held, after every change."""


class DeviceKind(enum.StrEnum):
    """What a device id stands for, which decides what Allocate returns."""

    GPU = "gpu"
    """A whole GPU, advertised as ``GPU-<uuid>``."""
    MIG = "mig"
    """A MIG device, advertised as ``MIG-<uuid>``."""
    MPS_SHARE = "mps-share"
    """The n-th MPS share of a GPU (or MIG device), advertised as ``<uuid>::<n>``."""
    REPLICA = "replica"
    """The n-th time-slicing replica of a GPU, advertised as ``<uuid>::<n>`` as NVIDIA's plugin
    names replicas; Allocate gives the GPU itself (no isolation between replicas)."""


@dataclasses.dataclass(frozen=True)
class MpsShare:
    """The MPS limits one share grants, and where its control daemon listens."""

    pipe_directory: str
    """Host path of the MPS control daemon's pipe directory; mounted at the same path."""
    pinned_memory_mib: int
    """Device memory one share may pin (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT), in MiB."""
    active_thread_percentage: int
    """Share of the SMs one share may use (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE), 1..100."""
    shm_directory: str | None = None
    """Host directory mounted at /dev/shm so clients and daemon share memory, if set."""

    def __post_init__(self) -> None:
        if not self.pipe_directory.startswith("/"):
            raise InvalidInputError("mps.pipe_directory", "must be an absolute host path")
        if self.pinned_memory_mib <= 0:
            raise InvalidInputError("mps.pinned_memory_mib", "must be positive")
        if not 1 <= self.active_thread_percentage <= 100:
            raise InvalidInputError("mps.active_thread_percentage", "must be within 1..100")


@dataclasses.dataclass(frozen=True)
class PluginDevice:
    """One advertised device and what Allocate must return for it.

    Build with :meth:`gpu`, :meth:`mig`, :meth:`mps_share` or :meth:`replica`; the advertised
    :attr:`id` is derived from the UUID (and share or replica number), so it is always one of
    the id forms dcgm-exporter and NVIDIA's tooling understand.
    """

    kind: DeviceKind
    uuid: str
    """``GPU-...`` or ``MIG-...``: what NVIDIA_VISIBLE_DEVICES and CDI names carry."""
    parent_uuid: str
    """The physical GPU (``GPU-...``); equal to ``uuid`` for a whole GPU."""
    parent_index: int
    """NVML index of the physical GPU."""
    share: int | None = None
    """Share number of an MPS share or replica number of a time-slicing replica; else None."""
    mps: MpsShare | None = None
    healthy: bool = True
    """Health as the feeder sees it; Xid overrides in :class:`Inventory` compose with it."""
    numa_node: int | None = None
    """NUMA node for the kubelet's TopologyManager; None means no preference."""
    device_nodes: tuple[str, ...] = ()
    """Host device nodes this device needs (``/dev/nvidia0``, MIG capability nodes), used when
    device specs are passed."""

    def __post_init__(self) -> None:
        if not self.parent_uuid.startswith("GPU-"):
            raise InvalidInputError("parent_uuid", f"{self.parent_uuid!r} is not a GPU UUID")
        if self.parent_index < 0:
            raise InvalidInputError("parent_index", "must not be negative")
        expected = {DeviceKind.GPU: ("GPU-",), DeviceKind.MIG: ("MIG-",),
                    DeviceKind.MPS_SHARE: ("GPU-", "MIG-"),
                    DeviceKind.REPLICA: ("GPU-",)}[self.kind]
        if not self.uuid.startswith(expected):
            raise InvalidInputError(
                "uuid", f"{self.uuid!r} must start with {' or '.join(expected)}")
        if self.kind is DeviceKind.GPU and self.uuid != self.parent_uuid:
            raise InvalidInputError("parent_uuid", "a whole GPU is its own parent")
        if self.kind is DeviceKind.MPS_SHARE:
            if self.share is None or self.share < 0 or self.mps is None:
                raise InvalidInputError("share", "an MPS share needs a share number >= 0 and mps")
        elif self.kind is DeviceKind.REPLICA:
            if self.share is None or self.share < 0 or self.mps is not None:
                raise InvalidInputError("share", "a replica needs a replica number >= 0, no mps")
        elif self.share is not None or self.mps is not None:
            raise InvalidInputError("share", f"only MPS shares and replicas carry a number, "
                                    f"not {self.kind}")
        if len(self.id) > MAX_DEVICE_ID_LENGTH:
            raise InvalidInputError("id", f"{self.id!r} is longer than {MAX_DEVICE_ID_LENGTH}")

    @property
    def id(self) -> str:
        """The id advertised in ListAndWatch and sent back in Allocate."""
        if self.kind in (DeviceKind.MPS_SHARE, DeviceKind.REPLICA):
            return f"{self.uuid}::{self.share}"
        return self.uuid

    @classmethod
    def gpu(
        cls, uuid: str, index: int, *, healthy: bool = True, numa_node: int | None = None,
        device_nodes: tuple[str, ...] = (),
    ) -> PluginDevice:
        """A whole GPU."""
        return cls(DeviceKind.GPU, uuid, uuid, index, healthy=healthy, numa_node=numa_node,
                   device_nodes=device_nodes)

    @classmethod
    def mig(
        cls, uuid: str, parent_uuid: str, parent_index: int, *, healthy: bool = True,
        numa_node: int | None = None, device_nodes: tuple[str, ...] = (),
    ) -> PluginDevice:
        """A MIG device on GPU ``parent_uuid``."""
        return cls(DeviceKind.MIG, uuid, parent_uuid, parent_index, healthy=healthy,
                   numa_node=numa_node, device_nodes=device_nodes)

    @classmethod
    def mps_share(
        cls, uuid: str, share: int, parent_uuid: str, parent_index: int, mps: MpsShare, *,
        healthy: bool = True, numa_node: int | None = None, device_nodes: tuple[str, ...] = (),
    ) -> PluginDevice:
        """Share number ``share`` of GPU (or MIG device) ``uuid``."""
        return cls(DeviceKind.MPS_SHARE, uuid, parent_uuid, parent_index, share=share, mps=mps,
                   healthy=healthy, numa_node=numa_node, device_nodes=device_nodes)

    @classmethod
    def replica(
        cls, uuid: str, replica: int, index: int, *, healthy: bool = True,
        numa_node: int | None = None, device_nodes: tuple[str, ...] = (),
    ) -> PluginDevice:
        """Time-slicing replica number ``replica`` of whole GPU ``uuid``."""
        return cls(DeviceKind.REPLICA, uuid, uuid, index, share=replica, healthy=healthy,
                   numa_node=numa_node, device_nodes=device_nodes)


class DeviceInventory(Protocol):
    """What a device plugin server reads. Implementations must be thread-safe.

    The servers call :meth:`devices` from gRPC worker threads and rely on :meth:`subscribe`'s
    listener firing after every change that could alter any resource's device list or health.
    Spurious notifications are harmless (the server only pushes when the list differs).
    """

    def resource_names(self) -> tuple[str, ...]:
        """Every resource name that should be registered, including ones with zero devices."""
        ...

    def devices(self, resource_name: str) -> tuple[PluginDevice, ...]:
        """The devices of one resource with their effective health, sorted by id."""
        ...

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener`` after each change; returns a function that unsubscribes."""
        ...


class Inventory:
    """Thread-safe, in-memory :class:`DeviceInventory` that the agent (or a test) feeds.

    Resource names are sticky: once known, a resource stays in :meth:`resource_names` with zero
    devices when a new layout drops it, because the kubelet keeps the resource registered and a
    plugin that disappears would first turn every device unhealthy and later drop capacity.
    """

    def __init__(self, resources: Mapping[str, Iterable[PluginDevice]] | None = None) -> None:
        self._lock = threading.Lock()
        self._devices: dict[str, tuple[PluginDevice, ...]] = {}
        self._unhealthy: dict[str, str] = {}
        self._listeners: list[Listener] = []
        if resources:
            self.set_layout(resources)

    # --- feeding -------------------------------------------------------------------------

    def set_layout(self, resources: Mapping[str, Iterable[PluginDevice]]) -> None:
        """Replace every resource's devices at once; known resources absent here become empty."""
        fresh = {validate_resource_name(name): _sorted_unique(name, devs)
                 for name, devs in resources.items()}
        _refuse_shared_ids(fresh)
        with self._lock:
            for name in self._devices:
                fresh.setdefault(name, ())
            self._devices = fresh
        self._notify()

    def set_devices(self, resource_name: str, devices: Iterable[PluginDevice]) -> None:
        """Replace one resource's devices, leaving the others alone."""
        validate_resource_name(resource_name)
        devs = _sorted_unique(resource_name, devices)
        with self._lock:
            fresh = dict(self._devices)
            fresh[resource_name] = devs
            _refuse_shared_ids(fresh)
            self._devices = fresh
        self._notify()

    def add_resource(self, resource_name: str) -> None:
        """Make a resource known (and so registered) before it has any device."""
        validate_resource_name(resource_name)
        with self._lock:
            if resource_name in self._devices:
                return
            self._devices = {**self._devices, resource_name: ()}
        self._notify()

    def set_health(self, uuid: str, healthy: bool, reason: str = "") -> int:
        """Mark a GPU or MIG UUID (or a single device id) unhealthy, or clear that mark.

        A GPU UUID covers every device whose parent it is. Returns how many advertised devices
        the mark now covers, so callers can log an event that hit nothing.
        """
        with self._lock:
            changed = (uuid in self._unhealthy) == healthy
            if healthy:
                self._unhealthy.pop(uuid, None)
            else:
                self._unhealthy[uuid] = reason or "marked unhealthy"
            covered = sum(1 for devs in self._devices.values() for dev in devs
                          if uuid in (dev.id, dev.uuid, dev.parent_uuid))
        if changed:
            self._notify()
        return covered

    def unhealthy_marks(self) -> dict[str, str]:
        """UUIDs currently marked unhealthy, with the reason given."""
        with self._lock:
            return dict(self._unhealthy)

    # --- DeviceInventory -----------------------------------------------------------------

    def resource_names(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(sorted(self._devices))

    def devices(self, resource_name: str) -> tuple[PluginDevice, ...]:
        with self._lock:
            devs = self._devices.get(resource_name, ())
            marks = self._unhealthy
            if not marks:
                return devs
            return tuple(
                dataclasses.replace(dev, healthy=False)
                if dev.healthy and (dev.id in marks or dev.uuid in marks
                                    or dev.parent_uuid in marks)
                else dev
                for dev in devs
            )

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        with self._lock:
            self._listeners.append(listener)

        def unsubscribe() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return unsubscribe

    def _notify(self) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            listener()


def _sorted_unique(resource_name: str, devices: Iterable[PluginDevice]) -> tuple[PluginDevice, ...]:
    by_id: dict[str, PluginDevice] = {}
    for dev in devices:
        if dev.id in by_id:
            raise InvalidInputError(f"devices[{resource_name}]", f"device id {dev.id!r} twice")
        by_id[dev.id] = dev
    return tuple(by_id[key] for key in sorted(by_id))


def _refuse_shared_ids(resources: Mapping[str, Sequence[PluginDevice]]) -> None:
    owner: dict[str, str] = {}
    for name, devs in resources.items():
        for dev in devs:
            other = owner.setdefault(dev.id, name)
            if other != name:
                raise InvalidInputError(
                    "devices", f"device id {dev.id!r} is in both {other} and {name}")
