"""Which waiting pods one plan considers (:func:`tessera.core.planner.bounded_batch`)."""

from __future__ import annotations

from tessera.core.planner import (
    Gpu,
    GpuSlice,
    Node,
    PendingPod,
    Snapshot,
    bounded_batch,
)

MIG_1G = "nvidia.com/mig-1g.10gb"
MIG_7G = "nvidia.com/mig-7g.80gb"


def _pods(resource: str, count: int, units: int = 1, start: float = 0.0) -> list[PendingPod]:
    return [PendingPod("ml", f"{resource[-7:]}-{units}-{i}", ((resource, units),),
                       creation_time=start + i) for i in range(count)]


def _cluster(*gpus: Gpu) -> Snapshot:
    return Snapshot((Node("node-a", gpus=gpus),))


EMPTY = Gpu(index=0, model="A100-80GB")
FULL = Gpu(index=1, model="A100-80GB", slices=(GpuSlice("7g.80gb", 0, in_use=True),))


def test_a_shape_sends_its_oldest_pods_up_to_what_free_compute_could_hold() -> None:
    batch = bounded_batch(_cluster(EMPTY, FULL), _pods(MIG_1G, 20))
    assert [p.creation_time for p in batch.pods] == [float(i) for i in range(7)]
    assert not batch.cut_short, "nothing left out that the free compute could hold"


def test_at_most_per_shape_pods_of_a_shape_and_the_plan_is_told_to_come_back() -> None:
    gpus = tuple(Gpu(index=i, model="A100-80GB") for i in range(4))  # 28 free compute slices
    batch = bounded_batch(_cluster(*gpus), _pods(MIG_1G, 40), per_shape=10)
    assert len(batch.pods) == 10
    assert batch.cut_short, "18 more could fit: plan again after these are counted"


def test_a_cluster_with_more_gpus_free_than_per_shape_takes_one_pod_per_such_gpu() -> None:
    """A plan's cost is of the order of the cluster's: a burst the cluster has room for goes
    in plans of one pod per GPU with room, not of ``per_shape``."""
    gpus = tuple(Gpu(index=i, model="A100-80GB") for i in range(30))  # 210 free slices
    batch = bounded_batch(_cluster(*gpus), _pods(MIG_1G, 100), per_shape=10)
    assert len(batch.pods) == 30
    assert batch.cut_short
    assert "at most 30 of a kind" in batch.later[0].reason


def test_a_shape_no_gpu_can_host_now_sends_only_the_pods_that_may_reserve() -> None:
    half = Gpu(index=0, model="A100-80GB", slices=(GpuSlice("3g.40gb", 4, in_use=True),))
    batch = bounded_batch(_cluster(half, FULL), [*_pods(MIG_7G, 5, start=0.0),
                                                 *_pods(MIG_1G, 3, start=10.0)],
                          reservations=1)
    sevens = [p for p in batch.pods if p.requests == ((MIG_7G, 1),)]
    assert [p.creation_time for p in sevens] == [0.0], "the oldest 7g pod, to reserve"
    assert len(batch.pods) == 4, "and every 1g pod the free compute holds"
    assert [p.creation_time for p in batch.pods] == sorted(p.creation_time
                                                           for p in batch.pods)


def test_a_pod_of_several_gpus_reserves_nothing_while_a_gpu_has_room_but_not_its_compute() -> None:
    """One whole card free, the pod asks two: it is left out of the plan, told why, and so
    reserves nothing in it (the module docstring says why that is kept)."""
    pods = _pods(MIG_7G, 2, units=2)
    batch = bounded_batch(_cluster(EMPTY, FULL), pods, reservations=1)
    assert batch.pods == ()
    assert [u.pod for u in batch.later] == [p.key for p in pods]
    assert batch.later[0].reason == ("it needs 14 free compute slices of MIG GPUs and 7 are "
                                     "free; it is planned when enough free up")


def test_a_pod_of_several_gpus_goes_in_to_reserve_when_no_gpu_can_host_a_unit() -> None:
    half = Gpu(index=0, model="A100-80GB", slices=(GpuSlice("3g.40gb", 4, in_use=True),))
    pods = _pods(MIG_7G, 2, units=2)
    batch = bounded_batch(_cluster(half, FULL), pods, reservations=1)
    assert [p.key for p in batch.pods] == [pods[0].key], "the oldest, to reserve"
    assert "no GPU can host 7g.80gb now" in batch.later[0].reason


def test_a_pod_of_several_gpus_goes_in_when_the_cluster_has_its_compute_free() -> None:
    gpus = tuple(Gpu(index=i, model="A100-80GB") for i in range(2))
    pods = _pods(MIG_7G, 3, units=2)
    batch = bounded_batch(_cluster(*gpus, FULL), pods, reservations=1)
    assert [p.key for p in batch.pods] == [pods[0].key], "what the free compute holds"


def test_priority_comes_before_age() -> None:
    old = _pods(MIG_1G, 8)
    urgent = PendingPod("ml", "urgent", ((MIG_1G, 1),), priority=100, creation_time=99.0)
    batch = bounded_batch(_cluster(EMPTY), [*old, urgent])
    assert batch.pods[0].name == "urgent"
    assert len(batch.pods) == 7


def test_requests_it_cannot_reason_about_pass_up_to_the_bound() -> None:
    whole = [PendingPod("ml", f"w{i}", (("nvidia.com/gpu", 1),), creation_time=i)
             for i in range(5)]
    batch = bounded_batch(_cluster(EMPTY), whole, per_shape=3)
    assert [p.name for p in batch.pods] == ["w0", "w1", "w2"]
    assert batch.cut_short


def test_every_pod_left_out_is_told_why() -> None:
    half = Gpu(index=0, model="A100-80GB", slices=(GpuSlice("3g.40gb", 4, in_use=True),))
    pods = [*_pods(MIG_7G, 3), *_pods(MIG_1G, 6, start=10.0), *_pods(MIG_7G, 1, units=2)]
    batch = bounded_batch(_cluster(half, FULL), pods, per_shape=2)
    reasons = {u.pod: u.reason for u in batch.later}
    assert {p.key for p in batch.pods} | set(reasons) == {p.key for p in pods}
    assert not {p.key for p in batch.pods} & set(reasons)
    sevens = sorted(k for k in reasons if k.endswith(("-1-1", "-1-2")) and "7g" in k)
    assert all("no GPU can host 7g.80gb now" in reasons[k] for k in sevens)
    ones = [k for k in reasons if "1g" in k]
    assert len(ones) == 4
    assert all("at most 2 of a kind" in reasons[k] for k in ones)


def test_the_room_per_node_counts_its_mig_gpus_free_and_used_compute() -> None:
    half = Gpu(index=2, model="A100-80GB", slices=(GpuSlice("3g.40gb", 4, in_use=True),
                                                   GpuSlice("3g.40gb", 0)))
    whole = Gpu(index=3, model="A100-80GB", mode="none")
    node = Node("node-a", gpus=(EMPTY, FULL, half, whole))
    free, used, open_gpus = node.mig_room
    assert (free, used) == (7 + 0 + 4, 0 + 7 + 3), "a free slice can be reshaped: only held count"
    assert [(model, spare) for model, _, spare in open_gpus] == [("A100-80GB", 7),
                                                                ("A100-80GB", 4)]
    assert node.mig_room is node.mig_room, "worked out once per node object"
    batch = bounded_batch(Snapshot((node,)), _pods(MIG_1G, 3))
    assert batch.room == {"node-a": (11, 10)}
