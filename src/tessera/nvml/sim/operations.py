"""Things that happen to a simulated card from outside NVML: jobs start and stop, Xids, lost GPUs.

On a real node these are CUDA processes, driver faults and hardware failures; no NVML call makes
them. ``tessera dev sim`` and the tests apply them to a :class:`NodeState` (usually inside
``FileStore.mutate()``) so a running agent sees them exactly as it would see the real thing.
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera.core.errors import InvalidInputError
from tessera.nvml.sim.fakelib import apply_pending_mig_mode
from tessera.nvml.sim.state import NodeState, SimGpu, SimProcess

__all__ = [
    "DeviceRef",
    "add_process",
    "inject_xid",
    "lose_gpu",
    "nvidia_smi_list",
    "remove_process",
    "reset_gpu",
    "resolve_device",
]

XID_FALLEN_OFF_THE_BUS = 79


@dataclass(frozen=True)
class DeviceRef:
    """A GPU, or one MIG device (GPU instance + compute instance) on it."""

    gpu: SimGpu
    gi: int | None = None
    ci: int | None = None


def resolve_device(state: NodeState, uuid: str, field: str = "--device") -> DeviceRef:
    known: list[str] = []
    for gpu in state.gpus:
        known.append(gpu.uuid)
        if gpu.uuid == uuid:
            return DeviceRef(gpu)
        for instance in gpu.instances:
            for compute in instance.compute_instances:
                known.append(compute.uuid)
                if compute.uuid == uuid:
                    return DeviceRef(gpu, instance.id, compute.id)
    raise InvalidInputError(field, f"no GPU or MIG device has UUID {uuid!r}", known)


def add_process(state: NodeState, uuid: str, pid: int, used_mib: int = 0,
                mps: bool = False) -> DeviceRef:
    """A CUDA job starts on the device: from now on NVML reports the device in use."""
    device = resolve_device(state, uuid)
    if any(p.pid == pid for p in device.gpu.processes):
        raise InvalidInputError("--pid", f"process {pid} already runs on GPU {device.gpu.index}")
    if device.gi is None and device.gpu.mig_current:
        raise InvalidInputError(
            "--device", f"GPU {device.gpu.index} is in MIG mode: a process runs on a MIG "
            "device, give its MIG-... UUID")
    device.gpu.processes.append(
        SimProcess(pid=pid, used_mib=used_mib, gi=device.gi, ci=device.ci, mps=mps))
    return device


def remove_process(state: NodeState, uuid: str, pid: int) -> DeviceRef:
    """The job exits; a MIG mode change that waited for an idle card now takes effect."""
    device = resolve_device(state, uuid)
    matching = [p for p in device.gpu.processes
                if p.pid == pid and (device.gi is None or (p.gi, p.ci) == (device.gi, device.ci))]
    if not matching:
        raise InvalidInputError("--pid", f"no process {pid} on {uuid}")
    device.gpu.processes = [p for p in device.gpu.processes if p not in matching]
    apply_pending_mig_mode(device.gpu)
    return device


def inject_xid(state: NodeState, uuid: str, code: int) -> DeviceRef:
    """The driver reports an Xid; on a MIG device the event names its GPU/compute instance."""
    if code < 0:
        raise InvalidInputError("--code", f"an Xid is a positive number, got {code}")
    device = resolve_device(state, uuid)
    state.post_event(device.gpu.index, code, gi=device.gi, ci=device.ci)
    return device


def lose_gpu(state: NodeState, index: int) -> SimGpu:
    """The card falls off the bus (Xid 79): every NVML call on it now fails GPU_IS_LOST."""
    gpu = state.gpu(index)
    if gpu is None:
        raise InvalidInputError(
            "--gpu", f"no GPU {index}", [str(g.index) for g in state.gpus])
    gpu.lost = True
    state.post_event(index, XID_FALLEN_OFF_THE_BUS)
    return gpu


def reset_gpu(state: NodeState, index: int) -> SimGpu:
    """A GPU reset (or reboot): instances and processes vanish, a pending MIG mode applies.

    MIG layouts never survive a reset; the MIG mode does (Ampere keeps it in the InfoROM).
    """
    gpu = state.gpu(index)
    if gpu is None:
        raise InvalidInputError(
            "--gpu", f"no GPU {index}", [str(g.index) for g in state.gpus])
    gpu.instances = []
    gpu.processes = []
    gpu.lost = False
    gpu.reset_required = False
    apply_pending_mig_mode(gpu)
    return gpu


def nvidia_smi_list(state: NodeState) -> str:
    """The cards as ``nvidia-smi -L`` lists them (MIG devices in NVML's index order)."""
    lines = []
    for gpu in state.gpus:
        lines.append(f"GPU {gpu.index}: {gpu.name} (UUID: {gpu.uuid})")
        model = gpu.catalogue_model()
        if model is None or not gpu.mig_current:
            continue
        devices = sorted(
            (instance.id, compute.id, instance, compute)
            for instance in gpu.instances
            for compute in instance.compute_instances
        )
        for position, (_, _, instance, compute) in enumerate(devices):
            profile = model.profile_by_id(instance.profile_id)
            name = profile.name if profile else "?"
            if profile and compute.size != profile.compute_slices:
                name = f"{compute.size}c.{name}"
            lines.append(f"  MIG {name:<11} Device {position:>2}: (UUID: {compute.uuid})")
    return "\n".join(lines)


def describe_details(state: NodeState) -> str:
    """What ``nvidia-smi -L`` leaves out: mode, placements, processes, lost cards."""
    lines = []
    for gpu in state.gpus:
        mode = "n/a" if gpu.catalogue_model() is None else (
            f"current {'on' if gpu.mig_current else 'off'}, pending "
            f"{'on' if gpu.mig_pending else 'off'}")
        flags = " LOST" if gpu.lost else ""
        flags += " RESET-REQUIRED" if gpu.reset_required else ""
        lines.append(f"GPU {gpu.index} {gpu.model}: MIG {mode}{flags}")
        model = gpu.catalogue_model()
        for instance in gpu.instances:
            profile = model.profile_by_id(instance.profile_id) if model else None
            cis = ", ".join(c.uuid for c in instance.compute_instances) or "no compute instance"
            lines.append(f"  GI {instance.id:>2} {profile.name if profile else '?'}"
                         f"@{instance.start} ({instance.start}:{instance.size}): {cis}")
        for process in gpu.processes:
            where = "GPU" if process.gi is None else f"GI {process.gi} CI {process.ci}"
            lines.append(f"  process {process.pid} on {where}, {process.used_mib} MiB"
                         + (" (MPS)" if process.mps else ""))
    return "\n".join(lines)
