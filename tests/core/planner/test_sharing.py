"""Dynamic sharing: idle whole GPUs become shares when pods wait for them, and back."""

from __future__ import annotations

import pytest

from tessera.core.errors import InvalidInputError
from tessera.core.planner import (
    MPS_SHARE_RESOURCE,
    WHOLE_GPU_RESOURCE,
    AssignedSlice,
    Gpu,
    GpuSlice,
    Node,
    PendingPod,
    Policy,
    Snapshot,
    parse_cluster,
    parse_pending,
    plan,
    plan_to_dict,
)

SOLVERS = ["fast", "exact"]
SHARING = Policy(name="l4", mode="dynamic", share="mps", share_count=6)


def _l4(index: int, **fields: object) -> Gpu:
    return Gpu(index=index, model="L4-24GB", mode="none", **fields)  # type: ignore[arg-type]


def _cluster(*gpus: Gpu, policy: Policy = SHARING, now: float | None = 1000.0) -> Snapshot:
    return Snapshot(nodes=(Node(name="l4-node", gpus=gpus, policy=policy),), now=now)


def _pods(count: int, resource: str = MPS_SHARE_RESOURCE, start: int = 0) -> list[PendingPod]:
    return [PendingPod("ml", f"p{start + i}", ((resource, 1),), creation_time=float(start + i))
            for i in range(count)]


@pytest.mark.parametrize("solver", SOLVERS)
class TestSharing:
    def test_six_share_pods_turn_one_idle_whole_gpu_into_six_shares(self, solver: str) -> None:
        result = plan(_cluster(_l4(0), _l4(1)), _pods(6), solver)
        (target,) = result.gpus
        assert (target.index, target.mode, target.shares, target.sharing) == (0, "mps", 6, "mps")
        assert len(result.placements) == 6
        assert {s.gpu for p in result.placements for s in p.slices} == {0}

    def test_a_seventh_pod_shares_a_second_gpu(self, solver: str) -> None:
        result = plan(_cluster(_l4(0), _l4(1)), _pods(7), solver)
        assert [(t.index, t.mode) for t in result.gpus] == [(0, "mps"), (1, "mps")]
        assert len(result.placements) == 7

    def test_free_shares_are_used_before_another_gpu_is_shared(self, solver: str) -> None:
        shared = Gpu(index=0, model="L4-24GB", mode="mps", shares=6, shares_in_use=4)
        result = plan(_cluster(shared, _l4(1)), _pods(2), solver)
        assert result.gpus == ()
        assert {s.gpu for p in result.placements for s in p.slices} == {0}

    def test_a_whole_gpu_pod_takes_back_a_gpu_whose_shares_are_all_free(self, solver: str) -> None:
        shared = Gpu(index=0, model="L4-24GB", mode="mps", shares=6, shares_in_use=0)
        result = plan(_cluster(shared), _pods(1, WHOLE_GPU_RESOURCE), solver)
        (target,) = result.gpus
        assert (target.mode, target.shares) == ("none", 0)
        assert result.placements[0].slices[0].resource == WHOLE_GPU_RESOURCE

    def test_a_gpu_in_use_is_never_switched(self, solver: str) -> None:
        held = Gpu(index=0, model="L4-24GB", mode="mps", shares=6, shares_in_use=6)
        result = plan(_cluster(held, _l4(1, in_use=True)), [
            *_pods(1), *_pods(1, WHOLE_GPU_RESOURCE, start=1)], solver)
        assert result.gpus == ()
        assert result.placements == ()

    def test_the_policy_decides_whether_and_how_gpus_are_shared(self, solver: str) -> None:
        unshared = plan(_cluster(_l4(0), policy=Policy(name="whole", mode="dynamic")),
                        _pods(2), solver)
        assert unshared.gpus == ()
        assert len(unshared.unplaced) == 2
        sliced = plan(_cluster(_l4(0), policy=Policy(name="ts", mode="dynamic",
                                                      share="timeslice", share_count=4)),
                      _pods(2), solver)
        (target,) = sliced.gpus
        assert (target.mode, target.shares, target.sharing) == ("mps", 4, "timeslice")

    def test_a_gpu_changed_lately_waits_for_the_policys_interval(self, solver: str) -> None:
        slow = Policy(name="l4", mode="dynamic", share="mps", share_count=6,
                      min_repartition_interval_s=60)
        recent = plan(_cluster(_l4(0, last_change=990.0), policy=slow), _pods(1), solver)
        assert recent.gpus == ()
        later = plan(_cluster(_l4(0, last_change=900.0), policy=slow), _pods(1), solver)
        assert [t.mode for t in later.gpus] == ["mps"]

    def test_a_gpu_switched_for_nothing_stays_as_it_was(self, solver: str) -> None:
        # the share pod fits nowhere on this node (it asks 8 shares of a 6-share GPU)
        result = plan(_cluster(_l4(0)), [PendingPod("ml", "wide", ((MPS_SHARE_RESOURCE, 8),))],
                      solver)
        assert result.gpus == ()
        assert len(result.unplaced) == 1


MIG_SHARED = "nvidia.com/mig-3g.40gb.shared"


def _a100_with_inner_mps(held: int) -> Snapshot:
    gpu = Gpu(index=0, model="A100-80GB", mode="mig", slices=(
        GpuSlice("3g.40gb", 4, in_use=True, shares=3, shares_in_use=held),
        GpuSlice("1g.10gb", 0)))
    return Snapshot(nodes=(Node(name="a100", gpus=(gpu,),
                                policy=Policy(name="static", mode="static")),))


