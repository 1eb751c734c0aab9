"""What the agent reports: the cards as they really are, and conditions an admin can act on.

Conditions (each True/False with a reason and a message):

- ``Applied``: the cards match the spec; False with reason ``Invalid``, ``Blocked``,
  ``Pending`` or ``InProgress`` says why not.
- ``Invalid``: part of the spec cannot be applied to this node; the message names the field.
- ``Blocked``: slices or GPUs in use stop part of the spec; the message names the pods.
- ``ResetRequired``: a MIG mode change waits for a GPU reset or a reboot.
- ``Degraded``: a GPU had a critical Xid or fell off the bus.

``lastTransitionTime`` changes only when a condition's status does, as Kubernetes expects.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Literal

from tessera.agent.apply import Outcome
from tessera.agent.observation import GpuObservation, NodeObservation
from tessera.agent.reconcile import NodePlan, TimesliceTarget
from tessera.api.v1alpha1 import (
    Condition,
    ConditionType,
    GpuMode,
    MigModeStatus,
    MpsStatus,
    NodePartitionStatus,
    ObservedGpu,
    ObservedSlice,
    TimesliceStatus,
)

__all__ = ["build_status", "dra_status", "observed_gpu"]

NVML_RESET_REQUIRED = 16


def observed_gpu(gpu: GpuObservation, mps: MpsStatus | None,
                 timeslice: TimesliceTarget | None = None,
                 inner_mps: Mapping[str, MpsStatus] | None = None) -> ObservedGpu:
    """``inner_mps``: the daemons running inside this GPU's MIG devices, by MIG UUID."""
    inner_mps = inner_mps or {}
    info = gpu.info
    mig = None if info.mig_current is None else MigModeStatus(
        current=bool(info.mig_current), pending=bool(info.mig_pending))
    mode: GpuMode = "mig" if info.mig_current else (
        "mps" if mps is not None else ("timeslice" if timeslice is not None else "none"))
    return ObservedGpu(
        index=info.index,
        uuid=info.uuid or f"lost-gpu-{info.index}",
        name=info.name,
        model=info.model,
        pci_device_id=f"0x{info.pci_device_id:08X}" if info.pci_device_id else None,
        mig_mode=mig,
        mode=mode,
        slices=[
            ObservedSlice(profile=i.profile, start=i.start, gpu_instance_id=i.gi_id,
                          uuid=i.mig_uuid, allocated=bool(i.pods), pods=list(i.pods),
                          processes=i.processes,
                          mps=inner_mps.get(i.mig_uuid) if i.mig_uuid else None)
            for i in gpu.instances
        ],
        mps=mps,
        timeslice=None if timeslice is None or info.mig_current else TimesliceStatus(
            replicas=timeslice.replicas, resource=timeslice.resource),
        healthy=gpu.healthy,
        last_xid=gpu.last_xid,
    )


def _condition(kind: ConditionType, true: bool, reason: str, message: str, *, now: str,
               generation: int | None, previous: Mapping[ConditionType, Condition]) -> Condition:
    status: Literal["True", "False"] = "True" if true else "False"
    before = previous.get(kind)
    since = before.last_transition_time if before and before.status == status else now
    return Condition(type=kind, status=status, reason=reason, message=message[:32000],
                     last_transition_time=since, observed_generation=generation)


def _unhealthy(observation: NodeObservation, consequence: str = "") -> list[str]:
    """The Degraded condition's message parts, one per unhealthy GPU."""
    return [f"GPU {g.index} " + ("has fallen off the bus" if g.info.lost else
                                 f"is unhealthy (last Xid {g.last_xid}){consequence}")
            for g in observation.gpus if not g.healthy]


