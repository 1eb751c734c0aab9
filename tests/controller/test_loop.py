"""The controller's decisions, tick by tick, over an in-memory cache and a recording writer."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from tessera.api.v1alpha1 import (
    NodePartition,
    NodePartitionSpec,
    PartitionPolicy,
    PartitionPolicyStatus,
)
from tessera.controller import loop
from tessera.controller.demand import GATE, PLACEHOLDER_LABEL
from tessera.controller.loop import ClusterCache, Controller, ControllerSettings, Metrics
from tessera.controller.policies import policy_gpu_specs
from tessera.controller.snapshot import build_snapshot
from tessera.core import planner


class Recorder:
    def __init__(self, cache: ClusterCache) -> None:
        self.cache = cache
        self.specs: list[tuple[str, NodePartitionSpec]] = []
        self.released: list[tuple[str, str, str, bool]] = []
        self.released_to_dra: list[tuple[str, dict[str, str]]] = []
        self.pod_events: list[tuple[str, str, str, bool]] = []
        self.node_events: list[tuple[str, str, str, bool]] = []
        self.policy_statuses: list[tuple[str, PartitionPolicyStatus]] = []
        self.placeholders: list[Mapping[str, Any]] = []
        self.deleted_placeholders: list[tuple[str, str]] = []
        self.deleted_kinds: list[str] = []
        self.requeued: list[str] = []

    def write_spec(self, node: str, spec: NodePartitionSpec,
                   current: NodePartition | None) -> bool:
        self.specs.append((node, spec))
        raw = (current.to_wire() if current else {"metadata": {"name": node}})
        raw["spec"] = spec.to_wire()
        self.cache.put("nodepartition", "MODIFIED", raw)
        return True

    def release_pod(self, pod: str, node: str, hostname: str, gated: bool,
                    seen: Mapping[str, Any] | None = None) -> None:
        self.released.append((pod, node, hostname, gated))

    def release_to_dra(self, pod: str, selector: Mapping[str, str]) -> bool:
        self.released_to_dra.append((pod, dict(selector)))
        return True

    def requeue_dra(self, device_class: str) -> None:
        self.requeued.append(device_class)

    def pod_event(self, pod: str, reason: str, message: str, warning: bool) -> None:
        self.pod_events.append((pod, reason, message, warning))

    def partition_event(self, node: str, reason: str, message: str, warning: bool) -> None:
        self.node_events.append((node, reason, message, warning))

    def policy_status(self, name: str, status: PartitionPolicyStatus) -> None:
        self.policy_statuses.append((name, status))

    def create_placeholder(self, body: Mapping[str, Any]) -> str | None:
        self.placeholders.append(body)
        return f"{body['metadata']['namespace']}/placeholder-{len(self.placeholders)}"

    def delete_placeholder(self, kind: str, key: str, reason: str) -> None:
        self.deleted_placeholders.append((key, reason))
        self.deleted_kinds.append(kind)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def node(name: str, allocatable: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
                                                  "gpu": "a100"}},
            "spec": {}, "status": {"allocatable": allocatable or {}}}


def partition(name: str, slices: list[dict[str, Any]], *, plan: str | None = None,
              applied: str | None = None, mig: bool = True) -> dict[str, Any]:
    return {"metadata": {"name": name, "generation": 1},
            "spec": {"planId": plan} if plan else {},
            "status": {"appliedPlanId": applied, "gpus": [{
                "index": 0, "uuid": "GPU-00000000-0000-0000-0000-000000000000",
                "name": "NVIDIA A100-SXM4-80GB", "model": "A100-80GB",
                "pciDeviceId": "0x20B210DE", "mode": "mig" if mig else "none",
                "migMode": {"current": mig, "pending": mig}, "slices": slices}]}}


def pod(name: str, resource: str = "nvidia.com/mig-1g.10gb", count: int = 1, *,
        gated: bool = True, node_name: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "resources": {
        "limits": {resource: str(count)}}}]}
    if gated:
        spec["schedulingGates"] = [{"name": GATE}]
    if node_name:
        spec["nodeName"] = node_name
    return {"metadata": {"namespace": "ml", "name": name,
                         "creationTimestamp": "2026-12-02T10:00:00Z"},
            "spec": spec, "status": {"phase": "Pending"}}


DYNAMIC = {"metadata": {"name": "a100-dynamic", "generation": 1},
           "spec": {"nodeSelector": {"matchLabels": {"gpu": "a100"}}, "mode": "dynamic"}}


def setup(policy: dict[str, Any] | None = DYNAMIC, metrics: Metrics | None = None,
          **settings: Any) -> tuple[ClusterCache, Recorder, Controller, Clock]:
    """A controller on a clock the test moves, writing to a recorder, under ``policy``
    (None: no policy), with the batch window of 0.5 s idle / 3 s unless ``settings`` say."""
    cache = ClusterCache()
    recorder = Recorder(cache)
    clock = Clock()
    controller = Controller(cache, recorder, ControllerSettings(
        **{"batch_idle_s": 0.5, "batch_max_s": 3.0, **settings}), clock=clock,
        wall_clock=clock, metrics=metrics)
    if policy is not None:
        cache.put("partitionpolicy", "ADDED", policy)
    return cache, recorder, controller, clock


def test_pending_pods_are_batched_then_planned_then_released_when_capacity_shows() -> None:
    cache, recorder, controller, clock = setup()
    cache.put("node", "ADDED", node("node-a"))
    cache.put("nodepartition", "ADDED", partition("node-a", []))
    cache.put("pod", "ADDED", pod("p1"))
    controller.tick()
    assert recorder.specs == [], "the batch window is still open"
    cache.put("pod", "ADDED", pod("p2"))
    clock.now += 0.3
    controller.tick()
    assert recorder.specs == [], "a new pod keeps the window open"
    clock.now += 0.6
    controller.tick()
    (written,) = [s for n, s in recorder.specs if n == "node-a"]
    slices = {(s.profile, s.start) for s in written.gpus[0].slices}
    assert [p for p, _ in slices] == ["1g.10gb", "1g.10gb"]
    events = {e[0]: e for e in recorder.pod_events}
    assert events["ml/p1"][1] == "Placed"
    assert events["ml/p1"][2].startswith("creating 1g.10gb on node-a GPU 0 for this pod")
    assert recorder.released == [], "not before the agent reports the plan"

    # The agent applies the plan; the kubelet advertises the slices a moment later.
    applied = partition("node-a", [{"profile": "1g.10gb", "start": s, "gpuInstanceId": 7 + s,
                                    "uuid": f"MIG-{s:08d}-0000-5000-0000-000000000000"}
                                   for _, s in sorted(slices)],
                        plan=written.plan_id, applied=written.plan_id)
    cache.put("nodepartition", "MODIFIED", applied)
    clock.now += 1
    controller.tick()
    assert recorder.released == [], "allocatable does not show the slices yet"
    cache.put("node", "MODIFIED", node("node-a", {"nvidia.com/mig-1g.10gb": "1"}))
    controller.tick()
    assert recorder.released == [("ml/p1", "node-a", "node-a", True)], \
        "never more pods released than the node has free slices"
    cache.put("node", "MODIFIED", node("node-a", {"nvidia.com/mig-1g.10gb": "2"}))
    controller.tick()
    assert [r[0] for r in recorder.released] == ["ml/p1", "ml/p2"]


def _a_free_1g_a_4g_pod_needs(cache: ClusterCache,
                              gpu1_slices: list[dict[str, Any]]) -> dict[str, Any]:
    """node-a: GPU 0 has a free 1g at start 0 and a held 3g; GPU 1 has a held 4g and
    ``gpu1_slices``; waiting, an older 4g pod (it can only start where the 1g is) and a 1g pod.
    Returns the NodePartition as put."""
    cache.put("node", "ADDED", node("node-a", {"nvidia.com/mig-1g.10gb": "1",
                                               "nvidia.com/mig-3g.40gb": "1",
                                               "nvidia.com/mig-4g.40gb": "1"}))
    raw = partition("node-a", [
        {"profile": "1g.10gb", "start": 0, "gpuInstanceId": 9,
         "uuid": "MIG-00000000-0000-5000-0000-000000000001"},
        {"profile": "3g.40gb", "start": 4, "gpuInstanceId": 2, "allocated": True,
         "uuid": "MIG-00000000-0000-5000-0000-000000000002"}])
    second = dict(raw["status"]["gpus"][0], index=1,
                  uuid="GPU-00000000-0000-0000-0000-000000000001",
                  slices=[{"profile": "4g.40gb", "start": 0, "gpuInstanceId": 1,
                           "allocated": True, "uuid": "MIG-00000000-0000-5000-0000-000000000003"},
                          *gpu1_slices])
    raw["status"]["gpus"].append(second)
    cache.put("nodepartition", "ADDED", raw)
    cache.put("pod", "ADDED", pod("holds-3g", "nvidia.com/mig-3g.40gb", gated=False,
                                  node_name="node-a"))
    cache.put("pod", "ADDED", pod("holds-4g", "nvidia.com/mig-4g.40gb", gated=False,
                                  node_name="node-a"))
    cache.put("pod", "ADDED", pod("big", "nvidia.com/mig-4g.40gb"))
    small = pod("small", "nvidia.com/mig-1g.10gb")
    small["metadata"]["creationTimestamp"] = "2026-12-02T10:00:01Z"
    cache.put("pod", "ADDED", small)
    return raw


def test_no_pod_is_released_onto_a_node_the_same_tick_s_plan_rewrote() -> None:
    """Found by the simulator driving this loop: the plan destroys a free 1g slice (a 4g must
    start there) and puts the 1g pod on a new slice of another GPU. The node's allocatable,
    read before the write, still shows the old 1g; releasing the pod then would have the
    kubelet refuse it once the agent destroys that slice."""
    cache, recorder, controller, clock = setup()
    _a_free_1g_a_4g_pod_needs(cache, [])
    controller.tick()
    clock.now += 1
    controller.tick()
    (written,) = [s for n, s in recorder.specs if n == "node-a"]
    gpu0 = next(g for g in written.gpus if g.index == 0)
    assert ("1g.10gb", 0) not in {(s.profile, s.start) for s in gpu0.slices}, \
        "the plan destroys the free 1g for the older 4g pod"
    assert {e[0] for e in recorder.pod_events if e[1] == "Placed"} == {"ml/big", "ml/small"}
    assert recorder.released == [], "the node's allocatable is from before the plan"


def test_a_dropped_advertised_slice_and_a_kept_unadvertised_one_are_no_room() -> None:
    """Found by the simulator driving this loop: the plan destroys GPU 0's free 1g, which the
    kubelet advertises (a 4g must start there), and puts the 1g pod on GPU 1's free 1g, which
    the agent reports but the kubelet does not advertise yet. Allocatable (one 1g, read before
    the write) and the slices that stay (one 1g) each count one, but not the same one: the
    kubelet has no 1g to give until it advertises GPU 1's."""
    cache, recorder, controller, clock = setup()
    raw = _a_free_1g_a_4g_pod_needs(cache, [
        {"profile": "1g.10gb", "start": 4, "gpuInstanceId": 11,
         "uuid": "MIG-00000000-0000-5000-0000-000000000004"}])
    controller.tick()
    clock.now += 1
    controller.tick()
    (written,) = [s for n, s in recorder.specs if n == "node-a"]
    layout = {g.index: {(s.profile, s.start) for s in g.slices} for g in written.gpus}
    assert ("1g.10gb", 0) not in layout[0], "the plan destroys GPU 0's free 1g for the 4g pod"
    assert 1 not in layout, "GPU 1 stays as it is, its free 1g for the 1g pod"
    assert {e[0] for e in recorder.pod_events if e[1] == "Placed"} == {"ml/big", "ml/small"}
    assert recorder.released == [], "the one advertised 1g is going"

    # The agent applies the plan; the kubelet advertises what is there now, GPU 1's 1g.
    gpu0 = dict(raw["status"]["gpus"][0], slices=[
        {"profile": "4g.40gb", "start": 0, "gpuInstanceId": 5,
         "uuid": "MIG-00000000-0000-5000-0000-000000000005"},
        {"profile": "3g.40gb", "start": 4, "gpuInstanceId": 2, "allocated": True,
         "uuid": "MIG-00000000-0000-5000-0000-000000000002"}])
    cache.put("nodepartition", "MODIFIED", {
        "metadata": raw["metadata"], "spec": written.to_wire(),
        "status": {"appliedPlanId": written.plan_id,
                   "gpus": [gpu0, raw["status"]["gpus"][1]]}})
    cache.put("node", "MODIFIED", node("node-a", {"nvidia.com/mig-1g.10gb": "1",
                                                  "nvidia.com/mig-3g.40gb": "1",
                                                  "nvidia.com/mig-4g.40gb": "2"}))
    clock.now += 1
    controller.tick()
    assert sorted(r[0] for r in recorder.released) == ["ml/big", "ml/small"], \
        "both once the node reports its plan and advertises the slices"


