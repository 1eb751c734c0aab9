"""Which PartitionPolicy governs a node, and the NodePartition spec a policy asks for.

The most specific rule wins: the matching policy with the highest ``priority`` (then the
alphabetically first name, so the choice is stable). A node no policy selects is left alone:
Tessera never repartitions a node an admin has not handed to it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tessera.api.v1alpha1 import (
    GpuSpec,
    LabelSelector,
    NodePartition,
    ObservedGpu,
    PartitionPolicy,
    SliceSpec,
)
from tessera.core import catalogue, layout
from tessera.core.errors import InvalidInputError

__all__ = ["matches", "policy_for", "policy_gpu_specs"]


def matches(selector: LabelSelector, labels: Mapping[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in selector.match_labels.items()):
        return False
    for requirement in selector.match_expressions:
        present = requirement.key in labels
        value = labels.get(requirement.key)
        if requirement.operator == "In" and value not in requirement.values:
            return False
        if requirement.operator == "NotIn" and present and value in requirement.values:
            return False
        if requirement.operator == "Exists" and not present:
            return False
        if requirement.operator == "DoesNotExist" and present:
            return False
    return True


def policy_for(labels: Mapping[str, str],
               policies: Sequence[PartitionPolicy]) -> PartitionPolicy | None:
    chosen = [p for p in policies if matches(p.spec.node_selector, labels)]
    chosen.sort(key=lambda p: (-p.spec.priority, p.metadata.name))
    return chosen[0] if chosen else None


def _static_gpu(policy: PartitionPolicy, gpu: ObservedGpu, index: int) -> GpuSpec | None:
    for position, entry in enumerate(policy.spec.static):
        if entry.devices and gpu.index not in entry.devices:
            continue
        if entry.device_filter and (gpu.pci_device_id or "").upper() not in {
                f.upper() for f in entry.device_filter}:
            continue
        if not entry.mig_enabled:
            return GpuSpec(index=gpu.index, mode="none")
        if gpu.model is None:
            raise InvalidInputError(
                f"spec.static[{position}]", f"GPU {gpu.index} ({gpu.name}) cannot do MIG")
        model = catalogue.model(gpu.model)
        placed = layout.layout_for_counts(
            model, entry.mig_devices, field=f"spec.static[{position}].migDevices",
            keep=[layout.Slice(s.profile, s.start) for s in gpu.slices])
        for name in entry.mps_devices:
            if model.profile(name, field_name=f"spec.static[{position}].mpsDevices.{name}"
                             ).name not in {s.profile for s in placed}:
                raise InvalidInputError(f"spec.static[{position}].mpsDevices.{name}",
                                        "no slice of this profile in migDevices")
        inner = {model.profile(n).name: m for n, m in entry.mps_devices.items()}
        return GpuSpec(index=gpu.index, mode="mig", slices=[
            SliceSpec(profile=s.profile, start=s.start, mps=inner.get(s.profile))
            for s in sorted(placed)])
    return None


def policy_gpu_specs(policy: PartitionPolicy, partition: NodePartition) -> list[GpuSpec] | None:
    """The GPUs a static or MPS policy fixes, from the agent-reported cards; None if unknown.

    Dynamic policies fix nothing here except that MIG-capable cards run in MIG mode (the
    planner only shapes MIG capacity and never switches a card's mode by itself).
    """
    status = partition.status
    if status is None or not status.gpus:
        return None
    specs: list[GpuSpec] = []
    for index, gpu in enumerate(status.gpus):
        if policy.spec.mode == "static":
            wanted = _static_gpu(policy, gpu, index)
            if wanted is not None:
                specs.append(wanted)
        elif policy.spec.mode == "mps" and policy.spec.mps is not None:
            specs.append(GpuSpec(index=gpu.index, mode="mps", mps=policy.spec.mps))
        elif policy.spec.mode == "timeslice" and policy.spec.timeslice is not None:
            specs.append(GpuSpec(index=gpu.index, mode="timeslice",
                                 timeslice=policy.spec.timeslice))
        elif gpu.model is not None:
            current = [SliceSpec(profile=s.profile, start=s.start) for s in gpu.slices]
            specs.append(GpuSpec(index=gpu.index, mode="mig", slices=current))
    return specs