def build_status(
    *,
    generation: int | None,
    plan_id: str | None,
    observation: NodeObservation,
    plan: NodePlan,
    outcomes: Sequence[Outcome],
    previous: NodePartitionStatus | None,
    now: str,
    mps: Mapping[str, MpsStatus] | None = None,
    timeslices: Mapping[str, TimesliceTarget] | None = None,
) -> NodePartitionStatus:
    mps = mps or {}
    timeslices = timeslices or {}
    invalid = [m for g in plan.gpus for m in g.invalid]
    blocked = [m for g in plan.gpus for m in g.blocked]
    blocked += [o.message for o in outcomes if o.status == "blocked"]
    reset = [o.message for o in outcomes
             if o.status == "pending" and o.code == NVML_RESET_REQUIRED]
    pending = [o.message for o in outcomes
               if o.status == "pending" and o.code != NVML_RESET_REQUIRED]
    failed = [o.message for o in outcomes if o.status == "failed"]
    unhealthy = _unhealthy(observation)
    before = {c.type: c for c in (previous.conditions if previous else [])}
    blocked = list(dict.fromkeys(blocked + pending))

    settled = plan.settled and not outcomes_unsettled(outcomes)
    if settled:
        applied = (True, "Applied", f"the cards match the spec ({len(plan.gpus)} GPU(s))")
    elif invalid:
        applied = (False, "Invalid", "part of the spec is invalid; see condition Invalid")
    elif blocked:
        applied = (False, "Blocked", "part of the spec waits for slices in use; see Blocked")
    elif reset:
        applied = (False, "Pending", "a MIG mode change needs a GPU reset; see ResetRequired")
    else:
        applied = (False, "InProgress", "; ".join(failed) or "steps remain; retrying")

    def make(kind: ConditionType, true: bool, reason: str, message: str) -> Condition:
        return _condition(kind, true, reason, message, now=now, generation=generation,
                          previous=before)

    conditions = [
        make("Applied", *applied),
        make("Invalid", bool(invalid), "InvalidSpec" if invalid else "SpecValid",
             "; ".join(invalid) or "every GPU in the spec can be applied"),
        make("Blocked", bool(blocked), "InUse" if blocked else "NotBlocked",
             "; ".join(blocked) or "nothing in use stands in the way"),
        make("ResetRequired", bool(reset), "ResetRequired" if reset else "NoResetNeeded",
             "; ".join(reset) or "no GPU waits for a reset"),
        make("Degraded", bool(unhealthy), "UnhealthyGpu" if unhealthy else "Healthy",
             "; ".join(unhealthy) or "every GPU is healthy"),
    ]
    return NodePartitionStatus(
        observed_generation=generation,
        applied_plan_id=plan_id,
        gpus=[observed_gpu(g, mps.get(g.info.uuid), timeslices.get(g.info.uuid), mps)
              for g in observation.gpus],
        conditions=conditions,
    )


def outcomes_unsettled(outcomes: Sequence[Outcome]) -> bool:
    """Outcomes of the last round that leave work: anything but done means not settled."""
    return any(not o.ok for o in outcomes)


def dra_status(*, generation: int | None, observation: NodeObservation,
               claims: Mapping[tuple[str, str, int], str], published: bool, problem: str,
               previous: NodePartitionStatus | None, now: str,
               mps: Mapping[str, MpsStatus] | None = None) -> NodePartitionStatus:
    """The status of a DRA node: the cards as they are, each slice with the claim it was made
    for (``claims``: (GPU uuid, profile, start) -> ``namespace/name`` of the claim), and
    whether the pool is published. There is no layout to apply, so ``Applied`` says whether the
    node's ResourceSlices are current."""
    gpus = []
    for gpu in observation.gpus:
        instances = tuple(
            dataclasses.replace(i, pods=(claims[key],)) if (
                key := (gpu.info.uuid, i.profile, i.start)) in claims else i
            for i in gpu.instances)
        gpus.append(observed_gpu(dataclasses.replace(gpu, instances=instances),
                                 (mps or {}).get(gpu.info.uuid)))
    unhealthy = _unhealthy(observation, "; its devices are tainted")
    before = {c.type: c for c in (previous.conditions if previous else [])}

    def make(kind: ConditionType, true: bool, reason: str, message: str) -> Condition:
        return _condition(kind, true, reason, message, now=now, generation=generation,
                          previous=before)

    return NodePartitionStatus(
        api="dra", observed_generation=generation, gpus=gpus,
        conditions=[
            make("Applied", published, "Published" if published else "PublishFailed",
                 "the node's ResourceSlices offer every placement of its MIG GPUs" if published
                 else problem),
            make("Degraded", bool(unhealthy), "UnhealthyGpu" if unhealthy else "Healthy",
                 "; ".join(unhealthy) or "every GPU is healthy"),
        ])
