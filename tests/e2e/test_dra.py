"""DRA end to end: unchanged pods asking ``nvidia.com/mig-1g.10gb`` on a node whose agent is
its DRA driver, with the real scheduler choosing MIG placements and the real kubelet preparing
claims through the agent's kubelet plugin.

The chart is installed with ``dra.enabled=true`` (DeviceClasses with ``extendedResourceName``,
the agent's ResourceSlice rights and their node confinement); the controller runs with the DRA
node selector; one A100-80GB node is labelled for DRA.
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

import pytest
from kubernetes import client
from kubernetes import config as kube_config
from kubernetes.client.exceptions import ApiException

from tessera.core import catalogue, dra
from tessera.nvml.sim.store import load_state_file
from tessera.testing.cluster import Cluster
from tessera.testing.deployment import TesseraDeployment

from ._util import eventually, selector

NAMESPACE = "tessera"
DRA_LABELS = {"tessera.dev/api": "dra"}
NODE = "dra-a100"
OTHER = "dra-b100"
SHARED = "dra-l4"
MIG_1G = "nvidia.com/mig-1g.10gb"
APP = {"app": "dra-e2e"}
SELECTOR = selector(APP)


@pytest.fixture(scope="module")
def system(cluster: Cluster) -> Iterator[TesseraDeployment]:
    running = TesseraDeployment(cluster, NAMESPACE)
    running.install("dra.enabled=true")
    try:
        for name in (NODE, OTHER):
            running.add_gpu_node(name, DRA_LABELS, ["A100-80GB"], mig=True, api="dra")
        running.add_gpu_node(SHARED, DRA_LABELS, ["L4-24GB"], api="dra", mps=True)
        running.start_controller("c1", "--batch-idle-seconds", "0.3",
                                 "--dra-node-selector", "tessera.dev/api=dra")
        for name in (NODE, OTHER, SHARED):
            eventually(lambda n=name: _pool(running, n), 30, f"the ResourceSlices of {name}")
        yield running
    finally:
        running.uninstall()


def _pool(system: TesseraDeployment, node: str = NODE) -> list[dict[str, Any]]:
    raw = cast(dict[str, Any], system.custom.list_cluster_custom_object(
        "resource.k8s.io", "v1", "resourceslices", field_selector=f"spec.nodeName={node}"))
    items = raw.get("items", [])
    counts = {i["spec"]["pool"]["resourceSliceCount"] for i in items}
    return items if counts == {len(items)} and items else []


def _pod(name: str, resource: str = MIG_1G) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels=APP),
        spec=client.V1PodSpec(
            termination_grace_period_seconds=0,
            containers=[client.V1Container(
                name="cuda", image="registry.invalid/infer:1",
                resources=client.V1ResourceRequirements(limits={resource: "1"}))]))


def _slices(system: TesseraDeployment, nodes: tuple[str, ...] = (NODE, OTHER)
            ) -> set[tuple[str, int, str]]:
    """(profile, start, MIG uuid) of every slice on the nodes' simulated cards."""
    found = set()
    for node in nodes:
        for gpu in load_state_file(system.states[node]).gpus:
            model = catalogue.model(gpu.model)
            for gi in gpu.instances:
                profile = model.profile_by_id(gi.profile_id)
                assert profile is not None
                found |= {(profile.name, gi.start, ci.uuid) for ci in gi.compute_instances}
    return found


@contextmanager
def _scratch_pod(system: TesseraDeployment, name: str, resource: str) -> Iterator[None]:
    """A pod asking one ``resource``, deleted with every test pod (and their slices) after."""
    try:
        system.core.create_namespaced_pod("default", _pod(name, resource))
        yield
    finally:
        _delete_all(system)


def _delete_all(system: TesseraDeployment) -> None:
    system.core.delete_collection_namespaced_pod("default", label_selector=SELECTOR,
                                                 grace_period_seconds=0)
    eventually(lambda: not system.core.list_namespaced_pod(
        "default", label_selector=SELECTOR).items, 60, "the test's pods gone")
    # The kubelet unprepares a claim after its pod is gone from the API: the slice goes then.
    eventually(lambda: not _slices(system), 60, "every slice destroyed once its pod is gone")


