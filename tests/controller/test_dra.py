"""The controller and DRA nodes: pods are handed to the scheduler at once, offers are curated.

A DRA node's agent reports ``status.api: dra``; the scheduler allocates MIG placements there
itself, so the controller neither plans layouts for it nor waits for capacity to show.
"""

from __future__ import annotations

from typing import Any

from tessera.api.v1alpha1 import NodePartition
from tessera.controller import dra
from tessera.core.dra import MPS_DEVICE_CLASS

from .test_loop import l4_partition, node, partition, pod, setup

SELECTOR = (("tessera.dev/api", "dra"),)


def dra_node(name: str) -> dict[str, Any]:
    raw = node(name)
    raw["metadata"]["labels"]["tessera.dev/api"] = "dra"
    return raw


def dra_partition(name: str, gpus: list[list[tuple[str, int]]]) -> dict[str, Any]:
    raw = partition(name, [])
    raw["status"]["api"] = "dra"
    template = raw["status"]["gpus"][0]
    raw["status"]["gpus"] = [
        {**template, "index": i, "uuid": f"GPU-00000000-0000-0000-0000-00000000000{i}",
         "slices": [{"profile": p, "start": s, "gpuInstanceId": 9, "allocated": True}
                    for p, s in slices]}
        for i, slices in enumerate(gpus)]
    return raw


def test_a_gated_pod_dra_can_serve_is_released_at_once_to_dra_nodes() -> None:
    cache, recorder, controller, _clock = setup(dra_node_selector=SELECTOR)
    cache.put("node", "ADDED", dra_node("dra-a"))
    cache.put("nodepartition", "ADDED", dra_partition("dra-a", [[], []]))
    cache.put("pod", "ADDED", pod("p1"))
    controller.tick()
    assert recorder.released_to_dra == [("ml/p1", {"tessera.dev/api": "dra"})]
    assert recorder.released == []
    assert not [s for _, s in recorder.specs if s.gpus], "no layout is planned for DRA nodes"
    controller.tick()
    assert len(recorder.released_to_dra) == 1, "released once, even before the cache shows it"


