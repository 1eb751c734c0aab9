"""Properties of every plan on seeded generated clusters, and the fast solver against the exact.

Each case is rebuilt from its seed, so a failure names a reproducible cluster. Cases are small
(at most 4 nodes x 4 GPUs, 16 pods) so the exact solver stays well under a second each.
"""

from __future__ import annotations

import random
from collections import Counter
from functools import cache

import pytest

from tessera.core import catalogue, layout
from tessera.core.layout import Slice
from tessera.core.planner import DEFAULT_RESERVATIONS, PendingPod, Plan, Snapshot, plan
from tessera.core.planner.filters import rejection
from tessera.core.planner.geometry import geometry_of
from tessera.core.planner.synthetic import synthetic_cluster, synthetic_pods

SEEDS = range(30)


@cache
def case(seed: int) -> tuple[Snapshot, tuple[PendingPod, ...]]:
    rng = random.Random(seed)
    snapshot = synthetic_cluster(
        rng, rng.randint(1, 4), gpus_per_node=rng.randint(1, 4), split=0.6, in_use=0.5,
        static=0.15, tainted=0.2, models=("A100-80GB", "H100-80GB"),
    )
    pods = synthetic_pods(rng, rng.randint(3, 16), multi=0.25, priorities=(0, 1, 5),
                          filtered=0.3)
    return snapshot, pods


@cache
def solved(seed: int, solver: str, reservations: int = DEFAULT_RESERVATIONS) -> Plan:
    snapshot, pods = case(seed)
    return plan(snapshot, pods, solver, reservations=reservations)  # type: ignore[arg-type]


def _compute(profile: str | None) -> float:
    """A unit's compute as a share of its card (whole GPUs and MPS shares count 1 and 0)."""
    if profile is None:
        return 0.0
    return int(profile.split("g", 1)[0]) / 7


def check_plan(snapshot: Snapshot, pods: tuple[PendingPod, ...], result: Plan) -> None:
    """Everything a plan promises, checked from the inputs alone (not from solver internals)."""
    nodes = {n.name: n for n in snapshot.nodes}
    targets = {(t.node, t.index): t for t in result.gpus}
    for (node_name, index), target in targets.items():
        gpu = next(g for g in nodes[node_name].gpus if g.index == index)
        model = catalogue.model(gpu.model)
        layout.check_layout(model, target.slices)
        assert {s.slice for s in gpu.slices if s.in_use} <= set(target.slices)
        assert nodes[node_name].policy.mode == "dynamic"
        assert set(target.destroy) == {s.slice for s in gpu.slices} - set(target.slices)
    given: Counter[tuple[str, int, object]] = Counter()
    by_key = {p.key: p for p in pods}
    for placement in result.placements:
        pod = by_key[placement.pod]
        node = nodes[placement.node]
        assert rejection(pod, node) is None
        got: Counter[str] = Counter()
        for item in placement.slices:
            gpu = next(g for g in node.gpus if g.index == item.gpu)
            got[item.resource] += item.count
            if item.profile is None:
                given[(node.name, gpu.index, item.resource)] += item.count
                continue
            assert item.start is not None
            slice_ = Slice(item.profile, item.start)
            changed = targets.get((node.name, gpu.index))
            final = set(changed.slices) if changed else {s.slice for s in gpu.slices}
            assert slice_ in final
            assert slice_ not in {s.slice for s in gpu.slices if s.in_use}
            assert catalogue.mig_resource_name(item.profile) == item.resource
            given[(node.name, gpu.index, slice_)] += 1
        assert dict(got) == pod.request_map
    assert all(count == 1 for key, count in given.items() if isinstance(key[2], Slice))
    for (node_name, index, resource), count in given.items():
        if isinstance(resource, str):
            gpu = next(g for g in nodes[node_name].gpus if g.index == index)
            free = gpu.shares - gpu.shares_in_use if gpu.mode == "mps" else int(not gpu.in_use)
            assert count <= free
    assert result.placed_pods | {u.pod for u in result.unplaced} == set(by_key)
    assert all(u.reason for u in result.unplaced)


def placed_by_priority(pods: tuple[PendingPod, ...], result: Plan) -> tuple[int, ...]:
    return tuple(
        sum(1 for p in pods if p.priority == priority and p.key in result.placed_pods)
        for priority in sorted({p.priority for p in pods}, reverse=True)
    )


@pytest.mark.parametrize("solver", ["fast", "exact"])
@pytest.mark.parametrize("seed", SEEDS)
def test_every_plan_keeps_its_promises(seed: int, solver: str) -> None:
    snapshot, pods = case(seed)
    check_plan(snapshot, pods, solved(seed, solver))


def in_planning_order(pods: tuple[PendingPod, ...], result: Plan) -> tuple[bool, ...]:
    """Whether each pod was placed, in the objective's order (priority, then arrival)."""
    ordered = sorted(pods, key=lambda p: (-p.priority, p.creation_time, p.namespace, p.name))
    return tuple(p.key in result.placed_pods for p in ordered)


@pytest.mark.parametrize("seed", SEEDS)
def test_the_exact_solver_is_never_beaten(seed: int) -> None:
    """Without reservations both solvers optimise the same lexicographic order, so the
    exact plan is at least as good at the first pod where they differ."""
    _, pods = case(seed)
    fast, exact = solved(seed, "fast", 0), solved(seed, "exact", 0)
    assert in_planning_order(pods, exact) >= in_planning_order(pods, fast)


def _totals(seeds: range) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for solver in ("fast", "exact"):
        placed = top = compute = 0.0
        for seed in seeds:
            _, pods = case(seed)
            result = solved(seed, solver)
            placed += len(result.placements)
            top += placed_by_priority(pods, result)[0]
            compute += sum(s.count * _compute(s.profile) for p in result.placements
                           for s in p.slices)
        out[solver] = {"placed": placed, "top": top, "compute": compute}
    return out


def test_the_fast_solver_is_within_one_percent_of_the_exact_one() -> None:
    """Pods placed and top-priority pods placed within 1% of the exact solver, both under
    the arrival-order objective with reservations. (Compute placed is 98% here: on seed 27
    the exact plan shuffles four nodes to fit a 3g+4g+7g pod; bench/README.md.)"""
    totals = _totals(SEEDS)
    fast, exact = totals["fast"], totals["exact"]
    assert exact["placed"] > 100  # the cases are not trivially empty
    for key in ("placed", "top"):
        assert fast[key] >= 0.99 * exact[key], (key, fast, exact)
    assert fast["compute"] >= 0.97 * exact["compute"]


def test_plans_are_deterministic() -> None:
    snapshot, pods = case(3)
    assert plan(snapshot, pods) == plan(snapshot, tuple(reversed(pods))) == solved(3, "fast")


@pytest.mark.parametrize("model", [m.name for m in catalogue.models()])
def test_the_bit_mask_geometry_agrees_with_the_layout_model(model: str) -> None:
    geometry = geometry_of(model)
    rng = random.Random(model)
    for _ in range(1500):
        mask = 0
        for _ in range(rng.randint(0, 7)):
            mask |= 1 << rng.randrange(len(geometry.slices))
        slices = sorted(geometry.to_slices(mask))
        assert geometry.valid(mask) == layout.is_valid(catalogue.model(model), slices), slices