def test_the_node_publishes_every_placement_with_the_catalogues_counters(
        system: TesseraDeployment) -> None:
    pool = _pool(system)
    devices = {d["name"]: d for s in pool for d in s["spec"].get("devices", [])}
    counters = [c for s in pool for c in s["spec"].get("sharedCounters", [])]
    assert len(devices) == 25
    assert [c["name"] for c in counters] == ["gpu-0"]
    assert counters[0]["counters"]["compute-slices"] == {"value": "7"}
    assert devices["gpu-0-7g80gb-at-0"]["consumesCounters"][0]["counterSet"] == "gpu-0"
    classes = client.CustomObjectsApi(system.api).get_cluster_custom_object(
        "resource.k8s.io", "v1", "deviceclasses", dra.device_class_name("1g.10gb"))
    assert classes["spec"]["extendedResourceName"] == MIG_1G
    partition = system.partition(NODE)
    assert partition["status"]["api"] == "dra"
    versions = {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in pool}
    time.sleep(3)  # three agent resyncs
    assert {s["metadata"]["name"]: s["metadata"]["resourceVersion"]
            for s in _pool(system)} == versions, "at rest the pool is not rewritten"


def test_curation_packs_one_pod_after_another_onto_the_split_gpu(
        system: TesseraDeployment) -> None:
    """The scheduler alone would put each pod on either node (no score tells them apart);
    once a slice exists, the controller taints the idle node's placements, so pods that come
    one after another fill the split GPU first."""
    names = [f"seq-{i}-{uuid.uuid4().hex[:5]}" for i in range(4)]
    try:
        for name in names:
            system.core.create_namespaced_pod("default", _pod(name))
            eventually(lambda n=name: system.core.read_namespaced_pod(n, "default").status.phase
                       == "Running", 60, f"{name} Running")
            # the next pod comes once the controller saw this slice and curated
            eventually(lambda: any(d.get("taints") for node in (NODE, OTHER)
                                   for s in _pool(system, node)
                                   for d in s["spec"].get("devices", [])), 30, "curation")
        nodes = {system.core.read_namespaced_pod(n, "default").spec.node_name for n in names}
        assert len(nodes) == 1, f"all on one node, not spread: {nodes}"
        (idle,) = {NODE, OTHER} - nodes
        tainted = {d["name"] for s in _pool(system, idle) for d in s["spec"].get("devices", [])
                   if any(t["key"] == dra.TAINT_CURATED for t in d.get("taints", []))}
        assert "gpu-0-1g10gb-at-6" in tainted
        assert "gpu-0-7g80gb-at-0" not in tainted, "a 7g fits only there: it stays offered"
    finally:
        _delete_all(system)


def test_unchanged_pods_get_slices_the_scheduler_placed_and_the_fifteenth_waits(
        system: TesseraDeployment) -> None:
    """Seven 1g slices fit an A100-80GB, fourteen the two nodes; the scheduler chooses the
    placements itself, and each pod's slice is made as it starts."""
    names = [f"infer-{i}-{uuid.uuid4().hex[:5]}" for i in range(15)]
    created: dict[str, float] = {}
    try:
        for name in names:
            system.core.create_namespaced_pod("default", _pod(name))
            created[name] = time.monotonic()
        running: dict[str, float] = {}

        def all_that_fit_running() -> bool:
            for name in names:
                if name in running:
                    continue
                pod = system.core.read_namespaced_pod(name, "default")
                if pod.status.phase == "Running":
                    running[name] = time.monotonic()
            return len(running) == 14

        eventually(all_that_fit_running, 90, "fourteen pods Running")
        (waiting,) = [n for n in names if n not in running]
        pod = system.core.read_namespaced_pod(waiting, "default")
        assert pod.status.phase == "Pending"
        assert not pod.spec.scheduling_gates, "handed to the scheduler, not held at the gate"
        assert pod.spec.node_selector == DRA_LABELS

        for node in (NODE, OTHER):
            slices = _slices(system, (node,))
            assert sorted(s for p, s, _u in slices if p == "1g.10gb") == list(range(7))
        slices = _slices(system)
        ids = {f"gpu.tessera.dev/mig={u}" for _p, _s, u in slices}
        given = [c for node in (NODE, OTHER) for c in system.nodes[node].created_containers()
                 if c["pod"] in running and c["container"] == "cuda"]
        assert sorted(i for c in given for i in c["cdiDevices"]) == sorted(ids), \
            "each container got the CDI id of its own new MIG device"
        waits = sorted(running[n] - created[n] for n in running)
        print(f"create -> Running through DRA: p50 {statistics.median(waits):.2f} s, "
              f"max {waits[-1]:.2f} s (14 pods, each a new slice)")
    finally:
        _delete_all(system)


