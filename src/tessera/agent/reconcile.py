"""Plan the next steps from a NodePartition spec and an observation: pure, so every rule is tested.

The rules that never bend live here:

- a slice the kubelet allocated or that has processes is never destroyed; a spec that needs its
  space gets ``Blocked`` naming the pod, and the rest of that GPU's spec is still applied where
  it fits around the slice;
- MIG mode is switched only on an idle GPU; a change the driver leaves pending is reported;
- bad input (an unknown GPU, profile or placement, an MPS share over the card's memory) is
  ``Invalid`` with the field path, and no step is planned for that GPU;
- GPUs the spec does not mention are left as they are.

The plan covers one *phase*: after a MIG mode switch the card must be observed again before its
slices are planned, so the agent loops observe -> plan -> apply until nothing is left to do.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from tessera.agent.observation import GpuObservation, NodeObservation, ObservedInstance
from tessera.api.v1alpha1 import GpuSpec, NodePartitionSpec
from tessera.core import catalogue, layout
from tessera.core.errors import InvalidInputError
from tessera.core.layout import Slice

__all__ = [
    "CompleteSlice",
    "CreateSlice",
    "DestroySlice",
    "GpuPlan",
    "NodePlan",
    "SetMigMode",
    "SetTimeslice",
    "StartMps",
    "Step",
    "StopMps",
    "StopTimeslice",
    "TimesliceTarget",
    "plan_node",
]


@dataclass(frozen=True)
class SetMigMode:
    gpu: int
    enabled: bool

    def __str__(self) -> str:
        return f"GPU {self.gpu}: {'enable' if self.enabled else 'disable'} MIG mode"


@dataclass(frozen=True)
class CreateSlice:
    gpu: int
    slice: Slice

    def __str__(self) -> str:
        return f"GPU {self.gpu}: create {self.slice}"


@dataclass(frozen=True)
class CompleteSlice:
    """Add the missing compute instance of a GPU instance whose creation was cut short."""

    gpu: int
    gi_id: int
    slice: Slice

    def __str__(self) -> str:
        return f"GPU {self.gpu}: complete {self.slice} (GI {self.gi_id})"


@dataclass(frozen=True)
class DestroySlice:
    gpu: int
    gi_id: int
    slice: Slice
    mig_uuid: str | None

    def __str__(self) -> str:
        return f"GPU {self.gpu}: destroy {self.slice} (GI {self.gi_id})"


@dataclass(frozen=True)
class StartMps:
    gpu: int
    uuid: str
    shares: int
    thread_percentage: int
    memory_mib: int
    resource: str = catalogue.MPS_SHARED_RESOURCE

    def __str__(self) -> str:
        where = f" in {self.uuid}" if self.uuid.startswith("MIG-") else ""
        return (f"GPU {self.gpu}: run MPS{where} with {self.shares} shares of "
                f"{self.thread_percentage}% and {self.memory_mib} MiB")


@dataclass(frozen=True)
class StopMps:
    gpu: int
    uuid: str

    def __str__(self) -> str:
        where = f" in {self.uuid}" if self.uuid.startswith("MIG-") else ""
        return f"GPU {self.gpu}: stop MPS{where}"


@dataclass(frozen=True)
class TimesliceTarget:
    replicas: int
    resource: str


@dataclass(frozen=True)
class SetTimeslice:
    """Advertise a whole GPU as time-slicing replicas; nothing on the card changes."""

    gpu: int
    uuid: str
    replicas: int
    resource: str

    def __str__(self) -> str:
        return f"GPU {self.gpu}: time-slice as {self.replicas} x {self.resource}"


@dataclass(frozen=True)
class StopTimeslice:
    gpu: int
    uuid: str

    def __str__(self) -> str:
        return f"GPU {self.gpu}: stop time-slicing"


Step = (SetMigMode | CreateSlice | CompleteSlice | DestroySlice | StartMps | StopMps
        | SetTimeslice | StopTimeslice)


@dataclass(frozen=True)
class MpsTarget:
    shares: int
    thread_percentage: int
    memory_mib: int
    resource: str = catalogue.MPS_SHARED_RESOURCE


@dataclass
class GpuPlan:
    """The steps for one GPU, and why it cannot (yet) look like its spec."""

    spec_index: int
    gpu: int | None
    steps: list[Step] = field(default_factory=list)
    invalid: list[str] = field(default_factory=list)
    blocked: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    mps: MpsTarget | None = None
    timeslice: TimesliceTarget | None = None

    @property
    def settled(self) -> bool:
        return not self.steps and not self.invalid and not self.blocked and not self.pending


@dataclass
class NodePlan:
    gpus: list[GpuPlan] = field(default_factory=list)

    @property
    def steps(self) -> list[Step]:
        return [step for gpu in self.gpus for step in gpu.steps]

    @property
    def settled(self) -> bool:
        return all(gpu.settled for gpu in self.gpus)


def _resolve(spec: GpuSpec, where: str, observed: NodeObservation) -> GpuObservation:
    if spec.index is not None:
        found = observed.gpu(spec.index)
        if found is None:
            raise InvalidInputError(
                f"{where}.index", f"this node has no GPU {spec.index}",
                [str(g.index) for g in observed.gpus])
        return found
    assert spec.uuid is not None
    found = observed.by_uuid(spec.uuid)
    if found is None:
        raise InvalidInputError(f"{where}.uuid", f"this node has no GPU {spec.uuid}",
                                [g.info.uuid for g in observed.gpus])
    return found


def _mps_target(spec: GpuSpec, where: str, gpu: GpuObservation) -> MpsTarget:
    assert spec.mps is not None
    shares = spec.mps.shares
    threads = spec.mps.thread_percentage or max(1, 100 // shares)
    memory = spec.mps.memory_mi_b or gpu.info.memory_total_mib // shares
    if memory * shares > gpu.info.memory_total_mib:
        raise InvalidInputError(
            f"{where}.mps.memoryMiB",
            f"{shares} shares x {memory} MiB exceed GPU {gpu.index}'s "
            f"{gpu.info.memory_total_mib} MiB; lower memoryMiB or shares")
    return MpsTarget(shares, threads, memory,
                     spec.mps.resource or catalogue.MPS_SHARED_RESOURCE)


def _plan_mig(plan: GpuPlan, gpu: GpuObservation, model: catalogue.GpuModel,
              target: list[Slice]) -> None:
    if not gpu.info.mig_current:
        if gpu.busy:
            plan.blocked.append(
                f"GPU {gpu.index} must be idle to enable MIG mode, but is used by "
                f"{gpu.users()}")
        else:
            plan.steps.append(SetMigMode(gpu.index, True))
        return
    instances = list(gpu.instances)
    kept: list[Slice] = []
    in_use: list[ObservedInstance] = [i for i in instances if i.in_use]
    for instance in in_use:
        kept.append(instance.slice)
        if instance.slice not in target:
            plan.blocked.append(
                f"{instance.slice} ({instance.mig_uuid}) on GPU {gpu.index} is in use by "
                f"{instance.users()}; it stays until they finish")
    achievable = list(kept)
    for wanted in target:
        if wanted in achievable:
            continue
        conflict = layout.conflict_with(model, achievable, wanted)
        if conflict is None:
            achievable.append(wanted)
            continue
        holders = [i for i in in_use if i.slice not in target]
        plan.blocked.append(
            f"{wanted} on GPU {gpu.index} waits: {conflict.message}"
            + (f" (held by {'; '.join(i.users() for i in holders)})" if holders else ""))
    current = [i.slice for i in instances]
    diff = layout.diff_layouts(model, current, achievable)
    by_slice = {i.slice: i for i in instances}
    for item in diff.destroy:
        instance = by_slice[item]
        plan.steps.append(DestroySlice(gpu.index, instance.gi_id, item, instance.mig_uuid))
    for item in diff.keep:
        instance = by_slice[item]
        if not instance.complete:
            plan.steps.append(CompleteSlice(gpu.index, instance.gi_id, item))
    for item in diff.create:
        plan.steps.append(CreateSlice(gpu.index, item))


def _plan_slice_mps(plan: GpuPlan, spec: GpuSpec, where: str, gpu: GpuObservation, *,
                    model: catalogue.GpuModel, mps_running: Mapping[str, MpsTarget]) -> None:
    """MPS daemons inside MIG devices: started once the slice is complete, restarted with new
    settings only when no pod holds a share, and stopped before their slice is destroyed or
    when the spec no longer asks for them (a slice running MPS is in use)."""
    wanted: dict[Slice, tuple[int, MpsTarget]] = {}
    for position, item in enumerate(spec.slices):
        if item.mps is None:
            continue
        profile = model.profile(item.profile)
        shares = item.mps.shares
        memory = item.mps.memory_mi_b or profile.memory_mib // shares
        if memory * shares > profile.memory_mib:
            raise InvalidInputError(
                f"{where}.slices[{position}].mps.memoryMiB",
                f"{shares} shares x {memory} MiB exceed {item.profile}'s {profile.memory_mib} "
                "MiB; lower memoryMiB or shares")
        threads = item.mps.thread_percentage or max(1, 100 // shares)
        wanted[Slice(item.profile, item.start)] = (position, MpsTarget(shares, threads, memory))
    destroying = {s.slice for s in plan.steps if isinstance(s, DestroySlice)}
    for instance in gpu.instances:
        uuid = instance.mig_uuid
        if uuid is None or uuid not in mps_running or instance.slice in wanted or (
                instance.slice in destroying):
            continue
        if instance.pods:
            plan.blocked.append(f"{instance.slice} ({uuid}) on GPU {gpu.index} runs MPS for "
                                f"{', '.join(instance.pods)}")
        else:
            plan.steps.append(StopMps(gpu.index, uuid))
    for instance in gpu.instances:
        if instance.slice not in wanted or not instance.complete or (
                instance.slice in destroying):
            continue
        assert instance.mig_uuid is not None
        _, target = wanted[instance.slice]
        running = mps_running.get(instance.mig_uuid)
        if running == target:
            continue
        if running is not None and instance.pods:
            plan.blocked.append(
                f"{instance.slice} on GPU {gpu.index}: new MPS settings wait until no pod "
                f"holds a share ({', '.join(instance.pods)})")
            continue
        plan.steps.append(StartMps(gpu.index, instance.mig_uuid, target.shares,
                                   target.thread_percentage, target.memory_mib))


def _stop_mps_before_destroy(plan: GpuPlan, mps_running: Mapping[str, MpsTarget]) -> None:
    """A MIG device running MPS is destroyed only once its daemon is down: this round stops
    the daemons, the next destroys (a slice whose pods hold shares is in use and kept)."""
    stops: list[Step] = [StopMps(s.gpu, s.mig_uuid) for s in plan.steps
                         if isinstance(s, DestroySlice) and s.mig_uuid in mps_running
                         and s.mig_uuid is not None]
    if stops:
        plan.steps[:] = stops


def _plan_whole(plan: GpuPlan, gpu: GpuObservation) -> bool:
    """Take the GPU out of MIG mode; True once it is whole."""
    if gpu.info.mig_current is None or not gpu.info.mig_current:
        return True
    in_use = [i for i in gpu.instances if i.in_use]
    for instance in in_use:
        plan.blocked.append(
            f"{instance.slice} ({instance.mig_uuid}) on GPU {gpu.index} is in use by "
            f"{instance.users()}; MIG mode stays on until they finish")
    for instance in gpu.instances:
        if not instance.in_use:
            plan.steps.append(DestroySlice(gpu.index, instance.gi_id, instance.slice,
                                           instance.mig_uuid))
    if not in_use and not plan.steps:
        plan.steps.append(SetMigMode(gpu.index, False))
    return False


def plan_gpu(spec_index: int, spec: GpuSpec, observed: NodeObservation,
             mps_running: Mapping[str, MpsTarget] | None = None,
             timesliced: Mapping[str, TimesliceTarget] | None = None) -> GpuPlan:
    """``mps_running``: the settings of each GPU's running MPS daemon, by GPU UUID;
    ``timesliced``: each time-sliced GPU's replicas, by GPU UUID."""
    mps_running = mps_running or {}
    timesliced = timesliced or {}
    where = f"spec.gpus[{spec_index}]"
    plan = GpuPlan(spec_index=spec_index, gpu=spec.index)
    try:
        gpu = _resolve(spec, where, observed)
    except InvalidInputError as exc:
        plan.invalid.append(str(exc))
        return plan
    plan.gpu = gpu.index
    if gpu.info.lost:
        plan.blocked.append(f"GPU {gpu.index} has fallen off the bus; nothing can be applied")
        return plan
    model: catalogue.GpuModel | None = None
    target: list[Slice] = []
    try:
        if spec.mode == "mig":
            model = catalogue.find_model(gpu.info.name, gpu.info.pci_device_id)
            if model is None:
                raise InvalidInputError(
                    f"{where}.mode", f"GPU {gpu.index} is a {gpu.info.name}, which cannot do "
                    "MIG; use mode mps or none", ["mps", "none"])
            target = [Slice(s.profile, s.start) for s in spec.slices]
            layout.check_layout(model, target, field=f"{where}.slices")
        mps = _mps_target(spec, where, gpu) if spec.mode == "mps" else None
    except InvalidInputError as exc:
        plan.invalid.append(str(exc))
        return plan
    if spec.mode != "timeslice" and gpu.info.uuid in timesliced:
        if gpu.pods:
            plan.blocked.append(f"GPU {gpu.index} is time-sliced for {', '.join(gpu.pods)}")
            return plan
        plan.steps.append(StopTimeslice(gpu.index, gpu.info.uuid))
        return plan
    if spec.mode != "mps" and gpu.info.uuid in mps_running:
        if gpu.pods:
            plan.blocked.append(f"GPU {gpu.index} runs MPS for {', '.join(gpu.pods)}")
            return plan
        plan.steps.append(StopMps(gpu.index, gpu.info.uuid))
        return plan
    if spec.mode == "mig":
        assert model is not None
        _plan_mig(plan, gpu, model, target)
        try:
            _plan_slice_mps(plan, spec, where, gpu, model=model, mps_running=mps_running)
        except InvalidInputError as exc:
            plan.invalid.append(str(exc))
            plan.steps.clear()
    elif spec.mode == "none":
        _plan_whole(plan, gpu)
    elif spec.mode == "timeslice":
        _plan_timeslice(plan, spec, gpu, timesliced.get(gpu.info.uuid))
    else:
        assert mps is not None
        plan.mps = mps
        running = mps_running.get(gpu.info.uuid)
        if _plan_whole(plan, gpu) and running != mps:
            if running is not None and gpu.pods:
                plan.blocked.append(
                    f"GPU {gpu.index}: new MPS settings wait until no pod holds a share "
                    f"({', '.join(gpu.pods)})")
                return plan
            if running is None and gpu.busy:
                # a process that started outside MPS would keep running outside its limits
                plan.blocked.append(f"GPU {gpu.index} is used by {gpu.users()}; MPS starts "
                                    "once it is idle")
                return plan
            plan.steps.append(StartMps(gpu.index, gpu.info.uuid, mps.shares,
                                       mps.thread_percentage, mps.memory_mib, mps.resource))
    _stop_mps_before_destroy(plan, mps_running)
    return plan