def test_a_pod_aimed_at_other_nodes_is_not_handed_to_dra() -> None:
    cache, recorder, controller, clock = setup(dra_node_selector=SELECTOR)
    cache.put("node", "ADDED", dra_node("dra-a"))
    cache.put("nodepartition", "ADDED", dra_partition("dra-a", [[]]))
    cache.put("node", "ADDED", node("node-b"))
    cache.put("nodepartition", "ADDED", partition("node-b", []))
    aimed = pod("aimed")
    aimed["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "node-b"}
    cache.put("pod", "ADDED", aimed)
    controller.tick()
    clock.now += 1
    controller.tick()
    assert recorder.released_to_dra == []
    (spec,) = [s for n, s in recorder.specs if n == "node-b" and s.gpus]
    assert [(x.profile) for x in spec.gpus[0].slices] == ["1g.10gb"], "planned on node-b"


def test_pods_dra_cannot_serve_go_through_the_planner() -> None:
    cache, recorder, controller, clock = setup(dra_node_selector=SELECTOR)
    cache.put("node", "ADDED", dra_node("dra-a"))
    cache.put("nodepartition", "ADDED", dra_partition("dra-a", [[]]))
    cache.put("node", "ADDED", node("node-b"))
    cache.put("nodepartition", "ADDED", partition("node-b", []))
    cache.put("pod", "ADDED", pod("whole", "nvidia.com/gpu"))
    cache.put("pod", "ADDED", pod("h100-only", "nvidia.com/mig-1g.12gb"))
    controller.tick()
    clock.now += 1
    controller.tick()
    assert recorder.released_to_dra == []
    assert {p for p, *_ in recorder.pod_events} >= {"ml/whole", "ml/h100-only"}
    (told,) = [m for p, r, m, _w in recorder.pod_events if r == "NoDraMatch"]
    assert told.startswith("no DRA node offers nvidia.com/mig-1g.12gb: their GPUs (A100-80GB)")


def test_curation_keeps_idle_gpus_whole_while_a_split_one_has_room() -> None:
    cache, recorder, controller, _clock = setup(dra_node_selector=SELECTOR)
    for name, gpus in (("dra-a", [[("3g.40gb", 4)], []]), ("dra-b", [[]])):
        cache.put("node", "ADDED", dra_node(name))
        cache.put("nodepartition", "ADDED", dra_partition(name, gpus))
    controller.tick()
    written = {n: s.dra for n, s in recorder.specs}
    assert written["dra-a"] is not None
    assert written["dra-b"] is not None
    tainted_a = {c.gpu: set(c.profiles) for c in written["dra-a"].curated}
    (idle_b,) = written["dra-b"].curated
    assert "GPU-00000000-0000-0000-0000-000000000000" not in tainted_a, "the split GPU offers"
    assert {"1g.10gb", "3g.40gb", "4g.40gb"} <= set(idle_b.profiles)
    assert "7g.80gb" not in tainted_a["GPU-00000000-0000-0000-0000-000000000001"], \
        "no split GPU can host a 7g: the busy node's idle GPU offers it"
    assert "7g.80gb" in idle_b.profiles, "and the idle node stays whole meanwhile"
    recorder.specs.clear()
    controller.tick()
    assert recorder.specs == [], "nothing changed: nothing written again"


def test_a_dra_pod_the_scheduler_could_not_place_lifts_curation_of_its_profile() -> None:
    cache, recorder, controller, _clock = setup(dra_node_selector=SELECTOR)
    cache.put("node", "ADDED", dra_node("dra-a"))
    cache.put("nodepartition", "ADDED", dra_partition("dra-a", [[("3g.40gb", 4)], []]))
    stuck = pod("stuck", gated=False)
    stuck["spec"]["nodeSelector"] = {"tessera.dev/api": "dra", "zone": "b"}
    stuck["status"]["conditions"] = [{"type": "PodScheduled", "status": "False",
                                      "reason": "Unschedulable"}]
    cache.put("pod", "ADDED", stuck)
    controller.tick()
    (spec,) = [s for n, s in recorder.specs if n == "dra-a"]
    assert spec.dra is not None
    (idle,) = spec.dra.curated
    assert "1g.10gb" not in idle.profiles
    assert "3g.40gb" in idle.profiles
    assert recorder.pod_events == [], "a DRA pod is the scheduler's: no planner verdict on it"


def _shares_cluster(bound: int, stuck: int) -> tuple[Any, Any, Any, Any]:
    """An L4 DRA node of 6 MPS shares, ``bound`` share pods on it and ``stuck`` handed to
    the scheduler that it turned down (Unschedulable)."""
    cache, recorder, controller, clock = setup(dra_node_selector=SELECTOR)
    cache.put("node", "ADDED", dra_node("dra-l4"))
    l4 = l4_partition("dra-l4", mode="mps")
    l4["status"]["api"] = "dra"
    cache.put("nodepartition", "ADDED", l4)
    for i in range(bound):
        cache.put("pod", "ADDED", pod(f"on-{i}", "nvidia.com/gpu.shared", gated=False,
                                      node_name="dra-l4"))
    for i in range(stuck):
        waiting = pod(f"stuck-{i}", "nvidia.com/gpu.shared", gated=False)
        waiting["spec"]["nodeSelector"] = {"tessera.dev/api": "dra"}
        waiting["status"]["conditions"] = [{"type": "PodScheduled", "status": "False",
                                            "reason": "Unschedulable"}]
        cache.put("pod", "ADDED", waiting)
    return cache, recorder, controller, clock


def test_share_pods_turned_down_while_shares_are_free_go_back_to_the_scheduler() -> None:
    """kube-scheduler may turn a share pod down with a share free (a bound claim counted
    twice for a moment) and then waits minutes for an event: the controller makes one by
    touching the shares' DeviceClass, after ``dra_requeue_s``, then less and less often."""
    _cache, recorder, controller, clock = _shares_cluster(bound=3, stuck=2)
    controller.tick()
    clock.now += 5
    controller.tick()
    assert recorder.requeued == [], "the scheduler gets dra_requeue_s (10 s) to retry first"
    clock.now += 5
    controller.tick()
    assert recorder.requeued == [MPS_DEVICE_CLASS]
    clock.now += 15
    controller.tick()
    assert recorder.requeued == [MPS_DEVICE_CLASS], "then less often: 20 s"
    clock.now += 5
    controller.tick()
    assert recorder.requeued == [MPS_DEVICE_CLASS] * 2, "still turned down: once more"
    for _ in range(100):
        clock.now += 5
        controller.tick()
    assert len(recorder.requeued) == 5, "40, 80 then 160 s apart (at 70, 150, 310 s)"


def test_share_pods_waiting_for_shares_in_use_are_left_waiting() -> None:
    _cache, recorder, controller, clock = _shares_cluster(bound=6, stuck=1)
    for _ in range(5):
        controller.tick()
        clock.now += 10
    assert recorder.requeued == [], "every share is held: nothing for the scheduler to find"


def test_free_shares_are_each_shared_gpus_shares_less_the_bound_pods_units() -> None:
    l4 = l4_partition("dra-l4", mode="mps")
    l4["status"]["api"] = "dra"
    partitions = {"dra-l4": NodePartition.model_validate(l4),
                  "dra-a": NodePartition.model_validate(dra_partition("dra-a", [[]]))}
    assert dra.free_shares(partitions, {"dra-l4": 4}) == {"dra-l4": 2}
    assert dra.free_shares(partitions, {"dra-l4": 6}) == {}, "full, and MIG nodes have none"


def test_servable_means_every_request_is_something_a_dra_gpu_serves() -> None:
    offered = frozenset({"nvidia.com/mig-1g.10gb", "nvidia.com/mig-7g.80gb",
                         "nvidia.com/gpu.shared"})
    assert dra.servable({"nvidia.com/gpu.shared": 1}, offered)
    assert dra.servable({"nvidia.com/mig-1g.10gb": 2}, offered)
    assert not dra.servable({"nvidia.com/mig-1g.10gb": 1, "nvidia.com/gpu": 1}, offered)
    assert not dra.servable({"nvidia.com/mig-1g.10gb.shared": 1}, offered)
    assert not dra.servable({"nvidia.com/mig-2g.20gb": 1}, offered)
    assert not dra.servable({}, offered)


def test_the_preview_leaves_dra_nodes_and_their_pods_to_the_scheduler() -> None:
    cache, _recorder, controller, _clock = setup(dra_node_selector=SELECTOR)
    cache.put("node", "ADDED", dra_node("dra-a"))
    cache.put("nodepartition", "ADDED", dra_partition("dra-a", [[]]))
    cache.put("pod", "ADDED", pod("p1"))
    plan = controller.preview()
    assert plan.placements == ()
    assert plan.unplaced == (), "a pod DRA takes is no planner's verdict"