def test_a_pod_reusing_freed_capacity_gets_a_7g_after_small_pods_leave(
        system: TesseraDeployment) -> None:
    name = f"train-{uuid.uuid4().hex[:5]}"
    with _scratch_pod(system, name, "nvidia.com/mig-7g.80gb"):
        eventually(lambda: system.core.read_namespaced_pod(name, "default").status.phase
                   == "Running", 60, f"{name} Running")
        assert {(p, s) for p, s, _u in _slices(system)} == {("7g.80gb", 0)}


def test_a_profile_the_model_lacks_never_matches_and_the_pod_says_why(
        system: TesseraDeployment) -> None:
    name = f"h100-only-{uuid.uuid4().hex[:5]}"
    with _scratch_pod(system, name, "nvidia.com/mig-1g.12gb"):

        def told() -> str | None:
            events = system.core.list_namespaced_event(
                "default", field_selector=f"involvedObject.name={name}").items
            found = [e.message for e in events if e.reason == "NoDraMatch"]
            return found[0] if found else None

        message = eventually(told, 30, f"an event on {name}")
        assert message == ("no DRA node offers nvidia.com/mig-1g.12gb: their GPUs (A100-80GB) "
                           "have no such MIG profile; only device-plugin nodes can take this pod")
        assert not _slices(system)


def test_the_agent_may_not_publish_slices_for_another_node(system: TesseraDeployment) -> None:
    api = kube_config.new_client_from_config(str(system.agent_kubeconfig_for(NODE)))
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": "forged"},
            "spec": {"driver": dra.DRIVER, "nodeName": "some-other-node",
                     "pool": {"name": "some-other-node", "generation": 1,
                              "resourceSliceCount": 1}, "devices": []}}
    with pytest.raises(ApiException) as refused:
        client.CustomObjectsApi(api).create_cluster_custom_object(
            "resource.k8s.io", "v1", "resourceslices", body)
    assert refused.value.status == 403
    assert "agent-own-slices" in str(refused.value.body)


def _phase(system: TesseraDeployment, name: str) -> str:
    return str(system.core.read_namespaced_pod(name, "default").status.phase)


def _pods_state(system: TesseraDeployment, names: list[str]) -> list[dict[str, Any]]:
    """Each pod's phase, gates, node and scheduling condition, and their Events: what a
    timed-out wait shows, so a failure in CI says where the pods stopped."""
    found = []
    for name in names:
        pod = system.core.read_namespaced_pod(name, "default")
        events = system.core.list_namespaced_event(
            "default", field_selector=f"involvedObject.name={name}").items
        found.append({
            "pod": name, "phase": pod.status.phase, "node": pod.spec.node_name,
            "gates": [g.name for g in pod.spec.scheduling_gates or []],
            "conditions": [(c.type, c.status, c.reason, c.message)
                           for c in pod.status.conditions or []],
            "events": [(e.reason, e.message) for e in events]})
    return found


def test_agent_crash_and_kubelet_restart_converge_with_no_slice_leaked(
        system: TesseraDeployment) -> None:
    """The agent is SIGKILLed with a claim prepared, a pod arrives while it is down (the
    kubelet retries its prepare), then the kubelet restarts: everything ends Running on the
    slices it was given, and deleting the pods destroys exactly those slices."""
    first, second = (f"{what}-{uuid.uuid4().hex[:5]}" for what in ("before", "during"))
    node = system.nodes[NODE]
    try:
        system.core.create_namespaced_pod("default", _pod(first, "nvidia.com/mig-3g.40gb"))
        eventually(lambda: _phase(system, first) == "Running", 60, f"{first} Running")
        system.restart_agent(NODE)  # SIGKILL; the new agent reads the checkpoint
        system.core.create_namespaced_pod("default", _pod(second, "nvidia.com/mig-4g.40gb"))
        eventually(lambda: _phase(system, second) == "Running", 90, f"{second} Running")
        node.restart_kubelet()
        eventually(lambda: _phase(system, first) == _phase(system, second) == "Running", 60,
                   "both Running after the kubelet restart")
        on_cards = sorted(p for p, _s, _u in _slices(system))
        assert on_cards == ["3g.40gb", "4g.40gb"], "one slice per pod, nothing else"
    finally:
        _delete_all(system)  # waits until every slice is destroyed: none leaked


