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
from tessera.core.planner import PendingPod, Plan, Snapshot, plan
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
def solved(seed: int, solver: str) -> Plan:
    snapshot, pods = case(seed)
    return plan(snapshot, pods, solver)  # type: ignore[arg-type]


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


@pytest.mark.parametrize("seed", SEEDS)
def test_the_exact_solver_is_never_beaten(seed: int) -> None:
    _, pods = case(seed)
    fast, exact = solved(seed, "fast"), solved(seed, "exact")
    assert placed_by_priority(pods, exact) >= placed_by_priority(pods, fast)


def test_the_fast_solver_places_within_one_percent_of_the_exact_one() -> None:
    """Issue #5's bar: within 1% of the exact solver. The greedy alone reached 98.3% here
    (pods wanting a 7g, or a 7g plus a small slice, lost the whole cards to earlier small
    pods); with the repair phase that repacks nodes for left-out pods it places as many as
    the exact solver on these seeds (178 of 178, top priority 75 of 75)."""
    fast = exact = top_fast = top_exact = 0
    for seed in SEEDS:
        _, pods = case(seed)
        fast += len(solved(seed, "fast").placements)
        exact += len(solved(seed, "exact").placements)
        top_fast += placed_by_priority(pods, solved(seed, "fast"))[0]
        top_exact += placed_by_priority(pods, solved(seed, "exact"))[0]
    assert exact > 100  # the cases are not trivially empty
    assert fast >= 0.99 * exact
    assert top_fast >= 0.99 * top_exact


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
