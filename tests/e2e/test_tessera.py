"""Tessera end to end: the chart, the controller and the agents on a real control plane.

The chart is installed with helm (CRDs, RBAC, service accounts, the admission policy); the
controller (two replicas) and one agent per simulated GPU node run as real processes with the
chart's service-account tokens, so RBAC is what the chart grants and nothing more. GPU nodes are
real kubelets whose device manager registers, lists and allocates from the agents' plugins.

The tests share one deployment and run in file order: the first one's replicas are what the
in-use, kubelet-restart and failover tests work around, as on a busy real cluster.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tessera.api.migparted import policy_from_mig_parted
from tessera.kubelet.podresources import PodResourcesClient
from tessera.nvml.sim import operations
from tessera.nvml.sim.store import FileStore, load_state_file
from tessera.testing.cluster import Cluster
from tessera.testing.deployment import TesseraDeployment

from ._util import eventually

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "tessera"
POOL = {"tessera.dev/pool": "a100"}
MIG_1G = "nvidia.com/mig-1g.10gb"
GROUP, VERSION = "tessera.dev", "v1alpha1"


System = TesseraDeployment


@pytest.fixture(scope="module")
def system(cluster: Cluster) -> Iterator[System]:
    running = System(cluster, NAMESPACE)
    running.install()
    try:
        for name in ("a100-a", "a100-b"):
            running.add_gpu_node(name, POOL, ["A100-80GB", "A100-80GB"])
        running.create_policy({
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "PartitionPolicy",
            "metadata": {"name": "a100-dynamic"},
            "spec": {"nodeSelector": {"matchLabels": POOL}, "mode": "dynamic"}})
        for identity in ("c1", "c2"):
            running.start_controller(identity, "--batch-idle-seconds", "0.3",
                                     "--batch-max-seconds", "2")
        for name in list(running.nodes):
            eventually(lambda n=name: running.reported(n), 30, f"NodePartition {name}")
        yield running
    finally:
        running.uninstall()


def _deployment(name: str, replicas: int, resource: str, count: int = 1) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": {
                     "nodeSelector": POOL,
                     "containers": [{"name": "main", "image": "registry.invalid/infer:1",
                                     "resources": {"limits": {resource: str(count)}}}]}}}}


def _pool_pod(name: str, resource: str, namespace: str = "default") -> dict[str, Any]:
    """A pod asking one ``resource`` on the pool's nodes."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"nodeSelector": POOL,
                     "containers": [{"name": "main", "image": "registry.invalid/infer:1",
                                     "resources": {"limits": {resource: "1"}}}]}}


def _running_pods(system: System, app: str) -> list[Any]:
    pods = system.core.list_namespaced_pod("default", label_selector=f"app={app}").items
    return [p for p in pods if p.status.phase == "Running"]


def _allocated(system: System) -> dict[str, str]:
    """Device id -> pod, from every node's PodResources (what the kubelet handed out)."""
    owners: dict[str, str] = {}
    for node in system.nodes.values():
        with PodResourcesClient(node.pod_resources_socket, timeout=5) as pods:
            for pod in pods.list():
                for container in pod.containers:
                    for devices in container.devices:
                        for device in devices.device_ids:
                            owners[device] = f"{pod.namespace}/{pod.name}"
    return owners


def _events(system: System, namespace: str, name: str) -> list[tuple[str, str]]:
    events = system.core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={name}").items
    return [(e.reason, e.message) for e in events]


def test_a_deployment_of_slices_lands_on_whole_gpus(system: System) -> None:
    """Whole A100s -> plan -> agents make slices -> plugins advertise -> pods Running."""
    apps = client.AppsV1Api(system.api)
    apps.create_namespaced_deployment("default", _deployment("infer", 6, MIG_1G))
    started = time.monotonic()
    running = eventually(lambda: len(_running_pods(system, "infer")) == 6 and
                         _running_pods(system, "infer"), 120, "6 replicas Running")
    elapsed = time.monotonic() - started
    owners = _allocated(system)
    mig = {device: pod for device, pod in owners.items() if device.startswith("MIG-")}
    names = {f"default/{p.metadata.name}" for p in running}
    assert set(mig.values()) >= names, "every replica got a MIG device from the kubelet"
    assert len({d for d, p in mig.items() if p in names}) == 6, "distinct MIG UUIDs"
    created = {c.uuid for s in system.states.values() for g in load_state_file(s).gpus
               for i in g.instances for c in i.compute_instances}
    assert {d for d, p in mig.items() if p in names} <= created, \
        "the UUIDs are the simulator's real MIG devices"
    pod = running[0]
    reasons = [r for r, _ in _events(system, "default", pod.metadata.name)]
    assert "Placed" in reasons
    print(f"6 replicas Running {elapsed:.1f} s after the Deployment was created")


