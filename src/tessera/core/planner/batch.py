"""Which waiting pods one plan looks at: a bounded batch.

Under overload thousands of pods wait, and planning all of them every time a slice frees costs
seconds while almost none can be placed. One plan therefore takes, per request shape (the pod's
requests), the oldest pods up to what the free compute of the GPUs could hold, and at most
``per_shape`` or one per GPU with free compute, whichever is more: a plan's cost is then of the
order of the cluster's (its snapshot and offers), never of the queue's, and a burst the cluster
has room for is placed in one plan or a few, not in plans of ``per_shape`` each (1,000 pods
onto 2,000 idle nodes took 16 plans of 64 at 0.4 s each, bench/scale_bench.py). A shape that no
GPU can host now (not even after reshaping its free slices) sends only its ``reservations``
oldest pods, which may reserve GPUs to drain (the objective's bounded backfill,
:mod:`~tessera.core.planner.reserve`). The planner still sees every pod that could possibly be
placed now, so the bound changes which pods are *considered together*, never who may start: the
pods left out wait for the next plan, which the caller runs at once when
:attr:`Batch.cut_short` says capacity may remain.

The batch does decide who may *reserve*: a pod left out reserves nothing in that plan. A shape
that some GPU could host a unit of, but whose compute the whole cluster lacks, sends no pod. So
a pod of several GPUs reserves when no GPU can host its largest unit (as a one-GPU pod does)
or when the cluster has its compute free, and not in between: there its reservation lapses,
and the node it was draining takes later pods until it reserves again. That came with the
bound, not by design, and it was kept on measurement (bench/README.md, "Which multi-GPU pods
reserve"). Reserving in every plan held nodes idle behind pods that ran for hours: the pods
behind waited far longer, and three of the four runs it changed served less compute.
Reserving only while the cluster has the compute free served less than this over 32 runs.

Shapes the bound cannot reason about (whole GPUs, shares, MPS in MIG slices) pass with at
most ``per_shape`` pods. "Oldest" is the planner's own order: priority first, then creation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache

from tessera.core import catalogue
from tessera.core.errors import InvalidInputError
from tessera.core.planner.geometry import hostable
from tessera.core.planner.model import PendingPod, Snapshot, Unplaced
from tessera.core.planner.reserve import DEFAULT_RESERVATIONS
from tessera.core.planner.room import RoomIndex

__all__ = ["DEFAULT_PER_SHAPE", "Batch", "bounded_batch"]

DEFAULT_PER_SHAPE = 64
"""Pods of one request shape a plan considers at most, unless more GPUs have free compute (the
simulator's grid measured the quality unchanged against unbounded batches; the cost per plan
falls from O(waiting) to O(shapes x GPUs))."""


@dataclass(frozen=True)
class Batch:
    pods: tuple[PendingPod, ...]
    """In the planner's order (priority, then creation)."""
    cut_short: bool
    """Pods of some shape were left out that the free capacity might still hold: plan again
    after this plan's placements are counted."""
    later: tuple[Unplaced, ...] = ()
    """The pods left for a later plan, each with why (what the pod is told)."""
    room: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    """Per node with MIG GPUs: (free compute slices, compute slices in use), counted on the
    way (:func:`~tessera.core.planner.candidates.narrow` ranks nodes by them)."""


@cache
def _profile(resource: str) -> str | None:
    """The MIG profile a resource names, or None for any other resource."""
    if not resource.startswith(catalogue.MIG_RESOURCE_PREFIX):
        return None
    try:
        name = catalogue.profile_name_from_resource(resource)
    except InvalidInputError:
        return None
    return name if compute_of(name) else None


def _order(pod: PendingPod) -> tuple[int, float, str]:
    return (-pod.priority, pod.creation_time, pod.key)


def bounded_batch(snapshot: Snapshot, pods: Sequence[PendingPod], *,
                  per_shape: int = DEFAULT_PER_SHAPE,
                  reservations: int = DEFAULT_RESERVATIONS,
                  index: RoomIndex | None = None) -> Batch:
    """The pods one plan considers, from ``pods`` waiting (see the module docstring).
    ``index``: the snapshot's room, kept by the caller (else counted here, node by node)."""
    if index is None:
        index = RoomIndex.of(snapshot.nodes)
    room = index.room
    free_compute = index.free_compute
    shapes: dict[tuple[tuple[str, int], ...], list[PendingPod]] = {}
    for pod in sorted(pods, key=_order):
        shapes.setdefault(pod.requests, []).append(pod)
    chosen: list[PendingPod] = []
    later: list[Unplaced] = []
    cut_short = False

    def take(queue: list[PendingPod], count: int, why: str) -> None:
        chosen.extend(queue[:count])
        later.extend(Unplaced(p.key, why) for p in queue[count:])

    def behind(most: int) -> str:
        return (f"older pods asking the same come first (a plan considers at most {most} "
                "of a kind)")

    most = max(per_shape, index.open_gpus)
    for shape, queue in shapes.items():
        profiles = [(_profile(r), n) for r, n in shape]
        if not profiles or any(p is None for p, _ in profiles):
            cut_short |= len(queue) > per_shape
            take(queue, per_shape, behind(per_shape))
            continue
        named = [(p, n) for p, n in profiles if p is not None]
        compute = max(1, sum(compute_of(p) * n for p, n in named))
        largest = max((p for p, _ in named), key=compute_of)
        if not any(hostable(model, held, largest) for model, held in index.layouts):
            # The oldest may reserve GPUs that drain for them; the rest wait behind it.
            take(queue, reservations, f"no GPU can host {largest} now; older pods asking "
                 "the same wait first, for GPUs to drain")
            continue
        could = min(len(queue), free_compute // compute)
        bound = min(could, most)
        cut_short |= bound < could
        if bound == 0:
            take(queue, 0, f"it needs {compute} free compute slices of MIG GPUs and "
                 f"{free_compute} are free; it is planned when enough free up")
        else:
            take(queue, bound, behind(most))
    return Batch(tuple(sorted(chosen, key=_order)), cut_short, tuple(later), room)


def mig_compute(requests: Sequence[tuple[str, int]]) -> int | None:
    """Compute slices a pod's requests take, or None when one is not a MIG profile."""
    total = 0
    for resource, count in requests:
        profile = _profile(resource)
        if profile is None:
            return None
        total += compute_of(profile) * count
    return total


@cache
def compute_of(profile: str) -> int:
    """A profile's compute slices (the same on every card that names it that way); 0 for a
    name no card has."""
    for model in catalogue.models():
        for candidate in model.profiles:
            if candidate.name == profile:
                return candidate.compute_slices
    return 0
