"""From a solver's decisions to a :class:`Plan`: target layouts, placements, and unplaced reasons.

Both solvers end here, so the guarantees a plan gives are enforced in one place: every target
layout passes :func:`layout.check_layout`, keeps every in-use slice, and a GPU frozen by its
policy is never changed. A violation is a solver bug, so it raises instead of returning a plan.
The reason for an unplaced pod is worked out from the final state, naming what blocks it.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tessera.core import layout
from tessera.core.catalogue import MIG_RESOURCE_PREFIX, is_gpu_share
from tessera.core.errors import InvalidInputError
from tessera.core.layout import Slice
from tessera.core.planner.geometry import geometry_of
from tessera.core.planner.model import (
    MPS_SHARE_RESOURCE,
    WHOLE_GPU_RESOURCE,
    AssignedSlice,
    GpuTarget,
    Plan,
    PodPlacement,
    Unplaced,
)
from tessera.core.planner.problem import GpuInfo, PodInfo, Problem, profile_for

__all__ = ["GpuOutcome", "Outcome", "PlannerBug", "assemble"]


class PlannerBug(AssertionError):  # noqa: N818 - a bug, not an error the caller handles
    """A solver produced something the plan's guarantees forbid (never an input problem)."""


@dataclass(frozen=True)
class GpuOutcome:
    """A GPU after the plan: its layout, the slices held (in use or given to a pod), spare."""

    layout: frozenset[Slice]
    locked: frozenset[Slice]
    whole_free: bool
    shares_free: int


Unit = tuple[int, str, Slice | None]
"""One unit a pod gets: (GPU id, resource, MIG slice or None for a whole GPU / MPS share)."""


@dataclass(frozen=True)
class Outcome:
    gpus: Sequence[GpuOutcome]
    assignments: Mapping[int, tuple[int, Sequence[Unit]]]
    """Pod position in :attr:`Problem.pods` -> (node position, the units it gets)."""
    reserved: Mapping[int, int] = field(default_factory=dict)
    """GPU id -> position of the waiting pod that reserved it (closed to pods after it)."""


def _short(resource: str) -> str:
    return resource.removeprefix("nvidia.com/")


def _targets(problem: Problem, outcome: Outcome) -> list[GpuTarget]:
    targets = []
    # Fleets repeat transitions (the same layouts on many cards): each distinct one is
    # checked and diffed once per plan, with the same verdict for every card that makes it.
    diffs: dict[tuple[str, frozenset[Slice], tuple[Slice, ...]], layout.LayoutDiff | str] = {}
    for info, after in zip(problem.gpus, outcome.gpus, strict=True):
        if info.gpu.mode != "mig" or after.layout == info.current:
            continue
        where = f"{problem.nodes[info.node].name}/gpu{info.gpu.index}"
        if info.frozen_reason is not None:
            raise PlannerBug(f"{where}: changed although {info.frozen_reason}")
        if not info.in_use <= after.layout:
            raise PlannerBug(f"{where}: in-use slices {sorted(info.in_use - after.layout)} lost")
        ordered = tuple(sorted(after.layout, key=lambda s: (s.start, s.profile)))
        key = (info.model_name, info.current, ordered)
        found = diffs.get(key)
        if found is None:
            try:
                found = diffs[key] = layout.diff_layouts(info.mig, info.current, ordered)
            except InvalidInputError as exc:
                found = diffs[key] = str(exc)
        if isinstance(found, str):
            raise PlannerBug(f"{where}: invalid target layout: {found}")
        diff = found
        targets.append(
            GpuTarget(
                node=problem.nodes[info.node].name,
                index=info.gpu.index,
                model=info.model_name,
                slices=ordered,
                destroy=diff.destroy,
                create=diff.create,
            )
        )
    return targets


def _placement(problem: Problem, node: int, units: Sequence[Unit], pod: PodInfo) -> PodPlacement:
    shares: dict[tuple[int, str], int] = {}
    items: list[AssignedSlice] = []
    given: dict[str, int] = {}
    for gid, resource, item in units:
        info = problem.gpus[gid]
        if info.node != node:
            raise PlannerBug(f"{pod.pod.key}: units on more than one node")
        given[resource] = given.get(resource, 0) + 1
        if is_gpu_share(resource):
            shares[(info.gpu.index, resource)] = shares.get((info.gpu.index, resource), 0) + 1
        elif item is not None:
            items.append(AssignedSlice(info.gpu.index, resource, item.profile, item.start))
        else:
            items.append(AssignedSlice(info.gpu.index, resource))
    items.extend(AssignedSlice(i, r, count=c) for (i, r), c in shares.items())
    if given != dict(pod.demand):
        raise PlannerBug(f"{pod.pod.key}: got {dict(given)}, asked {dict(pod.demand)}")
    return PodPlacement(pod.pod.key, problem.nodes[node].name, tuple(sorted(items)))