def test_a_slice_in_use_survives_and_the_blocked_pod_is_told(system: System) -> None:
    (node,) = {p.spec.node_name for p in _running_pods(system, "infer")}
    in_use = eventually(lambda: [s for g in system.partition(node)["status"]["gpus"]
                                 for s in g.get("slices", []) if s.get("allocated")], 30,
                        "the agent reports the replicas' slices allocated")
    held = {(s["profile"], s["start"]) for s in in_use}
    body = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "whole-card", "namespace": "default"},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": node},
                     "containers": [{"name": "main", "image": "registry.invalid/train:1",
                                     "resources": {"limits": {
                                         "nvidia.com/mig-7g.80gb": "2"}}}]}}
    system.core.create_namespaced_pod("default", body)
    eventually(lambda: any(r == "NoGPUFit" for r, _ in _events(system, "default",
                                                              "whole-card")),
               60, "a NoGPUFit event on the pod")
    reason = next(m for r, m in _events(system, "default", "whole-card") if r == "NoGPUFit")
    assert "7g.80gb" in reason
    after = system.partition(node)
    still = {(s["profile"], s["start"]) for g in after["status"]["gpus"]
             for s in g.get("slices", []) if s.get("allocated")}
    assert held <= still, "no slice a pod holds was destroyed"
    system.core.delete_namespaced_pod("whole-card", "default", grace_period_seconds=0)


def test_a_kubelet_restart_keeps_the_pods_and_their_slices(system: System) -> None:
    (host,) = {p.spec.node_name for p in _running_pods(system, "infer")} or {"a100-a"}
    node = system.nodes[host]
    capacity = int(system.cluster.get_node(host)["status"]["capacity"][MIG_1G])
    before = {d: p for d, p in _allocated(system).items() if d.startswith("MIG-")}
    restarted = time.monotonic()
    node.restart_kubelet()
    eventually(lambda: int((system.cluster.get_node(host) or {}).get("status", {})
                           .get("capacity", {}).get(MIG_1G, "0")) == capacity, 30,
               "the plugins registered again with the whole capacity")
    print(f"capacity back {time.monotonic() - restarted:.1f} s after the kubelet restart")
    eventually(lambda: before.items() <= _allocated(system).items(), 30,
               "every pod keeps its slice across the restart")
    state = load_state_file(system.states[host])
    live = {c.uuid for g in state.gpus for i in g.instances for c in i.compute_instances}
    assert set(before) <= live, "the agent destroyed nothing a pod holds"
    assert len(_running_pods(system, "infer")) == 6


def test_the_api_server_refuses_invalid_objects_naming_the_field(system: System) -> None:
    with pytest.raises(ApiException) as error:
        system.custom.create_cluster_custom_object(GROUP, VERSION, "nodepartitions", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "NodePartition",
            "metadata": {"name": "bad-node"},
            "spec": {"gpus": [{"index": 0, "uuid": "GPU-29740a30-5529-5daa-940a-26ee53ffc511",
                               "mode": "mig"}]}})
    assert error.value.status == 422
    assert "set exactly one of index and uuid" in error.value.body
    assert "spec.gpus[0]" in error.value.body
    with pytest.raises(ApiException) as policy_error:
        system.custom.create_cluster_custom_object(GROUP, VERSION, "partitionpolicies", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "PartitionPolicy",
            "metadata": {"name": "bad-policy"}, "spec": {"mode": "static"}})
    assert "mode static needs a static layout" in policy_error.value.body
    with pytest.raises(ApiException) as range_error:
        system.custom.create_cluster_custom_object(GROUP, VERSION, "nodepartitions", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "NodePartition",
            "metadata": {"name": "bad-start"},
            "spec": {"gpus": [{"index": 0, "mode": "mig",
                               "slices": [{"profile": "1g.10gb", "start": 12}]}]}})
    assert "spec.gpus[0].slices[0].start" in range_error.value.body


def test_a_pod_asking_a_slice_only_in_an_init_container_is_gated(system: System) -> None:
    body = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "init-only", "namespace": "default"},
            "spec": {"nodeSelector": POOL,
                     "initContainers": [{"name": "warm", "image": "registry.invalid/warm:1",
                                         "resources": {"limits": {MIG_1G: "1"}}}],
                     "containers": [{"name": "main", "image": "registry.invalid/app:1"}]}}
    created = system.core.create_namespaced_pod("default", body)
    try:
        gates = [g.name for g in created.spec.scheduling_gates or []]
        assert gates == ["tessera.dev/placement"]
    finally:
        system.core.delete_namespaced_pod("init-only", "default", grace_period_seconds=0)


