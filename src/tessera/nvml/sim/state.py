"""The simulated node: its cards, MIG mode, GPU/compute instances, processes, events and faults.

This is what a real GPU keeps in its driver: it outlives any process that looks at it. The state
is plain data (pydantic models, strict: unknown fields are refused) so it can live in a file that
every process on a node shares (see :mod:`tessera.nvml.sim.store`), and so a test can read or
write it directly. The rules of what NVML allows live in :mod:`tessera.nvml.sim.fakelib`, which
checks placements through the same :mod:`tessera.core.layout` the planner uses.
"""

from __future__ import annotations

import uuid as uuid_lib
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tessera.core import catalogue

__all__ = [
    "FORMAT_VERSION",
    "NodeState",
    "SimComputeInstance",
    "SimEvent",
    "SimFault",
    "SimGpu",
    "SimGpuInstance",
    "SimProcess",
    "new_node_state",
]

FORMAT_VERSION = 1
"""Version of the state-file format this code reads and writes."""

_NAMESPACE = uuid_lib.UUID("5f1e3a9c-2b47-4c1d-9e3a-6a7d2c9b8e10")


def _derived_uuid(*parts: object) -> str:
    """A stable version-5 UUID, as R470+ drivers print MIG UUIDs (version nibble 5)."""
    return str(uuid_lib.uuid5(_NAMESPACE, "/".join(str(p) for p in parts)))


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=False)


class SimProcess(_Strict):
    """A CUDA process: on the whole GPU (``gi``/``ci`` unset) or on one MIG device."""

    pid: int = Field(ge=1)
    used_mib: int = Field(default=0, ge=0)
    gi: int | None = None
    ci: int | None = None
    mps: bool = False
    """An MPS client (reported by ``nvmlDeviceGetMPSComputeRunningProcesses``)."""


