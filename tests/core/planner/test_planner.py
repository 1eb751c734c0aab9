"""What a plan promises, case by case: where pods land, what changes, and why others wait."""

from __future__ import annotations

import gc
import random

import pytest

from tessera.core.errors import InvalidInputError
from tessera.core.layout import Slice
from tessera.core.planner import AssignedSlice, Plan, fast, plan, plan_to_dict
from tessera.core.planner.parse import parse_cluster, parse_pending
from tessera.core.planner.synthetic import synthetic_cluster, synthetic_pods
from tests.core.planner.cases import gpu, pod, run

SOLVERS = ["fast", "exact"]


@pytest.mark.parametrize("solver", SOLVERS)
class TestPlacement:
    def test_a_free_existing_slice_is_used_before_anything_is_created(self, solver: str) -> None:
        result = run([{"name": "a", "gpus": [gpu(0, "A100-SXM4-40GB", "1g.5gb@6"),
                                               gpu(1, "A100-SXM4-40GB")]}],
                     [pod("p1", mig_1g_5gb=1)], solver)
        assert result.placements[0].slices == (
            AssignedSlice(0, "nvidia.com/mig-1g.5gb", "1g.5gb", 6),
        )
        assert result.gpus == ()

    def test_in_use_slices_are_kept_and_free_capacity_around_them_is_used(
        self, solver: str
    ) -> None:
        result = run([{"name": "a", "gpus": [gpu(0, "A100-SXM4-40GB", "3g.20gb@4*")]}],
                     [pod("p1", mig_4g_20gb=1)], solver)
        (target,) = result.gpus
        assert target.slices == (Slice("4g.20gb", 0), Slice("3g.20gb", 4))
        assert target.destroy == ()
        assert result.placements[0].slices[0].start == 0

    def test_a_free_slice_in_the_way_is_destroyed_but_never_one_in_use(self, solver: str) -> None:
        result = run([{"name": "a", "gpus": [gpu(0, "A100-SXM4-40GB", "1g.5gb@0", "1g.5gb@5*")]}],
                     [pod("big", mig_4g_20gb=1)], solver)
        (target,) = result.gpus
        assert target.destroy == (Slice("1g.5gb", 0),)
        assert Slice("1g.5gb", 5) in target.slices

    def test_already_split_gpus_are_filled_before_a_whole_one_is_split(self, solver: str) -> None:
        result = run([{"name": "a", "gpus": [gpu(0, "A100-SXM4-40GB"),
                                               gpu(1, "A100-SXM4-40GB", "3g.20gb@4*")]}],
                     [pod("p1", mig_1g_5gb=1)], solver)
        assert [t.index for t in result.gpus] == [1]

    def test_a_pods_slices_all_land_on_one_node(self, solver: str) -> None:
        nodes = [{"name": n, "gpus": [gpu(0, "A100-SXM4-40GB", "4g.20gb@0*")]} for n in "ab"]
        nodes.append({"name": "c", "gpus": [gpu(0), gpu(1)]})
        result = run(nodes, [pod("p", mig_3g_20gb=2, mig_4g_20gb=1)], solver)
        (placement,) = result.placements
        assert placement.node == "c"
        assert sorted(s.profile or "" for s in placement.slices) == [
            "3g.20gb", "3g.20gb", "4g.20gb"]

    def test_a_whole_card_is_made_for_a_pod_the_small_ones_left_no_room_for(
        self, solver: str
    ) -> None:
        # In arrival order the two 3g slices go first, onto one card (3g@0 blocks its 4g);
        # each 4g would then take a card of its own and leave none whole for the 7g. Only
        # a repack of the node (4g+3g twice, the 7g alone) places all five; the wide pod
        # that arrived last waits.
        nodes = [{"name": "a", "gpus": [gpu(i, "A100-80GB") for i in range(3)]}]
        pods = [pod("b-3g", mig_3g_40gb=1), pod("c-3g", mig_3g_40gb=1),
                pod("d-4g", mig_4g_40gb=1), pod("e-4g", mig_4g_40gb=1),
                pod("f-7g", mig_7g_80gb=1), pod("z-wide", mig_7g_80gb=3)]
        result = run(nodes, pods, solver)
        assert [u.pod for u in result.unplaced] == ["default/z-wide"]
        assert sorted(t.slices for t in result.gpus) == [
            (Slice("4g.40gb", 0), Slice("3g.40gb", 4)),
            (Slice("4g.40gb", 0), Slice("3g.40gb", 4)),
            (Slice("7g.80gb", 0),),
        ]

    def test_a_repack_works_around_in_use_slices(self, solver: str) -> None:
        # Free: two 2g placements on card 0, one 1g.20gb placement (start 6) on card 1. The
        # greedy (sizes tie, so oldest first) fills card 0, already touched for pod a, with
        # the 1g.20gb; repacking the node puts that at 6 on card 1 and a second 2g fits.
        # In-use slices stay put.
        nodes = [{"name": "a", "gpus": [
            gpu(0, "A100-80GB", "3g.40gb@4*"),
            gpu(1, "A100-80GB", "2g.20gb@0*", "2g.20gb@2*", "2g.20gb@4*")]}]
        pods = [pod("a", mig_2g_20gb=1), pod("b", mig_1g_20gb=1), pod("c", mig_2g_20gb=1),
                pod("d", mig_2g_20gb=1)]
        result = run(nodes, pods, solver)
        assert len(result.placements) == 3
        by_pod = {p.pod: p.slices for p in result.placements}
        assert by_pod["default/b"] == (AssignedSlice(1, "nvidia.com/mig-1g.20gb", "1g.20gb", 6),)
        assert sorted(s.start or 0 for k, v in by_pod.items() if k != "default/b" for s in v) == [
            0, 2]
        assert all(t.destroy == () for t in result.gpus)

    def test_higher_priority_pods_win_the_last_capacity(self, solver: str) -> None:
        result = run([{"name": "a", "gpus": [gpu(0)]}],
                     [pod("low", 0, mig_7g_40gb=1), pod("high", 5, mig_7g_40gb=1)], solver)
        assert result.placed_pods == {"default/high"}
        assert result.unplaced[0].pod == "default/low"

    def test_a_static_policy_only_offers_existing_free_slices(self, solver: str) -> None:
        nodes = [{"name": "a", "policy": {"name": "fixed", "mode": "static"},
                  "gpus": [gpu(0, "A100-SXM4-40GB", "1g.5gb@0")]}]
        result = run(nodes, [pod("p1", mig_1g_5gb=1), pod("p2", mig_1g_5gb=1)], solver)
        assert result.gpus == ()
        assert result.placed_pods == {"default/p1"}
        assert "policy fixed is static" in result.unplaced[0].reason

    def test_a_recently_changed_gpu_waits_for_the_repartition_interval(self, solver: str) -> None:
        nodes = [{"name": "a", "policy": {"min_repartition_interval_s": 300},
                  "gpus": [gpu(0, last_change=900), gpu(1, last_change=100)]}]
        result = run(nodes, [pod("p1", mig_7g_40gb=1), pod("p2", mig_7g_40gb=1)], solver,
                     now=1000)
        assert [t.index for t in result.gpus] == [1]
        assert "repartitioned 100s ago" in result.unplaced[0].reason

    def test_allowed_profiles_limit_what_is_created(self, solver: str) -> None:
        nodes = [{"name": "a", "policy": {"name": "small", "allowed_profiles": ["1g.5gb"]},
                  "gpus": [gpu(0)]}]
        result = run(nodes, [pod("p1", mig_1g_5gb=1), pod("p2", mig_2g_10gb=1)], solver)
        assert result.placed_pods == {"default/p1"}
        assert "offer mig-2g.10gb" in result.unplaced[0].reason

    def test_whole_gpus_and_mps_shares_come_from_gpus_in_those_modes(self, solver: str) -> None:
        nodes = [{"name": "a", "gpus": [
            {"index": 0, "model": "H100-80GB", "mode": "none"},
            {"index": 1, "model": "H100-80GB", "mode": "none", "in_use": True},
            {"index": 2, "model": "H100-80GB", "mode": "mps", "shares": 4, "shares_in_use": 2},
            gpu(3, "H100-80GB"),
        ]}]
        pods = [{"name": "w", "requests": {"nvidia.com/gpu": 1}},
                {"name": "s", "requests": {"nvidia.com/gpu.shared": 2}},
                {"name": "w2", "requests": {"nvidia.com/gpu": 1}}]
        result = run(nodes, pods, solver)
        by_pod = {p.pod: p.slices for p in result.placements}
        assert by_pod["default/s"] == (AssignedSlice(2, "nvidia.com/gpu.shared", count=2),)
        # Only one whole GPU is free; either of the two alike pods may get it.
        (whole,) = [v for k, v in by_pod.items() if k != "default/s"]
        assert whole == (AssignedSlice(0, "nvidia.com/gpu"),)
        (waiting,) = result.unplaced
        assert "whole GPUs are in use" in waiting.reason


