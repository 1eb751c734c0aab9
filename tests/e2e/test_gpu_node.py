"""A simulated GPU node: a real kubelet on the fake runtime, with Tessera's own device plugin
servers (``tessera.kubelet.plugins``) registered on its real ``kubelet.sock``.

The tests run in file order and share the session's node; each leaves it with no pods and no
plugins registered.
"""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from kubernetes import client

from tessera.agent.allocations import KubeletAllocations
from tessera.kubelet.errors import PodResourcesError
from tessera.kubelet.inventory import Inventory, PluginDevice
from tessera.kubelet.plugins import PluginManager, PluginSettings
from tessera.kubelet.podresources import PodResourcesClient
from tessera.testing.cluster import KUBERNETES_VERSION, Cluster, Node, _cluster
from tests.e2e._util import eventually

RESOURCE = "nvidia.com/mig-1g.10gb"
GPU_UUID = "GPU-5e3f2c1a-0000-4000-8000-000000000001"
MIG_UUIDS = tuple(f"MIG-5e3f2c1a-0000-4000-8000-00000000010{i}" for i in range(3))


def _inventory() -> Inventory:
    return Inventory({RESOURCE: [PluginDevice.mig(u, GPU_UUID, 0) for u in MIG_UUIDS]})


def _plugins(node: Node, inventory: Inventory) -> PluginManager:
    return PluginManager(inventory, PluginSettings(plugin_dir=str(node.device_plugin_dir)))


def _allocatable(cluster: Cluster, node: Node) -> int:
    status = (cluster.get_node(node.name) or {}).get("status", {})
    return int(status.get("allocatable", {}).get(RESOURCE, "0"))


def _capacity(cluster: Cluster, node: Node) -> int:
    status = (cluster.get_node(node.name) or {}).get("status", {})
    return int(status.get("capacity", {}).get(RESOURCE, "0"))


@pytest.fixture
def core(cluster: Cluster) -> Iterator[client.CoreV1Api]:
    api = cluster.api_client()
    yield client.CoreV1Api(api)
    api.close()


def _create_cuda_pod(core: client.CoreV1Api, prefix: str, count: int) -> str:
    """A pod whose container "cuda" asks ``count`` of the plugin's devices; its name."""
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    core.create_namespaced_pod("default", client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(
            termination_grace_period_seconds=0,
            containers=[client.V1Container(
                name="cuda", image="registry.k8s.io/pause:3.10",
                resources=client.V1ResourceRequirements(limits={RESOURCE: str(count)}))])))
    return name


def _delete_pod(core: client.CoreV1Api, name: str) -> None:
    """Delete the pod at once and wait until it is gone (the next test starts with none)."""
    core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
    eventually(lambda: not [p for p in core.list_namespaced_pod("default").items
                            if p.metadata.name == name], 30, f"pod {name} gone")


def test_node_registers_ready_untainted_on_the_pinned_kubelet(
        cluster: Cluster, gpu_node: Node) -> None:
    node = cluster.get_node(gpu_node.name)
    assert node is not None
    ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"]
    assert ready == "True"
    assert not [t for t in node["spec"].get("taints") or []
                if t["key"] == "node.kubernetes.io/not-ready"]
    assert node["status"]["nodeInfo"]["kubeletVersion"] == KUBERNETES_VERSION
    assert node["metadata"]["labels"]["tessera.dev/test-node"] == "true"
    assert gpu_node.ready_in_s is not None
    assert gpu_node.ready_in_s < 30
    assert gpu_node.kubelet_socket.is_socket()
    assert gpu_node.pod_resources_socket.is_socket()


def test_plugin_devices_are_scheduled_allocated_and_listed(
        cluster: Cluster, gpu_node: Node, core: client.CoreV1Api) -> None:
    inventory = _inventory()
    with _plugins(gpu_node, inventory) as plugins:
        assert plugins.wait_until_registered(timeout=10)
        eventually(lambda: _allocatable(cluster, gpu_node) == 3, 20,
                   f"allocatable {RESOURCE} = 3")

        name = _create_cuda_pod(core, "two-slices", 2)
        try:
            pod = eventually(
                lambda: (p := core.read_namespaced_pod(name, "default")).status.phase
                == "Running" and p, 60, f"pod {name} Running")
            assert pod.spec.node_name == gpu_node.name  # bound by kube-scheduler

            with PodResourcesClient(gpu_node.pod_resources_socket) as pod_resources:
                listed = pod_resources.get("default", name)
            (container,) = listed.containers
            assert container.name == "cuda"
            # The kubelet may split one resource's devices over several entries (per NUMA
            # node); what counts is the ids.
            assert {d.resource_name for d in container.devices} == {RESOURCE}
            ids = sorted(i for d in container.devices for i in d.device_ids)
            assert len(ids) == 2
            assert set(ids) <= set(MIG_UUIDS)

            # What Allocate answered reached the runtime's CreateContainer unchanged.
            (created,) = [c for c in gpu_node.created_containers()
                          if c["pod"] == name and c["container"] == "cuda"]
            visible = created["envs"]["NVIDIA_VISIBLE_DEVICES"].split(",")
            assert sorted(visible) == ids
        finally:
            _delete_pod(core, name)