def test_a_pod_on_a_slice_that_stays_is_released_while_another_gpu_reconfigures() -> None:
    """The plan makes a 7g on GPU 1 and puts a 3g pod on GPU 0's free 3g: the node is in
    flight until its agent reports, but the 3g pod need not wait for GPU 1."""
    cache, recorder, controller, clock = setup()
    cache.put("node", "ADDED", node("node-a", {"nvidia.com/mig-3g.40gb": "1"}))
    raw = partition("node-a", [{"profile": "3g.40gb", "start": 4, "gpuInstanceId": 2,
                                "uuid": "MIG-00000000-0000-5000-0000-000000000002"}])
    raw["status"]["gpus"].append(dict(raw["status"]["gpus"][0], index=1, slices=[],
                                      uuid="GPU-00000000-0000-0000-0000-000000000001"))
    cache.put("nodepartition", "ADDED", raw)
    cache.put("pod", "ADDED", pod("small", "nvidia.com/mig-3g.40gb"))
    cache.put("pod", "ADDED", pod("large", "nvidia.com/mig-7g.80gb"))
    controller.tick()
    clock.now += 1
    controller.tick()
    (written,) = [s for n, s in recorder.specs if n == "node-a"]
    assert [(g.index, [(s.profile, s.start) for s in g.slices]) for g in written.gpus
            if g.index == 1] == [(1, [("7g.80gb", 0)])]
    assert [r[0] for r in recorder.released] == ["ml/small"], \
        "released at once; the 7g pod waits for its slice"


