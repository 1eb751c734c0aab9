"""Reservations: how a waiting pod keeps later ones from taking the capacity it is waiting for.

The objective plans pods in arrival order (within a priority) with backfill: a later pod may
use free capacity only where that does not delay the start of an earlier waiting pod that
could use it. Without this, a ``7g.80gb`` pod behind a stream of ``1g.10gb`` pods never
starts: each time a small slice frees on a card, the next small pod takes it, and the card
is never whole.

So when a pod cannot be placed in a plan, it *reserves* the GPUs where it would start first:
on one of its eligible nodes, for each of its units, the GPU whose in-use slices stand least
in its way (:func:`blocking`: the compute of the in-use slices its best placement overlaps).
Pods after it in the planning order may not take anything on those GPUs, so the GPUs drain
towards it as their pods finish. The reservation is recomputed at every plan from what is
running then, so it follows whichever GPU is closest to freeing. Only a pod in the plan can
reserve, and which pods the controller's plans hold is for
:func:`~tessera.core.planner.batch.bounded_batch` to say: a pod of several GPUs is left out
while the cluster lacks its compute and some GPU could take one of its units (that module
says why this is kept).

It is bounded: only the first :data:`DEFAULT_RESERVATIONS` pod(s) that cannot be placed reserve
anything (per plan, all priorities together, in planning order), and a pod no GPU could ever
host (wrong model, a profile its policy forbids) reserves nothing. A plan may also ask a pod
to have waited a while before it reserves (``reserve_after_s``; the controller sets it from
the waits it sees, :attr:`~tessera.controller.loop.ControllerSettings.reserve_after_waits`):
most pods that find no room start a few seconds later anyway, as something ends, and a pod
that reserves at once holds GPUs idle for a wait it would not have had. A pod that has not
waited long enough is backfill like any later pod and does not count against the bound.
Everything after the reserving pods is backfill: it takes whatever the reservations leave
free.

Both solvers use this one definition, computed from the snapshot alone, so the exact and the
fast plan honour the same reservations for the same blocked pods.
"""

from __future__ import annotations

from collections.abc import Collection

from tessera.core.catalogue import is_gpu_share
from tessera.core.planner.geometry import geometry_of
from tessera.core.planner.model import WHOLE_GPU_RESOURCE
from tessera.core.planner.problem import GpuInfo, Problem, profile_for, resource_size

__all__ = ["DEFAULT_RESERVATIONS", "blocking", "reserve"]

DEFAULT_RESERVATIONS = 1
"""Waiting pods that may reserve GPUs in one plan. A reservation keeps free capacity idle while
its GPUs drain (a whole node for a pod of eight GPUs), so the bound caps that cost. Measured on
the simulation grid (bench/README.md, Planner objective): none starves multi-GPU pods (-7.8
points of compute served against first fit on gpushare40, 64 GPUs); one serves them and gains
most overall (+0.69 points on the 64- and 128-GPU cases); two hold back more capacity while
cards drain and gain less (+0.38)."""


def blocking(info: GpuInfo, resource: str) -> float | None:
    """How much in-use compute stands between ``info`` and one unit of ``resource``, as a share
    of the card (0: it could host the unit now); None when the GPU can never host it.

    MIG: the best placement of the profile, counting the in-use slices whose memory it
    overlaps plus any compute the card would lack beside the rest. A frozen GPU (static
    policy, waiting between changes) hosts only a free slice of the profile, or one of its
    in-use slices of that profile once it ends. Whole GPUs and MPS: 1 while in use.
    """
    gpu = info.gpu
    if gpu.mode == "none":
        return None if resource != WHOLE_GPU_RESOURCE else float(gpu.in_use)
    if gpu.mode == "mps":
        if resource != gpu.share_resource or gpu.shares == 0:
            return None
        return 0.0 if gpu.shares_in_use < gpu.shares else 1.0 / gpu.shares
    model = info.mig
    profile = profile_for(model, resource)
    if profile is None:
        return None
    total = model.compute_slices
    if not info.can_create(profile):
        if profile in info.free_profiles:
            return 0.0
        held = [model.profile(s.profile).compute_slices for s in info.in_use
                if s.profile == profile]
        return min(held) / total if held else None
    geometry = geometry_of(model.name)
    in_use = [(geometry.memory[geometry.index[s]], model.profile(s.profile).compute_slices)
              for s in info.in_use]
    held_compute = sum(c for _, c in in_use)
    need = model.profile(profile).compute_slices
    best: int | None = None
    for i in geometry.by_profile[profile]:
        overlapped = sum(c for memory, c in in_use if memory & geometry.memory[i])
        short = max(0, held_compute - overlapped + need - total)
        cost = overlapped + short
        if best is None or cost < best:
            best = cost
    return None if best is None else best / total


def reserve(problem: Problem, position: int, taken: Collection[int]) -> tuple[int, ...]:
    """The GPUs pod ``position`` reserves: on its eligible node where its units are least
    blocked in total (ties: the node listed first), one GPU per unit, none in ``taken``
    (reserved by an earlier pod). Empty when no eligible node could ever host it."""
    pod = problem.pods[position]
    units = [r for r, c in pod.demand for _ in range(c)]
    best: tuple[float, int, tuple[int, ...]] | None = None
    known: dict[tuple[object, ...], float | None] = {}

    def cost_of(g: int, resource: str) -> float | None:
        # A cluster's GPUs repeat a few layouts: each distinct one is weighed once.
        info = problem.gpus[g]
        gpu = info.gpu
        key = (resource, info.model_name, gpu.mode, info.in_use, info.free_profiles,
               info.frozen_reason is None, info.allowed, gpu.in_use, gpu.shares,
               gpu.shares_in_use, gpu.share_resource)
        found = known.get(key, _UNKNOWN)
        if found == _UNKNOWN:
            found = known[key] = blocking(info, resource)
        return found

    for node in pod.eligible:
        free = [g for g in problem.node_gpus[node] if g not in taken]
        load: dict[int, float] = {}
        total = 0.0
        for resource in units:
            share = _share(resource)
            options = [(cost, g) for g in free
                       if load.get(g, 0.0) + share <= 1.0 + 1e-9
                       and (cost := cost_of(g, resource)) is not None]
            if not options:
                break
            cost, gid = min(options)
            total += cost
            load[gid] = load.get(gid, 0.0) + share
        else:
            if best is None or (total, node) < best[:2]:
                best = (total, node, tuple(sorted(load)))
    return () if best is None else best[2]


_UNKNOWN = -1.0
"""Not weighed yet (:func:`blocking` is never negative)."""


def _share(resource: str) -> float:
    """A unit's share of a card (its memory), to tell how many units one reserved GPU holds."""
    return 0.0 if is_gpu_share(resource) else resource_size(resource)