def _aged(name: str, created: float, **requests: int) -> dict[str, object]:
    return {**pod(name, **requests), "creation_time": created}


@pytest.mark.parametrize("solver", SOLVERS)
class TestArrivalOrderWithBackfill:
    """Within a priority pods are served in arrival order; later pods backfill only capacity
    that no earlier waiting pod is waiting for (see :mod:`tessera.core.planner.reserve`)."""

    def test_an_older_large_pod_is_placed_before_younger_small_ones(self, solver: str) -> None:
        # Seven 1g pods would place more pods; the 7g came first, so it gets the card.
        nodes = [{"name": "a", "gpus": [gpu(0, "A100-80GB")]}]
        pods = [_aged("big", 1.0, mig_7g_80gb=1),
                *(_aged(f"small-{i}", 2.0 + i, mig_1g_10gb=1) for i in range(7))]
        result = run(nodes, pods, solver)
        assert [p.pod for p in result.placements] == ["default/big"]

    def test_younger_pods_backfill_capacity_the_waiting_pod_cannot_use(
        self, solver: str
    ) -> None:
        # The old 7g may only run on node b, whose card has an in-use slice: it waits and
        # holds that card back, but node a's whole card is free for the younger pods.
        nodes = [{"name": "a", "gpus": [gpu(0, "A100-80GB")]},
                 {"name": "b", "labels": {"pool": "train"},
                  "gpus": [gpu(0, "A100-80GB", "1g.10gb@0*")]}]
        pods = [{**_aged("old-7g", 1.0, mig_7g_80gb=1), "nodeSelector": {"pool": "train"}},
                *(_aged(f"young-{i}", 2.0 + i, mig_1g_10gb=1) for i in range(3))]
        result = run(nodes, pods, solver)
        assert [u.pod for u in result.unplaced] == ["default/old-7g"]
        assert {p.node for p in result.placements} == {"a"}
        assert len(result.placements) == 3

    def test_a_waiting_pod_reserves_the_card_closest_to_free(self, solver: str) -> None:
        # The 7g fits nowhere: card 0 has one in-use 1g, card 1 an in-use 3g. It reserves
        # card 0 (least in use in its way), so the younger 1g pods go to card 1 only and
        # card 0 drains towards the 7g instead of being refilled forever.
        nodes = [{"name": "a", "gpus": [gpu(0, "A100-80GB", "1g.10gb@0*"),
                                        gpu(1, "A100-80GB", "3g.40gb@4*")]}]
        pods = [_aged("big", 1.0, mig_7g_80gb=1),
                *(_aged(f"small-{i}", 2.0 + i, mig_1g_10gb=1) for i in range(6))]
        result = run(nodes, pods, solver)
        assert "default/big" in {u.pod for u in result.unplaced}
        assert {s.gpu for p in result.placements for s in p.slices} == {1}
        assert len(result.placements) == 4  # card 1 has four free 1g placements left
        assert all(t.index == 1 for t in result.gpus)
        waiting = [u.reason for u in result.unplaced if u.pod != "default/big"]
        assert len(waiting) == 2
        assert all("1 GPUs held for default/big, which waits for them (it came first)" in r
                   for r in waiting), waiting

    def test_without_reservations_backfill_takes_everything(self, solver: str) -> None:
        nodes = [{"name": "a", "gpus": [gpu(0, "A100-80GB", "1g.10gb@0*"),
                                        gpu(1, "A100-80GB", "3g.40gb@4*")]}]
        pods = [_aged("big", 1.0, mig_7g_80gb=1),
                *(_aged(f"small-{i}", 2.0 + i, mig_1g_10gb=1) for i in range(6))]
        result = plan(parse_cluster({"nodes": nodes}), parse_pending({"pods": pods}),
                      solver, reservations=0)  # type: ignore[arg-type]
        assert 0 in {s.gpu for p in result.placements for s in p.slices}
        assert len(result.placements) == 6

    def test_reservations_are_bounded(self, solver: str) -> None:
        # Two waiting 7g pods, one reservation allowed: only the older one holds a card
        # back; the younger 1g pods may use the other card.
        nodes = [{"name": "a", "gpus": [gpu(0, "A100-80GB", "1g.10gb@0*"),
                                        gpu(1, "A100-80GB", "1g.10gb@0*")]}]
        pods = [_aged("big-1", 1.0, mig_7g_80gb=1), _aged("big-2", 1.5, mig_7g_80gb=1),
                *(_aged(f"small-{i}", 2.0 + i, mig_1g_10gb=1) for i in range(3))]
        result = plan(parse_cluster({"nodes": nodes}), parse_pending({"pods": pods}),
                      solver, reservations=1)  # type: ignore[arg-type]
        assert {s.gpu for p in result.placements for s in p.slices} == {1}
        assert len(result.placements) == 3

    def test_a_pod_reserves_only_once_it_has_waited_reserve_after_s(self, solver: str) -> None:
        # The 7g arrived at t=100 and fits nowhere. At t=110 it has waited 10 s, less than
        # the 30 s asked: it holds nothing back, and the 1g pods backfill card 0 as well.
        # At t=130 it has waited long enough and card 0 (closest to free) is kept for it.
        nodes = [{"name": "a", "gpus": [gpu(0, "A100-80GB", "1g.10gb@0*"),
                                        gpu(1, "A100-80GB", "3g.40gb@4*")]}]
        pods = parse_pending({"pods": [
            _aged("big", 100.0, mig_7g_80gb=1),
            *(_aged(f"small-{i}", 101.0 + i, mig_1g_10gb=1) for i in range(6))]})

        def at(now: float) -> Plan:
            return plan(parse_cluster({"nodes": nodes, "now": now}), pods,
                        solver, reserve_after_s=30.0)  # type: ignore[arg-type]

        early, late = at(110.0), at(130.0)
        assert 0 in {s.gpu for p in early.placements for s in p.slices}
        assert len(early.placements) == 6
        assert {s.gpu for p in late.placements for s in p.slices} == {1}
        assert len(late.placements) == 4

    def test_a_pod_too_new_to_reserve_does_not_use_up_the_bound(self, solver: str) -> None:
        # Two waiting 7g pods, one reservation. "big-new" comes first in planning order (a
        # higher priority) but has waited 5 s of the 30 asked: it reserves nothing, and the
        # one reservation goes to "big-old", which has waited 80 s.
        nodes = [{"name": "a", "gpus": [gpu(0, "A100-80GB", "1g.10gb@0*"),
                                        gpu(1, "A100-80GB", "3g.40gb@4*")]}]
        pods = parse_pending({"pods": [
            {**_aged("big-new", 125.0, mig_7g_80gb=1), "priority": 10},
            _aged("big-old", 50.0, mig_7g_80gb=1),
            *(_aged(f"small-{i}", 126.0 + i, mig_1g_10gb=1) for i in range(6))]})
        result = plan(parse_cluster({"nodes": nodes, "now": 130.0}), pods,
                      solver,  # type: ignore[arg-type]
                      reservations=1, reserve_after_s=30.0)
        assert {u.pod for u in result.unplaced} >= {"default/big-new", "default/big-old"}
        assert {s.gpu for p in result.placements for s in p.slices} == {1}
        held = [u.reason for u in result.unplaced if u.pod.startswith("default/small")]
        assert held
        assert all("held for default/big-old" in r for r in held), held