def test_a_restarting_kubelet_s_empty_pod_list_is_not_taken_for_free_devices(
        cluster: Cluster, gpu_node: Node, core: client.CoreV1Api) -> None:
    """The real kubelet answers PodResources ``List`` before its sync loop has added its pods
    (an empty list, for about a second here): the agent's reader says "unknown" then, never
    "free", while a pod holds its devices throughout (tessera.agent.allocations)."""
    inventory = _inventory()
    with _plugins(gpu_node, inventory) as plugins:
        assert plugins.wait_until_registered(timeout=10)
        eventually(lambda: _allocatable(cluster, gpu_node) == 3, 20,
                   f"allocatable {RESOURCE} = 3")
        name = _create_cuda_pod(core, "holds", 1)
        try:
            eventually(lambda: core.read_namespaced_pod(name, "default").status.phase
                       == "Running", 60, f"pod {name} Running")
            socket_path = str(gpu_node.pod_resources_socket)
            with PodResourcesClient(socket_path, timeout=2.0) as pod_resources:
                reader = KubeletAllocations(pod_resources, socket_path)
                held = {d for d, pods in (reader.read() or {}).items()
                        if f"default/{name}" in pods}
                assert len(held) == 1
                answers: list[dict[str, tuple[str, ...]] | None] = []
                raw_empty = threading.Event()
                stop = threading.Event()

                def poll() -> None:
                    with PodResourcesClient(socket_path, timeout=1.0) as raw:
                        while not stop.is_set():
                            answers.append(reader.read())
                            try:
                                if not raw.list():
                                    raw_empty.set()
                            except PodResourcesError:
                                pass
                            time.sleep(0.02)

                poller = threading.Thread(target=poll, daemon=True)
                poller.start()
                try:
                    gpu_node.restart_kubelet()
                    eventually(lambda: answers and answers[-1] is not None
                               and held <= answers[-1].keys(), 30,
                               "the pod's devices listed again after the restart")
                finally:
                    stop.set()
                    poller.join(timeout=10)
            known = [a for a in answers if a is not None]
            assert known, "the reader trusted the kubelet again"
            assert all(held <= a.keys() for a in known), \
                "no answer the reader trusted showed the held devices free"
            print(f"{len(answers)} reads through the restart: {len(answers) - len(known)} "
                  f"unknown; the raw List {'did' if raw_empty.is_set() else 'did not'} "
                  "answer an empty pod list meanwhile")
        finally:
            _delete_pod(core, name)


def test_kubelet_restart_drops_capacity_until_the_plugin_registers_again(
        cluster: Cluster, gpu_node: Node) -> None:
    inventory = _inventory()
    with _plugins(gpu_node, inventory) as plugins:
        assert plugins.wait_until_registered(timeout=10)
        eventually(lambda: _capacity(cluster, gpu_node) == 3, 20, f"capacity {RESOURCE} = 3")
        socket_path = plugins.socket_path(RESOURCE)
    # The plugin is gone (as if its agent were down) while the kubelet restarts.
    gpu_node.restart_kubelet()
    eventually(lambda: _capacity(cluster, gpu_node) == 0, 20, f"capacity {RESOURCE} = 0")
    assert not _allocatable(cluster, gpu_node)

    with _plugins(gpu_node, inventory) as plugins:
        assert plugins.wait_until_registered(timeout=10)
        eventually(lambda: _allocatable(cluster, gpu_node) == 3, 20,
                   f"allocatable {RESOURCE} = 3 again")
        # A restart while the plugin runs: the new kubelet deletes the plugin's socket, the
        # manager notices and registers again, and the capacity comes back by itself.
        before = plugins.status()[RESOURCE].registrations
        gpu_node.restart_kubelet()
        eventually(lambda: plugins.status()[RESOURCE].registrations > before, 20,
                   "a second registration")
        assert (gpu_node.device_plugin_dir / socket_path.rsplit("/", 1)[1]).is_socket()
        eventually(lambda: _allocatable(cluster, gpu_node) == 3, 20,
                   f"allocatable {RESOURCE} = 3 after a restart with the plugin running")


def test_a_kubelet_port_taken_meanwhile_is_retried_with_another(
        cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ports are chosen free but bound later; a concurrent cluster may take one in between."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        real = _cluster.free_ports
        first = [[port]]
        monkeypatch.setattr(_cluster, "free_ports",
                            lambda count: first.pop() if first else real(count))
        node = cluster.add_node("port-clash")
        try:
            assert node.kubelet_port != port
            assert (node.logs / "kubelet.1.log").exists()
            assert node.kubelet is not None
            assert node.kubelet.alive()
        finally:
            cluster.remove_node(node.name)
    eventually(lambda: cluster.get_node("port-clash") is None, 20, "the Node object deleted")
