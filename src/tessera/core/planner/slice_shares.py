"""Shares of MIG slices that run their own MPS daemon (``nvidia.com/mig-<profile>.shared``).

A slice whose spec asks for MPS is in use as a slice (the solvers never give it out or reshape
it) and offers its shares instead. Pods asking only for such shares are placed here, before the
solvers run, on the free shares that exist: oldest first (priority, then arrival), on a node the
pod may run on, the fullest slice first so that others stay free for larger requests. Slices
running MPS are made by their spec (a static policy's ``mpsDevices``), never by the planner; a
pod asking for shares together with other GPU resources is refused with the reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tessera.core.catalogue import MIG_RESOURCE_PREFIX, SHARED_SUFFIX, shared_mig_resource_name
from tessera.core.planner.filters import rejection
from tessera.core.planner.model import AssignedSlice, PendingPod, PodPlacement, Snapshot, Unplaced

__all__ = ["SharesOutcome", "is_slice_share", "place_slice_shares"]

def is_slice_share(resource: str) -> bool:
    """``nvidia.com/mig-3g.40gb.shared``: an MPS share of a MIG slice."""
    return resource.startswith(MIG_RESOURCE_PREFIX) and resource.endswith(SHARED_SUFFIX)


@dataclass(frozen=True)
class SharesOutcome:
    rest: tuple[PendingPod, ...]
    """The pods for the solvers (those asking no slice share)."""
    placements: tuple[PodPlacement, ...]
    unplaced: tuple[Unplaced, ...]


def place_slice_shares(snapshot: Snapshot, pods: Sequence[PendingPod]) -> SharesOutcome:
    wanting = [p for p in pods if any(r.endswith(SHARED_SUFFIX) and is_slice_share(r)
                                      for r, _ in p.requests)]
    if not wanting:
        return SharesOutcome(tuple(pods), (), ())
    free: dict[tuple[int, int, int], int] = {}
    for n, node in enumerate(snapshot.nodes):
        for gpu in node.gpus:
            for item in gpu.slices:
                if item.shares:
                    free[(n, gpu.index, item.start)] = item.shares - item.shares_in_use
    placements: list[PodPlacement] = []
    unplaced: list[Unplaced] = []
    for pod in sorted(wanting, key=lambda p: (-p.priority, p.creation_time, p.namespace,
                                              p.name)):
        if not all(is_slice_share(r) for r, _ in pod.requests):
            unplaced.append(Unplaced(pod.key, "asks for MPS shares of a MIG slice together "
                                     "with other GPU resources; such shares are placed alone"))
            continue
        placed = _place(snapshot, pod, free)
        if placed is None:
            asked = ", ".join(f"{n} x {r.removeprefix('nvidia.com/')}" for r, n in pod.requests)
            unplaced.append(Unplaced(pod.key, f"no node it may run on has {asked} free (MIG "
                                     "slices running MPS are made by their spec, e.g. a static "
                                     "policy's mpsDevices)"))
        else:
            placements.append(placed)
    rest = tuple(p for p in pods if p not in wanting)
    return SharesOutcome(rest, tuple(placements), tuple(unplaced))


def _place(snapshot: Snapshot, pod: PendingPod,
           free: dict[tuple[int, int, int], int]) -> PodPlacement | None:
    for n, node in enumerate(snapshot.nodes):
        if rejection(pod, node) is not None:
            continue
        taken: list[tuple[tuple[int, int, int], str, str, int]] = []
        for resource, count in pod.requests:
            left = count
            slots = sorted(
                (free[(n, gpu.index, item.start)], gpu.index, item.start, item.profile)
                 for gpu in node.gpus for item in gpu.slices
                 if item.shares and shared_mig_resource_name(item.profile) == resource
                 and free[(n, gpu.index, item.start)] > 0)
            for available, index, start, profile in slots:
                if not left:
                    break
                use = min(left, available)
                taken.append(((n, index, start), resource, profile, use))
                left -= use
            if left:
                break
        else:
            for key, _, _, use in taken:
                free[key] -= use
            return PodPlacement(pod.key, node.name, tuple(sorted(
                AssignedSlice(key[1], resource, profile, key[2], count=use)
                for key, resource, profile, use in taken)))
    return None