def assemble(problem: Problem, outcome: Outcome, solver: str) -> Plan:
    """Check the solver's outcome against the plan's guarantees and describe it."""
    targets = _targets(problem, outcome)
    cpu = [n.free_cpu_milli for n in problem.nodes]
    memory = [n.free_memory_mib for n in problem.nodes]
    placements = []
    for position, (node, units) in outcome.assignments.items():
        pod = problem.pods[position]
        placements.append(_placement(problem, node, units, pod))
        at = bisect_left(pod.eligible, node)  # sorted: a cluster's worth of nodes
        if at == len(pod.eligible) or pod.eligible[at] != node:
            raise PlannerBug(f"{pod.pod.key}: placed on a node its filters reject")
        node_cpu, node_memory = cpu[node], memory[node]
        if node_cpu is not None:
            cpu[node] = node_cpu - pod.pod.cpu_milli
        if node_memory is not None:
            memory[node] = node_memory - pod.pod.memory_mib
    if any(c is not None and c < 0 for c in cpu) or any(m is not None and m < 0 for m in memory):
        raise PlannerBug("a node's CPU or memory is over-committed")
    reasons: dict[tuple[object, ...], str] = {}
    why: dict[tuple[object, ...], object] = {}
    unplaced = []
    for position, info in enumerate(problem.pods):
        if position in outcome.assignments:
            continue
        # Pods alike in demand, filters and size get the same reason; work it out once.
        holders = tuple(sorted({o for o in outcome.reserved.values() if o < position}))
        key = (info.demand, info.classes, info.pod.cpu_milli, info.pod.memory_mib, holders)
        if key not in reasons:
            reasons[key] = explain(problem=problem, pod=info, outcome=outcome, cpu=cpu,
                                   memory=memory, memo=why, position=position)
        unplaced.append(Unplaced(info.pod.key, reasons[key]))
    return Plan(
        gpus=tuple(sorted(targets, key=lambda t: (t.node, t.index))),
        placements=tuple(sorted(placements, key=lambda p: p.pod)),
        unplaced=tuple(sorted(unplaced, key=lambda u: u.pod)),
        solver=solver,
    )


def _why_not(info: GpuInfo, after: GpuOutcome, resource: str,
             memo: dict[tuple[object, ...], object]) -> str | None:
    key = (info.model_name, info.gpu.mode, info.frozen_reason, info.allowed, info.in_use, after,
           resource)
    if key not in memo:
        memo[key] = _why_not_uncached(info, after, resource)
    found = memo[key]
    assert found is None or isinstance(found, str)
    return found


def _why_not_uncached(info: GpuInfo, after: GpuOutcome, resource: str) -> str | None:
    """Why this GPU has no unit of ``resource`` to spare after the plan (None: it has one)."""
    mode = info.gpu.mode
    if mode == "none":
        return None if after.whole_free else "whole GPUs are in use"
    if mode == "mps":
        return None if after.shares_free > 0 else "MPS GPUs have every share in use"
    profile = profile_for(info.mig, resource)
    if profile is None:  # pragma: no cover - filtered by the caller
        return f"{info.model_name} has no such profile"
    if any(s.profile == profile for s in after.layout - after.locked):
        return None
    if info.frozen_reason is not None:
        return f"GPUs are frozen ({info.frozen_reason}) with no free {profile}"
    if not info.can_create(profile):
        return f"GPUs follow a policy that does not allow {profile}"
    geometry = geometry_of(info.model_name)
    candidates = geometry.by_profile[profile]
    in_use = geometry.aggregate(geometry.to_mask(info.in_use))
    if not any(geometry.fits(in_use, i) for i in candidates):
        blockers = sorted(
            {str(u) for u in info.in_use for i in candidates
             if geometry.memory[i] & geometry.memory[geometry.index[u]]}
        )
        detail = ", ".join(blockers) if blockers else "card budget"
        return f"GPUs have slices in use that block every {profile} placement ({detail})"
    locked = geometry.aggregate(geometry.to_mask(after.locked))
    if not any(geometry.fits(locked, i) for i in candidates):
        return f"GPUs have their {profile} placements given to other pods of this plan"
    return None


def _could_offer(info: GpuInfo, resource: str) -> bool:
    """Whether the GPU's mode and model know ``resource`` at all (policy aside)."""
    if info.gpu.mode == "mig":
        return profile_for(info.mig, resource) is not None
    return info.offers(resource)


_Survey = tuple[Counter[str], Counter[int]]


