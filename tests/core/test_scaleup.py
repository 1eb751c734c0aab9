"""Sizing scale-up: waiting pods packed into whole GPUs of a pool's models, as an autoscaler
reads capacity (``nvidia.com/gpu``), counting the nodes already on their way."""

from __future__ import annotations

from collections import Counter

import pytest

from tessera.core import catalogue, layout, scaleup
from tessera.core.planner import MatchExpression, PendingPod, Taint, Toleration

A100 = ("A100-80GB",)
POOL = (("pool", "gpu"),)


def pod(name: str, *requests: tuple[str, int], age: float = 0.0, priority: int = 0,
        **where: object) -> PendingPod:
    return PendingPod(namespace="ml", name=name, requests=tuple(sorted(requests)),
                      creation_time=age, priority=priority, **where)  # type: ignore[arg-type]


def mig(profile: str, count: int = 1) -> tuple[str, int]:
    return (catalogue.mig_resource_name(profile), count)


def target(**settings: object) -> scaleup.Target:
    return scaleup.Target(**{"models": A100, "labels": POOL, **settings})  # type: ignore[arg-type]


def test_small_pods_share_whole_gpus_first_fit_in_the_order_they_wait() -> None:
    pods = [pod(f"p{i}", mig("1g.10gb"), age=i) for i in range(9)]
    sizing = scaleup.size(pods, target())
    assert [(a.gpus, len(a.pods)) for a in sizing.asks] == [(1, 7), (1, 2)]
    assert sizing.asks[0].pods == tuple(f"ml/p{i}" for i in range(7))
    assert sizing.gpus == 2


def test_every_gpu_asked_for_holds_a_valid_layout_of_its_pods() -> None:
    shapes = ["1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "1g.20gb", "7g.80gb"]
    pods = [pod(f"p{i}", mig(shapes[(i * 7) % len(shapes)]), age=i) for i in range(40)]
    sizing = scaleup.size(pods, target())
    model = catalogue.model("A100-80GB")
    wanted = {p.key: p for p in pods}
    for ask in sizing.asks:
        counts: Counter[str] = Counter()
        for key in ask.pods:
            for resource, n in wanted[key].requests:
                counts[catalogue.profile_name_from_resource(resource)] += n
        layout.layout_for_counts(model, counts)  # raises if the GPU could not hold them
    assert sum(len(a.pods) for a in sizing.asks) == 40
    alone = sum(1 for _ in pods)
    assert sizing.gpus < alone


def test_a_pod_needing_several_gpus_gets_an_ask_of_its_own_for_all_of_them() -> None:
    sizing = scaleup.size([pod("train", mig("7g.80gb", 3)), pod("whole", ("nvidia.com/gpu", 2)),
                           pod("small", mig("1g.10gb"))], target())
    by_pod = {a.pods: a.gpus for a in sizing.asks}
    assert by_pod == {("ml/train",): 3, ("ml/whole",): 2, ("ml/small",): 1}


def test_whole_gpu_pods_never_share_and_shares_pack_by_the_policy_s_count() -> None:
    pods = [pod("w1", ("nvidia.com/gpu", 1)), pod("w2", ("nvidia.com/gpu", 1)),
            *(pod(f"s{i}", ("nvidia.com/gpu.shared", 1), age=i) for i in range(6))]
    sizing = scaleup.size(pods, target(shares_per_gpu=4))
    assert sorted(len(a.pods) for a in sizing.asks) == [1, 1, 2, 4]
    assert sizing.gpus == 4


def test_the_first_model_that_can_hold_a_pod_is_asked_for() -> None:
    sizing = scaleup.size([pod("small", mig("1g.6gb")), pod("big", mig("7g.80gb"))],
                          target(models=("A30-24GB", "A100-80GB")))
    assert {a.pods[0]: a.model for a in sizing.asks} == {"ml/small": "A30-24GB",
                                                          "ml/big": "A100-80GB"}


def test_a_pod_no_new_node_could_hold_asks_nothing_and_says_why() -> None:
    sizing = scaleup.size([
        pod("alien", mig("1g.12gb")),
        pod("elsewhere", mig("1g.10gb"), node_selector=(("pool", "cpu"),)),
        pod("fenced", mig("1g.10gb"), affinity_terms=((MatchExpression("pool", "In", ("x",)),),)),
    ], target())
    assert sizing.asks == ()
    assert "has no 1g.12gb profile" in sizing.impossible["ml/alien"]
    assert "contradicts the pool's pool=gpu" in sizing.impossible["ml/elsewhere"]
    assert "affinity excludes" in sizing.impossible["ml/fenced"]


def test_a_selector_on_labels_the_pool_does_not_fix_is_left_to_the_autoscaler() -> None:
    sizing = scaleup.size([pod("zoned", mig("1g.10gb"),
                               node_selector=(("topology.kubernetes.io/zone", "a"),))], target())
    assert [a.constraints.node_selector for a in sizing.asks] == [
        (("topology.kubernetes.io/zone", "a"),)]


def test_pods_with_different_constraints_never_share_a_gpu() -> None:
    tolerant = (Toleration(key="dedicated", operator="Exists"),)
    sizing = scaleup.size([pod("a", mig("1g.10gb")), pod("b", mig("1g.10gb"),
                                                          tolerations=tolerant)], target())
    assert sorted(a.pods for a in sizing.asks) == [("ml/a",), ("ml/b",)]


def test_a_node_on_its_way_covers_what_it_holds_and_only_that() -> None:
    pods = [pod(f"p{i}", mig("3g.40gb"), age=i) for i in range(6)]
    arriving = scaleup.Arriving("new-1", gpus=2, labels=POOL)
    sizing = scaleup.size(pods, target(), [arriving])
    assert sizing.covered == {f"ml/p{i}": "new-1" for i in range(4)}
    assert [a.pods for a in sizing.asks] == [("ml/p4", "ml/p5")]


def test_a_node_on_its_way_the_pod_may_not_use_covers_nothing() -> None:
    tainted = scaleup.Arriving("new-1", gpus=8, labels=POOL,
                               taints=(Taint("dedicated", "team-a", "NoSchedule"),))
    sizing = scaleup.size([pod("p", mig("1g.10gb"))], target(), [tainted])
    assert sizing.covered == {}
    assert sizing.gpus == 1


def test_the_gpu_limit_serves_higher_priority_then_older_pods_first() -> None:
    pods = [pod("late", mig("7g.80gb"), age=5), pod("early", mig("7g.80gb"), age=1),
            pod("urgent", mig("7g.80gb"), age=9, priority=10)]
    sizing = scaleup.size(pods, target(max_gpus=2))
    assert sorted(a.pods[0] for a in sizing.asks) == ["ml/early", "ml/urgent"]
    assert sizing.capped == ("ml/late",)


@pytest.mark.parametrize("model", [m.name for m in catalogue.models()])
def test_every_profile_of_every_model_fits_alone_on_one_gpu(model: str) -> None:
    for profile in catalogue.model(model).profiles:
        sizing = scaleup.size([pod("p", mig(profile.name))], target(models=(model,)))
        assert sizing.gpus == 1, (model, profile.name, sizing.impossible)