def test_a_pod_that_fits_a_free_slice_is_released_without_a_new_plan() -> None:
    cache, recorder, controller, clock = setup()
    cache.put("node", "ADDED", node("node-a", {"nvidia.com/mig-3g.40gb": "1"}))
    cache.put("nodepartition", "ADDED", partition("node-a", [
        {"profile": "3g.40gb", "start": 4, "gpuInstanceId": 2,
         "uuid": "MIG-00000002-0000-5000-0000-000000000000"}]))
    cache.put("pod", "ADDED", pod("fits", "nvidia.com/mig-3g.40gb"))
    controller.tick()
    clock.now += 1
    controller.tick()
    assert recorder.specs == []
    assert recorder.released == [("ml/fits", "node-a", "node-a", True)]
    assert recorder.pod_events[0][2] == "free 3g.40gb on node-a GPU 0 for this pod"


def test_a_pod_that_cannot_fit_gets_a_warning_with_the_reason() -> None:
    cache, recorder, controller, clock = setup()
    cache.put("node", "ADDED", node("node-a"))
    cache.put("nodepartition", "ADDED", partition("node-a", [
        {"profile": "1g.10gb", "start": 0, "gpuInstanceId": 7, "allocated": True,
         "pods": ["ml/old"], "uuid": "MIG-00000007-0000-5000-0000-000000000000"}]))
    cache.put("pod", "ADDED", pod("big", "nvidia.com/mig-7g.80gb"))
    controller.tick()
    clock.now += 1
    controller.tick()
    (event,) = recorder.pod_events
    assert event[:2] == ("ml/big", "NoGPUFit")
    assert event[3] is True
    assert "7g.80gb" in event[2]
    controller.tick()
    assert len(recorder.pod_events) == 1, "the same reason is not repeated"


def test_nodes_with_a_plan_in_flight_are_not_planned_over() -> None:
    cache, recorder, controller, clock = setup()
    cache.put("node", "ADDED", node("node-a"))
    cache.put("nodepartition", "ADDED", partition("node-a", [], plan="x-1", applied="x-0"))
    cache.put("pod", "ADDED", pod("p1"))
    controller.tick()
    clock.now += 1
    controller.tick()
    assert recorder.specs == []
    assert recorder.pod_events[0][1] == "NoGPUFit"
    clock.now += 200
    controller.tick()
    assert recorder.node_events[-1][1] == "PlanTimedOut"


def test_a_settled_node_is_in_flight_again_once_a_new_plan_is_written_there() -> None:
    """A node whose plan is applied is remembered as settled (not looked at again until the
    cache delivers a change of its NodePartition); a new plan, the controller's or anyone's,
    ends that."""
    cache, _, controller, clock = setup()

    def inflight() -> set[str]:  # as a tick: the view, with what changed, then the walk
        return controller._inflight(controller._loop_view()[2], clock.now)
    cache.put("node", "ADDED", node("node-a"))
    cache.put("nodepartition", "ADDED", partition("node-a", [], plan="x-1", applied="x-1"))
    assert inflight() == set()
    assert inflight() == set(), "settled, nothing delivered since"
    assert controller.state.unsettled == set()
    controller.state.written["node-a"] = ("x-2", clock.now)  # our write, not yet in the cache
    assert inflight() == {"node-a"}
    cache.put("nodepartition", "MODIFIED", partition("node-a", [], plan="x-2", applied="x-1"))
    assert inflight() == {"node-a"}
    cache.put("nodepartition", "MODIFIED", partition("node-a", [], plan="x-2", applied="x-2"))
    assert inflight() == set()
    cache.put("nodepartition", "MODIFIED", partition("node-a", [], plan="x-3", applied="x-2"))
    assert inflight() == {"node-a"}, "someone else's plan"
    cache.put("nodepartition", "DELETED", partition("node-a", []))
    assert inflight() == set()
    assert "node-a" not in controller.state.settled, "a node that went is forgotten"


