"""Scale-up in the controller: placeholders asked, handed over, expired and withdrawn, tick
by tick over an in-memory cache (the pure rounds first, then the loop that drives them)."""

from __future__ import annotations

import datetime
import json
from typing import Any

from tessera.api.v1alpha1 import PartitionPolicy
from tessera.controller import scaleup
from tessera.controller.demand import GATE, PLACEHOLDER_LABEL, pending_pod
from tessera.core import catalogue

from .test_loop import Clock, node, partition, pod, setup

POOL = {"gpu": "a100"}
SCALE_UP = {"enabled": True, "models": ["A100-80GB"], "gpusPerNode": 2, "delaySeconds": 0}


def policy(scale_up: dict[str, Any] | None = SCALE_UP, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"nodeSelector": {"matchLabels": POOL}, "mode": "dynamic", **spec}
    if scale_up is not None:
        body["scaleUp"] = scale_up
    return {"metadata": {"name": "pool", "generation": 1}, "spec": body}


def stamp(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def new_node(name: str, created: float, **extra: Any) -> dict[str, Any]:
    raw = node(name)
    raw["metadata"]["creationTimestamp"] = stamp(created)
    raw["metadata"]["labels"].update(extra.pop("labels", {}))
    raw["status"].update(extra)
    return raw


def placeholder(name: str, created: float, gpus: int = 1, node_name: str | None = None,
                policy_name: str = "pool") -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeSelector": dict(POOL), "containers": [{
        "name": "placeholder", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}
    marked = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
    if node_name:
        spec["nodeName"] = node_name
    return {"metadata": {"namespace": "tessera", "name": name, "creationTimestamp": stamp(created),
                         "labels": {PLACEHOLDER_LABEL: policy_name},
                         "annotations": {scaleup.ASK_ANNOTATION: json.dumps(
                             {"policy": policy_name, "model": "A100-80GB", "gpus": gpus,
                              "pods": []})}},
            "spec": spec, "status": {"phase": "Pending", "conditions": [marked]}}


def read(raw: dict[str, Any]) -> scaleup.Placeholder:
    found = scaleup.Placeholder.of(raw)
    assert found is not None
    return found


# -- rounds ---------------------------------------------------------------------------------

def test_a_node_created_after_a_placeholder_that_would_take_it_answers_it() -> None:
    policies = [PartitionPolicy.model_validate(policy())]
    old, fresh = read(placeholder("ph-1", 1000)), read(placeholder("ph-2", 1000))
    nodes = {"before": new_node("before", 990), "answer": new_node("answer", 1010)}
    decided = scaleup.plan_round([], [old, fresh], nodes=nodes, partitions={},
                                 policies=policies, now=1020, ttl_s=900)
    reasons = {p.key: why for p, why in decided.delete}
    assert reasons == {"tessera/ph-1": "node answer registered for it",
                       "tessera/ph-2": "node answer registered for it"}


def test_a_node_answers_only_as_many_placeholders_as_its_gpus_hold() -> None:
    policies = [PartitionPolicy.model_validate(policy())]
    asks = [read(placeholder(f"ph-{i}", 1000 + i)) for i in range(3)]
    nodes = {"answer": new_node("answer", 1010, allocatable={"nvidia.com/gpu": "2"})}
    decided = scaleup.plan_round([], asks, nodes=nodes, partitions={}, policies=policies,
                                 now=1020, ttl_s=900)
    handed = sorted(p.key for p, why in decided.delete if why.startswith("node answer"))
    assert handed == ["tessera/ph-0", "tessera/ph-1"]


def test_a_node_that_would_refuse_the_placeholder_answers_nothing() -> None:
    policies = [PartitionPolicy.model_validate(policy())]
    other = new_node("cpu-node", 1010, labels={"gpu": "none"})
    decided = scaleup.plan_round([], [read(placeholder("ph", 1000))], nodes={"cpu-node": other},
                                 partitions={}, policies=policies, now=1020, ttl_s=900)
    assert [why for _, why in decided.delete] == ["the waiting pods no longer need it"]


