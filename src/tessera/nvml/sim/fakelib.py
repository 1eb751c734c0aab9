"""A stand-in for ``libnvidia-ml.so`` that the real ``pynvml`` wrappers call unchanged.

``pynvml`` resolves every C function with ``getattr(pynvml.nvmlLib, name)``. Installing an
instance of :class:`FakeNvmlLib` there (see :func:`tessera.nvml.sim.install`) means the agent's
NVML code, pynvml's wrappers, its ctypes structs and its ``NVMLError_*`` classes all run exactly as
on a node; only the bottom layer differs. Each method below has the C symbol's name and argument
order, receives what pynvml passes (``byref`` out-parameters, opaque handle pointers, struct
pointers) and returns an ``nvmlReturn_t`` code. A symbol that is not modelled does not exist, so
pynvml raises ``NVMLError_FunctionNotFound`` as it does against an older driver.

Behaviour follows NVML (``shared/reference/mig_facts.md``): profile info takes the
``NVML_GPU_INSTANCE_PROFILE_*`` constant and returns the per-model id that the create/placement
calls take; creation checks placements through :mod:`tessera.core.layout` (overlap and exhausted
capacity are INSUFFICIENT_RESOURCES, a start the profile does not offer is INVALID_ARGUMENT);
destroying a GPU instance that still has compute instances or processes is IN_USE; MIG mode stays
pending while the card is busy and ``nvmlDeviceSetMigMode`` reports that as its activation status
instead of failing; MIG devices get ``MIG-<uuid>`` UUIDs; Xid events come through event sets.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tessera.core import catalogue, layout
from tessera.nvml.sim.state import (
    NodeState,
    SimComputeInstance,
    SimFault,
    SimGpu,
    SimGpuInstance,
)
from tessera.nvml.sim.store import StateStore

__all__ = ["FakeNvmlLib", "codes", "error_string"]


class codes:
    """``nvmlReturn_t`` values the simulator returns."""

    SUCCESS = 0
    UNINITIALIZED = 1
    INVALID_ARGUMENT = 2
    NOT_SUPPORTED = 3
    NO_PERMISSION = 4
    NOT_FOUND = 6
    INSUFFICIENT_SIZE = 7
    DRIVER_NOT_LOADED = 9
    TIMEOUT = 10
    GPU_IS_LOST = 15
    RESET_REQUIRED = 16
    IN_USE = 19
    INSUFFICIENT_RESOURCES = 23
    ARGUMENT_VERSION_MISMATCH = 25
    UNKNOWN = 999


_ERROR_STRINGS = {
    0: "Success",
    1: "Uninitialized",
    2: "Invalid Argument",
    3: "Not Supported",
    4: "Insufficient Permissions",
    6: "Not Found",
    7: "Insufficient Size",
    9: "Driver Not Loaded",
    10: "Timeout",
    15: "GPU is lost",
    16: "GPU requires restart",
    19: "In use by another client",
    23: "Insufficient Resources",
    25: "Argument version mismatch",
    999: "Unknown Error",
}

XID_EVENT = 0x8
TOPOLOGY_INTERNAL, TOPOLOGY_NODE = 0, 40
"""``nvmlGpuTopologyLevel_t``: the same board; an interconnect within one CPU's PCIe root."""
NO_INSTANCE = 0xFFFFFFFF
MIB = 1024 * 1024
GI_PROFILE_COUNT = 18
CI_PROFILE_COUNT = 9


class _FailError(Exception):
    """Unwinds a fake call with an NVML return code."""

    def __init__(self, code: int) -> None:
        self.code = code


@dataclass(frozen=True)
class _Key:
    """What an opaque handle points at; handles are resolved against fresh state on every call."""

    kind: str  # gpu | gi | ci | mig | eventset
    gpu: int = -1
    gi: int = -1
    ci: int = -1
    serial: int = -1


@dataclass
class _EventSet:
    gpus: dict[int, int]  # gpu index -> registered event mask
    last_seq: int


def _out(ref: Any) -> Any:
    """The object behind a ``byref()`` argument (what C would write through)."""
    return ref._obj if hasattr(ref, "_obj") else ref


def _address(pointer: Any) -> int:
    value = ctypes.cast(pointer, ctypes.c_void_p).value
    return int(value or 0)


def _set_pointer(ref: Any, address: int) -> None:
    target = _out(ref)
    ctypes.c_void_p.from_address(ctypes.addressof(target)).value = address


def _struct(ref: Any, name: str) -> Any:
    """A struct passed by pointer; refusing by-value passing catches a real-hardware bug early."""
    if not hasattr(ref, "_obj") and not isinstance(ref, ctypes._Pointer):
        raise TypeError(f"{name} must be passed by pointer (ctypes.byref), as the C API takes it")
    return ref._obj if hasattr(ref, "_obj") else ref.contents


