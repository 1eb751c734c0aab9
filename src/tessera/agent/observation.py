"""What the agent sees on its node: cards, their slices, and who uses each slice.

An observation is plain frozen data gathered in one pass (NVML for the cards, slices and
processes; the kubelet's PodResources for allocations), so that planning the next steps is a
pure function of it and can be tested without a node.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tessera.core.layout import Slice
from tessera.nvml.backend import GpuBackend, GpuInfo

__all__ = ["UNKNOWN_HOLDERS", "GpuObservation", "NodeObservation", "ObservedInstance", "observe",
           "owners_of"]


UNKNOWN_HOLDERS = ("the kubelet's PodResources could not be read, or a restarted kubelet has "
                   "not listed its pods again yet")
"""Why a slice counts as possibly in use when the kubelet's allocations are not known."""


@dataclass(frozen=True)
class ObservedInstance:
    """A GPU instance on the card, with the MIG device of its compute instance if it has one."""

    gi_id: int
    profile: str
    start: int
    size: int
    mig_uuid: str | None
    pods: tuple[str, ...] = ()
    """Pods the kubelet allocated this MIG device to (``namespace/name``)."""
    processes: int = 0
    """CUDA processes NVML reports on it: in use even if no pod holds it (a job outside k8s)."""
    use_unknown: bool = False
    """The kubelet's allocations could not be read: assume a pod may hold it."""

    @property
    def slice(self) -> Slice:
        return Slice(self.profile, self.start)

    @property
    def complete(self) -> bool:
        """A GI without a compute instance is no CUDA device: a creation cut short."""
        return self.mig_uuid is not None

    @property
    def in_use(self) -> bool:
        return bool(self.pods) or self.processes > 0 or (self.use_unknown and self.complete)

    def users(self) -> str:
        parts = [f"pod {p}" for p in self.pods]
        if self.use_unknown and not parts:
            parts.append(f"possibly a pod ({UNKNOWN_HOLDERS})")
        if self.processes and not self.pods:
            parts.append(f"{self.processes} CUDA process(es) outside Kubernetes")
        return ", ".join(parts)


@dataclass(frozen=True)
class GpuObservation:
    info: GpuInfo
    instances: tuple[ObservedInstance, ...] = ()
    pods: tuple[str, ...] = ()
    """Pods holding the whole GPU (``nvidia.com/gpu``) or one of its shares or replicas."""
    whole_holders: tuple[str, ...] = ()
    """Of :attr:`pods`, those holding the GPU itself (its plain UUID), not a share of it."""
    processes: int = 0
    """Processes on the whole GPU (outside MIG)."""
    healthy: bool = True
    last_xid: int | None = None
    use_unknown: bool = False
    """The kubelet's allocations could not be read: assume a pod may hold the GPU."""

    @property
    def index(self) -> int:
        return self.info.index

    @property
    def busy(self) -> bool:
        return bool(self.pods) or self.processes > 0 or self.use_unknown

    def users(self) -> str:
        parts = [f"pod {p}" for p in self.pods]
        if self.processes:
            parts.append(f"{self.processes} CUDA process(es)")
        if self.use_unknown and not parts:
            parts.append(f"possibly a pod ({UNKNOWN_HOLDERS})")
        return ", ".join(parts)


@dataclass(frozen=True)
class NodeObservation:
    gpus: tuple[GpuObservation, ...] = ()

    def gpu(self, index: int) -> GpuObservation | None:
        for gpu in self.gpus:
            if gpu.index == index:
                return gpu
        return None

    def by_uuid(self, uuid: str) -> GpuObservation | None:
        for gpu in self.gpus:
            if gpu.info.uuid == uuid:
                return gpu
        return None


def owners_of(allocations: Mapping[str, Iterable[str]], uuid: str) -> tuple[str, ...]:
    """Pods holding a device: exactly its id, or one of its MPS shares (``<uuid>::<n>``)."""
    found: set[str] = set()
    for device_id, pods in allocations.items():
        if device_id == uuid or device_id.startswith(uuid + "::"):
            found.update(pods)
    return tuple(sorted(found))


def observe(backend: GpuBackend, allocations: Mapping[str, Iterable[str]] | None,
            health: Mapping[str, tuple[bool, int | None]] | None = None) -> NodeObservation:
    """Gather one observation.

    ``allocations`` maps each device id the kubelet has allocated to the pods holding it (from
    PodResources ``List``), or is None when that could not be read: then every slice counts as
    possibly in use. ``health`` maps GPU UUIDs to (healthy, last Xid) from the event watcher.
    """
    health = health or {}
    unknown = allocations is None
    allocations = allocations or {}
    gpus = []
    for info in backend.gpus():
        if info.lost:
            gpus.append(GpuObservation(info=info, healthy=False, last_xid=79))
            continue
        instances = []
        if info.model is not None and info.mig_current:
            for instance in backend.gpu_instances(info.index):
                uuid = instance.uuid
                processes = len(backend.processes(uuid)) if uuid else 0
                instances.append(ObservedInstance(
                    gi_id=instance.id, profile=instance.profile, start=instance.start,
                    size=instance.size, mig_uuid=uuid,
                    pods=owners_of(allocations, uuid) if uuid else (), processes=processes,
                    use_unknown=unknown))
            gpu_processes = 0
        else:
            gpu_processes = len(backend.processes(info.uuid))
        healthy, last_xid = health.get(info.uuid, (True, None))
        gpus.append(GpuObservation(
            info=info, instances=tuple(instances), pods=owners_of(allocations, info.uuid),
            whole_holders=tuple(sorted(allocations.get(info.uuid, ()))),
            processes=gpu_processes, healthy=healthy, last_xid=last_xid, use_unknown=unknown))
    return NodeObservation(gpus=tuple(gpus))
