"""The C signature of every NVML entry point the simulator models: one table, read by both doors.

The simulator's semantics live once, in :class:`~tessera.nvml.sim.fakelib.FakeNvmlLib`. Two doors
lead to it:

* the in-process one (``--nvml sim:FILE``): pynvml calls ``FakeNvmlLib`` with ctypes arguments;
* ``libnvidia-ml.so.1`` for simulated GPUs: a C library that any program loads as it loads the
  driver's (``dlopen("libnvidia-ml.so.1")``), which forwards each call over a Unix socket to
  :mod:`tessera.nvml.sim.server`, where ``FakeNvmlLib`` answers it.

The table below says, per symbol, what each argument is: a value, an opaque handle, a string, or a
pointer the callee reads, writes or both, with the ctypes type pynvml gives it. From it
``tools/nvml/gen_shim.py`` writes the library's C source with the prototypes NVIDIA's ``nvml.h``
declares (a signature that disagrees with the header does not compile) and, for every struct, a
``_Static_assert`` that pynvml's ctypes layout (size and each field's offset) is the header's. The
server reads the same table to turn the bytes on the wire back into the ctypes objects pynvml
would have passed. A symbol missing here is missing from the library, as on an older driver:
a client's ``dlsym`` finds nothing rather than a stub that claims success.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Literal

import pynvml

__all__ = ["SYMBOLS", "Arg", "Symbol", "structs"]

Kind = Literal["value", "handle", "cstr", "in", "inout", "out", "buffer", "array"]


@dataclass(frozen=True)
class Arg:
    """One parameter of an NVML function.

    ``value``: an integer passed by value (``unsigned int``, an enum, ``unsigned long long``).
    ``handle``: an opaque pointer passed by value (``nvmlDevice_t`` ...); only the server
    resolves it. ``cstr``: a NUL-terminated input string. ``in``/``inout``/``out``: a pointer to
    one ``ctype`` the callee reads, reads and writes, or only writes. ``buffer``: a ``char *``
    of the length in argument ``count``. ``array``: a pointer to ``ctype`` elements; argument
    ``count`` is the ``unsigned int *`` that holds the number written (and, when it is
    ``inout``, the caller's capacity on entry); ``capacity`` is the number the server may write
    when the caller gives none (NVML's contract: "at least instanceCount" of the profile).
    """

    name: str
    kind: Kind
    c_type: str
    ctype: Any = None
    count: int = -1
    capacity: int = 0

    @property
    def is_pointer(self) -> bool:
        return self.kind in ("in", "inout", "out", "buffer", "array")


@dataclass(frozen=True)
class Symbol:
    name: str
    args: tuple[Arg, ...]


def _u32(name: str) -> Arg:
    return Arg(name, "value", "unsigned int")


def _device(name: str = "device") -> Arg:
    return Arg(name, "handle", "nvmlDevice_t")


def _gi(name: str = "gpuInstance") -> Arg:
    return Arg(name, "handle", "nvmlGpuInstance_t")


def _ci(name: str = "computeInstance") -> Arg:
    return Arg(name, "handle", "nvmlComputeInstance_t")


def _out(name: str, c_type: str, ctype: Any) -> Arg:
    return Arg(name, "out", c_type, ctype)


def _out_u32(name: str) -> Arg:
    return _out(name, "unsigned int *", ctypes.c_uint)


def _out_handle(name: str, c_type: str) -> Arg:
    return _out(name, c_type, ctypes.c_void_p)


_MAX_INSTANCES = 8
"""More than any profile's instanceCount (7), the most GetGpuInstances/GetComputeInstances
write."""


def _symbols(*entries: Symbol) -> dict[str, Symbol]:
    return {entry.name: entry for entry in entries}


SYMBOLS: dict[str, Symbol] = _symbols(
    Symbol("nvmlInit_v2", ()),
    Symbol("nvmlInitWithFlags", (_u32("flags"),)),
    Symbol("nvmlShutdown", ()),
    Symbol("nvmlSystemGetDriverVersion",
           (Arg("version", "buffer", "char *", count=1), _u32("length"))),
    Symbol("nvmlSystemGetNVMLVersion",
           (Arg("version", "buffer", "char *", count=1), _u32("length"))),
    Symbol("nvmlSystemGetCudaDriverVersion",
           (_out("cudaDriverVersion", "int *", ctypes.c_int),)),
    Symbol("nvmlDeviceGetCount_v2", (_out_u32("deviceCount"),)),
    Symbol("nvmlDeviceGetHandleByIndex_v2",
           (_u32("index"), _out_handle("device", "nvmlDevice_t *"))),
    Symbol("nvmlDeviceGetHandleByUUID",
           (Arg("uuid", "cstr", "const char *"), _out_handle("device", "nvmlDevice_t *"))),
    Symbol("nvmlDeviceGetHandleByPciBusId_v2",
           (Arg("pciBusId", "cstr", "const char *"), _out_handle("device", "nvmlDevice_t *"))),
    Symbol("nvmlDeviceGetName",
           (_device(), Arg("name", "buffer", "char *", count=2), _u32("length"))),
    Symbol("nvmlDeviceGetUUID",
           (_device(), Arg("uuid", "buffer", "char *", count=2), _u32("length"))),
    Symbol("nvmlDeviceGetIndex", (_device(), _out_u32("index"))),
    Symbol("nvmlDeviceGetMinorNumber", (_device(), _out_u32("minorNumber"))),
    Symbol("nvmlDeviceGetAttributes_v2",
           (_device(), _out("attributes", "nvmlDeviceAttributes_t *",
                            pynvml.c_nvmlDeviceAttributes))),
    Symbol("nvmlDeviceGetCudaComputeCapability",
           (_device(), _out("major", "int *", ctypes.c_int), _out("minor", "int *", ctypes.c_int))),
    Symbol("nvmlDeviceGetPciInfo_v3",
           (_device(), _out("pci", "nvmlPciInfo_t *", pynvml.nvmlPciInfo_t))),
    Symbol("nvmlDeviceGetMemoryInfo",
           (_device(), _out("memory", "nvmlMemory_t *", pynvml.c_nvmlMemory_t))),
    Symbol("nvmlDeviceGetComputeRunningProcesses_v3",
           (_device(), Arg("infoCount", "inout", "unsigned int *", ctypes.c_uint),
            Arg("infos", "array", "nvmlProcessInfo_t *", pynvml.c_nvmlProcessInfo_v3_t,
                count=1))),
    Symbol("nvmlDeviceGetMPSComputeRunningProcesses_v3",
           (_device(), Arg("infoCount", "inout", "unsigned int *", ctypes.c_uint),
            Arg("infos", "array", "nvmlProcessInfo_t *", pynvml.c_nvmlProcessInfo_v3_t,
                count=1))),
    Symbol("nvmlDeviceGetMigMode",
           (_device(), _out_u32("currentMode"), _out_u32("pendingMode"))),
    Symbol("nvmlDeviceSetMigMode",
           (_device(), _u32("mode"), _out("activationStatus", "nvmlReturn_t *", ctypes.c_int))),
    Symbol("nvmlDeviceIsMigDeviceHandle", (_device(), _out_u32("isMigDevice"))),
    Symbol("nvmlDeviceGetMaxMigDeviceCount", (_device(), _out_u32("count"))),
    Symbol("nvmlDeviceGetMigDeviceHandleByIndex",
           (_device(), _u32("index"), _out_handle("migDevice", "nvmlDevice_t *"))),
    Symbol("nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
           (_device("migDevice"), _out_handle("device", "nvmlDevice_t *"))),
    Symbol("nvmlDeviceGetGpuInstanceId", (_device(), _out_u32("id"))),
    Symbol("nvmlDeviceGetComputeInstanceId", (_device(), _out_u32("id"))),
    Symbol("nvmlDeviceGetGpuInstanceProfileInfo",
           (_device(), _u32("profile"),
            _out("info", "nvmlGpuInstanceProfileInfo_t *", pynvml.c_nvmlGpuInstanceProfileInfo_t))),
    Symbol("nvmlDeviceGetGpuInstanceProfileInfoV",
           (_device(), _u32("profile"),
            Arg("info", "inout", "nvmlGpuInstanceProfileInfo_v2_t *",
                pynvml.c_nvmlGpuInstanceProfileInfo_v2_t))),
    Symbol("nvmlDeviceGetGpuInstanceProfileInfoByIdV",
           (_device(), _u32("profileId"),
            Arg("info", "inout", "nvmlGpuInstanceProfileInfo_v2_t *",
                pynvml.c_nvmlGpuInstanceProfileInfo_v2_t))),
    Symbol("nvmlDeviceGetGpuInstancePossiblePlacements_v2",
           (_device(), _u32("profileId"),
            Arg("placements", "array", "nvmlGpuInstancePlacement_t *",
                pynvml.c_nvmlGpuInstancePlacement_t, count=3),
            Arg("count", "inout", "unsigned int *", ctypes.c_uint))),
    Symbol("nvmlDeviceGetGpuInstanceRemainingCapacity",
           (_device(), _u32("profileId"), _out_u32("count"))),
    Symbol("nvmlDeviceCreateGpuInstance",
           (_device(), _u32("profileId"), _out_handle("gpuInstance", "nvmlGpuInstance_t *"))),
    Symbol("nvmlDeviceCreateGpuInstanceWithPlacement",
           (_device(), _u32("profileId"),
            Arg("placement", "in", "const nvmlGpuInstancePlacement_t *",
                pynvml.c_nvmlGpuInstancePlacement_t),
            _out_handle("gpuInstance", "nvmlGpuInstance_t *"))),
    Symbol("nvmlDeviceGetGpuInstances",
           (_device(), _u32("profileId"),
            Arg("gpuInstances", "array", "nvmlGpuInstance_t *", ctypes.c_void_p, count=3,
                capacity=_MAX_INSTANCES),
            _out_u32("count"))),
    Symbol("nvmlDeviceGetGpuInstanceById",
           (_device(), _u32("id"), _out_handle("gpuInstance", "nvmlGpuInstance_t *"))),
    Symbol("nvmlGpuInstanceGetInfo",
           (_gi(), _out("info", "nvmlGpuInstanceInfo_t *", pynvml.c_nvmlGpuInstanceInfo_t))),
    Symbol("nvmlGpuInstanceDestroy", (_gi(),)),
    Symbol("nvmlGpuInstanceGetComputeInstanceProfileInfo",
           (_gi(), _u32("profile"), _u32("engProfile"),
            _out("info", "nvmlComputeInstanceProfileInfo_t *",
                 pynvml.c_nvmlComputeInstanceProfileInfo_t))),
    Symbol("nvmlGpuInstanceGetComputeInstanceProfileInfoV",
           (_gi(), _u32("profile"), _u32("engProfile"),
            Arg("info", "inout", "nvmlComputeInstanceProfileInfo_v2_t *",
                pynvml.c_nvmlComputeInstanceProfileInfo_v2_t))),
    Symbol("nvmlGpuInstanceGetComputeInstanceRemainingCapacity",
           (_gi(), _u32("profileId"), _out_u32("count"))),
    Symbol("nvmlGpuInstanceCreateComputeInstance",
           (_gi(), _u32("profileId"),
            _out_handle("computeInstance", "nvmlComputeInstance_t *"))),
    Symbol("nvmlGpuInstanceGetComputeInstances",
           (_gi(), _u32("profileId"),
            Arg("computeInstances", "array", "nvmlComputeInstance_t *", ctypes.c_void_p,
                count=3, capacity=_MAX_INSTANCES),
            _out_u32("count"))),
    Symbol("nvmlGpuInstanceGetComputeInstanceById",
           (_gi(), _u32("id"), _out_handle("computeInstance", "nvmlComputeInstance_t *"))),
    Symbol("nvmlComputeInstanceGetInfo_v2",
           (_ci(), _out("info", "nvmlComputeInstanceInfo_t *",
                        pynvml.c_nvmlComputeInstanceInfo_t))),
    Symbol("nvmlComputeInstanceDestroy", (_ci(),)),
    Symbol("nvmlEventSetCreate", (_out_handle("set", "nvmlEventSet_t *"),)),
    Symbol("nvmlDeviceGetTopologyCommonAncestor",
           (_device("device1"), _device("device2"),
            _out("pathInfo", "nvmlGpuTopologyLevel_t *", ctypes.c_uint))),
    Symbol("nvmlDeviceGetNvLinkState",
           (_device(), _u32("link"), _out("isActive", "nvmlEnableState_t *", ctypes.c_uint))),
    Symbol("nvmlDeviceGetSupportedEventTypes",
           (_device(), _out("eventTypes", "unsigned long long *", ctypes.c_ulonglong))),
    Symbol("nvmlDeviceRegisterEvents",
           (_device(), Arg("eventTypes", "value", "unsigned long long"),
            Arg("set", "handle", "nvmlEventSet_t"))),
    Symbol("nvmlEventSetWait_v2",
           (Arg("set", "handle", "nvmlEventSet_t"),
            _out("data", "nvmlEventData_t *", pynvml.c_nvmlEventData_t), _u32("timeoutms"))),
    Symbol("nvmlEventSetFree", (Arg("set", "handle", "nvmlEventSet_t"),)),
)


def structs() -> dict[str, Any]:
    """Every struct the table passes, by its ``nvml.h`` type name: the layouts to check."""
    found: dict[str, Any] = {}
    for symbol in SYMBOLS.values():
        for arg in symbol.args:
            if arg.ctype is not None and issubclass(arg.ctype, ctypes.Structure):
                c_name = arg.c_type.replace("const ", "").rstrip(" *")
                found[c_name] = arg.ctype
    return found