class FakeNvmlLib:
    """The simulated driver library for one node, backed by a :class:`StateStore`."""

    def __init__(self, store: StateStore, event_poll_s: float = 0.02) -> None:
        self.store = store
        self._event_poll_s = event_poll_s
        self._tokens: dict[_Key, ctypes.c_uint64] = {}
        self._keys: dict[int, _Key] = {}
        self._event_sets: dict[int, _EventSet] = {}
        self._initialized = 0
        self._call_counts: dict[str, int] = {}

    # -- plumbing ---------------------------------------------------------------------------

    def _token(self, key: _Key) -> int:
        token = self._tokens.get(key)
        if token is None:
            token = ctypes.c_uint64(len(self._tokens) + 1)
            self._tokens[key] = token
            self._keys[ctypes.addressof(token)] = key
        return ctypes.addressof(token)

    def _key(self, handle: Any, *kinds: str) -> _Key:
        key = self._keys.get(_address(handle))
        if key is None or key.kind not in kinds:
            raise _FailError(codes.INVALID_ARGUMENT)
        return key

    def __getattribute__(self, name: str) -> Any:
        attribute = object.__getattribute__(self, name)
        if name.startswith("nvml") and callable(attribute):
            return object.__getattribute__(self, "_wrap")(name, attribute)
        return attribute

    def _wrap(self, name: str, function: Callable[..., int]) -> Callable[..., int]:
        def call(*args: Any) -> int:
            if name not in ("nvmlInitWithFlags", "nvmlInit_v2", "nvmlErrorString") and (
                self._initialized <= 0
            ):
                return codes.UNINITIALIZED
            fault = self._injected_fault(name)
            if fault is not None and fault.action == "fail":
                return fault.code
            if fault is not None and fault.action == "kill-before":
                os.kill(os.getpid(), signal.SIGKILL)
            try:
                result = function(*args)
            except _FailError as failure:
                result = failure.code
            if fault is not None and fault.action == "kill-after":
                os.kill(os.getpid(), signal.SIGKILL)
            return result

        call.__name__ = name
        return call

    def _injected_fault(self, name: str) -> SimFault | None:
        state = self.store.read()
        if not any(fault.matches(name) for fault in state.faults):
            return None
        with self.store.mutate() as working:
            for fault in working.faults:
                if not fault.matches(name):
                    continue
                if fault.after > 0:
                    fault.after -= 1
                    return None
                fault.times -= 1
                fired = fault.model_copy()
                working.faults = [f for f in working.faults if f.times > 0]
                return fired
        return None

    def _gpu(self, state: NodeState, key: _Key) -> SimGpu:
        gpu = state.gpu(key.gpu)
        if gpu is None:
            raise _FailError(codes.INVALID_ARGUMENT)
        if gpu.lost:
            raise _FailError(codes.GPU_IS_LOST)
        return gpu

    def _mig_gpu(self, state: NodeState, key: _Key) -> tuple[SimGpu, catalogue.GpuModel]:
        gpu = self._gpu(state, key)
        model = gpu.catalogue_model()
        if model is None or not gpu.mig_current:
            raise _FailError(codes.NOT_SUPPORTED)
        return gpu, model

    def _gi(self, state: NodeState, key: _Key) -> tuple[SimGpu, catalogue.GpuModel,
                                                       SimGpuInstance]:
        gpu, model = self._mig_gpu(state, key)
        instance = gpu.gpu_instance(key.gi)
        if instance is None:
            raise _FailError(codes.INVALID_ARGUMENT)
        return gpu, model, instance

    def _ci(self, state: NodeState, key: _Key) -> tuple[SimGpu, catalogue.GpuModel,
                                                       SimGpuInstance, SimComputeInstance]:
        gpu, model, instance = self._gi(state, key)
        for compute in instance.compute_instances:
            if compute.id == key.ci:
                return gpu, model, instance, compute
        raise _FailError(codes.INVALID_ARGUMENT)

    # -- library and system -----------------------------------------------------------------

    def nvmlInitWithFlags(self, flags: int) -> int:
        self.store.read()
        self._initialized += 1
        return codes.SUCCESS

    def nvmlInit_v2(self) -> int:
        return self.nvmlInitWithFlags(0)

    def nvmlShutdown(self) -> int:
        self._initialized = max(0, self._initialized - 1)
        return codes.SUCCESS

    def nvmlErrorString(self, result: int) -> bytes:
        return error_string(int(result))

    def nvmlSystemGetDriverVersion(self, buffer: Any, length: Any) -> int:
        version = self.store.read().driver_version.encode()
        if len(version) + 1 > _length(length):
            return codes.INSUFFICIENT_SIZE
        buffer.value = version
        return codes.SUCCESS

    def nvmlSystemGetNVMLVersion(self, buffer: Any, length: Any) -> int:
        """NVML's version is the CUDA major version it ships with, then the driver's."""
        state = self.store.read()
        version = f"{state.cuda_driver_version // 1000}.{state.driver_version}".encode()
        if len(version) + 1 > _length(length):
            return codes.INSUFFICIENT_SIZE
        buffer.value = version
        return codes.SUCCESS

    def nvmlSystemGetCudaDriverVersion(self, version: Any) -> int:
        _out(version).value = self.store.read().cuda_driver_version
        return codes.SUCCESS

    # -- devices ----------------------------------------------------------------------------

    def nvmlDeviceGetCount_v2(self, count: Any) -> int:
        _out(count).value = len(self.store.read().gpus)
        return codes.SUCCESS

    def nvmlDeviceGetHandleByIndex_v2(self, index: Any, device: Any) -> int:
        state = self.store.read()
        gpu = state.gpu(int(index.value))
        if gpu is None:
            return codes.INVALID_ARGUMENT
        if gpu.lost:
            return codes.GPU_IS_LOST
        _set_pointer(device, self._token(_Key("gpu", gpu.index)))
        return codes.SUCCESS

    def nvmlDeviceGetHandleByUUID(self, uuid: Any, device: Any) -> int:
        wanted = uuid.value.decode()
        state = self.store.read()
        for gpu in state.gpus:
            if gpu.uuid == wanted:
                if gpu.lost:
                    return codes.GPU_IS_LOST
                _set_pointer(device, self._token(_Key("gpu", gpu.index)))
                return codes.SUCCESS
            for instance in gpu.instances:
                for compute in instance.compute_instances:
                    if compute.uuid == wanted and not gpu.lost:
                        key = _Key("mig", gpu.index, instance.id, compute.id)
                        _set_pointer(device, self._token(key))
                        return codes.SUCCESS
        return codes.NOT_FOUND

    def nvmlDeviceGetHandleByPciBusId_v2(self, bus_id: Any, device: Any) -> int:
        """Any spelling NVML takes: ``domain:bus:device.function`` with a 4- or 8-digit
        domain, or ``bus:device.function``; hex digits in either case."""
        wanted = _pci_address(bus_id.value.decode())
        if wanted is None:
            return codes.INVALID_ARGUMENT
        for gpu in self.store.read().gpus:
            if _pci_address(gpu.bus_id) == wanted:
                if gpu.lost:
                    return codes.GPU_IS_LOST
                _set_pointer(device, self._token(_Key("gpu", gpu.index)))
                return codes.SUCCESS
        return codes.NOT_FOUND

    def _device(self, handle: Any) -> tuple[NodeState, SimGpu, _Key]:
        key = self._key(handle, "gpu", "mig")
        state = self.store.read()
        gpu = self._gpu(state, key)
        if key.kind == "mig":
            self._ci(state, key)
        return state, gpu, key

    def _mig_profile_name(self, state: NodeState, key: _Key) -> str:
        _, model, instance, compute = self._ci(state, key)
        profile = model.profile_by_id(instance.profile_id)
        assert profile is not None
        if compute.size == profile.compute_slices:
            return profile.name
        return f"{compute.size}c.{profile.name}"

    def nvmlDeviceGetName(self, handle: Any, name: Any, length: Any) -> int:
        state, gpu, key = self._device(handle)
        text = gpu.name
        if key.kind == "mig":
            text = f"{gpu.name} MIG {self._mig_profile_name(state, key)}"
        if len(text) + 1 > _length(length):
            return codes.INSUFFICIENT_SIZE
        name.value = text.encode()
        return codes.SUCCESS

    def nvmlDeviceGetUUID(self, handle: Any, uuid: Any, length: Any) -> int:
        state, gpu, key = self._device(handle)
        text = gpu.uuid
        if key.kind == "mig":
            text = self._ci(state, key)[3].uuid
        if len(text) + 1 > _length(length):
            return codes.INSUFFICIENT_SIZE
        uuid.value = text.encode()
        return codes.SUCCESS

    def _gpu_ordinal(self, handle: Any, out: Any) -> int:
        """Index and minor number: the simulated node numbers /dev/nvidiaN by NVML index."""
        _, gpu, key = self._device(handle)
        if key.kind == "mig":
            return codes.NOT_SUPPORTED
        _out(out).value = gpu.index
        return codes.SUCCESS

    def nvmlDeviceGetIndex(self, handle: Any, index: Any) -> int:
        return self._gpu_ordinal(handle, index)

    def nvmlDeviceGetMinorNumber(self, handle: Any, minor: Any) -> int:
        return self._gpu_ordinal(handle, minor)

    def nvmlDeviceGetAttributes_v2(self, handle: Any, attributes: Any) -> int:
        """A MIG device's share of its card: its compute instance's SMs and slices, its GPU
        instance's engines, slices and memory (what go-nvlib derives a MIG profile's name
        from). A whole GPU answers NOT_SUPPORTED here: its attributes are not recorded in
        the catalogue, and no client of the simulator asks for them."""
        state, _, key = self._device(handle)
        if key.kind != "mig":
            return codes.NOT_SUPPORTED
        _, model, instance, compute = self._ci(state, key)
        profile = model.profile_by_id(instance.profile_id)
        assert profile is not None
        slices = compute.size
        target = _out(attributes)
        _fill_ci_share(target, profile, slices)
        target.gpuInstanceSliceCount = profile.compute_slices
        target.computeInstanceSliceCount = slices
        target.memorySizeMB = profile.memory_mib
        return codes.SUCCESS

    def nvmlDeviceGetCudaComputeCapability(self, handle: Any, major: Any, minor: Any) -> int:
        """The card's, from the catalogue; a MIG device answers with its parent's."""
        _, gpu, _ = self._device(handle)
        card = catalogue.card(gpu.model)
        _out(major).value, _out(minor).value = card.compute_capability
        return codes.SUCCESS

    def nvmlDeviceGetPciInfo_v3(self, handle: Any, info: Any) -> int:
        _, gpu, _ = self._device(handle)
        target = _out(info)
        domain, bus, rest = gpu.bus_id.split(":")
        device, _function = rest.split(".")
        target.busIdLegacy = gpu.bus_id[-12:].encode()
        target.busId = gpu.bus_id.encode()
        target.domain = int(domain, 16)
        target.bus = int(bus, 16)
        target.device = int(device, 16)
        target.pciDeviceId = gpu.device_id
        target.pciSubSystemId = 0x147E10DE
        return codes.SUCCESS

    def nvmlDeviceGetMemoryInfo(self, handle: Any, memory: Any) -> int:
        state, gpu, key = self._device(handle)
        total_mib = gpu.total_memory_mib
        processes = gpu.processes
        if key.kind == "mig":
            _, model, instance, _ = self._ci(state, key)
            profile = model.profile_by_id(instance.profile_id)
            assert profile is not None
            total_mib = profile.memory_mib
            processes = [p for p in gpu.processes if p.gi == key.gi]
        used = sum(p.used_mib for p in processes) * MIB
        target = _out(memory)
        target.total = total_mib * MIB
        target.used = used
        target.free = max(0, total_mib * MIB - used)
        return codes.SUCCESS

    def _processes(self, handle: Any, mps: bool) -> list[tuple[int, int, int, int]]:
        _, gpu, key = self._device(handle)
        found = []
        for process in gpu.processes:
            if process.mps != mps:
                continue
            if key.kind == "mig" and (process.gi, process.ci) != (key.gi, key.ci):
                continue
            gi = NO_INSTANCE if process.gi is None else process.gi
            ci = NO_INSTANCE if process.ci is None else process.ci
            found.append((process.pid, process.used_mib * MIB, gi, ci))
        return found

    def _fill_processes(self, rows: list[tuple[int, int, int, int]], count: Any,
                        infos: Any) -> int:
        counter = _out(count)
        if infos is None or counter.value < len(rows):
            needed = len(rows)
            counter.value = needed
            return codes.SUCCESS if needed == 0 else codes.INSUFFICIENT_SIZE
        for i, (pid, used, gi, ci) in enumerate(rows):
            infos[i].pid = pid
            infos[i].usedGpuMemory = used
            infos[i].gpuInstanceId = gi
            infos[i].computeInstanceId = ci
        counter.value = len(rows)
        return codes.SUCCESS

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: Any, count: Any,
                                                infos: Any) -> int:
        return self._fill_processes(self._processes(handle, mps=False), count, infos)

    def nvmlDeviceGetMPSComputeRunningProcesses_v3(self, handle: Any, count: Any,
                                                   infos: Any) -> int:
        return self._fill_processes(self._processes(handle, mps=True), count, infos)

    # -- MIG mode ---------------------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, handle: Any, current: Any, pending: Any) -> int:
        _, gpu, key = self._device(handle)
        if key.kind == "mig" or gpu.catalogue_model() is None:
            return codes.NOT_SUPPORTED
        _out(current).value = gpu.mig_current
        _out(pending).value = gpu.mig_pending
        return codes.SUCCESS

    def nvmlDeviceSetMigMode(self, handle: Any, mode: Any, activation: Any) -> int:
        key = self._key(handle, "gpu")
        wanted = int(mode.value if hasattr(mode, "value") else mode)
        if wanted not in (0, 1):
            return codes.INVALID_ARGUMENT
        with self.store.mutate() as state:
            gpu = self._gpu(state, key)
            if gpu.catalogue_model() is None:
                return codes.NOT_SUPPORTED
            gpu.mig_pending = wanted
            status = apply_pending_mig_mode(gpu)
        _out(activation).value = status
        return codes.SUCCESS

    def nvmlDeviceIsMigDeviceHandle(self, handle: Any, is_mig: Any) -> int:
        key = self._key(handle, "gpu", "mig")
        _out(is_mig).value = int(key.kind == "mig")
        return codes.SUCCESS

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any, count: Any) -> int:
        _, gpu, key = self._device(handle)
        model = gpu.catalogue_model()
        enabled = model is not None and gpu.mig_current and key.kind == "gpu"
        _out(count).value = model.max_gpu_instances if enabled and model else 0
        return codes.SUCCESS

    def _mig_devices(self, gpu: SimGpu) -> list[tuple[int, int]]:
        return sorted(
            (instance.id, compute.id)
            for instance in gpu.instances
            for compute in instance.compute_instances
        )

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: Any,
                                            mig_device: Any) -> int:
        key = self._key(handle, "gpu")
        state = self.store.read()
        gpu, _ = self._mig_gpu(state, key)
        devices = self._mig_devices(gpu)
        position = int(index.value)
        if position >= len(devices):
            return codes.NOT_FOUND
        gi, ci = devices[position]
        _set_pointer(mig_device, self._token(_Key("mig", gpu.index, gi, ci)))
        return codes.SUCCESS

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, mig_device: Any, device: Any) -> int:
        key = self._key(mig_device, "mig")
        self._ci(self.store.read(), key)
        _set_pointer(device, self._token(_Key("gpu", key.gpu)))
        return codes.SUCCESS

    def nvmlDeviceGetGpuInstanceId(self, handle: Any, gi: Any) -> int:
        key = self._key(handle, "gpu", "mig")
        if key.kind != "mig":
            return codes.NOT_SUPPORTED
        self._ci(self.store.read(), key)
        _out(gi).value = key.gi
        return codes.SUCCESS

    def nvmlDeviceGetComputeInstanceId(self, handle: Any, ci: Any) -> int:
        key = self._key(handle, "gpu", "mig")
        if key.kind != "mig":
            return codes.NOT_SUPPORTED
        self._ci(self.store.read(), key)
        _out(ci).value = key.ci
        return codes.SUCCESS

    # -- GPU-instance profiles and placements -----------------------------------------------

    def _fill_gi_profile(self, target: Any, gpu: SimGpu, profile: catalogue.MigProfile) -> None:
        target.id = profile.profile_id
        target.isP2pSupported = 0
        target.sliceCount = profile.compute_slices
        target.instanceCount = profile.max_count
        target.multiprocessorCount = profile.sm_count
        target.copyEngineCount = profile.engines.copy
        target.decoderCount = profile.engines.decoders
        target.encoderCount = profile.engines.encoders
        target.jpegCount = profile.engines.jpeg
        target.ofaCount = profile.engines.ofa
        target.memorySizeMB = profile.memory_mib
        if hasattr(target, "name"):
            target.name = f"MIG {profile.name}".encode()

    def _gi_profile_info(self, handle: Any, constant: int, info: Any, needs_mig: bool) -> int:
        key = self._key(handle, "gpu")
        state = self.store.read()
        gpu = self._gpu(state, key)
        model = gpu.catalogue_model()
        if int(constant) >= GI_PROFILE_COUNT:
            return codes.INVALID_ARGUMENT
        if model is None or (needs_mig and not gpu.mig_current):
            return codes.NOT_SUPPORTED
        profile = model.profile_by_constant(int(constant))
        if profile is None:
            return codes.NOT_SUPPORTED
        self._fill_gi_profile(_out(info), gpu, profile)
        return codes.SUCCESS

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: Any, constant: Any, info: Any) -> int:
        return self._gi_profile_info(handle, int(constant), info, needs_mig=False)

    def nvmlDeviceGetGpuInstanceProfileInfoV(self, handle: Any, constant: Any, info: Any) -> int:
        target = _out(info)
        if getattr(target, "version", 0) != 0x02000098:
            return codes.ARGUMENT_VERSION_MISMATCH
        return self._gi_profile_info(handle, int(constant), info, needs_mig=True)

    def nvmlDeviceGetGpuInstanceProfileInfoByIdV(self, handle: Any, profile_id: Any,
                                                 info: Any) -> int:
        key = self._key(handle, "gpu")
        gpu, model = self._mig_gpu(self.store.read(), key)
        profile = model.profile_by_id(int(profile_id))
        if profile is None:
            return codes.INVALID_ARGUMENT
        self._fill_gi_profile(_out(info), gpu, profile)
        return codes.SUCCESS

    def _profile_for_id(self, model: catalogue.GpuModel, profile_id: int) -> catalogue.MigProfile:
        profile = model.profile_by_id(profile_id)
        if profile is None:
            raise _FailError(codes.INVALID_ARGUMENT)
        return profile

    def _slices(self, model: catalogue.GpuModel, gpu: SimGpu) -> list[layout.Slice]:
        found = []
        for instance in gpu.instances:
            profile = model.profile_by_id(instance.profile_id)
            assert profile is not None
            found.append(layout.Slice(profile.name, instance.start))
        return found

    def nvmlDeviceGetGpuInstancePossiblePlacements_v2(self, handle: Any, profile_id: Any,
                                                      placements: Any, count: Any) -> int:
        key = self._key(handle, "gpu")
        _, model = self._mig_gpu(self.store.read(), key)
        profile = self._profile_for_id(model, int(profile_id))
        counter = _out(count)
        if placements is None:
            counter.value = len(profile.placements)
            return codes.SUCCESS
        if counter.value < len(profile.placements):
            counter.value = len(profile.placements)
            return codes.INSUFFICIENT_SIZE
        for i, placement in enumerate(profile.placements):
            placements[i].start = placement.start
            placements[i].size = placement.size
        counter.value = len(profile.placements)
        return codes.SUCCESS

    def nvmlDeviceGetGpuInstanceRemainingCapacity(self, handle: Any, profile_id: Any,
                                                  count: Any) -> int:
        key = self._key(handle, "gpu")
        gpu, model = self._mig_gpu(self.store.read(), key)
        profile = self._profile_for_id(model, int(profile_id))
        slices = self._slices(model, gpu)
        added = 0
        for placement in profile.placements:
            candidate = layout.Slice(profile.name, placement.start)
            if layout.conflict_with(model, slices, candidate) is None:
                slices.append(candidate)
                added += 1
        _out(count).value = added
        return codes.SUCCESS

    # -- GPU instances ----------------------------------------------------------------------

    def _create_gi(self, key: _Key, profile_id: int, start: int | None, out: Any) -> int:
        with self.store.mutate() as state:
            gpu, model = self._mig_gpu(state, key)
            profile = self._profile_for_id(model, profile_id)
            slices = self._slices(model, gpu)
            if start is None:
                start = _auto_start(model, profile, slices)
                if start is None:
                    return codes.INSUFFICIENT_RESOURCES
            conflict = layout.conflict_with(model, slices, layout.Slice(profile.name, start))
            if conflict is not None:
                return (codes.INVALID_ARGUMENT if conflict.kind == "placement"
                        else codes.INSUFFICIENT_RESOURCES)
            placement = catalogue.Placement(start, profile.memory_slices)
            gi_id = model.gpu_instance_id(placement)
            gpu.instances.append(SimGpuInstance(
                id=gi_id, profile_id=profile.profile_id, start=start, size=placement.size))
            gpu.instances.sort(key=lambda instance: instance.id)
        _set_pointer(out, self._token(_Key("gi", key.gpu, gi_id)))
        return codes.SUCCESS

    def nvmlDeviceCreateGpuInstance(self, handle: Any, profile_id: Any, out: Any) -> int:
        return self._create_gi(self._key(handle, "gpu"), int(profile_id), None, out)

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, handle: Any, profile_id: Any,
                                                 placement: Any, out: Any) -> int:
        requested = _struct(placement, "placement")
        key = self._key(handle, "gpu")
        state = self.store.read()
        _, model = self._mig_gpu(state, key)
        profile = self._profile_for_id(model, int(profile_id))
        if int(requested.size) != profile.memory_slices:
            return codes.INVALID_ARGUMENT
        return self._create_gi(key, int(profile_id), int(requested.start), out)

    def nvmlDeviceGetGpuInstances(self, handle: Any, profile_id: Any, instances: Any,
                                  count: Any) -> int:
        key = self._key(handle, "gpu")
        gpu, model = self._mig_gpu(self.store.read(), key)
        profile = self._profile_for_id(model, int(profile_id))
        found = [i for i in gpu.instances if i.profile_id == profile.profile_id]
        counter = _out(count)
        if instances is None:
            counter.value = len(found)
            return codes.SUCCESS
        for i, instance in enumerate(found):
            address = self._token(_Key("gi", gpu.index, instance.id))
            ctypes.c_void_p.from_address(ctypes.addressof(instances) + i * 8).value = address
        counter.value = len(found)
        return codes.SUCCESS

    def nvmlDeviceGetGpuInstanceById(self, handle: Any, gi_id: Any, out: Any) -> int:
        key = self._key(handle, "gpu")
        gpu, _ = self._mig_gpu(self.store.read(), key)
        wanted = int(gi_id.value if hasattr(gi_id, "value") else gi_id)
        if gpu.gpu_instance(wanted) is None:
            return codes.NOT_FOUND
        _set_pointer(out, self._token(_Key("gi", gpu.index, wanted)))
        return codes.SUCCESS

    def nvmlGpuInstanceGetInfo(self, gi_handle: Any, info: Any) -> int:
        key = self._key(gi_handle, "gi")
        gpu, _, instance = self._gi(self.store.read(), key)
        target = _out(info)
        target.device = ctypes.cast(self._token(_Key("gpu", gpu.index)),
                                    _device_pointer_type(target))
        target.id = instance.id
        target.profileId = instance.profile_id
        target.placement.start = instance.start
        target.placement.size = instance.size
        return codes.SUCCESS

    def nvmlGpuInstanceDestroy(self, gi_handle: Any) -> int:
        key = self._key(gi_handle, "gi")
        with self.store.mutate() as state:
            gpu, _, instance = self._gi(state, key)
            if instance.compute_instances or any(p.gi == instance.id for p in gpu.processes):
                return codes.IN_USE
            gpu.instances = [i for i in gpu.instances if i.id != instance.id]
        return codes.SUCCESS

    # -- compute instances ------------------------------------------------------------------

    def _ci_profile(self, instance: SimGpuInstance, model: catalogue.GpuModel,
                    constant: int) -> tuple[catalogue.MigProfile, int]:
        if constant >= CI_PROFILE_COUNT:
            raise _FailError(codes.INVALID_ARGUMENT)
        gi_profile = model.profile_by_id(instance.profile_id)
        assert gi_profile is not None
        slices = catalogue.compute_instance_slices(constant)
        if slices not in _ci_sizes(gi_profile.compute_slices):
            raise _FailError(codes.NOT_SUPPORTED)
        return gi_profile, slices

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, gi_handle: Any, constant: Any,
                                                     engine_profile: Any, info: Any) -> int:
        key = self._key(gi_handle, "gi")
        _, model, instance = self._gi(self.store.read(), key)
        if int(engine_profile) != 0:
            return codes.INVALID_ARGUMENT
        gi_profile, slices = self._ci_profile(instance, model, int(constant))
        target = _out(info)
        target.id = int(constant)
        target.sliceCount = slices
        target.instanceCount = gi_profile.compute_slices // slices
        _fill_ci_share(target, gi_profile, slices)
        if hasattr(target, "name"):
            suffix = gi_profile.name if slices == gi_profile.compute_slices else (
                f"{slices}c.{gi_profile.name}")
            target.name = f"MIG {suffix}".encode()
        return codes.SUCCESS

    def nvmlGpuInstanceGetComputeInstanceProfileInfoV(self, gi_handle: Any, constant: Any,
                                                      engine_profile: Any, info: Any) -> int:
        if getattr(_out(info), "version", 0) != 0x02000088:
            return codes.ARGUMENT_VERSION_MISMATCH
        return self.nvmlGpuInstanceGetComputeInstanceProfileInfo(
            gi_handle, constant, engine_profile, info)

    def nvmlGpuInstanceGetComputeInstanceRemainingCapacity(self, gi_handle: Any, constant: Any,
                                                           count: Any) -> int:
        key = self._key(gi_handle, "gi")
        _, model, instance = self._gi(self.store.read(), key)
        gi_profile, slices = self._ci_profile(instance, model, int(constant))
        _out(count).value = len(_free_ci_starts(instance, gi_profile.compute_slices, slices))
        return codes.SUCCESS

    def nvmlGpuInstanceCreateComputeInstance(self, gi_handle: Any, constant: Any,
                                             out: Any) -> int:
        key = self._key(gi_handle, "gi")
        with self.store.mutate() as state:
            gpu, model, instance = self._gi(state, key)
            gi_profile, slices = self._ci_profile(instance, model, int(constant))
            starts = _free_ci_starts(instance, gi_profile.compute_slices, slices)
            if not starts:
                return codes.INSUFFICIENT_RESOURCES
            used = {c.id for c in instance.compute_instances}
            ci_id = min(i for i in range(len(used) + 1) if i not in used)
            instance.compute_instances.append(SimComputeInstance(
                id=ci_id, profile=int(constant), start=starts[0], size=slices,
                uuid=state.new_mig_uuid(gpu, instance.id, ci_id)))
            instance.compute_instances.sort(key=lambda compute: compute.id)
        _set_pointer(out, self._token(_Key("ci", key.gpu, key.gi, ci_id)))
        return codes.SUCCESS

    def nvmlGpuInstanceGetComputeInstances(self, gi_handle: Any, constant: Any,
                                           instances: Any, count: Any) -> int:
        key = self._key(gi_handle, "gi")
        gpu, _, instance = self._gi(self.store.read(), key)
        found = [c for c in instance.compute_instances if c.profile == int(constant)]
        counter = _out(count)
        if instances is None:
            counter.value = len(found)
            return codes.SUCCESS
        for i, compute in enumerate(found):
            address = self._token(_Key("ci", gpu.index, instance.id, compute.id))
            ctypes.c_void_p.from_address(ctypes.addressof(instances) + i * 8).value = address
        counter.value = len(found)
        return codes.SUCCESS

    def nvmlGpuInstanceGetComputeInstanceById(self, gi_handle: Any, ci_id: Any,
                                              out: Any) -> int:
        key = self._key(gi_handle, "gi")
        gpu, _, instance = self._gi(self.store.read(), key)
        wanted = int(ci_id.value if hasattr(ci_id, "value") else ci_id)
        if all(c.id != wanted for c in instance.compute_instances):
            return codes.NOT_FOUND
        _set_pointer(out, self._token(_Key("ci", gpu.index, instance.id, wanted)))
        return codes.SUCCESS

    def nvmlComputeInstanceGetInfo_v2(self, ci_handle: Any, info: Any) -> int:
        key = self._key(ci_handle, "ci")
        gpu, _, instance, compute = self._ci(self.store.read(), key)
        target = _out(info)
        target.device = ctypes.cast(self._token(_Key("gpu", gpu.index)),
                                    _device_pointer_type(target))
        target.gpuInstance = ctypes.cast(self._token(_Key("gi", gpu.index, instance.id)),
                                         type(target.gpuInstance))
        target.id = compute.id
        target.profileId = compute.profile
        target.placement.start = compute.start
        target.placement.size = compute.size
        return codes.SUCCESS

    def nvmlComputeInstanceDestroy(self, ci_handle: Any) -> int:
        key = self._key(ci_handle, "ci")
        with self.store.mutate() as state:
            gpu, _, instance, compute = self._ci(state, key)
            if any((p.gi, p.ci) == (instance.id, compute.id) for p in gpu.processes):
                return codes.IN_USE
            instance.compute_instances = [
                c for c in instance.compute_instances if c.id != compute.id]
        return codes.SUCCESS

    # -- events -----------------------------------------------------------------------------

    def nvmlEventSetCreate(self, out: Any) -> int:
        serial = len(self._event_sets) + 1
        address = self._token(_Key("eventset", serial=serial))
        self._event_sets[address] = _EventSet(
            gpus={}, last_seq=self.store.read().next_event_seq - 1)
        _set_pointer(out, address)
        return codes.SUCCESS

    def nvmlDeviceGetTopologyCommonAncestor(self, first: Any, second: Any, level: Any) -> int:
        """The simulated node's topology: every card on the PCIe root of one CPU (NODE), as
        in a single-socket PCIe server; a card and itself share the board (INTERNAL)."""
        state = self.store.read()
        one = self._gpu(state, self._key(first, "gpu"))
        other = self._gpu(state, self._key(second, "gpu"))
        _out(level).value = TOPOLOGY_INTERNAL if one.index == other.index else TOPOLOGY_NODE
        return codes.SUCCESS

    def nvmlDeviceGetNvLinkState(self, handle: Any, link: Any, active: Any) -> int:
        """No simulated card has NVLink (they sit on PCIe, above): NOT_SUPPORTED for every
        link, as a PCIe card answers."""
        self._device(handle)
        return codes.NOT_SUPPORTED

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any, event_types: Any) -> int:
        """Xid critical errors, the one kind of event the simulator delivers (a real card
        also lists ECC, clock and power events; claiming them here would promise events that
        never come). Asked of a MIG device, NOT_SUPPORTED, as registering is."""
        self._events_gpu(handle)
        _out(event_types).value = XID_EVENT
        return codes.SUCCESS

    def _events_gpu(self, handle: Any) -> _Key:
        """The GPU a handle names for its events; events belong to the card, not to its MIG
        devices (NOT_SUPPORTED)."""
        key = self._key(handle, "gpu", "mig")
        if key.kind == "mig":
            raise _FailError(codes.NOT_SUPPORTED)
        self._gpu(self.store.read(), key)
        return key

    def nvmlDeviceRegisterEvents(self, handle: Any, mask: Any, event_set: Any) -> int:
        key = self._events_gpu(handle)
        registered = self._event_sets.get(_address(event_set))
        if registered is None:
            return codes.INVALID_ARGUMENT
        registered.gpus[key.gpu] = int(mask.value if hasattr(mask, "value") else mask)
        return codes.SUCCESS

    def nvmlEventSetWait_v2(self, event_set: Any, data: Any, timeout_ms: Any) -> int:
        registered = self._event_sets.get(_address(event_set))
        if registered is None:
            return codes.INVALID_ARGUMENT
        timeout = int(timeout_ms.value if hasattr(timeout_ms, "value") else timeout_ms)
        deadline = time.monotonic() + timeout / 1000
        while True:
            state = self.store.read()
            for event in state.events:
                if event.seq <= registered.last_seq:
                    continue
                registered.last_seq = event.seq
                mask = registered.gpus.get(event.gpu)
                if mask is None or not mask & event.type:
                    continue
                target = _out(data)
                target.device = ctypes.cast(self._token(_Key("gpu", event.gpu)),
                                            _device_pointer_type(target))
                target.eventType = event.type
                target.eventData = event.data
                target.gpuInstanceId = NO_INSTANCE if event.gi is None else event.gi
                target.computeInstanceId = NO_INSTANCE if event.ci is None else event.ci
                return codes.SUCCESS
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return codes.TIMEOUT
            time.sleep(min(self._event_poll_s, remaining))

    def nvmlEventSetFree(self, event_set: Any) -> int:
        if self._event_sets.pop(_address(event_set), None) is None:
            return codes.INVALID_ARGUMENT
        return codes.SUCCESS


