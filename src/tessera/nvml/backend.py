"""What Tessera needs from a GPU driver, and its one implementation over ``pynvml``.

The agent observes cards, switches MIG mode, creates and destroys slices and watches for Xid
errors through :class:`GpuBackend`. :class:`PynvmlBackend` implements it with nvidia-ml-py; on a
node it talks to ``libnvidia-ml.so``, in tests and demos to the simulator installed in its place
(:func:`open_backend` with ``sim:FILE``). Both run the same lines here.

Every slice is created *with its placement*: NVML's placement-free creation is greedy and
order-dependent. A slice is a GPU instance plus one compute instance spanning it, since a GPU
instance without a compute instance is no CUDA device at all. Teardown goes compute instances
first, then the GPU instance, as NVML demands.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import pynvml

from tessera.core import catalogue
from tessera.core.errors import BackendError, InvalidInputError

__all__ = [
    "BackendError",
    "ComputeInstance",
    "GpuBackend",
    "GpuInfo",
    "GpuInstance",
    "MigModeResult",
    "ProcessInfo",
    "PynvmlBackend",
    "XidEvent",
    "check_backend",
    "open_backend",
]

NVML_IN_USE = 19
NVML_RESET_REQUIRED = 16
NVML_NOT_SUPPORTED = 3
NVML_INSUFFICIENT_RESOURCES = 23
_NO_INSTANCE = 0xFFFFFFFF
_MIB = 1024 * 1024


@dataclass(frozen=True)
class GpuInfo:
    index: int
    uuid: str
    name: str
    pci_bus_id: str
    pci_device_id: int
    memory_total_mib: int
    model: str | None
    """Catalogue model, or None for a card the catalogue does not know (no MIG management)."""
    mig_current: bool | None
    """None when the card cannot do MIG at all."""
    mig_pending: bool | None
    lost: bool = False
    """Fallen off the bus: NVML cannot reach it; every other field is a placeholder."""

    @property
    def mig_change_pending(self) -> bool:
        return self.mig_current is not None and self.mig_current != self.mig_pending


@dataclass(frozen=True)
class ComputeInstance:
    id: int
    profile: int
    start: int
    size: int
    uuid: str
    """The MIG device UUID (``MIG-...``) that pods see."""


@dataclass(frozen=True)
class GpuInstance:
    gpu_index: int
    id: int
    profile: str
    profile_id: int
    start: int
    size: int
    compute_instances: tuple[ComputeInstance, ...]

    @property
    def uuid(self) -> str | None:
        """The MIG device of a whole-GI compute instance; None while the GI has none."""
        return self.compute_instances[0].uuid if self.compute_instances else None


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    used_mib: int
    gpu_instance_id: int | None
    compute_instance_id: int | None


@dataclass(frozen=True)
class MigModeResult:
    """``nvmlDeviceSetMigMode`` reports, rather than raises, a change it could not apply yet."""

    activation_status: int

    @property
    def applied(self) -> bool:
        return self.activation_status == 0

    @property
    def pending_busy(self) -> bool:
        return self.activation_status == NVML_IN_USE

    @property
    def reset_required(self) -> bool:
        return self.activation_status == NVML_RESET_REQUIRED


@dataclass(frozen=True)
class XidEvent:
    gpu_uuid: str
    xid: int
    gpu_instance_id: int | None
    compute_instance_id: int | None


class GpuBackend(Protocol):
    """The driver surface the agent uses; all GPU indices are NVML indices."""

    def gpus(self) -> list[GpuInfo]: ...

    def set_mig_mode(self, index: int, enabled: bool) -> MigModeResult: ...

    def gpu_instances(self, index: int) -> list[GpuInstance]: ...

    def create_slice(self, index: int, profile: str, start: int) -> GpuInstance: ...

    def create_compute_instance(self, index: int, gpu_instance_id: int) -> GpuInstance: ...

    def destroy_slice(self, index: int, gpu_instance_id: int) -> None: ...

    def processes(self, uuid: str) -> list[ProcessInfo]: ...

    def wait_xid(self, timeout_s: float) -> XidEvent | None: ...

    def close(self) -> None: ...


def _error(operation: str, exc: pynvml.NVMLError) -> BackendError:
    return BackendError(operation, str(exc), code=int(exc.value))


def _address(handle: Any) -> int:
    """Opaque NVML handles are pointers; the same device always has the same one."""
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class PynvmlBackend:
    """:class:`GpuBackend` over nvidia-ml-py; works unchanged on a node and on the simulator."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._event_set: Any = None
        self._event_uuids: dict[int, str] = {}  # handle address -> UUID, named before any loss
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise _error("nvmlInit", exc) from exc

    @contextmanager
    def _calls(self, operation: str) -> Iterator[None]:
        try:
            with self._lock:
                yield
        except pynvml.NVMLError as exc:
            raise _error(operation, exc) from exc

    def _handle(self, index: int) -> Any:
        return pynvml.nvmlDeviceGetHandleByIndex(index)

    def _model(self, handle: Any) -> catalogue.GpuModel | None:
        pci = pynvml.nvmlDeviceGetPciInfo(handle)
        return catalogue.find_model(_text(pynvml.nvmlDeviceGetName(handle)), pci.pciDeviceId)

    def _require_model(self, index: int, handle: Any) -> catalogue.GpuModel:
        model = self._model(handle)
        if model is None:
            name = _text(pynvml.nvmlDeviceGetName(handle))
            raise InvalidInputError(
                f"gpus[{index}]", f"{name} is not a MIG-capable model in the catalogue",
                [m.name for m in catalogue.models()])
        return model

    # -- observation ------------------------------------------------------------------------

    def gpus(self) -> list[GpuInfo]:
        with self._calls("list GPUs"):
            found = []
            for index in range(pynvml.nvmlDeviceGetCount()):
                try:
                    handle = self._handle(index)
                except pynvml.NVMLError_GpuIsLost:
                    found.append(GpuInfo(index=index, uuid="", name="(lost)", pci_bus_id="",
                                         pci_device_id=0, memory_total_mib=0, model=None,
                                         mig_current=None, mig_pending=None, lost=True))
                    continue
                pci = pynvml.nvmlDeviceGetPciInfo(handle)
                memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
                current: bool | None
                pending: bool | None
                try:
                    mode = pynvml.nvmlDeviceGetMigMode(handle)
                    current, pending = bool(mode[0]), bool(mode[1])
                except pynvml.NVMLError_NotSupported:
                    current = pending = None
                model = self._model(handle)
                found.append(GpuInfo(
                    index=index,
                    uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
                    name=_text(pynvml.nvmlDeviceGetName(handle)),
                    pci_bus_id=_text(pci.busId),
                    pci_device_id=int(pci.pciDeviceId),
                    memory_total_mib=int(memory.total) // _MIB,
                    model=model.name if model else None,
                    mig_current=current,
                    mig_pending=pending,
                ))
            return found

    def gpu_instances(self, index: int) -> list[GpuInstance]:
        with self._calls(f"list GPU instances of GPU {index}"):
            handle = self._handle(index)
            model = self._require_model(index, handle)
            if not pynvml.nvmlDeviceGetMigMode(handle)[0]:
                return []
            found = []
            for profile in model.profiles:
                array = (pynvml.c_nvmlGpuInstance_t * profile.max_count)()
                count = ctypes.c_uint(profile.max_count)
                pynvml.nvmlDeviceGetGpuInstances(
                    handle, profile.profile_id, array, ctypes.byref(count))
                for position in range(count.value):
                    found.append(self._describe(index, model, array[position]))
            return sorted(found, key=lambda instance: instance.id)

    def _describe(self, index: int, model: catalogue.GpuModel, gi: Any) -> GpuInstance:
        info = pynvml.nvmlGpuInstanceGetInfo(gi)
        profile = model.profile_by_id(info.profileId)
        computes = []
        for constant in catalogue.COMPUTE_INSTANCE_PROFILE_CONSTANTS.values():
            try:
                ci_info = pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                    gi, constant, pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
            except pynvml.NVMLError_NotSupported:
                continue
            except pynvml.NVMLError_InvalidArgument:
                continue
            array = (pynvml.c_nvmlComputeInstance_t * max(1, ci_info.instanceCount))()
            count = ctypes.c_uint(max(1, ci_info.instanceCount))
            pynvml.nvmlGpuInstanceGetComputeInstances(gi, constant, array, ctypes.byref(count))
            for position in range(count.value):
                ci = pynvml.nvmlComputeInstanceGetInfo(array[position])
                computes.append(ComputeInstance(
                    id=int(ci.id), profile=int(ci.profileId), start=int(ci.placement.start),
                    size=int(ci.placement.size), uuid=self._ci_uuid(index, int(info.id),
                                                                     int(ci.id))))
        return GpuInstance(
            gpu_index=index,
            id=int(info.id),
            profile=profile.name if profile else f"unknown-profile-{info.profileId}",
            profile_id=int(info.profileId),
            start=int(info.placement.start),
            size=int(info.placement.size),
            compute_instances=tuple(sorted(computes, key=lambda c: c.id)),
        )

    def _ci_uuid(self, index: int, gi_id: int, ci_id: int) -> str:
        """A compute instance's MIG device UUID, found by walking the parent's MIG devices."""
        parent = self._handle(index)
        for position in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(parent)):
            try:
                device = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, position)
            except pynvml.NVMLError_NotFound:
                continue
            if (pynvml.nvmlDeviceGetGpuInstanceId(device) == gi_id
                    and pynvml.nvmlDeviceGetComputeInstanceId(device) == ci_id):
                return _text(pynvml.nvmlDeviceGetUUID(device))
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    def processes(self, uuid: str) -> list[ProcessInfo]:
        with self._calls(f"list processes on {uuid}"):
            handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
            found = []
            for getter in (pynvml.nvmlDeviceGetComputeRunningProcesses,
                           pynvml.nvmlDeviceGetMPSComputeRunningProcesses):
                try:
                    rows = getter(handle)
                except pynvml.NVMLError_FunctionNotFound:
                    continue
                for row in rows:
                    found.append(ProcessInfo(
                        pid=int(row.pid),
                        used_mib=int(row.usedGpuMemory or 0) // _MIB,
                        gpu_instance_id=None if row.gpuInstanceId == _NO_INSTANCE
                        else int(row.gpuInstanceId),
                        compute_instance_id=None if row.computeInstanceId == _NO_INSTANCE
                        else int(row.computeInstanceId),
                    ))
            return found

    # -- changes ----------------------------------------------------------------------------

    def set_mig_mode(self, index: int, enabled: bool) -> MigModeResult:
        with self._calls(f"set MIG mode of GPU {index}"):
            handle = self._handle(index)
            mode = pynvml.NVML_DEVICE_MIG_ENABLE if enabled else pynvml.NVML_DEVICE_MIG_DISABLE
            status = pynvml.nvmlDeviceSetMigMode(handle, mode)
            return MigModeResult(int(status))

    def create_slice(self, index: int, profile: str, start: int) -> GpuInstance:
        with self._calls(f"create {profile}@{start} on GPU {index}"):
            handle = self._handle(index)
            model = self._require_model(index, handle)
            wanted = model.profile(profile)
            info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, wanted.nvml_constant)
            placement = pynvml.c_nvmlGpuInstancePlacement_t()
            placement.start = start
            placement.size = wanted.memory_slices
            gi = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(
                handle, info.id, ctypes.byref(placement))
            try:
                self._create_full_ci(gi, wanted)
            except pynvml.NVMLError:
                pynvml.nvmlGpuInstanceDestroy(gi)  # leave nothing half-made behind
                raise
            return self._describe(index, model, gi)

    def create_compute_instance(self, index: int, gpu_instance_id: int) -> GpuInstance:
        """Give a GI without compute instances (a creation cut short) its whole-GI CI."""
        with self._calls(f"create compute instance in GI {gpu_instance_id} on GPU {index}"):
            handle = self._handle(index)
            model = self._require_model(index, handle)
            gi = pynvml.nvmlDeviceGetGpuInstanceById(handle, gpu_instance_id)
            info = pynvml.nvmlGpuInstanceGetInfo(gi)
            profile = model.profile_by_id(info.profileId)
            if profile is None:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
            self._create_full_ci(gi, profile)
            return self._describe(index, model, gi)

    def _create_full_ci(self, gi: Any, profile: catalogue.MigProfile) -> None:
        constant = catalogue.compute_instance_profile_for_slices(profile.compute_slices)
        ci_info = pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
            gi, constant, pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
        pynvml.nvmlGpuInstanceCreateComputeInstance(gi, ci_info.id)

    def destroy_slice(self, index: int, gpu_instance_id: int) -> None:
        with self._calls(f"destroy GI {gpu_instance_id} on GPU {index}"):
            handle = self._handle(index)
            model = self._require_model(index, handle)
            try:
                gi = pynvml.nvmlDeviceGetGpuInstanceById(handle, gpu_instance_id)
            except pynvml.NVMLError_NotFound:
                return  # already gone: destroying is idempotent
            described = self._describe(index, model, gi)
            for compute in described.compute_instances:
                ci = pynvml.nvmlGpuInstanceGetComputeInstanceById(gi, compute.id)
                pynvml.nvmlComputeInstanceDestroy(ci)
            pynvml.nvmlGpuInstanceDestroy(gi)

    # -- health -----------------------------------------------------------------------------

    def wait_xid(self, timeout_s: float) -> XidEvent | None:
        """Wait for the next Xid on any card; None on timeout. Registers lazily, once."""
        with self._calls("wait for Xid events"):
            if self._event_set is None:
                event_set = pynvml.nvmlEventSetCreate()
                for index in range(pynvml.nvmlDeviceGetCount()):
                    try:
                        handle = self._handle(index)
                        pynvml.nvmlDeviceRegisterEvents(
                            handle, pynvml.nvmlEventTypeXidCriticalError, event_set)
                        self._event_uuids[_address(handle)] = _text(
                            pynvml.nvmlDeviceGetUUID(handle))
                    except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_GpuIsLost):
                        continue
                self._event_set = event_set
            event_set = self._event_set
        try:
            data = pynvml.nvmlEventSetWait_v2(event_set, int(timeout_s * 1000))
        except pynvml.NVMLError_Timeout:
            return None
        except pynvml.NVMLError as exc:
            raise _error("wait for Xid events", exc) from exc
        uuid = self._event_uuids.get(_address(data.device))
        if uuid is None:  # a card registered before this process knew it; it still answers
            with self._calls("describe Xid event"):
                uuid = _text(pynvml.nvmlDeviceGetUUID(data.device))
        return XidEvent(
            gpu_uuid=uuid,
            xid=int(data.eventData),
            gpu_instance_id=None if data.gpuInstanceId == _NO_INSTANCE
            else int(data.gpuInstanceId),
            compute_instance_id=None if data.computeInstanceId == _NO_INSTANCE
            else int(data.computeInstanceId),
        )

    def close(self) -> None:
        with self._lock:
            if self._event_set is not None:
                pynvml.nvmlEventSetFree(self._event_set)
                self._event_set = None
            pynvml.nvmlShutdown()


def check_backend(spec: str) -> None:
    """Refuse a ``--nvml`` that names no backend (InvalidInputError), before anything opens
    it: ``real`` or ``sim:FILE``."""
    if spec != "real" and not (spec.startswith("sim:") and len(spec) > 4):
        raise InvalidInputError("--nvml", f"{spec!r} is not a backend", ["real", "sim:FILE"])


def open_backend(spec: str) -> PynvmlBackend:
    """``real`` (the node's libnvidia-ml) or ``sim:FILE`` (a simulated node state file)."""
    check_backend(spec)
    if spec.startswith("sim:"):
        from tessera.nvml import sim  # noqa: PLC0415 - only a simulated node loads the simulator

        sim.install(sim.FileStore(spec[4:]))
    return PynvmlBackend()
