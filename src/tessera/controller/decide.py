"""From a plan to what the controller writes: NodePartition specs, and what each pod is told.

A changed GPU's entry in its node's spec is replaced by the plan's full target layout; every
other entry stays as it was, so an admin's or a policy's settings for other GPUs survive.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field

from tessera.api.v1alpha1 import (
    GpuSpec,
    MpsSpec,
    NodePartition,
    NodePartitionSpec,
    PartitionPolicy,
    SliceSpec,
    TimesliceSpec,
)
from tessera.core.catalogue import WHOLE_GPU_RESOURCE, share_size_gib
from tessera.core.planner import GpuTarget, Plan

__all__ = ["Decision", "PodDecision", "decide", "plan_id"]


@dataclass(frozen=True)
class PodDecision:
    pod: str
    node: str
    requests: tuple[tuple[str, int], ...]
    message: str
    """What the pod's Event says: where its slices are, or are being made."""
    needs_new_slices: bool


@dataclass
class Decision:
    specs: dict[str, NodePartitionSpec] = field(default_factory=dict)
    pods: list[PodDecision] = field(default_factory=list)
    unplaced: list[tuple[str, str]] = field(default_factory=list)
    created: int = 0
    destroyed: int = 0


def plan_id(node: str, spec: NodePartitionSpec, counter: int) -> str:
    digest = hashlib.sha256(spec.model_dump_json().encode()).hexdigest()[:8]
    return f"{node[:40]}-{counter}-{digest}"


def _merged(partition: NodePartition | None, changes: Mapping[int, GpuSpec]) -> list[GpuSpec]:
    current = list(partition.spec.gpus) if partition else []
    kept = [g for g in current if g.index not in changes]
    return sorted([*kept, *changes.values()], key=lambda g: (g.index is None, g.index or 0))


def _switched_spec(target: GpuTarget, policy: PartitionPolicy | None) -> GpuSpec:
    """A whole GPU the plan shares (with the policy's MPS limits or time-slicing settings)
    or takes back whole."""
    if target.mode == "none":
        return GpuSpec(index=target.index, mode="none")
    if target.sharing == "timeslice":
        settings = policy.spec.timeslice if policy else None
        return GpuSpec(index=target.index, mode="timeslice", timeslice=settings or TimesliceSpec(
            replicas=target.shares))
    size = share_size_gib(target.share_resource)
    if size is not None:  # memory-sized: N GiB pinned per share, threads split evenly
        return GpuSpec(index=target.index, mode="mps", mps=MpsSpec.model_validate({
            "shares": target.shares, "memoryMiB": size * 1024,
            "resource": target.share_resource}))
    limits = policy.spec.mps if policy else None
    return GpuSpec(index=target.index, mode="mps", mps=limits or MpsSpec(shares=target.shares))


def decide(plan: Plan, partitions: Mapping[str, NodePartition],
           requests: Mapping[str, tuple[tuple[str, int], ...]], counter: int,
           policies: Mapping[str, PartitionPolicy] | None = None) -> Decision:
    """``policies``: each node's policy, whose sharing settings a shared GPU gets."""
    policies = policies or {}
    decision = Decision()
    changes: dict[str, dict[int, GpuSpec]] = {}
    created_at: set[tuple[str, int, str, int]] = set()
    switched: set[tuple[str, int]] = set()
    for target in plan.gpus:
        if target.mode != "mig":
            changes.setdefault(target.node, {})[target.index] = _switched_spec(
                target, policies.get(target.node))
            switched.add((target.node, target.index))
            continue
        changes.setdefault(target.node, {})[target.index] = GpuSpec(
            index=target.index, mode="mig",
            slices=[SliceSpec(profile=s.profile, start=s.start) for s in sorted(target.slices)])
        decision.created += len(target.create)
        decision.destroyed += len(target.destroy)
        created_at.update((target.node, target.index, s.profile, s.start) for s in target.create)
    for node, gpus in changes.items():
        spec = NodePartitionSpec(gpus=_merged(partitions.get(node), gpus))
        decision.specs[node] = spec.model_copy(update={"plan_id": plan_id(node, spec, counter)})
    for placement in plan.placements:
        parts = []
        new = False
        for item in placement.slices:
            what = item.profile or item.resource.rsplit("/", 1)[-1]
            count = f"{item.count} x " if item.count > 1 else ""
            if item.profile is not None and item.start is not None and (
                    placement.node, item.gpu, item.profile, item.start) in created_at:
                parts.append(f"creating {count}{what} on {placement.node} GPU {item.gpu}")
                new = True
            elif (placement.node, item.gpu) in switched:
                how = ("taking back whole" if item.resource == WHOLE_GPU_RESOURCE
                       else "sharing")
                parts.append(f"{how} {placement.node} GPU {item.gpu}: {count}{what}")
                new = True
            else:
                parts.append(f"free {count}{what} on {placement.node} GPU {item.gpu}")
        decision.pods.append(PodDecision(
            pod=placement.pod, node=placement.node, requests=requests.get(placement.pod, ()),
            message="; ".join(parts) + " for this pod", needs_new_slices=new))
    decision.unplaced = [(u.pod, u.reason) for u in plan.unplaced]
    return decision