@pytest.mark.parametrize("solver", SOLVERS)
class TestSharesOfMigSlices:
    def test_free_shares_of_a_slice_running_mps_go_to_pods_oldest_first(
            self, solver: str) -> None:
        pods = [PendingPod("ml", f"s{n}", ((MIG_SHARED, 1),), creation_time=float(n))
                for n in range(3)]
        result = plan(_a100_with_inner_mps(held=1), pods, solver)
        assert [p.pod for p in result.placements] == ["ml/s0", "ml/s1"]
        assert result.placements[0].slices == (
            AssignedSlice(0, MIG_SHARED, "3g.40gb", 4, count=1),)
        (unplaced,) = result.unplaced
        assert unplaced.pod == "ml/s2"
        assert "no node it may run on has 1 x mig-3g.40gb.shared free" in unplaced.reason
        assert result.gpus == (), "the planner never reshapes a slice running MPS"

    def test_plain_slices_beside_it_are_planned_as_ever(self, solver: str) -> None:
        pods = [PendingPod("ml", "inner", ((MIG_SHARED, 2),)),
                PendingPod("ml", "plain", (("nvidia.com/mig-1g.10gb", 1),))]
        result = plan(_a100_with_inner_mps(held=0), pods, solver)
        assert sorted(p.pod for p in result.placements) == ["ml/inner", "ml/plain"]
        inner = next(p for p in result.placements if p.pod == "ml/inner")
        assert inner.slices == (AssignedSlice(0, MIG_SHARED, "3g.40gb", 4, count=2),)

    def test_shares_asked_with_other_resources_are_refused_with_the_reason(
            self, solver: str) -> None:
        pods = [PendingPod("ml", "mixed", ((MIG_SHARED, 1), ("nvidia.com/mig-1g.10gb", 1)))]
        (unplaced,) = plan(_a100_with_inner_mps(held=0), pods, solver).unplaced
        assert "together with other GPU resources" in unplaced.reason


SIZED = Policy(name="l4", mode="dynamic", share="mps", share_count=4, share_sizes_gib=(8, 4))
EIGHT = "nvidia.com/gpu.shared-8gb"


@pytest.mark.parametrize("solver", SOLVERS)
class TestMemorySizedShares:
    def test_a_gpu_becomes_as_many_8gb_shares_as_its_memory_holds(self, solver: str) -> None:
        result = plan(_cluster(_l4(0), _l4(1), policy=SIZED), _pods(3, EIGHT), solver)
        # an L4's 23,034 MiB hold two 8 GiB shares: three pods need both GPUs
        assert [(t.index, t.shares, t.share_resource) for t in result.gpus] == [
            (0, 2, EIGHT), (1, 2, EIGHT)]
        assert len(result.placements) == 3

    def test_each_gpu_takes_the_size_its_pods_ask(self, solver: str) -> None:
        pods = [*_pods(1, EIGHT), *_pods(3, MPS_SHARE_RESOURCE, start=1)]
        result = plan(_cluster(_l4(0), _l4(1), policy=SIZED), pods, solver)
        assert sorted((t.share_resource, t.shares) for t in result.gpus) == [
            (MPS_SHARE_RESOURCE, 4), (EIGHT, 2)]

    def test_a_gpu_whose_shares_are_all_free_is_resized(self, solver: str) -> None:
        plain = Gpu(index=0, model="L4-24GB", mode="mps", shares=4, shares_in_use=0)
        (target,) = plan(_cluster(plain, policy=SIZED), _pods(1, EIGHT), solver).gpus
        assert (target.mode, target.shares, target.share_resource) == ("mps", 2, EIGHT)

    def test_a_size_the_policy_does_not_offer_is_never_made(self, solver: str) -> None:
        result = plan(_cluster(_l4(0), policy=SIZED), _pods(1, "nvidia.com/gpu.shared-10gb"),
                      solver)
        assert result.gpus == ()
        assert len(result.unplaced) == 1


def test_plan_files_name_cards_without_mig_and_sized_shares() -> None:
    snapshot = parse_cluster({"nodes": [{
        "name": "l4", "policy": {"mode": "dynamic", "share": "mps", "share_count": 4,
                                 "share_sizes_gib": [8]},
        "gpus": [{"index": 0, "model": "NVIDIA L4", "mode": "none"},
                 {"index": 1, "model": "0x27B8", "mode": "mps", "shares": 4,
                  "shares_in_use": 1}]}]})
    pods = parse_pending({"pods": [{"name": "a", "requests": {EIGHT: 1}},
                                   {"name": "b", "requests": {MPS_SHARE_RESOURCE: 2}}]})
    data = plan_to_dict(plan(snapshot, pods))
    (switched,) = data["gpus"]  # type: ignore[misc]
    assert (switched["model"], switched["mode"], switched["shares"],
            switched["share_resource"]) == ("L4-24GB", "mps", 2, EIGHT)
    assert [p["slices"] for p in data["placements"]] == [  # type: ignore[index]
        [{"gpu": 0, "resource": EIGHT, "shares": 1}],
        [{"gpu": 1, "resource": MPS_SHARE_RESOURCE, "shares": 2}]]
    with pytest.raises(InvalidInputError, match="not a GPU share resource"):
        parse_cluster({"nodes": [{"name": "x", "gpus": [
            {"index": 0, "model": "L4", "mode": "mps", "shares": 2,
             "share_resource": "nvidia.com/gpu"}]}]})
