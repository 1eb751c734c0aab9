"""Allocation policy: what Allocate returns and what GetPreferredAllocation suggests.

Plain functions over :class:`~tessera.kubelet.inventory.PluginDevice` values, no gRPC: the
servicer in :mod:`tessera.kubelet.plugins` only translates (the split NVIDIA's plugin uses).

Allocate content follows NVIDIA's k8s-device-plugin so containers, the NVIDIA container
toolkit and dcgm-exporter behave as they do under it. The device list reaches the runtime in the
ways NVIDIA's ``deviceListStrategy`` offers, alone or combined:

- ``envvar``: ``NVIDIA_VISIBLE_DEVICES=<uuid>,...`` (GPU or MIG UUIDs);
- ``volume-mounts``: ``NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices`` plus one
  ``/dev/null`` mount per UUID under that directory;
- ``cdi-annotations``: one ``cdi.k8s.io/...`` container annotation listing CDI device names;
- ``cdi-cri``: the CRI ``cdi_devices`` field (kubelet feature DevicePluginCDIDevices, GA 1.31).

If only CDI strategies are chosen no ``NVIDIA_VISIBLE_DEVICES`` is set, as NVIDIA does. CDI
names are ``<cdi_kind>=<uuid>``; the default kind ``nvidia.com/gpu`` matches the specs that
``nvidia-ctk cdi generate --device-name-strategy=uuid`` writes. CDI also avoids NVIDIA issue
#728: the kubelet keeps only the first ``NVIDIA_VISIBLE_DEVICES`` when a container asks for two
resources, while it merges CDI devices.

MPS shares additionally get ``CUDA_MPS_PIPE_DIRECTORY`` and a mount of the daemon's pipe
directory, and, unlike NVIDIA's plugin (daemon-wide defaults only), the per-share limits
``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` and ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``. The kubelet
caches the response for the container's lifetime, so these values are frozen at admission.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

from tessera.core.errors import InvalidInputError
from tessera.kubelet.errors import AllocationRefusedError
from tessera.kubelet.inventory import DeviceKind, PluginDevice

VISIBLE_DEVICES_ENV: Final = "NVIDIA_VISIBLE_DEVICES"
VOLUME_MOUNTS_DIR: Final = "/var/run/nvidia-container-devices"
MPS_PIPE_ENV: Final = "CUDA_MPS_PIPE_DIRECTORY"
MPS_MEMORY_ENV: Final = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
MPS_THREADS_ENV: Final = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
CONTROL_DEVICE_NODES: Final = (
    "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset",
)
"""Driver-wide nodes NVIDIA passes with ``passDeviceSpecs`` (each only if present on the host)."""


class DeviceListStrategy(enum.StrEnum):
    """How the allocated device list reaches the container runtime (NVIDIA's names)."""

    ENVVAR = "envvar"
    VOLUME_MOUNTS = "volume-mounts"
    CDI_ANNOTATIONS = "cdi-annotations"
    CDI_CRI = "cdi-cri"


@dataclasses.dataclass(frozen=True)
class AllocateOptions:
    """Plugin-wide settings for Allocate responses."""

    strategies: tuple[DeviceListStrategy, ...] = (DeviceListStrategy.ENVVAR,)
    pass_device_specs: bool = False
    """Add DeviceSpecs (cgroup access to the device nodes), as NVIDIA's ``passDeviceSpecs``."""
    dev_root: str = "/"
    """Host root the device nodes live under (NVIDIA's ``nvidiaDevRoot``)."""
    control_device_nodes: tuple[str, ...] = CONTROL_DEVICE_NODES
    """Driver-wide nodes added with device specs; pass only those present on the host."""
    cdi_kind: str = "nvidia.com/gpu"
    """CDI ``vendor/class`` of the device names."""
    cdi_annotation_prefix: str = "cdi.k8s.io/"

    def __post_init__(self) -> None:
        if not self.strategies:
            raise InvalidInputError("strategies", "at least one device list strategy is needed",
                                    choices=[s.value for s in DeviceListStrategy])
        object.__setattr__(self, "strategies",
                           tuple(DeviceListStrategy(s) for s in self.strategies))
        if "/" not in self.cdi_kind or "=" in self.cdi_kind:
            raise InvalidInputError("cdi_kind", f"{self.cdi_kind!r} is not 'vendor.com/class'")


@dataclasses.dataclass(frozen=True)
class Mount:
    container_path: str
    host_path: str
    read_only: bool = False


@dataclasses.dataclass(frozen=True)
class DeviceNode:
    """A DeviceSpec: a host device node exposed in the container with cgroup permissions."""

    container_path: str
    host_path: str
    permissions: str = "rw"


@dataclasses.dataclass(frozen=True)
class ContainerAllocation:
    """One ContainerAllocateResponse, as plain data."""

    envs: Mapping[str, str] = dataclasses.field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    device_nodes: tuple[DeviceNode, ...] = ()
    annotations: Mapping[str, str] = dataclasses.field(default_factory=dict)
    cdi_devices: tuple[str, ...] = ()


def resolve_request(
    resource_name: str, device_ids: Sequence[str], devices: Iterable[PluginDevice],
) -> tuple[PluginDevice, ...]:
    """The devices an Allocate request names, or :class:`AllocationRefusedError`.

    Refuses, naming every offender: ids this resource does not advertise (stale ids from a
    kubelet checkpoint, or another resource's ids) and ids that are unhealthy now.
    """
    known = {dev.id: dev for dev in devices}
    unknown = [i for i in device_ids if i not in known]
    unhealthy = [i for i in device_ids if i in known and not known[i].healthy]
    if unknown or unhealthy:
        parts = []
        if unknown:
            parts.append(f"unknown device ids {', '.join(unknown)}")
        if unhealthy:
            parts.append(f"unhealthy device ids {', '.join(unhealthy)}")
        raise AllocationRefusedError(
            "devices_ids", f"{resource_name}: cannot allocate {'; '.join(parts)}",
            unknown + unhealthy)
    if not device_ids:
        raise AllocationRefusedError("devices_ids", f"{resource_name}: no device ids", ())
    return tuple(known[i] for i in dict.fromkeys(device_ids))


def container_allocation(
    resource_name: str, devices: Sequence[PluginDevice], options: AllocateOptions,
) -> ContainerAllocation:
    """What a container given ``devices`` of ``resource_name`` must receive."""
    visible = list(dict.fromkeys(dev.uuid for dev in devices))
    envs: dict[str, str] = {}
    mounts: list[Mount] = []
    annotations: dict[str, str] = {}
    cdi: tuple[str, ...] = ()
    strategies = set(options.strategies)
    if DeviceListStrategy.ENVVAR in strategies:
        envs[VISIBLE_DEVICES_ENV] = ",".join(visible)
    if DeviceListStrategy.VOLUME_MOUNTS in strategies:
        # With both envvar and volume-mounts NVIDIA's plugin ends with the mount directory.
        envs[VISIBLE_DEVICES_ENV] = VOLUME_MOUNTS_DIR
        mounts.extend(Mount(f"{VOLUME_MOUNTS_DIR}/{uuid}", "/dev/null", read_only=True)
                      for uuid in visible)
    cdi_names = tuple(f"{options.cdi_kind}={uuid}" for uuid in visible)
    if DeviceListStrategy.CDI_ANNOTATIONS in strategies:
        annotations[cdi_annotation_key(resource_name, options)] = ",".join(cdi_names)
    if DeviceListStrategy.CDI_CRI in strategies:
        cdi = cdi_names

    shares = [dev for dev in devices if dev.kind is DeviceKind.MPS_SHARE]
    if shares:
        mps_envs, mps_mounts = _mps_settings(resource_name, shares, visible)
        envs.update(mps_envs)
        mounts.extend(mps_mounts)

    nodes: tuple[DeviceNode, ...] = ()
    if options.pass_device_specs:
        paths = [*options.control_device_nodes, *(n for dev in devices for n in dev.device_nodes)]
        root = options.dev_root.rstrip("/")
        nodes = tuple(DeviceNode(path, f"{root}{path}") for path in dict.fromkeys(paths))
    return ContainerAllocation(envs=envs, mounts=tuple(mounts), device_nodes=nodes,
                               annotations=annotations, cdi_devices=cdi)


def cdi_annotation_key(resource_name: str, options: AllocateOptions) -> str:
    """A deterministic annotation key per resource, so two resources in one container keep both.

    NVIDIA uses a random suffix; a stable one keeps responses reproducible (the kubelet
    checkpoints them) while staying unique per resource. The name part must be a qualified
    name of at most 63 characters; long resource names fall back to a digest.
    """
    name = "tessera_" + resource_name.replace("/", "_", 1)
    if len(name) > 63:
        name = "tessera_" + hashlib.sha256(resource_name.encode()).hexdigest()[:16]
    return options.cdi_annotation_prefix + name


def _mps_settings(
    resource_name: str, shares: Sequence[PluginDevice], visible: Sequence[str],
) -> tuple[dict[str, str], list[Mount]]:
    """Pipe, memory and thread limits for MPS shares on one MPS daemon.

    Shares of one GPU add up (two shares: twice the memory and threads, capped at 100%).
    ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` lists one limit per visible device ordinal; the
    thread percentage is a single value for the whole client, so with shares on several GPUs
    it is the smallest per-GPU grant, never more than any one GPU granted.
    """
    daemons = {dev.mps.pipe_directory for dev in shares if dev.mps is not None}
    if len(daemons) != 1:
        raise AllocationRefusedError(
            "devices_ids",
            f"{resource_name}: MPS shares {', '.join(d.id for d in shares)} belong to "
            f"{len(daemons)} MPS daemons; a container can reach only one",
            [d.id for d in shares])
    memory: dict[str, int] = defaultdict(int)
    threads: dict[str, int] = defaultdict(int)
    shm = None
    for dev in shares:
        assert dev.mps is not None  # checked by PluginDevice
        memory[dev.uuid] += dev.mps.pinned_memory_mib
        threads[dev.uuid] += dev.mps.active_thread_percentage
        shm = shm or dev.mps.shm_directory
    (pipe,) = daemons
    envs = {
        MPS_PIPE_ENV: pipe,
        MPS_MEMORY_ENV: ",".join(f"{ordinal}={memory[uuid]}M"
                                 for ordinal, uuid in enumerate(visible) if uuid in memory),
        MPS_THREADS_ENV: str(min(100, *threads.values())),
    }
    mounts = [Mount(pipe, pipe)]
    if shm:
        mounts.append(Mount("/dev/shm", shm))
    return envs, mounts


def preferred_allocation(
    available: Sequence[str], must_include: Sequence[str], size: int,
    devices: Iterable[PluginDevice],
) -> list[str]:
    """Pick ``size`` ids from ``available``, including ``must_include``, on as few GPUs as possible.

    Best effort and total: it never raises, because the kubelet fails the pod's admission when
    GetPreferredAllocation errors; it returns fewer ids if fewer are available (the kubelet fills
    the rest itself). Order of preference: GPUs already used by ``must_include``; then the
    tightest single GPU that can hold the whole remainder (keeping larger free groups whole for
    later requests); failing that, the GPU with the most candidates, repeatedly. Within a GPU
    ids go in advertised order (share numbers numerically).
    """
    by_id = {dev.id: dev for dev in devices}
    chosen = list(dict.fromkeys(must_include))
    remaining = size - len(chosen)
    if remaining <= 0:
        return chosen
    groups: dict[str, list[str]] = defaultdict(list)
    for device_id in dict.fromkeys(available):
        if device_id not in chosen:
            groups[_gpu_of(device_id, by_id)].append(device_id)
    for ids in groups.values():
        ids.sort(key=lambda i: _order_key(i, by_id))

    def take(gpu: str, count: int) -> None:
        nonlocal remaining
        picked = groups[gpu][:count]
        chosen.extend(picked)
        del groups[gpu][:count]
        remaining -= len(picked)

    touched = dict.fromkeys(_gpu_of(i, by_id) for i in chosen)
    for gpu in sorted(touched, key=lambda g: -len(groups.get(g, []))):
        if remaining > 0 and groups.get(gpu):
            take(gpu, remaining)
    while remaining > 0:
        live = [g for g, ids in groups.items() if ids]
        if not live:
            break
        fitting = [g for g in live if len(groups[g]) >= remaining]
        if fitting:
            take(min(fitting, key=lambda g: (len(groups[g]), g)), remaining)
        else:
            take(max(live, key=lambda g: (len(groups[g]), _neg(g))), remaining)
    return chosen


def _gpu_of(device_id: str, by_id: Mapping[str, PluginDevice]) -> str:
    dev = by_id.get(device_id)
    if dev is not None:
        return dev.parent_uuid
    return device_id.split("::", 1)[0]


def _order_key(device_id: str, by_id: Mapping[str, PluginDevice]) -> tuple[str, int]:
    dev = by_id.get(device_id)
    if dev is not None and dev.share is not None:
        return dev.uuid, dev.share
    base, _, share = device_id.partition("::")
    return (base, int(share)) if share.isdigit() else (device_id, -1)


def _neg(text: str) -> tuple[int, ...]:
    """Sort key that reverses string order inside ``max`` (so ties pick the smallest name)."""
    return tuple(-ord(c) for c in text)