def test_the_cache_keeps_which_nodes_serve_dra_as_their_reports_come() -> None:
    cache = ClusterCache()
    raw = partition("node-a", [])
    cache.put("nodepartition", "ADDED", raw)
    assert cache.loop_view()[4] == {}
    cache.put("nodepartition", "MODIFIED", {**raw, "status": {**raw["status"], "api": "dra"}})
    (name,) = cache.loop_view()[4]
    assert name == "node-a"
    assert cache.loop_view()[4][name] is cache.partitions["node-a"]
    cache.put("nodepartition", "MODIFIED", raw)
    assert cache.loop_view()[4] == {}, "back on the device plugin"
    cache.put("nodepartition", "MODIFIED", {**raw, "status": {**raw["status"], "api": "dra"}})
    cache.put("nodepartition", "DELETED", raw)
    assert cache.loop_view()[4] == {}


def test_a_static_policy_is_written_and_restored_after_an_edit() -> None:
    cache, recorder, controller, _ = setup({
        "metadata": {"name": "all-1g", "generation": 3},
        "spec": {"nodeSelector": {"matchLabels": {"gpu": "a100"}}, "mode": "static",
                 "static": [{"deviceFilter": ["0x20B210DE"], "migDevices": {"1g.10gb": 7}}]}})
    cache.put("node", "ADDED", node("node-a"))
    cache.put("nodepartition", "ADDED", partition("node-a", []))
    controller.tick()
    (first,) = recorder.specs
    assert first[1].gpus[0].mode == "mig"
    assert [s.start for s in first[1].gpus[0].slices] == list(range(7))
    edited = partition("node-a", [], plan=first[1].plan_id, applied=first[1].plan_id)
    edited["spec"]["gpus"] = [{"index": 0, "mode": "none"}]
    cache.put("nodepartition", "MODIFIED", edited)
    controller.tick()
    assert len(recorder.specs) == 2
    assert recorder.specs[1][1].gpus == first[1].gpus
    (name, status) = recorder.policy_statuses[0]
    assert (name, status.matched_nodes) == ("all-1g", ["node-a"])


def test_enforcement_looks_again_only_at_nodes_whose_objects_changed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """At 2,000 nodes a walk asking every node's policy what it wants was a third of a tick;
    a node whose Node, NodePartition and in-flight flag are the objects it needed nothing
    with is not asked again, and the policy's matched nodes still follow every change."""
    cache, recorder, controller, clock = setup()
    asked: list[str] = []

    def counting(policy: Any, partition: Any) -> Any:
        asked.append(partition.metadata.name)
        return policy_gpu_specs(policy, partition)

    monkeypatch.setattr(loop, "policy_gpu_specs", counting)
    looked: list[str] = []
    policy_of = controller._policy_of

    def looking(name: str, raw: Any, policies: Any) -> Any:
        looked.append(name)
        return policy_of(name, raw, policies)

    monkeypatch.setattr(controller, "_policy_of", looking)
    for name in ("node-a", "node-b", "node-c"):
        cache.put("node", "ADDED", node(name))
        cache.put("nodepartition", "ADDED", partition(name, []))
    controller.tick()
    assert sorted(asked) == ["node-a", "node-b", "node-c"]
    asked.clear()
    looked.clear()
    cache.put("nodepartition", "MODIFIED", partition("node-b", [], plan="x-1", applied="x-1"))
    clock.now += 1
    controller.tick()
    assert asked == ["node-b"], "only the node whose NodePartition changed"
    assert looked == ["node-b"], "the others are not even matched to their policy again"
    asked.clear()
    relabelled = node("node-a")
    relabelled["metadata"]["labels"]["gpu"] = "h100"  # no policy selects it now
    cache.put("node", "MODIFIED", relabelled)
    clock.now += 1
    controller.tick()
    assert asked == []
    name, status = recorder.policy_statuses[-1]
    assert (name, status.matched_nodes) == ("a100-dynamic", ["node-b", "node-c"])
    cache.put("node", "DELETED", node("node-c"))
    cache.put("node", "ADDED", node("node-d"))  # one went while another came
    cache.put("nodepartition", "ADDED", partition("node-d", []))
    clock.now += 1
    controller.tick()
    assert recorder.policy_statuses[-1][1].matched_nodes == ["node-b", "node-d"]


def test_nodes_no_policy_selects_are_left_alone() -> None:
    cache, recorder, controller, _ = setup(policy=None)
    cache.put("node", "ADDED", node("node-a"))
    cache.put("nodepartition", "ADDED", partition("node-a", [], mig=False))
    cache.put("pod", "ADDED", pod("p1"))
    controller.tick()
    controller.state.batch_opened = -1e9
    controller.tick()
    assert recorder.specs == []
    assert recorder.pod_events[0][1] == "NoGPUFit"


def test_pods_bound_to_one_gpu_do_not_hide_free_slices_on_another() -> None:
    """A bound pod's slice, reported allocated on GPU 1, must not also reserve GPU 0's slice."""
    raw = partition("node-a", [{"profile": "1g.10gb", "start": 0, "gpuInstanceId": 7,
                                "uuid": "MIG-00000007-0000-5000-0000-000000000000"}])
    second = dict(raw["status"]["gpus"][0], index=1,
                  uuid="GPU-00000001-0000-0000-0000-000000000000",
                  slices=[{"profile": "1g.10gb", "start": 0, "gpuInstanceId": 7,
                           "allocated": True, "pods": ["ml/held"],
                           "uuid": "MIG-00000017-0000-5000-0000-000000000000"}])
    raw["status"]["gpus"].append(second)
    snapshot = build_snapshot([node("node-a")], {"node-a": NodePartition.model_validate(raw)},
                              [PartitionPolicy.model_validate(DYNAMIC)],
                              {"node-a": {"nvidia.com/mig-1g.10gb": 1}})
    (gpu0, gpu1) = snapshot.nodes[0].gpus
    assert [s.in_use for s in gpu0.slices] == [False]
    assert [s.in_use for s in gpu1.slices] == [True]


class PlanCounter:
    def __init__(self) -> None:
        self.plans = 0
        self.oldest: list[float] = []
        self.waits: list[float | None] = []
        self.released = 0

    def record_tick(self, pending: int, leader: bool, oldest_s: float = 0.0) -> None:
        self.oldest.append(oldest_s)

    def record_plan(self, seconds: float, placed: int, unplaced: int, created: int,
                    destroyed: int) -> None:
        self.plans += 1

    def record_release(self, waited_s: float | None = None, pinned: bool = True) -> None:
        self.waits.append(waited_s)
        self.released += pinned

    def record_scale_up(self, gpus: int) -> None:
        self.scale_up = gpus


