"""Scale-up end to end with a real autoscaler: Karpenter (built from its Go module with its
kwok cloud provider, ``make karpenter``) adds a node for MIG pods no existing node can hold.

One A100-80GB node serves a dynamic PartitionPolicy whose pool is a Karpenter NodePool of
two-GPU machines. Pods asking ``nvidia.com/mig-3g.40gb`` (two per card) overflow it: with
scale-up off they wait and say why; with it on the controller asks for whole GPUs through a
placeholder pod, Karpenter launches a node for it, the placeholder is deleted as soon as that
node exists, a real kubelet and agent then start under the node's name, and every pod runs.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import cast

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tessera.api.v1alpha1 import GROUP, VERSION
from tessera.controller.demand import PLACEHOLDER_LABEL
from tessera.testing.cluster import Cluster
from tessera.testing.deployment import TesseraDeployment
from tessera.testing.karpenter import Karpenter, KarpenterMissingError, gpu_instance_type

from ._util import eventually, selector

NAMESPACE = "tessera"
POOL = {"tessera.dev/pool": "scale-up"}
BASE = "scale-base"
POLICY = "scale-pool"
INSTANCE_TYPE = "gpu-2x-a100-80gb"
MIG_3G = "nvidia.com/mig-3g.40gb"
APP = {"app": "scale-up-e2e"}
SELECTOR = selector(APP)


@pytest.fixture(scope="module")
def system(cluster: Cluster) -> Iterator[tuple[TesseraDeployment, Karpenter]]:
    try:
        karpenter = Karpenter(cluster, [gpu_instance_type(INSTANCE_TYPE, 2)])
    except KarpenterMissingError as error:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(str(error), pytrace=False)
        pytest.skip(str(error))
    running = TesseraDeployment(cluster, NAMESPACE)
    running.install()
    try:
        running.add_gpu_node(BASE, POOL, ["A100-80GB"], mig=True)
        running.create_policy({
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "PartitionPolicy",
            "metadata": {"name": POLICY},
            "spec": {"mode": "dynamic", "nodeSelector": {"matchLabels": POOL}}})
        running.start_controller("c1", "--batch-idle-seconds", "0.3",
                                 "--scale-up-priority-class", "tessera-placeholder")
        karpenter.start()
        karpenter.node_pool("gpus", labels=POOL, instance_types=[INSTANCE_TYPE])
        eventually(lambda: running.reported(BASE), 30, "the base node's report")
        yield running, karpenter
    finally:
        # This module's pods first, whatever its tests did: one left Pending would be planned
        # onto the next module's nodes.
        client.CoreV1Api(cluster.api_client()).delete_collection_namespaced_pod(
            "default", label_selector=SELECTOR, grace_period_seconds=0)
        karpenter.stop()
        running.uninstall()
        # Nothing of this module may ask for nodes in the next one's.
        with contextlib.suppress(ApiException):
            running.custom.delete_cluster_custom_object(GROUP, VERSION, "partitionpolicies",
                                                        POLICY)
        with contextlib.suppress(ApiException):
            running.custom.delete_cluster_custom_object("karpenter.sh", "v1", "nodepools",
                                                        "gpus")
        core = client.CoreV1Api(cluster.api_client())
        for node in core.list_node().items:
            if (node.spec.provider_id or "").startswith("kwok://"):
                core.delete_node(node.metadata.name)


def _pod(name: str) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels=APP),
        spec=client.V1PodSpec(
            termination_grace_period_seconds=0,
            containers=[client.V1Container(
                name="cuda", image="registry.invalid/infer:1",
                resources=client.V1ResourceRequirements(limits={MIG_3G: "1"}))]))


def _pods(core: client.CoreV1Api) -> list[client.V1Pod]:
    return list(core.list_namespaced_pod("default", label_selector=SELECTOR).items)


def _placeholders(core: client.CoreV1Api) -> list[client.V1Pod]:
    return list(core.list_namespaced_pod(NAMESPACE, label_selector=PLACEHOLDER_LABEL).items)


def _unschedulable(pod: client.V1Pod) -> bool:
    marked = [(c.type, c.status, c.reason) for c in pod.status.conditions or []]
    return ("PodScheduled", "False", "Unschedulable") in marked


def _reasons(core: client.CoreV1Api, pod: str) -> list[tuple[str, str]]:
    events = core.list_namespaced_event("default", field_selector=f"involvedObject.name={pod}")
    return [(e.reason or "", e.message or "") for e in events.items]


def test_without_scale_up_the_pods_that_fit_nowhere_wait_and_say_why(
        system: tuple[TesseraDeployment, Karpenter]) -> None:
    running, karpenter = system
    for i in range(4):
        running.core.create_namespaced_pod("default", _pod(f"infer-{i}"))
    eventually(lambda: sum(p.status.phase == "Running" for p in _pods(running.core)) == 2, 60,
               "two pods running on the base node's one card")
    waiting = [p.metadata.name for p in _pods(running.core) if p.status.phase != "Running"]
    for name in waiting:  # the planner's NoGPUFit, or Waiting behind an older pod like it
        eventually(lambda n=name: any(r in ("NoGPUFit", "Waiting") and "3g.40gb" in m
                                      for r, m in _reasons(running.core, n)),
                   30, f"{name}'s Event saying why it waits")
    time.sleep(5)  # several ticks and a Karpenter batch: still nothing asked
    assert _placeholders(running.core) == []
    assert karpenter.node_claims() == []


def test_with_scale_up_karpenter_adds_a_node_and_every_pod_runs(
        system: tuple[TesseraDeployment, Karpenter]) -> None:
    running, karpenter = system
    core = running.core
    running.custom.patch_cluster_custom_object(GROUP, VERSION, "partitionpolicies", POLICY, {
        "spec": {"scaleUp": {"enabled": True, "models": ["A100-80GB"], "gpusPerNode": 2,
                             "delaySeconds": 2}}})
    # Two 3g.40gb pods fill one A100-80GB: one placeholder asking one whole GPU. No scheduler
    # binds it (so it never holds a GPU); the controller marks it Unschedulable, which is what
    # the autoscaler acts on. The mark is a status write after the create, so wait for it.
    placeholders = eventually(lambda: (found := _placeholders(core)) and all(
        _unschedulable(p) for p in found) and found, 30, "a placeholder pod marked Unschedulable",
        describe=lambda: [(p.metadata.name, p.status.conditions) for p in _placeholders(core)])
    assert len(placeholders) == 1
    placeholder = placeholders[0]
    requests = placeholder.spec.containers[0].resources.requests
    assert requests == {"nvidia.com/gpu": "1"}
    assert placeholder.spec.node_selector == POOL
    assert placeholder.spec.scheduler_name == "tessera-placeholder"
    assert not placeholder.spec.node_name
    assert placeholder.spec.priority_class_name == "tessera-placeholder"
    assert placeholder.spec.priority == -5
    assert not placeholder.spec.scheduling_gates  # the admission gate leaves it alone
    waiting = [p.metadata.name for p in _pods(core) if p.status.phase != "Running"]
    for name in waiting:
        eventually(lambda n=name: any(r == "ScaleUpRequested" and "1 whole A100-80GB" in m
                                      for r, m in _reasons(core, n)),
                   30, f"{name}'s ScaleUpRequested Event")

    def kwok_node() -> str | None:
        for node in core.list_node().items:
            if (node.spec.provider_id or "").startswith("kwok://"):
                return cast(str, node.metadata.name)
        return None

    name = eventually(kwok_node, 90, "the node Karpenter launched")
    claims = karpenter.node_claims()
    assert len(claims) == 1, claims
    # The node exists: the placeholder goes before it could take a GPU there.
    eventually(lambda: not _placeholders(core), 30, "the placeholder's deletion")
    for pod in waiting:
        eventually(lambda n=pod: any(r == "ScaleUpArriving" and name in m
                                     for r, m in _reasons(core, n)),
                   30, f"{pod}'s ScaleUpArriving Event")
    time.sleep(3)
    assert _placeholders(core) == [], "nothing more is asked while the node is on its way"
    assert len(karpenter.node_claims()) == 1
    # The machine boots: a real kubelet and agent join under the name Karpenter gave it.
    running.add_gpu_node(name, POOL, ["A100-80GB", "A100-80GB"], mig=False)
    eventually(lambda: all(p.status.phase == "Running" for p in _pods(core)), 120,
               "every pod running")
    on_new = [p.metadata.name for p in _pods(core) if p.spec.node_name == name]
    assert sorted(on_new) == sorted(waiting)
    assert _placeholders(core) == []
    claims = karpenter.node_claims()
    assert [c["status"]["nodeName"] for c in claims] == [name], "one node, no second ask"

    def initialized() -> bool:
        # Karpenter initializes a node once the GPUs it was asked for (nvidia.com/gpu) were
        # advertised there; only an initialized node is one it may later consolidate away.
        status = karpenter.node_claims()[0]["status"]
        return any(c["type"] == "Initialized" and c["status"] == "True"
                   for c in status.get("conditions", []))

    eventually(initialized, 30, "Karpenter's NodeClaim Initialized")


def test_a_user_pod_labelled_as_a_placeholder_elsewhere_is_still_gated(
        system: tuple[TesseraDeployment, Karpenter]) -> None:
    """The gate's exemption holds only in Tessera's namespace: a label is no way around it."""
    running, _ = system
    body = _pod("sneaky")
    body.metadata.labels = {PLACEHOLDER_LABEL: "x"}
    created = running.core.create_namespaced_pod("default", body)
    try:
        assert [g.name for g in created.spec.scheduling_gates or []] == ["tessera.dev/placement"]
    finally:
        running.core.delete_namespaced_pod("sneaky", "default", grace_period_seconds=0)
