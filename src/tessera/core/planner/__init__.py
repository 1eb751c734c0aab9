"""The planner: a cluster snapshot and pending pods in, target GPU layouts and pod placements out.

Pure and deterministic (same input, same plan; no I/O). The objective, in order: most pods
placed (higher priority strictly first); never an in-use slice touched (a hard rule, not a
cost); fewest free slices destroyed and GPUs touched; then flexible free capacity (fill GPUs
that are already split before splitting a whole one, keep large placements free). A pod's
units (all containers, all GPU resources) land on one node or not at all.

Two solvers behind :func:`plan`: ``fast`` (default; greedy over memoised per-GPU states in
three pod orders, then a bounded repair that repacks one or two nodes around each pod left out;
for any cluster size) and ``exact`` (an integer program solved by HiGHS, for small clusters: the
reference in tests and benchmarks). Every plan passes the same checks
(:func:`~tessera.core.planner.result.assemble`) before it is returned.

Example::

    snapshot = parse_cluster({"nodes": [{"name": "a", "gpus": [
        {"index": 0, "model": "A100-SXM4-40GB", "slices": []}]}]})
    pods = parse_pending({"pods": [{"name": "p1", "requests": {"nvidia.com/mig-1g.5gb": 2}}]})
    result = plan(snapshot, pods)             # or plan(..., solver="exact")
    result.placements[0].slices               # (AssignedSlice(gpu=0, ..., start=...), ...)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from tessera.core.errors import InvalidInputError
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
from tessera.core.planner.problem import Problem, largest_first, oldest_first, prepare
from tessera.core.planner.result import PlannerBug, assemble

__all__ = [
    "DEFAULT_MAX_GPUS",
    "MPS_SHARE_RESOURCE",
    "SOLVERS",
    "WHOLE_GPU_RESOURCE",
    "AssignedSlice",
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
    "Snapshot",
    "SolverName",
    "Taint",
    "Toleration",
    "Unplaced",
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
) -> Plan:
    """Plan ``pods`` onto ``snapshot``; raises :class:`InvalidInputError` for an unknown solver
    or an exact solve on more than ``max_exact_gpus`` GPUs."""
    if solver not in SOLVERS:
        raise InvalidInputError("solver", f"unknown solver {solver!r}", SOLVERS)
    problem = prepare(snapshot, pods)
    if solver == "exact":
        return assemble(problem, solve_exact(problem, max_gpus=max_exact_gpus), solver)
    # Smallest pods first places the most when capacity is short; largest first packs better
    # when it is not (small slices no longer fragment the cards big ones need); creation order
    # sits between. Run each and keep the best plan by the objective. Later runs are skipped
    # once one places every pod: they could only save a destroyed slice, not place a pod.
    best: tuple[tuple[int, ...], Plan] | None = None
    for ordered in (problem, largest_first(problem), oldest_first(problem)):
        if best is not None and not best[1].unplaced:
            break
        candidate = assemble(ordered, solve_fast(ordered), solver)
        score = _score(ordered, candidate)
        if best is None or score > best[0]:
            best = (score, candidate)
    assert best is not None
    return best[1]


def _score(problem: Problem, result: Plan) -> tuple[int, ...]:
    """The objective as a tuple to maximise: pods placed per priority (highest first), then
    fewest slices destroyed, GPUs touched and slices created."""
    placed = result.placed_pods
    per_priority = tuple(
        sum(1 for p in problem.pods if p.pod.priority == priority and p.pod.key in placed)
        for priority in problem.priorities
    )
    return (
        *per_priority,
        -sum(len(g.destroy) for g in result.gpus),
        -len(result.gpus),
        -sum(len(g.create) for g in result.gpus),
    )