def error_string(result: int) -> bytes:
    """``nvmlErrorString``: the same text through either door (in process, or the library)."""
    return _ERROR_STRINGS.get(result, f"Unknown Error {result}").encode()


def _fill_ci_share(target: Any, gi_profile: catalogue.MigProfile, slices: int) -> None:
    """A compute instance of ``slices`` in a GPU instance of ``gi_profile``: its share of the
    SMs, and the GI's engines, which its compute instances share."""
    target.multiprocessorCount = gi_profile.sm_count * slices // gi_profile.compute_slices
    target.sharedCopyEngineCount = gi_profile.engines.copy
    target.sharedDecoderCount = gi_profile.engines.decoders
    target.sharedEncoderCount = gi_profile.engines.encoders
    target.sharedJpegCount = gi_profile.engines.jpeg
    target.sharedOfaCount = gi_profile.engines.ofa


def _pci_address(text: str) -> tuple[int, int, int, int] | None:
    """(domain, bus, device, function) of a PCI bus id, or None if it is not one."""
    parts = text.strip().split(":")
    if len(parts) == 2:
        parts = ["0", *parts]
    if len(parts) != 3 or "." not in parts[2]:
        return None
    device, function = parts[2].split(".", 1)
    try:
        return int(parts[0], 16), int(parts[1], 16), int(device, 16), int(function, 16)
    except ValueError:
        return None