def test_the_oldest_waiting_pod_s_age_and_each_pod_s_wait_are_measured() -> None:
    """What the dashboard's "pending GPU pods and their age" and the wait alert read: the
    age of the oldest waiting pod on every tick, and creation-to-release per released pod."""
    counter = PlanCounter()
    cache, recorder, controller, clock = setup(metrics=counter)
    created = 1_796_205_600.0  # the pods' creationTimestamp, 2026-12-02T10:00:00Z
    clock.now = created + 100
    cache.put("node", "ADDED", node("node-a", {"nvidia.com/mig-1g.10gb": "1"}))
    free = {"profile": "1g.10gb", "start": 0, "gpuInstanceId": 7,
            "uuid": "MIG-00000000-0000-5000-0000-000000000001"}
    cache.put("nodepartition", "ADDED", partition("node-a", [free]))
    cache.put("pod", "ADDED", pod("waits"))
    controller.tick()
    assert counter.oldest[-1] == 100.0
    for _ in range(5):
        clock.now += 1
        controller.tick()
    assert [r[0] for r in recorder.released] == ["ml/waits"]
    (waited,) = counter.waits
    assert waited is not None
    assert 100.0 < waited <= 106.0
    assert counter.oldest[:2] == [100.0, 101.0], "the age grows with the clock"
    assert counter.oldest[-1] == 0.0, "a released pod waits no more (the watch may lag)"


def test_a_pod_the_gate_missed_gets_room_and_its_wait_counts_but_not_as_released() -> None:
    """A pod created before the admission policy took effect is planned like any other (the
    scheduler found no slice for it), but nothing pins or releases it: the released-pods
    counter leaves it out, while its wait for the room made is measured like any pod's."""
    counter = PlanCounter()
    cache, recorder, controller, clock = setup(metrics=counter)
    cache.put("node", "ADDED", node("node-a", {"nvidia.com/mig-1g.10gb": "2"}))
    free = [{"profile": "1g.10gb", "start": s, "gpuInstanceId": 7 + s,
             "uuid": f"MIG-00000000-0000-5000-0000-00000000000{s}"} for s in (0, 1)]
    cache.put("nodepartition", "ADDED", partition("node-a", free))
    late = pod("late", gated=False)
    late["status"]["conditions"] = [{"type": "PodScheduled", "status": "False",
                                     "reason": "Unschedulable"}]
    cache.put("pod", "ADDED", late)
    cache.put("pod", "ADDED", pod("gated"))
    for _ in range(6):
        clock.now += 1
        controller.tick()
    assert sorted(recorder.released) == [("ml/gated", "node-a", "node-a", True),
                                         ("ml/late", "node-a", "node-a", False)]
    assert len(counter.waits) == 2, "both waited for the room made for them"
    assert counter.released == 1, "only the gated pod was pinned and released"


def _a_7g_waits_behind_a_busy_card(cache: ClusterCache) -> None:
    """node-a's one card runs a 7g pod ("holder"); "waits" asks another 7g: it cannot fit."""
    cache.put("node", "ADDED", node("node-a"))
    busy = {"profile": "7g.80gb", "start": 0, "gpuInstanceId": 0,
            "uuid": "MIG-00000000-0000-5000-0000-000000000000"}
    cache.put("nodepartition", "ADDED", partition("node-a", [busy]))
    cache.put("pod", "ADDED", pod("holder", "nvidia.com/mig-7g.80gb", gated=False,
                                  node_name="node-a"))
    cache.put("pod", "ADDED", pod("waits", "nvidia.com/mig-7g.80gb"))


def test_pods_that_do_not_fit_are_planned_again_only_when_something_changed() -> None:
    counter = PlanCounter()
    cache, recorder, controller, clock = setup(metrics=counter, resync_s=30.0)
    _a_7g_waits_behind_a_busy_card(cache)
    for _ in range(20):
        clock.now += 1
        controller.tick()
    assert counter.plans == 1, "20 s of ticks with nothing new: one plan, not twenty"
    assert [e[1] for e in recorder.pod_events if e[0] == "ml/waits"] == ["NoGPUFit"], \
        "the pod is told once"
    cache.put("pod", "ADDED", pod("another", "nvidia.com/mig-7g.80gb"))  # something new
    for _ in range(2):
        clock.now += 1
        controller.tick()
    assert counter.plans == 1, "with pods already waiting, the batch window is 5 s"
    for _ in range(4):
        clock.now += 1
        controller.tick()
    assert counter.plans == 2
    for _ in range(8):
        clock.now += 1
        controller.tick()
    assert counter.plans == 2
    clock.now += 30  # the periodic resync
    for _ in range(2):
        controller.tick()
        clock.now += 1
    assert counter.plans == 3


def _reserve_after_asked(monkeypatch: pytest.MonkeyPatch) -> list[tuple[float, float | None]]:
    """Every plan's ``reserve_after_s`` and snapshot time, as the planner is asked them."""
    asked: list[tuple[float, float | None]] = []
    real_plan = planner.plan

    def spy(snapshot: Any, pods: Any, *args: Any, **kwargs: Any) -> Any:
        asked.append((kwargs["reserve_after_s"], snapshot.now))
        return real_plan(snapshot, pods, *args, **kwargs)

    monkeypatch.setattr(planner, "plan", spy)
    return asked


def _ran(name: str, waited: str, *, placeholder: bool = False) -> dict[str, Any]:
    """A pod bound elsewhere (node-z, not in the cache), created at 10:00:00 and bound at
    10:``waited`` (minutes:seconds) by its PodScheduled condition."""
    raw = pod(name, gated=False, node_name="node-z")
    raw["status"]["conditions"] = [{"type": "PodScheduled", "status": "True",
                                    "lastTransitionTime": f"2026-12-02T10:{waited}Z"}]
    if placeholder:
        raw["metadata"] = {**raw["metadata"], "namespace": "tessera",
                           "labels": {PLACEHOLDER_LABEL: "a100-dynamic"}}
    return raw