@pytest.mark.parametrize("solver", SOLVERS)
class TestFilters:
    NODES = [  # noqa: RUF012 - read-only table
        {"name": "a", "labels": {"zone": "a"}, "gpus": [gpu(0)]},
        {"name": "b", "labels": {"zone": "b"},
         "taints": [{"key": "dedicated", "value": "batch", "effect": "NoSchedule"}],
         "gpus": [gpu(0)]},
    ]

    def test_node_selector_is_obeyed(self, solver: str) -> None:
        wanted = pod("p", mig_1g_5gb=1) | {"nodeSelector": {"zone": "a"}}
        assert run(self.NODES, [wanted], solver).placements[0].node == "a"

    def test_required_affinity_is_obeyed(self, solver: str) -> None:
        affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "zone", "operator": "NotIn", "values": ["a"]}]}]}}}
        wanted = pod("p", mig_1g_5gb=1) | {
            "affinity": affinity,
            "tolerations": [{"key": "dedicated", "operator": "Exists"}]}
        assert run(self.NODES, [wanted], solver).placements[0].node == "b"

    def test_an_untolerated_taint_excludes_the_node_and_says_so(self, solver: str) -> None:
        wanted = pod("p", mig_1g_5gb=1) | {"nodeSelector": {"zone": "b"}}
        result = run(self.NODES, [wanted], solver)
        assert result.placements == ()
        assert "taint dedicated=batch:NoSchedule" in result.unplaced[0].reason