def test_the_components_hold_only_the_chart_s_permissions(system: System) -> None:
    agent = client.CoreV1Api(_client(system.agent_kubeconfig))
    with pytest.raises(ApiException) as error:
        agent.list_namespaced_pod("default")
    assert error.value.status == 403
    controller = client.CoreV1Api(_client(system.controller_kubeconfig))
    with pytest.raises(ApiException) as delete_error:
        controller.delete_node("a100-a")
    assert delete_error.value.status == 403
    custom = client.CustomObjectsApi(_client(system.agent_kubeconfig))
    with pytest.raises(ApiException) as policy_error:
        custom.create_cluster_custom_object(GROUP, VERSION, "partitionpolicies", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "PartitionPolicy",
            "metadata": {"name": "agent-may-not"}, "spec": {"mode": "dynamic"}})
    assert policy_error.value.status == 403


def test_an_agent_writes_only_its_own_node_s_partition(system: System) -> None:
    """The agent on a100-a (token bound to its pod there) is refused a100-b's status; a token
    bound to no pod is refused everything; its own node's status it may write."""
    own = client.CustomObjectsApi(_client(system.agent_kubeconfig_for("a100-a")))
    status = {"status": system.partition("a100-b").get("status", {})}
    with pytest.raises(ApiException) as error:
        own.patch_cluster_custom_object_status(GROUP, VERSION, "nodepartitions", "a100-b",
                                               status)
    assert error.value.status == 403
    assert "the agent on node a100-a may write only NodePartition a100-a" in error.value.body
    assert "tessera-agent-own-node" in error.value.body
    unbound = client.CustomObjectsApi(_client(system.agent_kubeconfig))
    with pytest.raises(ApiException) as unbound_error:
        unbound.patch_cluster_custom_object_status(GROUP, VERSION, "nodepartitions", "a100-a",
                                                   {"status": system.partition("a100-a")
                                                    .get("status", {})})
    assert unbound_error.value.status == 403
    own.patch_cluster_custom_object_status(GROUP, VERSION, "nodepartitions", "a100-a",
                                           {"status": system.partition("a100-a")["status"]})


def test_only_the_controller_may_lift_the_placement_gate(system: System) -> None:
    body = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "jumps-the-queue", "namespace": "default"},
            "spec": {"nodeSelector": {"tessera.dev/pool": "nowhere"},
                     "containers": [{"name": "main", "image": "registry.invalid/app:1",
                                     "resources": {"limits": {MIG_1G: "1"}}}]}}
    created = system.core.create_namespaced_pod("default", body)
    try:
        assert [g.name for g in created.spec.scheduling_gates] == ["tessera.dev/placement"]
        with pytest.raises(ApiException) as error:  # the cluster admin, even
            system.core.patch_namespaced_pod("jumps-the-queue", "default", [
                {"op": "remove", "path": "/spec/schedulingGates/0"}])
        assert error.value.status in (403, 422)
        assert "placement-gate-owner" in error.value.body
        assert "only Tessera's controller" in error.value.body
    finally:
        system.core.delete_namespaced_pod("jumps-the-queue", "default", grace_period_seconds=0)


def test_a_namespace_opted_out_of_the_gate_still_gets_its_slices_made(system: System) -> None:
    """The chart's documented opt-out (namespace label ``tessera.dev/placement=disabled``):
    its pods are not gated, so the scheduler places them and the controller only makes the
    slices; no Event claims the pod was pinned."""
    system.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(
        name="opted-out", labels={"tessera.dev/placement": "disabled"})))
    try:
        created = system.core.create_namespaced_pod(
            "opted-out", _pool_pod("own-scheduling", "nvidia.com/mig-4g.40gb", "opted-out"))
        assert not created.spec.scheduling_gates
        eventually(lambda: system.core.read_namespaced_pod("own-scheduling", "opted-out")
                   .status.phase == "Running", 90, "the pod Running on a slice made for it")
        # The controller planned it (the slice is one it made); whether it also saw the pod
        # still unbound once the slice showed, and said NotGated, is a race with the
        # scheduler. What it must never say is that it pinned the pod.
        events = eventually(lambda: "Placed" in (found := dict(_events(
            system, "opted-out", "own-scheduling"))) and found, 30, "the controller's Placed event")
        assert "Released" not in events, events
    finally:
        system.core.delete_namespace("opted-out", grace_period_seconds=0)


def _client(kubeconfig: Path) -> client.ApiClient:
    from kubernetes import config  # noqa: PLC0415

    return config.new_client_from_config(config_file=str(kubeconfig))


def _leader(system: System) -> str:
    lease = client.CoordinationV1Api(system.api).read_namespaced_lease(
        "tessera-controller", NAMESPACE)
    return str(lease.spec.holder_identity)