def test_a_restarted_controller_takes_the_recent_waits_from_the_pods_bound_before_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A new controller (a restart, a new leader) has released nothing yet: the pods the
    cluster shows bound tell how long pods lately waited (creation to binding), so the
    rule that a pod reserves GPUs only after twice the median wait holds from its first
    plan, instead of reserving at once until 20 pods went through it."""
    asked = _reserve_after_asked(monkeypatch)
    cache, _, controller, clock = setup(reserve_after_waits=2.0)
    clock.now = 1_796_205_600.0 + 3600
    for i in range(15):
        cache.put("pod", "ADDED", _ran(f"quick-{i}", "00:10"))
    for i in range(10):
        cache.put("pod", "ADDED", _ran(f"slow-{i}", "20:00"))
    cache.put("pod", "ADDED", _ran("placeholder", "59:00", placeholder=True))
    _a_7g_waits_behind_a_busy_card(cache)
    for _ in range(3):
        controller.tick()
        clock.now += 1
    assert asked[0][0] == 20.0, "2 x the median wait of the 25 bound pods (10 s)"
    assert len(controller.state.waits) == 25, "the placeholder is no pod that waited"


def test_a_dry_run_holds_pods_to_the_same_wait_as_the_live_controller(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``tessera plan --kubeconfig`` builds a fresh controller over a listing of the live
    cluster: its preview asks the planner for the same wait the live controller does."""
    asked = _reserve_after_asked(monkeypatch)
    cache, _, controller, _ = setup(reserve_after_waits=2.0)
    for i in range(25):
        cache.put("pod", "ADDED", _ran(f"quick-{i}", "00:10"))
    _a_7g_waits_behind_a_busy_card(cache)
    result = controller.preview()
    assert [u.pod for u in result.unplaced] == ["ml/waits"]
    assert [a[0] for a in asked] == [20.0]


