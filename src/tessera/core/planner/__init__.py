"""The planner: a cluster snapshot and pending pods in, target GPU layouts and pod placements out.

Pure and deterministic (same input, same plan; no I/O). The objective, in order: higher
priority first; within a priority, arrival order with backfill (placing a pod outweighs
placing every later one, and the first waiting pods that fit nowhere, once they have waited
``reserve_after_s``, reserve the GPUs they would start on first, closing them to later pods:
:mod:`~tessera.core.planner.reserve`);
never an in-use slice touched (a hard rule, not a cost); fewest free slices destroyed and GPUs
touched; then the free capacity left most usable by recent demand (fragmentation-aware). A
pod's units (all containers, all GPU resources) land on one node or not at all.

Two solvers behind :func:`plan`: ``fast`` (default; greedy in planning order over memoised
per-GPU states, then a bounded repair that repacks one or two nodes around each pod left out,
possibly leaving out later pods; for any cluster size) and ``exact`` (an integer program
solved by HiGHS, for small clusters: the reference in tests and benchmarks). Every plan passes
the same checks (:func:`~tessera.core.planner.result.assemble`) before it is returned.

Example::

    snapshot = parse_cluster({"nodes": [{"name": "a", "gpus": [
        {"index": 0, "model": "A100-SXM4-40GB", "slices": []}]}]})
    pods = parse_pending({"pods": [{"name": "p1", "requests": {"nvidia.com/mig-1g.5gb": 2}}]})
    result = plan(snapshot, pods)             # or plan(..., solver="exact")
    result.placements[0].slices               # (AssignedSlice(gpu=0, ..., start=...), ...)
"""

from __future__ import annotations

import gc
import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Literal

from tessera.core.errors import InvalidInputError
from tessera.core.planner.batch import DEFAULT_PER_SHAPE, Batch, bounded_batch
from tessera.core.planner.candidates import narrow
from tessera.core.planner.exact import DEFAULT_MAX_GPUS, solve_exact
from tessera.core.planner.fast import solve_fast
from tessera.core.planner.model import (
    MPS_SHARE_RESOURCE,
    WHOLE_GPU_RESOURCE,
    AssignedSlice,
    Gpu,
    GpuSlice,
    GpuTarget,
    MatchExpression,
    Node,
    PendingPod,
    Plan,
    PodPlacement,
    Policy,
    Snapshot,
    Taint,
    Toleration,
    Unplaced,
)
from tessera.core.planner.parse import parse_cluster, parse_pending, plan_to_dict
from tessera.core.planner.problem import prepare
from tessera.core.planner.reserve import DEFAULT_RESERVATIONS
from tessera.core.planner.result import PlannerBug, assemble
from tessera.core.planner.room import RoomIndex, RoomTracker
from tessera.core.planner.sharing import reshape
from tessera.core.planner.slice_shares import place_slice_shares

__all__ = [
    "DEFAULT_MAX_GPUS",
    "DEFAULT_PER_SHAPE",
    "DEFAULT_RESERVATIONS",
    "MPS_SHARE_RESOURCE",
    "SOLVERS",
    "WHOLE_GPU_RESOURCE",
    "AssignedSlice",
    "Batch",
    "Gpu",
    "GpuSlice",
    "GpuTarget",
    "MatchExpression",
    "Node",
    "PendingPod",
    "Plan",
    "PlannerBug",
    "PodPlacement",
    "Policy",
    "RoomIndex",
    "RoomTracker",
    "Snapshot",
    "SolverName",
    "Taint",
    "Toleration",
    "Unplaced",
    "bounded_batch",
    "narrow",
    "parse_cluster",
    "parse_pending",
    "plan",
    "plan_to_dict",
]

SolverName = Literal["fast", "exact"]
SOLVERS: tuple[SolverName, ...] = ("fast", "exact")


def plan(
    snapshot: Snapshot,
    pods: Sequence[PendingPod],
    solver: SolverName = "fast",
    *,
    max_exact_gpus: int = DEFAULT_MAX_GPUS,
    reservations: int = DEFAULT_RESERVATIONS,
    recent_demand: Mapping[str, float] | None = None,
    reserve_after_s: float = 0.0,
) -> Plan:
    """Plan ``pods`` onto ``snapshot``; raises :class:`InvalidInputError` for an unknown solver
    or an exact solve on more than ``max_exact_gpus`` GPUs. ``reservations`` bounds how many
    waiting pods may hold GPUs back from later ones (:mod:`~tessera.core.planner.reserve`);
    ``recent_demand`` (units per resource lately asked for) is what placements keep free
    capacity usable for, the pending pods' own requests when not given. A pod may reserve only
    once it has waited ``reserve_after_s`` by ``snapshot.now`` (0: at once)."""
    if solver not in SOLVERS:
        raise InvalidInputError("solver", f"unknown solver {solver!r}", SOLVERS)
    if reservations < 0:
        raise InvalidInputError("reservations", f"must be 0 or more, not {reservations}")
    if not 0 <= reserve_after_s < math.inf:
        raise InvalidInputError("reserve_after_s",
                                f"must be a finite number of seconds, 0 or more, not "
                                f"{reserve_after_s}")
    with collector_paused():
        return _plan(snapshot, pods, solver, max_exact_gpus=max_exact_gpus,
                     reservations=reservations, recent_demand=recent_demand,
                     reserve_after_s=reserve_after_s)


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cycle collector off for a plan, then back as it was.

    A plan allocates hundreds of thousands of small objects (offers, heap entries, states)
    and frees nearly all of them by reference counting when it returns; it relies on the cycle
    collector for nothing. But the collector runs on allocation counts, and each of its full
    passes walks every object the process holds (the snapshot, the controller's cache): on
    10,000 GPUs that was about a third of a plan's time (bench/README.md, Planner). Garbage
    cycles made meanwhile are collected at the first pass after it, as before.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _plan(snapshot: Snapshot, pods: Sequence[PendingPod], solver: SolverName, *,
          max_exact_gpus: int, reservations: int,
          recent_demand: Mapping[str, float] | None, reserve_after_s: float) -> Plan:
    shares = place_slice_shares(snapshot, pods)
    pods = shares.rest
    reshaped = reshape(snapshot, pods)
    problem = prepare(reshaped.snapshot, pods, recent_demand, reserve_after_s)
    if solver == "exact":
        outcome = solve_exact(problem, max_gpus=max_exact_gpus, reservations=reservations)
    else:
        outcome = solve_fast(problem, reservations)
    result = assemble(problem, outcome, solver)
    if shares.placements or shares.unplaced:
        result = replace(result, placements=(*shares.placements, *result.placements),
                         unplaced=(*shares.unplaced, *result.unplaced))
    if not reshaped.switches:
        return result
    # A GPU switched for pods the solvers then put elsewhere stays as it was.
    used = {(p.node, s.gpu) for p in result.placements for s in p.slices}
    kept = tuple(t for t in reshaped.switches if (t.node, t.index) in used)
    return replace(result, gpus=tuple(sorted((*result.gpus, *kept),
                                             key=lambda t: (t.node, t.index))))