def test_a_dra_native_claim_by_memory_gets_the_first_slice_that_big(
        system: TesseraDeployment) -> None:
    """The README's ResourceClaimTemplate: any Tessera MIG slice with at least 20 GB (10^9
    bytes: a 1g.20gb has 19968 MiB)."""
    # At rest (no slices), curation taints nothing: the first fit is the published order's.
    # "At rest" is held for a while: as the last test's slices go one by one, the controller
    # curates each step it sees (an A100 left with one slice taints the idle one's smaller
    # placements) and the pools follow a moment later, so one untainted look proves nothing.
    untainted_since = [time.monotonic()]

    def settled() -> bool:
        if any(d.get("taints") for node in (NODE, OTHER) for s in _pool(system, node)
               for d in s["spec"].get("devices", [])):
            untainted_since[0] = time.monotonic()
        return time.monotonic() - untainted_since[0] > 3
    eventually(settled, 30, "no taints at rest for 3 s")
    resource = client.CustomObjectsApi(system.api)
    template = {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "mig-20g", "namespace": "default"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": f"mig.{dra.DRIVER}",
            "selectors": [{"cel": {"expression": (
                f'device.capacity["{dra.DRIVER}"].memory.compareTo(quantity("20G")) >= 0')}}],
        }}]}}},
    }
    resource.create_namespaced_custom_object("resource.k8s.io", "v1", "default",
                                             "resourceclaimtemplates", template)
    name = f"native-{uuid.uuid4().hex[:5]}"
    body = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": APP},
            "spec": {"terminationGracePeriodSeconds": 0,
                     "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "mig-20g"}],
                     "containers": [{"name": "cuda", "image": "registry.invalid/infer:1",
                                     "resources": {"claims": [{"name": "gpu"}]}}]}}
    try:
        system.core.create_namespaced_pod("default", body)
        eventually(lambda: _phase(system, name) == "Running", 60, f"{name} Running")
        (made,) = _slices(system)
        assert made[:2] == ("1g.20gb", 6), "the first placement in published order that fits"
    finally:
        _delete_all(system)
        resource.delete_namespaced_custom_object("resource.k8s.io", "v1", "default",
                                                 "resourceclaimtemplates", "mig-20g")



def test_mps_shares_of_a_gpu_without_mig_through_consumable_capacity(
        system: TesseraDeployment) -> None:
    """An L4 offered as 4 MPS shares: unchanged pods asking ``nvidia.com/gpu.shared`` share it
    (the scheduler allocates the one device four times), the fifth waits, and each container
    gets the daemon's pipe and its share's limits."""
    names = [f"shared-{i}-{uuid.uuid4().hex[:5]}" for i in range(5)]
    try:
        for name in names:
            system.core.create_namespaced_pod("default", _pod(name, "nvidia.com/gpu.shared"))
        eventually(lambda: sum(_phase(system, n) == "Running" for n in names) == 4, 90,
                   "four shares Running", describe=lambda: _pods_state(system, names))
        time.sleep(2)
        assert sum(_phase(system, n) == "Running" for n in names) == 4, "the fifth waits"
        given = [c for c in system.nodes[SHARED].created_containers()
                 if c["pod"] in names and c["container"] == "cuda"]
        assert len(given) == 4
        ids = {i for c in given for i in c["cdiDevices"]}
        assert len(ids) == 4, "one CDI device per share"
        assert all(i.startswith("gpu.tessera.dev/mps=GPU-") for i in ids)
        status = system.partition(SHARED)["status"]["gpus"][0]
        assert status["mode"] == "mps"
        assert status["mps"]["daemon"] == "Running"
    finally:
        _delete_all(system)
    eventually(lambda: system.partition(SHARED)["status"]["gpus"][0]["mps"]["daemon"]
               == "Stopped", 60, "the daemon stopped after the last share")


def test_a_share_pod_the_scheduler_turns_down_with_shares_free_is_sent_back_to_it(
        system: TesseraDeployment) -> None:
    """The controller touches the shares' DeviceClass (its RBAC allows that one class) when a
    share pod handed to the scheduler waits Unschedulable while the L4 has shares free. Here
    the pod asks more CPU than any node has, so it stays down: the touch is made, once, then
    less often (the unit tests pin the intervals)."""
    name = f"cpu-bound-{uuid.uuid4().hex[:5]}"
    body = _pod(name, "nvidia.com/gpu.shared")
    body.spec.containers[0].resources.requests = {"cpu": "1000"}
    classes = client.CustomObjectsApi(system.api)

    def touched() -> str | None:
        found = classes.get_cluster_custom_object(
            "resource.k8s.io", "v1", "deviceclasses", dra.MPS_DEVICE_CLASS)
        return cast(str | None, found["metadata"].get("annotations", {}).get(
            dra.REQUEUED_ANNOTATION))
    before = touched()
    try:
        system.core.create_namespaced_pod("default", body)
        eventually(lambda: touched() != before, 60, "the DeviceClass touched",
                   describe=lambda: _pods_state(system, [name]))
        assert _phase(system, name) == "Pending"
    finally:
        _delete_all(system)