def test_placeholders_that_are_bound_expired_or_orphaned_are_deleted() -> None:
    policies = [PartitionPolicy.model_validate(policy())]
    found = [read(placeholder("bound", 1000, node_name="n1")),
             read(placeholder("stale", 0)),
             read(placeholder("orphan", 1000, policy_name="gone"))]
    waiting = [pending_pod(pod("p1", "nvidia.com/mig-7g.80gb"))]
    decided = scaleup.plan_round(waiting, found, nodes={}, partitions={}, policies=policies,
                                 now=1020, ttl_s=900)
    assert {p.key: why for p, why in decided.delete} == {
        "tessera/bound": "bound to n1", "tessera/stale": "no node came within 900 s",
        "tessera/orphan": "its policy no longer asks for scale-up"}
    assert [(name, ask.gpus) for name, _, ask in decided.create] == [("pool", 1)]


def test_an_existing_placeholder_of_the_same_shape_stands_for_a_new_ask() -> None:
    policies = [PartitionPolicy.model_validate(policy())]
    waiting = [pending_pod(pod("p1", "nvidia.com/mig-7g.80gb"))]
    first = scaleup.plan_round(waiting, [], nodes={}, partitions={}, policies=policies,
                               now=1000, ttl_s=900)
    ((_, _, ask),) = first.create
    body = scaleup.placeholder_body(policies[0], ask, namespace="tessera",
                                    priority_class="low", image="pause")
    body["metadata"].update(name="ph", creationTimestamp=stamp(1000))
    again = scaleup.plan_round(waiting, [read(body)], nodes={}, partitions={},
                               policies=policies, now=1001, ttl_s=900)
    assert again.create == []
    assert again.delete == []
    assert again.requested_gpus == 1
    assert again.asked["ml/p1"][0] == "ScaleUpRequested"