def _length(value: Any) -> int:
    """A ``length`` argument, whether pynvml wrapped it in ``c_uint`` or not."""
    return int(value.value if hasattr(value, "value") else value)


def _device_pointer_type(struct: Any) -> Any:
    """The ``c_nvmlDevice_t`` type of a struct's ``device`` field, without importing pynvml."""
    return dict(type(struct)._fields_)["device"]


def _ci_sizes(gi_compute_slices: int) -> tuple[int, ...]:
    """Compute-instance sizes a GI offers: observed 3g -> 1c/2c/3c, 2g -> 1c/2c, 7g -> 1..7."""
    return {1: (1,), 2: (1, 2), 3: (1, 2, 3), 4: (1, 2, 4), 7: (1, 2, 3, 4, 7)}.get(
        gi_compute_slices, (gi_compute_slices,))


def _free_ci_starts(instance: SimGpuInstance, gi_slices: int, size: int) -> list[int]:
    used = {s for c in instance.compute_instances for s in range(c.start, c.start + c.size)}
    return [
        start for start in range(0, gi_slices - size + 1, size)
        if not used & set(range(start, start + size))
    ]


_AUTO_ORDER = {1: (6, 4, 5, 0, 1, 2, 3), 2: (4, 0, 2, 6), 4: (4, 0)}
"""Observed greedy placement of ``nvmlDeviceCreateGpuInstance`` on an empty 8-slice card [U]."""


def _auto_start(model: catalogue.GpuModel, profile: catalogue.MigProfile,
                slices: list[layout.Slice]) -> int | None:
    order = _AUTO_ORDER.get(profile.memory_slices, ()) if model.memory_slices == 8 else ()
    starts = [s for s in order if s in profile.starts] + [
        s for s in profile.starts if s not in order]
    for start in starts:
        if layout.conflict_with(model, slices, layout.Slice(profile.name, start)) is None:
            return start
    return None


def apply_pending_mig_mode(gpu: SimGpu) -> int:
    """Apply a pending MIG mode if the card allows it now; return the activation status.

    A card with processes (or, for disabling, with GPU instances) keeps the change pending
    (IN_USE); a pass-through card needs a reboot (RESET_REQUIRED). Enabling on Ampere resets the
    card, which is why it must be idle.
    """
    if gpu.mig_pending == gpu.mig_current:
        return codes.SUCCESS
    if gpu.reset_required:
        return codes.RESET_REQUIRED
    if gpu.busy() or (gpu.mig_pending == 0 and gpu.instances):
        return codes.IN_USE
    gpu.mig_current = gpu.mig_pending
    gpu.instances = []
    return codes.SUCCESS