class TestReasons:
    def test_the_reason_names_the_in_use_slices_that_block_the_profile(self) -> None:
        nodes = [{"name": f"n{i}", "gpus": [gpu(0, "A100-80GB", "1g.10gb@0*")]}
                 for i in range(3)]
        result = run(nodes, [pod("p9", mig_4g_40gb=1)])
        assert result.unplaced[0].reason == (
            "no node with a free mig-4g.40gb placement: 3 GPUs have slices in use that block "
            "every 4g.40gb placement (1g.10gb@0)"
        )

    def test_a_profile_no_model_in_the_cluster_has_is_unplaced_with_a_reason(self) -> None:
        result = run([{"name": "a", "gpus": [gpu(0, "A30-24GB")]}], [pod("p", mig_7g_80gb=1)])
        assert "no node's GPUs can offer mig-7g.80gb" in result.unplaced[0].reason
        assert "A30-24GB" in result.unplaced[0].reason

    def test_cpu_and_memory_of_the_node_are_respected(self) -> None:
        nodes = [{"name": "a", "allocatable": {"cpu": "8", "memory": "64Gi"},
                  "allocated": {"cpu": "6"}, "gpus": [gpu(0)]}]
        pods = [{"name": "p", "containers": [
            {"requests": {"cpu": "3", "nvidia.com/mig-1g.5gb": 1}}]}]
        result = run(nodes, pods)
        assert "no eligible node has 3000m CPU" in result.unplaced[0].reason