def test_when_the_leader_dies_the_other_replica_plans(system: System) -> None:
    leader = eventually(lambda: _leader(system) in ("c1", "c2") and _leader(system), 30,
                        "a leader")
    process = next(p for p in system.controllers if p.name == f"controller-{leader}")
    process.stop()
    system.controllers.remove(process)
    other = "c2" if leader == "c1" else "c1"
    eventually(lambda: _leader(system) == other, 40, f"{other} takes the lease")
    system.core.create_namespaced_pod("default",
                                      _pool_pod("after-failover", "nvidia.com/mig-2g.20gb"))
    eventually(lambda: system.core.read_namespaced_pod("after-failover", "default")
               .status.phase == "Running", 90, "the pod Running after the failover")
    system.start_controller(leader, "--batch-idle-seconds", "0.3", "--batch-max-seconds", "2")


def _set_gpu_spec(system: System, node: str, gpu: dict[str, Any]) -> None:
    """An admin edits one GPU of a NodePartition (the controller keeps entries it did not
    plan on a dynamic node)."""
    partition = system.partition(node)
    gpus = [g for g in partition["spec"].get("gpus", []) if g.get("index") != gpu["index"]]
    partition["spec"] = {**partition["spec"], "gpus": [*gpus, gpu],
                         "planId": f"admin-{time.time_ns()}"}
    system.custom.replace_cluster_custom_object(GROUP, VERSION, "nodepartitions", node,
                                                partition)


def _condition(system: System, node: str, kind: str) -> dict[str, Any]:
    return next(c for c in system.partition(node)["status"]["conditions"] if c["type"] == kind)


def test_a_cuda_job_outside_kubernetes_protects_its_slice(system: System) -> None:
    node = "a100-b"
    _set_gpu_spec(system, node, {"index": 1, "mode": "mig",
                                 "slices": [{"profile": "7g.80gb", "start": 0}]})
    slice_ = eventually(lambda: next((s for g in system.partition(node)["status"]["gpus"]
                                      if g["index"] == 1 for s in g.get("slices", [])
                                      if s.get("uuid")), None), 30, "the 7g slice made")
    with FileStore(system.states[node]).mutate() as working:
        operations.add_process(working, slice_["uuid"], pid=31337, used_mib=512)
    _set_gpu_spec(system, node, {"index": 1, "mode": "mig",
                                 "slices": [{"profile": "1g.10gb", "start": 0}]})
    blocked = eventually(lambda: _condition(system, node, "Blocked")["status"] == "True" and
                         _condition(system, node, "Blocked"), 30, "Blocked on the job")
    assert "1 CUDA process(es) outside Kubernetes" in blocked["message"]
    events = _events(system, "default", node)
    assert any(r == "Blocked" for r, _ in events), events
    with FileStore(system.states[node]).mutate() as working:
        operations.remove_process(working, slice_["uuid"], pid=31337)
    eventually(lambda: _condition(system, node, "Applied")["status"] == "True", 30,
               "applied once the job ended")


def test_status_reads_as_an_admin_expects(system: System) -> None:
    partition = system.partition("a100-a")
    conditions = {c["type"]: c for c in partition["status"]["conditions"]}
    assert set(conditions) == {"Applied", "Invalid", "Blocked", "ResetRequired", "Degraded"}
    assert partition["status"]["appliedPlanId"] == partition["spec"].get("planId")
    print(json.dumps(partition["status"]["conditions"], indent=1))


def test_a_static_policy_from_mig_parted_is_applied_and_kept(system: System) -> None:
    policy = policy_from_mig_parted({"version": "v1", "mig-configs": {"all-3g.40gb": [
        {"devices": "all", "mig-enabled": True, "mig-devices": {"3g.40gb": 2}}]}},
        None, name="static-3g", node_selector={"tessera.dev/pool": "static"}).policy
    system.custom.create_cluster_custom_object(GROUP, VERSION, "partitionpolicies",
                                               policy.to_wire())
    # Its agent finds the cards as on a GPU node: through libnvidia-ml.so.1 (the simulated one).
    node = system.add_gpu_node("a100-static", {"tessera.dev/pool": "static"},
                               ["A100-80GB", "A100-80GB"], nvml="library")

    def layout() -> list[set[tuple[str, int]]]:
        if not system.reported(node.name):
            return []
        status = system.partition(node.name).get("status", {})
        return [{(s["profile"], s["start"]) for s in g.get("slices", [])}
                for g in status.get("gpus", [])]

    wanted = [{("3g.40gb", 0), ("3g.40gb", 4)}] * 2
    eventually(lambda: layout() == wanted, 60, "the static layout applied on both GPUs")
    _set_gpu_spec(system, node.name, {"index": 0, "mode": "none"})
    eventually(lambda: system.partition(node.name)["spec"]["gpus"][0].get("mode") == "mig"
               and layout() == wanted, 60, "the controller restores the policy's layout")
    status = system.custom.get_cluster_custom_object(GROUP, VERSION, "partitionpolicies",
                                                     "static-3g")["status"]
    assert status["matchedNodes"] == ["a100-static"]