def test_the_placeholder_says_what_the_autoscaler_must_provide() -> None:
    chosen = PartitionPolicy.model_validate(policy())
    waiting = pending_pod({**pod("p1", "nvidia.com/mig-7g.80gb", 2), "spec": {
        **pod("p1", "nvidia.com/mig-7g.80gb", 2)["spec"],
        "nodeSelector": {"topology.kubernetes.io/zone": "a"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kind", "operator": "In", "values": ["big"]}]}]}}}}})
    decided = scaleup.plan_round([waiting], [], nodes={}, partitions={}, policies=[chosen],
                                 now=1000, ttl_s=900)
    ((_, _, ask),) = decided.create
    body = scaleup.placeholder_body(chosen, ask, namespace="tessera", priority_class="low",
                                    image="pause")
    spec = body["spec"]
    assert spec["containers"][0]["resources"]["requests"] == {"nvidia.com/gpu": "2"}
    assert spec["nodeSelector"] == {"gpu": "a100", "topology.kubernetes.io/zone": "a"}
    assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists",
                                    "effect": "NoSchedule"}]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [{"matchExpressions": [
        {"key": "kind", "operator": "In", "values": ["big"]}]}]
    assert spec["priorityClassName"] == "low"
    assert "schedulingGates" not in spec
    assert body["metadata"]["labels"][PLACEHOLDER_LABEL] == "pool"
    assert json.loads(body["metadata"]["annotations"][scaleup.ASK_ANNOTATION]) == {
        "policy": "pool", "model": "A100-80GB", "gpus": 2, "pods": ["ml/p1"]}


def test_an_unknown_model_is_a_problem_of_the_policy_not_an_ask() -> None:
    bad = PartitionPolicy.model_validate(policy({"enabled": True, "models": ["Z9000"]}))
    found, problems = scaleup.targets([bad])
    assert found == {}
    assert "spec.scaleUp.models[0]" in problems["pool"]


def test_the_product_label_of_a_new_node_names_its_model() -> None:
    policies = [PartitionPolicy.model_validate(policy())]
    raw = new_node("n", 1000, labels={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB",
                                      "nvidia.com/gpu.count": "4"})
    (found,) = scaleup.arriving({"n": raw}, {}, policies, policies[0], now=1010,
                                planned=frozenset())
    assert (found.model, found.gpus) == (catalogue.model("NVIDIA A100-SXM4-40GB").name, 4)


# -- the loop -------------------------------------------------------------------------------

def overflowing(scale_up: dict[str, Any] | None = SCALE_UP,
                **settings: Any) -> tuple[Any, Any, Any, Clock]:
    """One full A100 node and a pod asking a 7g.80gb that fits nowhere, planned once."""
    cache, recorder, controller, clock = setup(policy(scale_up), namespace="tessera",
                                               **settings)
    cache.put("node", "ADDED", node("node-a"))
    cache.put("nodepartition", "ADDED", partition("node-a", [
        {"profile": "7g.80gb", "start": 0, "gpuInstanceId": 0, "uuid": "MIG-1"}]))
    cache.put("pod", "ADDED", pod("held", "nvidia.com/mig-7g.80gb", node_name="node-a",
                                  gated=False))
    cache.put("pod", "ADDED", pod("big", "nvidia.com/mig-7g.80gb"))
    controller.tick()
    clock.now += 1
    controller.tick()
    return cache, recorder, controller, clock


def test_with_scale_up_off_nothing_is_asked_and_the_pod_says_why_it_waits() -> None:
    _, recorder, _, _ = overflowing(scale_up=None)
    assert recorder.placeholders == []
    reasons = [r for p, r, _, _ in recorder.pod_events if p == "ml/big"]
    assert reasons == ["NoGPUFit"]


def test_a_pod_that_fits_nowhere_is_asked_for_once_then_handed_over() -> None:
    cache, recorder, controller, clock = overflowing()
    (body,) = recorder.placeholders
    assert body["metadata"]["namespace"] == "tessera"
    events = {r: m for p, r, m, _ in recorder.pod_events if p == "ml/big"}
    assert "asked the cluster autoscaler for 1 whole A100-80GB GPU(s)" in events[
        "ScaleUpRequested"]
    for _ in range(3):  # the watch has not delivered the placeholder yet: no second ask
        clock.now += 10
        controller.tick()
    assert len(recorder.placeholders) == 1
    created = {**body, "metadata": {**body["metadata"], "name": "placeholder-1",
                                    "creationTimestamp": stamp(clock.now - 5)},
               "status": {"phase": "Pending", "conditions": [{
                   "type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}}
    cache.put("pod", "ADDED", created)
    clock.now += 10
    controller.tick()
    assert recorder.deleted_placeholders == []
    cache.put("node", "ADDED", new_node("node-b", clock.now - 1,
                                        allocatable={"nvidia.com/gpu": "2"}))
    clock.now += 1
    controller.tick()
    assert recorder.deleted_placeholders == [("tessera/placeholder-1",
                                              "node node-b registered for it")]
    cache.put("pod", "DELETED", created)
    for _ in range(3):  # node-b is on its way: it covers the pod, nothing more is asked
        clock.now += 10
        controller.tick()
    assert len(recorder.placeholders) == 1
    events = {r: m for p, r, m, _ in recorder.pod_events if p == "ml/big"}
    assert events["ScaleUpArriving"].startswith("node node-b is joining")


def test_a_pod_is_asked_for_only_once_it_has_found_no_room_for_the_delay() -> None:
    _, recorder, controller, clock = overflowing({**SCALE_UP, "delaySeconds": 15})
    assert recorder.placeholders == [], "a plan in flight may yet make room"
    clock.now += 10
    controller.tick()
    assert recorder.placeholders == []
    clock.now += 6
    controller.tick()
    assert len(recorder.placeholders) == 1


def test_no_scheduler_binds_a_placeholder_and_one_never_marked_is_asked_again() -> None:
    cache, recorder, controller, clock = overflowing()
    (body,) = recorder.placeholders
    assert body["spec"]["schedulerName"] == scaleup.PLACEHOLDER_SCHEDULER
    unmarked = {**body, "metadata": {**body["metadata"], "name": "placeholder-1",
                                     "creationTimestamp": stamp(clock.now)},
                "status": {"phase": "Pending"}}
    cache.put("pod", "ADDED", unmarked)
    clock.now += 10
    controller.tick()
    assert recorder.deleted_placeholders == []
    clock.now += 30
    controller.tick()
    assert recorder.deleted_placeholders == [("tessera/placeholder-1",
                                              "never marked Unschedulable: asked again")]


def test_placeholders_are_never_gpu_demand_of_their_own() -> None:
    cache, recorder, controller, clock = overflowing()
    (body,) = recorder.placeholders
    cache.put("pod", "ADDED", {**body, "metadata": {**body["metadata"], "name": "placeholder-1",
                                                    "creationTimestamp": stamp(clock.now)},
                               "status": {"phase": "Pending", "conditions": [{
                                   "type": "PodScheduled", "status": "False",
                                   "reason": "Unschedulable"}]}})
    clock.now += 40
    controller.tick()
    assert all(p != "tessera/placeholder-1" for p, *_ in recorder.pod_events)
    assert GATE not in json.dumps(body)


def test_the_label_outside_the_controller_s_namespace_makes_no_placeholder() -> None:
    cache, recorder, controller, clock = overflowing()
    impostor = placeholder("impostor", clock.now)
    impostor["metadata"]["namespace"] = "ml"
    cache.put("pod", "ADDED", impostor)
    clock.now += 10
    controller.tick()
    assert all(key != "ml/impostor" for key, _ in recorder.deleted_placeholders)


# -- ProvisioningRequests (Cluster Autoscaler, GKE) ---------------------------------------------

def test_method_auto_asks_through_provisioning_requests_where_they_are_served() -> None:
    chosen = PartitionPolicy.model_validate(policy())
    forced = PartitionPolicy.model_validate(policy({**SCALE_UP, "method": "placeholders"}))
    strict = PartitionPolicy.model_validate(policy({**SCALE_UP, "method": "provisioningRequest"}))
    assert scaleup.kind_for(chosen, True) == scaleup.PROVISIONING_REQUEST
    assert scaleup.kind_for(chosen, False) == scaleup.POD
    assert scaleup.kind_for(forced, True) == scaleup.POD
    assert scaleup.kind_for(strict, False) is None
    _, problems = scaleup.targets([strict], provisioning_requests=False)
    assert "does not serve autoscaling.x-k8s.io/v1 ProvisioningRequests" in problems["pool"]


def test_a_provisioning_request_carries_its_pod_template_and_upstream_s_class() -> None:
    chosen = PartitionPolicy.model_validate(policy())
    decided = scaleup.plan_round([pending_pod(pod("p1", "nvidia.com/mig-7g.80gb"))], [],
                                 nodes={}, partitions={}, policies=[chosen], now=1000,
                                 ttl_s=900, provisioning_requests=True)
    ((_, kind, ask),) = decided.create
    assert kind == scaleup.PROVISIONING_REQUEST
    body = scaleup.placeholder_body(chosen, ask, namespace="tessera", priority_class="low",
                                    image="pause", kind=kind)
    assert body["apiVersion"] == "autoscaling.x-k8s.io/v1"
    assert body["spec"]["provisioningClassName"] == (
        "best-effort-atomic-scale-up.autoscaling.x-k8s.io")
    assert body["spec"]["podSets"][0]["count"] == 1
    template = body["podTemplate"]["template"]["spec"]
    assert template["containers"][0]["resources"]["requests"] == {"nvidia.com/gpu": "1"}
    assert template["nodeSelector"] == POOL
    assert "through a ProvisioningRequest" in decided.asked["ml/p1"][1]
    # Read back (name given by the writer), it is the same ask: nothing new is created.
    body["metadata"].update(name="req", creationTimestamp=stamp(1000))
    again = scaleup.plan_round([pending_pod(pod("p1", "nvidia.com/mig-7g.80gb"))],
                               [read(body)], nodes={}, partitions={}, policies=[chosen],
                               now=1001, ttl_s=900, provisioning_requests=True)
    assert again.create == []
    assert again.delete == []
    # A node it brought answers it like a placeholder pod.
    answered = scaleup.plan_round([], [read(body)], nodes={"n": new_node("n", 1005)},
                                  partitions={}, policies=[chosen], now=1006, ttl_s=900,
                                  provisioning_requests=True)
    assert [why for _, why in answered.delete] == ["node n registered for it"]


def test_a_failed_provisioning_request_is_not_asked_again_before_its_ttl() -> None:
    chosen = PartitionPolicy.model_validate(policy())
    waiting = [pending_pod(pod("p1", "nvidia.com/mig-7g.80gb"))]
    ((_, kind, ask),) = scaleup.plan_round(waiting, [], nodes={}, partitions={},
                                           policies=[chosen], now=1000, ttl_s=900,
                                           provisioning_requests=True).create
    body = scaleup.placeholder_body(chosen, ask, namespace="tessera", priority_class="",
                                    image="pause", kind=kind)
    body["metadata"].update(name="req", creationTimestamp=stamp(1000))
    body["status"] = {"conditions": [{"type": "Failed", "status": "True",
                                      "reason": "CapacityIsNotFound",
                                      "message": "no node group can hold it"}]}
    decided = scaleup.plan_round(waiting, [read(body)], nodes={}, partitions={},
                                 policies=[chosen], now=1100, ttl_s=900,
                                 provisioning_requests=True)
    assert decided.create == []
    assert decided.asked["ml/p1"][0] == "ScaleUpFailed"
    assert "no node group can hold it" in decided.asked["ml/p1"][1]
    expired = scaleup.plan_round(waiting, [read(body)], nodes={}, partitions={},
                                 policies=[chosen], now=2000, ttl_s=900,
                                 provisioning_requests=True)
    assert [why for _, why in expired.delete] == ["no node came within 900 s"]
    assert len(expired.create) == 1


def test_the_loop_asks_through_a_provisioning_request_and_reads_it_back() -> None:
    cache, recorder, controller, clock = overflowing(provisioning_requests=True)
    (body,) = recorder.placeholders
    assert body["kind"] == "ProvisioningRequest"
    stored = {k: v for k, v in body.items() if k != "podTemplate"}
    stored["metadata"] = {**body["metadata"], "name": "placeholder-1",
                          "creationTimestamp": stamp(clock.now)}
    cache.put("provisioningrequest", "ADDED", stored)
    assert list(cache.placeholder_view()) == ["ProvisioningRequest:tessera/placeholder-1"]
    cache.put("node", "ADDED", new_node("node-b", clock.now + 1))
    clock.now += 10
    controller.tick()
    assert recorder.deleted_placeholders == [("tessera/placeholder-1",
                                              "node node-b registered for it")]
    assert recorder.deleted_kinds == ["ProvisioningRequest"]


def test_a_scale_up_the_cluster_cannot_serve_marks_the_policy_invalid() -> None:
    strict = policy({**SCALE_UP, "method": "provisioningRequest"})
    cache, recorder, controller, _ = setup(strict, namespace="tessera")
    cache.put("node", "ADDED", node("node-a"))
    controller.tick()
    ((name, status),) = recorder.policy_statuses
    (condition,) = status.conditions
    assert (name, condition.status, condition.reason) == ("pool", "True", "ScaleUpInvalid")
    assert "spec.scaleUp.method" in condition.message


def test_a_restarted_controller_finds_its_placeholders_by_label_and_withdraws_them() -> None:
    """Nothing about placeholders lives only in memory: a new leader that sees one no waiting
    pod needs (its pods were placed or deleted meanwhile) deletes it."""
    cache, recorder, controller, clock = setup(policy(), namespace="tessera")
    cache.put("pod", "ADDED", placeholder("left-behind", clock.now - 60))
    controller.tick()
    assert recorder.deleted_placeholders == [("tessera/left-behind",
                                              "the waiting pods no longer need it")]
    assert recorder.placeholders == []