class SimComputeInstance(_Strict):
    id: int = Field(ge=0)
    profile: int = Field(ge=0, description="NVML_COMPUTE_INSTANCE_PROFILE_* value")
    start: int = Field(ge=0)
    size: int = Field(ge=1)
    uuid: str = Field(pattern=r"^MIG-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


class SimGpuInstance(_Strict):
    id: int = Field(ge=0)
    profile_id: int = Field(ge=0, description="device-specific profile id (info.id)")
    start: int = Field(ge=0)
    size: int = Field(ge=1)
    compute_instances: list[SimComputeInstance] = Field(default_factory=list)


class SimGpu(_Strict):
    index: int = Field(ge=0)
    model: str = Field(description="catalogue name (MIG-capable or whole), or 'none' for a card "
                       "the catalogue lacks (then product_name and memory_mib)")
    uuid: str = Field(pattern=r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
    product_name: str | None = None
    memory_mib: int | None = Field(default=None, ge=1)
    pci_device_id: int | None = None
    pci_bus_id: str | None = None
    mig_current: int = Field(default=0, ge=0, le=1)
    mig_pending: int = Field(default=0, ge=0, le=1)
    reset_required: bool = False
    """Pass-through: a mode change cannot take effect without a reboot (RESET_REQUIRED)."""
    lost: bool = False
    """Fallen off the bus: every call on it fails with GPU_IS_LOST."""
    instances: list[SimGpuInstance] = Field(default_factory=list)
    processes: list[SimProcess] = Field(default_factory=list)

    @model_validator(mode="after")
    def _known_model(self) -> SimGpu:
        if self.model != "none":
            catalogue.card(self.model, field_name=f"gpus[{self.index}].model")
        elif self.product_name is None or self.memory_mib is None:
            raise ValueError("a card with model 'none' needs product_name and memory_mib")
        return self

    def card(self) -> catalogue.Card | None:
        """The catalogued card (MIG-capable or not); None for a card given only by name."""
        return None if self.model == "none" else catalogue.card(self.model)

    def catalogue_model(self) -> catalogue.GpuModel | None:
        """The MIG model, or None for a card without MIG."""
        found = self.card()
        return found if isinstance(found, catalogue.GpuModel) else None

    @property
    def name(self) -> str:
        if self.product_name is not None:
            return self.product_name
        found = self.card()
        assert found is not None
        return found.product_names[0]

    @property
    def total_memory_mib(self) -> int:
        if self.memory_mib is not None:
            return self.memory_mib
        found = self.card()
        assert found is not None
        return found.total_memory_mib

    @property
    def device_id(self) -> int:
        if self.pci_device_id is not None:
            return self.pci_device_id
        found = self.card()
        return found.pci_device_ids[0] if found is not None else 0

    @property
    def bus_id(self) -> str:
        return self.pci_bus_id or f"00000000:{0x17 + self.index * 0x10:02X}:00.0"

    def gpu_instance(self, gi_id: int) -> SimGpuInstance | None:
        for instance in self.instances:
            if instance.id == gi_id:
                return instance
        return None

    def busy(self) -> bool:
        return bool(self.processes)


class SimEvent(_Strict):
    seq: int = Field(ge=1)
    gpu: int = Field(ge=0)
    type: int = Field(default=0x8, description="nvmlEventType*; 0x8 = XidCriticalError")
    data: int = Field(ge=0, description="the Xid")
    gi: int | None = None
    ci: int | None = None


MUTATING_FUNCTIONS = frozenset({
    "nvmlDeviceSetMigMode",
    "nvmlDeviceCreateGpuInstance",
    "nvmlDeviceCreateGpuInstanceWithPlacement",
    "nvmlGpuInstanceCreateComputeInstance",
    "nvmlGpuInstanceCreateComputeInstanceWithPlacement",
    "nvmlComputeInstanceDestroy",
    "nvmlGpuInstanceDestroy",
})
"""The calls that change a card; ``function: mutating`` in a fault matches any of them."""


class SimFault(_Strict):
    """Make NVML calls misbehave: skip ``after`` matching calls, then act on ``times`` of them.

    ``action`` ``fail`` returns ``code`` instead of running the call; ``kill-before`` and
    ``kill-after`` SIGKILL the calling process just before the call takes effect or just after
    (before it returns), which is how crash tests stop an agent between two steps.
    """

    function: str = Field(description="an NVML symbol, or 'mutating' for any call that "
                          "changes a card")
    code: int = Field(default=999, ge=1)
    after: int = Field(default=0, ge=0)
    times: int = Field(default=1, ge=1)
    action: Literal["fail", "kill-before", "kill-after"] = "fail"

    def matches(self, name: str) -> bool:
        return self.function == name or (
            self.function == "mutating" and name in MUTATING_FUNCTIONS)


class NodeState(_Strict):
    version: int = FORMAT_VERSION
    node: str = "sim-node"
    driver_version: str = "570.133.20"
    cuda_driver_version: int = 12080
    gpus: list[SimGpu] = Field(default_factory=list)
    events: list[SimEvent] = Field(default_factory=list)
    next_event_seq: int = Field(default=1, ge=1)
    serial: int = Field(default=0, ge=0, description="counter that keeps MIG UUIDs unique")
    faults: list[SimFault] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> NodeState:
        if self.version > FORMAT_VERSION:
            raise ValueError(
                f"format version {self.version} is newer than this tessera reads "
                f"({FORMAT_VERSION}); upgrade tessera"
            )
        indices = [gpu.index for gpu in self.gpus]
        if sorted(indices) != list(range(len(indices))):
            raise ValueError(f"gpu indices must be 0..{len(indices) - 1}, got {indices}")
        self.gpus.sort(key=lambda gpu: gpu.index)
        uuids = [gpu.uuid for gpu in self.gpus]
        if len(set(uuids)) != len(uuids):
            raise ValueError("gpu uuids must be unique")
        return self

    def gpu(self, index: int) -> SimGpu | None:
        return self.gpus[index] if 0 <= index < len(self.gpus) else None

    def gpu_by_uuid(self, uuid: str) -> SimGpu | None:
        for gpu in self.gpus:
            if gpu.uuid == uuid:
                return gpu
        return None

    def new_mig_uuid(self, gpu: SimGpu, gi_id: int, ci_id: int) -> str:
        self.serial += 1
        return "MIG-" + _derived_uuid(gpu.uuid, gi_id, ci_id, self.serial)

    def post_event(self, gpu: int, data: int, gi: int | None = None, ci: int | None = None,
                   event_type: int = 0x8) -> SimEvent:
        event = SimEvent(seq=self.next_event_seq, gpu=gpu, type=event_type, data=data, gi=gi,
                         ci=ci)
        self.next_event_seq += 1
        self.events.append(event)
        del self.events[:-256]  # a bounded ring, like the driver's event queue
        return event


def new_node_state(node: str, models: list[str], mig: bool = True) -> NodeState:
    """A node whose cards are of the given catalogue models, all idle and empty; ``mig`` turns
    MIG mode on for the cards that have it (a card without MIG never has it on)."""
    gpus = [
        SimGpu(
            index=i,
            model=name,
            uuid="GPU-" + _derived_uuid(node, "gpu", i),
            mig_current=int(mig and isinstance(catalogue.card(name), catalogue.GpuModel)),
            mig_pending=int(mig and isinstance(catalogue.card(name), catalogue.GpuModel)),
        )
        for i, name in enumerate(models)
    ]
    return NodeState(node=node, gpus=gpus)