class TestContract:
    def test_the_same_input_gives_the_same_plan(self) -> None:
        nodes = [{"name": n, "gpus": [gpu(0), gpu(1, "A100-SXM4-40GB", "3g.20gb@4*")]}
                 for n in "abc"]
        pods = [pod(f"p{i}", i % 2, mig_1g_5gb=1 + i % 2, mig_3g_20gb=i % 3 // 2)
                for i in range(12)]
        assert plan_to_dict(run(nodes, pods)) == plan_to_dict(run(nodes, list(reversed(pods))))

    def test_the_exact_solver_refuses_large_clusters(self) -> None:
        snapshot = parse_cluster({"nodes": [{"name": "a", "gpus": [gpu(i) for i in range(4)]}]})
        with pytest.raises(InvalidInputError, match="at most 3 GPUs") as error:
            plan(snapshot, parse_pending({"pods": []}), "exact", max_exact_gpus=3)
        assert error.value.choices == ("fast",)

    @pytest.mark.parametrize("wait", [-1.0, float("inf"), float("nan")])
    def test_a_wait_before_reserving_must_be_finite_seconds(self, wait: float) -> None:
        snapshot = parse_cluster({"nodes": [{"name": "a", "gpus": [gpu(0)]}]})
        with pytest.raises(InvalidInputError, match=r"^reserve_after_s: must be a finite"):
            plan(snapshot, parse_pending({"pods": []}), reserve_after_s=wait)

    def test_the_plan_json_has_the_documented_shape(self) -> None:
        result = run([{"name": "node-a", "gpus": [gpu(0)]}], [pod("p1", mig_1g_5gb=1),
                                                            pod("p9", mig_7g_40gb=2)])
        data = plan_to_dict(result)
        assert data["gpus"] == [{"node": "node-a", "index": 0, "model": "A100-SXM4-40GB",
                                 "mode": "mig", "slices": [{"profile": "1g.5gb", "start": 6}],
                                 "destroy": [], "create": [{"profile": "1g.5gb", "start": 6}]}]
        assert data["placements"] == [{"pod": "default/p1", "node": "node-a",
                                       "slices": [{"gpu": 0, "profile": "1g.5gb", "start": 6}]}]
        unplaced = data["unplaced"]
        assert isinstance(unplaced, list)
        assert [u["pod"] for u in unplaced] == ["default/p9"]


def test_offers_kept_between_plans_give_the_plan_worked_out_afresh() -> None:
    """MIG offers and fragmentation are kept between plans (a fleet's GPUs repeat a few
    states): a plan made with them is the plan made with none kept, whatever the demand mix."""
    rng = random.Random(5)
    snapshot = synthetic_cluster(rng, 40, gpus_per_node=8, split=0.5, in_use=0.5,
                                 standard=True)
    pods = synthetic_pods(rng, 200, multi=0.1, priorities=(0, 10))
    mixes = [None, {"nvidia.com/mig-1g.10gb": 3.0, "nvidia.com/mig-7g.80gb": 1.0}]
    warm = []
    for mix in mixes:  # the first plan fills the kept offers the second then reads
        warm.append(plan(snapshot, pods, recent_demand=mix))
    assert fast._SHARED_OFFERS, "offers were kept"
    for mix, kept in zip(mixes, warm, strict=True):
        fast._SHARED_OFFERS.clear()
        fast._SHARED_FRAG.clear()
        assert plan(snapshot, pods, recent_demand=mix) == kept


class TestCycleCollector:
    """A plan runs with Python's cycle collector paused (its full passes walk every object the
    process holds, a third of a plan's time on 10,000 GPUs) and leaves it as it found it."""

    def test_it_is_off_while_planning_and_back_on_after(self, monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
        seen: list[bool] = []
        real = fast.solve_fast

        def watching(*args: object, **kwargs: object) -> object:
            seen.append(gc.isenabled())
            return real(*args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr("tessera.core.planner.solve_fast", watching)
        assert gc.isenabled()
        run([{"name": "a", "gpus": [gpu(0)]}], [pod("p1", mig_1g_5gb=1)])
        assert seen == [False]
        assert gc.isenabled()

    def test_it_is_back_on_when_a_plan_fails(self, monkeypatch: pytest.MonkeyPatch) -> None:
        def failing(*args: object, **kwargs: object) -> object:
            raise RuntimeError("solver bug")

        monkeypatch.setattr("tessera.core.planner.solve_fast", failing)
        with pytest.raises(RuntimeError, match="solver bug"):
            run([{"name": "a", "gpus": [gpu(0)]}], [pod("p1", mig_1g_5gb=1)])
        assert gc.isenabled()

    def test_a_caller_that_turned_it_off_finds_it_off(self) -> None:
        gc.disable()
        try:
            run([{"name": "a", "gpus": [gpu(0)]}], [pod("p1", mig_1g_5gb=1)])
            assert not gc.isenabled()
        finally:
            gc.enable()