def _survey(
    problem: Problem,
    outcome: Outcome,
    *,
    resource: str,
    fitting: Sequence[int],
    memo: dict[tuple[object, ...], object],
    position: int = -1,
) -> _Survey:
    """Over the nodes a pod could use: why GPUs have no ``resource`` left, spare GPUs per node.

    Memoised per (resource, the nodes surveyed, the reservations that bar the pod), which is
    all the survey depends on, and each node's part once per resource (:func:`_node_survey`):
    an oversubscribed cluster has thousands of unplaced pods, of many CPU and memory sizes,
    whose surveys walk the same GPUs.
    """
    holders = tuple(sorted({o for o in outcome.reserved.values() if o < position}))
    key = ("survey", resource, tuple(fitting), holders)
    found = memo.get(key)
    if found is None:
        blocked: Counter[str] = Counter()
        spare_by_node: Counter[int] = Counter()
        for n in fitting:
            reasons, spare, reserved = _node_survey(problem, outcome, resource, n, memo)
            for why, count in reasons:
                blocked[why] += count
            for g in reserved:
                owner = outcome.reserved[g]
                if owner < position:
                    blocked[f"GPUs held for {problem.pods[owner].pod.key}, which waits for "
                            "them (it came first)"] += 1
                    continue
                verdict = _why_not(problem.gpus[g], outcome.gpus[g], resource, memo)
                if verdict is None:
                    spare += 1
                else:
                    blocked[verdict] += 1
            if spare:
                spare_by_node[n] += spare
        found = memo[key] = (blocked, spare_by_node)
    return found  # type: ignore[return-value]


_NodeSurvey = tuple[tuple[tuple[str, int], ...], int, tuple[int, ...]]


def _node_survey(problem: Problem, outcome: Outcome, resource: str, node: int,
                 memo: dict[tuple[object, ...], object]) -> _NodeSurvey:
    """One node's GPUs that could ever offer ``resource``: (why the unreserved ones have none
    left, how many GPUs each; how many have one to spare; the reserved ones, which depend on
    the pod asking)."""
    key = ("node", resource, node)
    found = memo.get(key)
    if found is None:
        reasons: dict[str, int] = {}
        spare = 0
        reserved = []
        for g in problem.node_gpus[node]:
            info = problem.gpus[g]
            if not _could_offer(info, resource):
                continue
            if g in outcome.reserved:
                reserved.append(g)
                continue
            why = _why_not(info, outcome.gpus[g], resource, memo)
            if why is None:
                spare += 1
            else:
                reasons[why] = reasons.get(why, 0) + 1
        found = memo[key] = (tuple(reasons.items()), spare, tuple(reserved))
    return found  # type: ignore[return-value]


def explain(
    *,
    problem: Problem,
    pod: PodInfo,
    outcome: Outcome,
    cpu: Sequence[int | None],
    memory: Sequence[int | None],
    memo: dict[tuple[object, ...], object],
    position: int = -1,
) -> str:
    """One sentence on why ``pod`` got no place, naming the blocking facts and how many GPUs."""
    if not pod.demand:
        return (f"requests no GPU resource ({MIG_RESOURCE_PREFIX}*, {WHOLE_GPU_RESOURCE} or "
                f"{MPS_SHARE_RESOURCE}); nothing for tessera to plan")
    if not pod.eligible:
        parts = ", ".join(f"{count} by {why}" for why, count in sorted(pod.rejections.items()))
        return f"no node passes the pod's filters ({parts or 'the cluster has no nodes'})"
    for resource, _ in pod.demand:
        if not any(problem.gpus[g].offers(resource)
                   for n in pod.eligible for g in problem.node_gpus[n]):
            eligible_gpus = [g for n in pod.eligible for g in problem.node_gpus[n]]
            models = sorted({problem.gpus[g].model_name for g in eligible_gpus})
            anywhere = any(problem.gpus[g].offers(resource) for g in range(len(problem.gpus)))
            where = "no node's" if not anywhere else "no eligible node's"
            return (f"{where} GPUs can offer {_short(resource)} (eligible nodes' models: "
                    f"{', '.join(models) or 'none'}; static policies and allowed profiles count)")
    fitting = [
        n for n in pod.eligible
        if (cpu[n] is None or cpu[n] >= pod.pod.cpu_milli)  # type: ignore[operator]
        and (memory[n] is None or memory[n] >= pod.pod.memory_mib)  # type: ignore[operator]
    ]
    if not fitting:
        return (f"no eligible node has {pod.pod.cpu_milli}m CPU and {pod.pod.memory_mib}Mi "
                f"memory free (after this plan's other pods)")
    wants = ", ".join(f"{count} x {_short(r)}" for r, count in pod.demand)
    for resource, count in pod.demand:
        blocked, spare_by_node = _survey(problem, outcome, resource=resource, fitting=fitting,
                                         memo=memo, position=position)
        if spare_by_node and count <= max(spare_by_node.values()) and len(pod.demand) == 1:
            break
        if not spare_by_node or count > max(spare_by_node.values()):
            parts = "; ".join(f"{c} {why}" for why, c in sorted(blocked.items(),
                                                                   key=lambda i: (-i[1], i[0])))
            head = (f"no node with a free {_short(resource)} placement" if count == 1
                    else f"no node can hold {count} x {_short(resource)}")
            return f"{head}: {parts}" if parts else head
    return (f"no single node can hold all of {wants} at once (a pod's GPUs must share a "
            f"node); free capacity is spread over several nodes")