def _plan_timeslice(plan: GpuPlan, spec: GpuSpec, gpu: GpuObservation,
                    running: TimesliceTarget | None) -> None:
    """Replicas on a whole GPU. Advertising more replicas never takes a device from a pod, so
    only a pod holding the GPU whole, or fewer replicas or another name while replicas are
    held, waits; after an agent restart (``running`` unknown) the replicas are offered again
    under the ids their pods hold."""
    assert spec.timeslice is not None
    target = TimesliceTarget(
        spec.timeslice.replicas,
        catalogue.MPS_SHARED_RESOURCE if spec.timeslice.rename_by_default
        else catalogue.WHOLE_GPU_RESOURCE)
    plan.timeslice = target
    if not _plan_whole(plan, gpu) or running == target:
        return
    if gpu.whole_holders:
        plan.blocked.append(f"GPU {gpu.index} is held whole by {', '.join(gpu.whole_holders)}; "
                            "time-slicing waits until it ends")
        return
    if running is not None and gpu.pods and (
            target.resource != running.resource or target.replicas < running.replicas):
        plan.blocked.append(
            f"GPU {gpu.index}: fewer or renamed replicas wait until no pod holds one "
            f"({', '.join(gpu.pods)})")
        return
    plan.steps.append(SetTimeslice(gpu.index, gpu.info.uuid, target.replicas, target.resource))


def plan_node(spec: NodePartitionSpec, observed: NodeObservation,
              mps_running: Mapping[str, MpsTarget] | None = None,
              timesliced: Mapping[str, TimesliceTarget] | None = None) -> NodePlan:
    """One phase of steps for every GPU the spec names; duplicates are Invalid."""
    node = NodePlan()
    claimed: dict[int, int] = {}
    for index, gpu_spec in enumerate(spec.gpus):
        plan = plan_gpu(index, gpu_spec, observed, mps_running, timesliced)
        if plan.gpu is not None and plan.gpu in claimed and not plan.invalid:
            plan.steps.clear()
            plan.blocked.clear()
            plan.invalid.append(
                f"spec.gpus[{index}]: GPU {plan.gpu} is already given by "
                f"spec.gpus[{claimed[plan.gpu]}]; name each GPU once")
        elif plan.gpu is not None:
            claimed.setdefault(plan.gpu, index)
        node.gpus.append(plan)
    return node