def test_a_pod_may_reserve_once_it_has_waited_twice_the_median_recent_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The planner is told how long a pod must have waited to reserve GPUs, and the time a
    waiting pod becomes old enough is a change of its own: it is planned again then, not at
    the next resync."""
    asked = _reserve_after_asked(monkeypatch)
    cache = ClusterCache()
    clock = Clock()
    created = 1_796_205_600.0  # the pods' creationTimestamp (wall clock)
    clock.now = 50.0  # the loop's own clock is monotonic: seconds since boot, not the epoch
    controller = Controller(cache, Recorder(cache), ControllerSettings(
        batch_idle_s=0.5, batch_max_s=3.0, resync_s=300.0, reserve_after_waits=2.0),
        clock=clock, wall_clock=lambda: clock.now - 50.0 + created + 1)
    cache.put("partitionpolicy", "ADDED", DYNAMIC)
    for _ in range(25):  # as if 25 pods had been released after 10 s each
        controller.state.waits.add(10.0)
    _a_7g_waits_behind_a_busy_card(cache)
    def waited() -> float:
        return clock.now - 50.0 + 1

    while waited() < 19.5:
        clock.now += 1
        controller.tick()
    assert len(asked) == 1, "nothing changed and the pod is still too new to reserve"
    assert asked[0][0] == 20.0, "2 x the median recent wait of 10 s"
    while waited() < 21.5:
        clock.now += 1
        controller.tick()
    assert len(asked) == 2, "20 s after its creation the pod may reserve: planned again"
    replanned_at = asked[1][1]
    assert replanned_at is not None
    assert replanned_at - created >= 20.0
    while waited() < 60:
        clock.now += 1
        controller.tick()
    assert len(asked) == 2, "once it may reserve, time alone changes nothing until resync"


def test_a_pod_placed_on_a_slice_the_cluster_did_not_bear_out_is_planned_again() -> None:
    """Planned on a view without the pod that held the slice (a restart's partial cache): the
    node reports no room, so after ``stale_s`` the pod goes back to planning and lands on
    the free slice elsewhere, instead of waiting for ``release_timeout_s``."""
    cache, recorder, controller, clock = setup(stale_s=30.0, release_timeout_s=300.0)
    free = [{"profile": "1g.10gb", "start": 0, "gpuInstanceId": 9,
             "uuid": "MIG-00000009-0000-5000-0000-000000000000"}]
    cache.put("node", "ADDED", node("node-a"))  # its kubelet has not published yet
    cache.put("nodepartition", "ADDED", partition("node-a", free))
    cache.put("node", "ADDED", node("node-b", {"nvidia.com/mig-1g.10gb": "1"}))
    cache.put("nodepartition", "ADDED", partition("node-b", free))
    cache.put("pod", "ADDED", pod("p"))
    for _ in range(2):
        controller.tick()
        clock.now += 1
    first = next(e[2] for e in recorder.pod_events if e[0] == "ml/p")
    assert first.endswith("node-a GPU 0 for this pod")
    # Now the truth arrives: a pod bound on node-a holds that slice.
    cache.put("pod", "ADDED", pod("holder", gated=False, node_name="node-a"))
    cache.put("node", "MODIFIED", node("node-a", {"nvidia.com/mig-1g.10gb": "1"}))
    for _ in range(40):
        controller.tick()
        clock.now += 1
    assert recorder.released == [("ml/p", "node-b", "node-b", True)]


L4_SHARING = {"metadata": {"name": "l4-sharing", "generation": 1},
              "spec": {"nodeSelector": {"matchLabels": {"gpu": "l4"}}, "mode": "dynamic",
                       "allowedModes": ["mps"],
                       "mps": {"shares": 6, "threadPercentage": 16, "memoryMiB": 3800}}}


def l4_partition(name: str, *, mode: str = "none", plan: str | None = None,
                 applied: str | None = None) -> dict[str, Any]:
    gpu: dict[str, Any] = {"index": 0, "uuid": "GPU-00000000-0000-0000-0000-000000000000",
                           "name": "NVIDIA L4", "pciDeviceId": "0x27B810DE", "mode": mode}
    if mode == "mps":
        gpu["mps"] = {"shares": 6, "threadPercentage": 16, "memoryMiB": 3800,
                      "daemon": "Running", "pipeDirectory": "/run/tessera/mps/x/pipe"}
    return {"metadata": {"name": name, "generation": 1},
            "spec": {"planId": plan} if plan else {},
            "status": {"appliedPlanId": applied, "gpus": [gpu]}}


def test_share_pods_turn_an_idle_l4_into_mps_shares_with_the_policys_limits() -> None:
    cache, recorder, controller, clock = setup()
    cache.put("partitionpolicy", "ADDED", L4_SHARING)
    l4 = node("l4-a")
    l4["metadata"]["labels"]["gpu"] = "l4"
    cache.put("node", "ADDED", l4)
    cache.put("nodepartition", "ADDED", l4_partition("l4-a"))
    for n in range(6):
        cache.put("pod", "ADDED", pod(f"s{n}", "nvidia.com/gpu.shared"))
    controller.tick()
    clock.now += 4
    controller.tick()
    (written,) = [s for n, s in recorder.specs if n == "l4-a"]
    (gpu,) = written.gpus
    assert gpu.mode == "mps"
    assert gpu.mps is not None
    assert (gpu.mps.shares, gpu.mps.thread_percentage, gpu.mps.memory_mi_b) == (6, 16, 3800)
    events = {e[0]: e for e in recorder.pod_events}
    assert events["ml/s0"][1] == "Placed"
    assert "sharing l4-a GPU 0" in events["ml/s0"][2]
    cache.put("nodepartition", "MODIFIED", l4_partition(
        "l4-a", mode="mps", plan=written.plan_id, applied=written.plan_id))
    l4["status"]["allocatable"] = {"nvidia.com/gpu.shared": "6"}
    cache.put("node", "MODIFIED", l4)
    clock.now += 1
    controller.tick()
    assert sorted(r[0] for r in recorder.released) == [f"ml/s{n}" for n in range(6)]


def test_a_static_policy_may_run_mps_inside_its_slices() -> None:
    cache, recorder, controller, _ = setup({
        "metadata": {"name": "inner-mps", "generation": 1},
        "spec": {"nodeSelector": {"matchLabels": {"gpu": "a100"}}, "mode": "static",
                 "static": [{"migDevices": {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2},
                             "mpsDevices": {"3g.40gb": {"shares": 3}}}]}})
    cache.put("node", "ADDED", node("node-a"))
    cache.put("nodepartition", "ADDED", partition("node-a", []))
    controller.tick()
    (written,) = recorder.specs
    slices = {(s.profile, s.mps.shares if s.mps else None) for s in written[1].gpus[0].slices}
    assert slices == {("3g.40gb", 3), ("2g.20gb", None), ("1g.10gb", None)}
    cache.put("nodepartition", "MODIFIED", partition(
        "node-a", [], plan=written[1].plan_id, applied=written[1].plan_id))
    cache.put("partitionpolicy", "MODIFIED", {
        "metadata": {"name": "inner-mps", "generation": 2},
        "spec": {"nodeSelector": {"matchLabels": {"gpu": "a100"}}, "mode": "static",
                 "static": [{"migDevices": {"1g.10gb": 7},
                             "mpsDevices": {"3g.40gb": {"shares": 3}}}]}})
    controller.tick()
    (_, status) = recorder.policy_statuses[-1]
    assert "mpsDevices.3g.40gb: no slice of this profile in migDevices" in (
        status.conditions[0].message)


def test_memory_sized_share_pods_get_gpus_cut_into_shares_of_that_size() -> None:
    cache, recorder, controller, clock = setup()
    sized = {"metadata": {"name": "l4-sized", "generation": 1},
             "spec": {"nodeSelector": {"matchLabels": {"gpu": "l4"}}, "mode": "dynamic",
                      "allowedModes": ["mps"], "mps": {"shares": 4},
                      "shareSizesGiB": [8]}}
    cache.put("partitionpolicy", "ADDED", sized)
    l4 = node("l4-a")
    l4["metadata"]["labels"]["gpu"] = "l4"
    cache.put("node", "ADDED", l4)
    cache.put("nodepartition", "ADDED", l4_partition("l4-a"))
    cache.put("pod", "ADDED", pod("big", "nvidia.com/gpu.shared-8gb"))
    controller.tick()
    clock.now += 4
    controller.tick()
    (written,) = [s for n, s in recorder.specs if n == "l4-a"]
    (gpu,) = written.gpus
    assert gpu.mps is not None
    assert (gpu.mps.shares, gpu.mps.memory_mi_b, gpu.mps.resource) == (
        2, 8192, "nvidia.com/gpu.shared-8gb")


def test_a_preview_plans_as_a_tick_would_and_writes_nothing() -> None:
    cache, recorder, controller, clock = setup()
    cache.put("node", "ADDED", node("node-a"))
    cache.put("nodepartition", "ADDED", partition("node-a", []))
    cache.put("pod", "ADDED", pod("p1"))
    cache.put("pod", "ADDED", pod("big", "nvidia.com/mig-7g.80gb", 2))
    preview = controller.preview()
    assert [p.pod for p in preview.placements] == ["ml/p1"]
    assert [u.pod for u in preview.unplaced] == ["ml/big"]
    assert (recorder.specs, recorder.pod_events, recorder.released) == ([], [], [])
    controller.tick()
    clock.now += 4
    controller.tick()
    (written,) = [s for n, s in recorder.specs if n == "node-a"]
    (target,) = preview.gpus
    assert {(s.profile, s.start) for s in written.gpus[0].slices} == {
        (s.profile, s.start) for s in target.slices}, "the tick does what the preview said"


def test_a_slice_given_to_a_pod_that_waits_for_it_is_not_given_again() -> None:
    """A pod placed on a free slice waits until the kubelet shows it; a plan meanwhile must
    not hand the same slice to the next pod (both were placed, one could never start)."""
    cache, recorder, controller, clock = setup()
    cache.put("node", "ADDED", node("node-a"))  # allocatable lags: shows nothing yet
    cache.put("nodepartition", "ADDED", partition("node-a", [
        {"profile": "1g.10gb", "start": 0, "gpuInstanceId": 7,
         "uuid": "MIG-00000007-0000-5000-0000-000000000000"}]))
    cache.put("pod", "ADDED", pod("first"))
    controller.tick()
    clock.now += 1
    controller.tick()
    assert recorder.specs == [], "the free slice is used as it is"
    cache.put("pod", "ADDED", pod("second"))
    controller.tick()
    clock.now += 1
    controller.tick()
    events = {e[0]: e[2] for e in recorder.pod_events if e[1] == "Placed"}
    assert events["ml/first"].startswith("free 1g.10gb on node-a GPU 0")
    assert events["ml/second"].startswith("creating 1g.10gb"), events["ml/second"]


def test_a_batch_cut_short_is_planned_again_at_once() -> None:
    """A plan takes at most ``per_shape`` pods of a kind; the rest are planned on the next
    ticks, not after the backlog's longer batch window."""
    counter = PlanCounter()
    cache, recorder, controller, clock = setup(metrics=counter, per_shape=1)
    cache.put("node", "ADDED", node("node-a", {"nvidia.com/mig-1g.10gb": "3"}))
    cache.put("nodepartition", "ADDED", partition("node-a", [
        {"profile": "1g.10gb", "start": s, "gpuInstanceId": 9 + s,
         "uuid": f"MIG-{s:08d}-0000-5000-0000-000000000000"} for s in (0, 1, 2)]))
    for name in ("p1", "p2", "p3"):
        cache.put("pod", "ADDED", pod(name))
    controller.tick()  # the batch window opens
    clock.now += 0.5
    controller.tick()  # and closes: the first plan, cut short
    assert counter.plans == 1
    for _ in range(2):
        clock.now += 0.05
        controller.tick()
        for key, node_name, _, _ in recorder.released:  # the scheduler binds them
            cache.put("pod", "MODIFIED", pod(key.split("/")[1], gated=False,
                                             node_name=node_name))
    placed = [e[0] for e in recorder.pod_events if e[1] == "Placed"]
    assert sorted(placed) == ["ml/p1", "ml/p2", "ml/p3"], "one tick each, no second window"
    assert counter.plans == 3


def test_a_released_pod_the_watch_still_shows_gated_is_not_planned_twice() -> None:
    """The release (pin and ungate) reaches the cache a little later through the watch: in
    between the pod is neither planned again (it would take a second slice) nor new (it would
    restart the next batch's window); a release the cache never shows is planned again after
    ``release_grace_s``."""
    counter = PlanCounter()
    cache, recorder, controller, clock = setup(metrics=counter, release_grace_s=10.0)
    cache.put("node", "ADDED", node("node-a", {"nvidia.com/mig-1g.10gb": "2"}))
    cache.put("nodepartition", "ADDED", partition("node-a", [
        {"profile": "1g.10gb", "start": s, "gpuInstanceId": 9 + s,
         "uuid": f"MIG-{s:08d}-0000-5000-0000-000000000000"} for s in (0, 1)]))
    cache.put("pod", "ADDED", pod("first"))
    for _ in range(2):
        clock.now += 0.5
        controller.tick()
    assert [r[0] for r in recorder.released] == ["ml/first"]
    cache.put("pod", "ADDED", pod("second"))  # "first" still shows gated: the watch lags
    for _ in range(4):
        clock.now += 0.2
        controller.tick()
    placed = [e[0] for e in recorder.pod_events if e[1] == "Placed"]
    assert placed == ["ml/first", "ml/second"], "the second batch is the new pod alone"
    assert counter.plans == 2
    assert [r[0] for r in recorder.released] == ["ml/first", "ml/second"]
    clock.now += 9.0
    controller.tick()
    assert counter.plans == 2, "within the grace, a lagging watch is no reason to plan"
    for _ in range(3):  # neither release ever shows: both are planned, and released, again
        clock.now += 1.0
        controller.tick()
    assert counter.plans == 3
    assert sorted(r[0] for r in recorder.released[2:]) == ["ml/first", "ml/second"]


def test_a_node_update_that_changes_nothing_the_loop_reads_is_no_change() -> None:
    """Heartbeats, conditions, annotations and image lists change a Node far more often than
    its labels, taints or allocatable: the cache keeps what the loop reads, and an update that
    leaves it as it was keeps the same object and wakes no tick."""
    cache = ClusterCache()
    raw = node("node-a", {"nvidia.com/mig-1g.10gb": "2"})
    cache.put("node", "ADDED", raw)
    kept = cache.nodes["node-a"]
    cache.changed.clear()
    noisy = {**raw, "metadata": {**raw["metadata"], "annotations": {"kcm/seen": "2"},
                                 "resourceVersion": "99"},
             "status": {**raw["status"], "images": [{"names": ["pause"]}],
                        "conditions": [{"type": "Ready", "status": "True"}]}}
    cache.put("node", "MODIFIED", noisy)
    assert cache.nodes["node-a"] is kept
    assert not cache.changed.is_set()
    assert "images" not in kept["status"]
    assert "annotations" not in kept["metadata"]
    relabelled = {**noisy, "metadata": {**noisy["metadata"],
                                        "labels": {**raw["metadata"]["labels"], "gpu": "h100"}}}
    cache.put("node", "MODIFIED", relabelled)
    assert cache.changed.is_set()
    assert cache.nodes["node-a"]["metadata"]["labels"]["gpu"] == "h100"
    cache.changed.clear()
    cordoned = {**relabelled, "spec": {"unschedulable": True}}
    cache.put("node", "MODIFIED", cordoned)
    assert cache.changed.is_set()
    assert cache.nodes["node-a"]["spec"]["unschedulable"] is True


def test_on_a_large_cluster_a_pod_the_chosen_nodes_cannot_take_is_planned_over_every_node(
        ) -> None:
    """A plan on a large cluster looks at the best-fitting nodes first (planner.narrow); a pod
    that only a node outside them can take is planned again over every node, in the same
    plan."""
    cache, recorder, controller, clock = setup()
    for i in range(70):
        name = f"node-{i:02d}"
        raw = node(name)
        raw["metadata"]["labels"]["zone"] = "far" if i == 69 else "near"
        cache.put("node", "ADDED", raw)
        cache.put("nodepartition", "ADDED", partition(name, []))
    far = pod("far")
    far["spec"]["nodeSelector"] = {"zone": "far"}
    cache.put("pod", "ADDED", far)
    cache.put("pod", "ADDED", pod("near"))
    controller.tick()
    clock.now += 0.5
    controller.tick()
    placed = {e[0]: e[2] for e in recorder.pod_events if e[1] == "Placed"}
    assert set(placed) == {"ml/far", "ml/near"}
    assert "node-69" in placed["ml/far"], placed["ml/far"]
    assert "node-69" in {n for n, _ in recorder.specs}
