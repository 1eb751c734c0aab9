"""Tessera as a platform team installs it: the chart, with the image built from
``daemonset/Dockerfile`` (``make image``), on a node whose kubelet runs containerd and runc
(``make containerd``), so the chart's own pods run in real containers.

What no other e2e module covers: the image's entry point and Python environment, the
DaemonSet's hostPath mounts (device-plugin and pod-resources sockets, the simulated GPU's
state), in-cluster configuration from a projected ServiceAccount token, the probes as the
kubelet runs them, and what a GPU workload's own container receives. Only the GPU is
simulated, behind the driver's own door: the agent in its container runs with ``--nvml=real``
and loads ``libnvidia-ml.so.1`` where the NVIDIA container toolkit mounts it, which is the
simulated library (``make nvml-lib``) talking to each node's simulator over a socket.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tessera.api.v1alpha1 import GROUP, VERSION
from tessera.kubelet.podresources import PodResourcesClient
from tessera.nvml.sim.server import NvmlServer
from tessera.nvml.sim.state import new_node_state
from tessera.nvml.sim.store import write_new_state_file
from tessera.testing.cluster import Cluster, Node, free_ports
from tessera.testing.cluster._containerd import Images
from tessera.testing.cluster.fixtures import require_nvml_library, require_real_runtime
from tessera.testing.deployment import CHART
from tests.e2e._util import eventually, selector

NAMESPACE = "tessera-shipped"
NODES = ("real-gpu-1", "real-gpu-2")
"""Device-plugin nodes (the chart's agent DaemonSet)."""
NODE = NODES[0]
DRA_NODE = "real-dra-1"
"""A DRA node (the chart's agent-dra DaemonSet, dra.enabled)."""
POOL = {"tessera.dev/pool": "shipped-device-plugin"}
DRA_LABELS = {"tessera.dev/api": "dra"}
L4_NODE = "real-l4-1"
"""An L4 (no MIG) the controller shares by MPS."""
L4_POOL = {"tessera.dev/pool": "shipped-l4"}
MPS_STANDIN = "/var/lib/tessera-sim/bin/nvidia-cuda-mps-control"
"""The stand-in MPS control program, on each node where the agent's container sees it (the
simulated GPU's folder): the image's own Python runs tessera.testing.mps_control."""
RUNTIME_LABEL = {"tessera.dev/runtime": "containerd"}
SIM_STATE = "/var/lib/tessera-sim/node.json"
"""The simulated GPU's state, on the node (the simulator serving it runs in the test)."""
DRIVER_LIB = "/var/lib/tessera-sim/driver/libnvidia-ml.so.1"
"""The simulated driver library on each node, which the chart mounts into the agent."""
SIM_SOCKET = "/var/lib/tessera-sim/nvml.sock"
"""Where the library finds the node's simulator (its built-in default)."""
POLICY = "shipped-dynamic"
L4_POLICY = "shipped-l4-mps"
APP = {"app": "as-it-ships"}


def _helm(cluster: Cluster, *args: str) -> str:
    done = subprocess.run([cluster.binaries["helm"], "--kubeconfig", str(cluster.kubeconfig),
                           *args], capture_output=True, text=True, timeout=300, check=False)
    if done.returncode:
        raise AssertionError(f"helm {' '.join(args)}: {done.stdout}{done.stderr}")
    return done.stdout


class Shipped:
    """The chart installed with the built image on three containerd nodes, two with device
    plugins and one with DRA (each node with its own network namespace, so all run
    host-network pods on the same ports)."""

    def __init__(self, cluster: Cluster, nodes: dict[str, Node], images: Images) -> None:
        self.cluster = cluster
        self.nodes = nodes
        self.images = images
        self.drivers: dict[str, NvmlServer] = {}
        """Each node's simulated driver: what answers its libnvidia-ml.so.1."""
        self.core = cluster.core_v1()
        self.custom = client.CustomObjectsApi(cluster.api_client())

    def pods(self, component: str) -> list[client.V1Pod]:
        return list(self.core.list_namespaced_pod(
            NAMESPACE, label_selector=f"app.kubernetes.io/component={component}").items)

    def describe(self) -> dict[str, Any]:
        """What a failure shows: Tessera's pods and their states, the node's allocatable."""
        seen = {p.metadata.name: (p.status.phase, [(c.name, c.ready, c.state.to_dict())
                                                   for c in p.status.container_statuses or []])
                for p in self.core.list_namespaced_pod(NAMESPACE).items}
        allocatable = {n: (self.cluster.get_node(n) or {}).get("status", {}).get("allocatable")
                       for n in self.nodes}
        return {"pods": seen, "allocatable": allocatable}

    def container_log(self, namespace: str, pod: str, container: str) -> str:
        """A container's output, read where the kubelet keeps it on its node (the API server
        would ask the kubelet at the node's address, inside the node's own network)."""
        found = sorted(f for node in self.nodes.values()
                       for f in node.root.glob(f"pod-logs/{namespace}_{pod}_*/{container}/*.log"))
        return "".join(line.split(" ", 3)[-1] for f in found
                       for line in f.read_text().splitlines(keepends=True))


@pytest.fixture(scope="module")
def shipped(cluster: Cluster) -> Iterator[Shipped]:
    _, images = require_real_runtime()
    library = require_nvml_library()
    nodes: dict[str, Node] = {}
    running = Shipped(cluster, nodes, images)
    try:
        for name in (*NODES, DRA_NODE, L4_NODE):
            pool = {DRA_NODE: DRA_LABELS, L4_NODE: L4_POOL}.get(name, POOL)
            nodes[name] = cluster.add_node(name, runtime="containerd", labels={
                **RUNTIME_LABEL, **pool, "nvidia.com/gpu.present": "true"})
            runtime = nodes[name].containers
            assert runtime is not None
            card = "L4-24GB" if name == L4_NODE else "A100-SXM4-80GB"
            write_new_state_file(runtime.host_path(SIM_STATE),
                                 new_node_state(name, [card], mig=name != L4_NODE))
            driver = runtime.host_path(DRIVER_LIB)
            driver.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(library, driver)
            running.drivers[name] = NvmlServer(runtime.host_path(SIM_STATE),
                                               runtime.host_path(SIM_SOCKET))
            standin = runtime.host_path(MPS_STANDIN)
            standin.parent.mkdir(parents=True, exist_ok=True)
            standin.write_text("#!/bin/sh\nexec /opt/tessera/bin/python "
                               "/opt/tessera/lib/python3*/site-packages/tessera/testing/"
                               'mps_control.py "$@"\n')
            standin.chmod(0o755)
        yield from _installed(cluster, running)
    finally:
        for name in nodes:
            cluster.remove_node(name)
            if name in running.drivers:
                running.drivers[name].close()
            with contextlib.suppress(ApiException):
                running.custom.delete_cluster_custom_object(GROUP, VERSION, "nodepartitions",
                                                            name)


def _installed(cluster: Cluster, running: Shipped) -> Iterator[Shipped]:
    images = running.images
    repository, tag = images.image.rsplit(":", 1)
    agent_port, controller_port = free_ports(2)
    try:
        _helm(cluster, "install", "tessera", str(CHART), "--namespace", NAMESPACE,
              "--create-namespace", "--wait", "--timeout", "240s",
              "--set", f"image.repository={repository}", "--set", f"image.tag={tag}",
              "--set", "image.pullPolicy=Never",
              "--set", "apiServer.host=127.0.0.1",
              "--set-string", f"apiServer.port={cluster.ports()['apiserver']}",
              "--set", f"agent.simulatedDriver.library={DRIVER_LIB}",
              "--set", "agent.nodeSelector.tessera\\.dev/runtime=containerd",
              "--set", f"agent.metricsPort={agent_port}", "--set", "agent.resyncSeconds=1",
              # A hung agent is restarted within seconds, not the default minute and a half.
              "--set", "agent.livenessProbe.periodSeconds=2",
              "--set", "agent.livenessProbe.failureThreshold=2",
              "--set", "agent.livenessProbe.terminationGracePeriodSeconds=2",
              "--set", "controller.replicas=2", "--set", "controller.hostNetwork=true",
              "--set", f"controller.metricsPort={controller_port}",
              "--set", "dra.enabled=true", "--set", f"agent.mpsControl={MPS_STANDIN}")
        running.custom.create_cluster_custom_object(GROUP, VERSION, "partitionpolicies", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "PartitionPolicy",
            "metadata": {"name": POLICY},
            "spec": {"nodeSelector": {"matchLabels": POOL}, "mode": "dynamic"}})
        running.custom.create_cluster_custom_object(GROUP, VERSION, "partitionpolicies", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "PartitionPolicy",
            "metadata": {"name": L4_POLICY},
            "spec": {"nodeSelector": {"matchLabels": L4_POOL}, "mode": "dynamic",
                     "allowedModes": ["mps"],
                     "mps": {"shares": 4, "threadPercentage": 25, "memoryMiB": 5000}}})
        yield running
    finally:
        for pod in running.core.list_namespaced_pod("default", label_selector=selector(APP)
                                                    ).items:
            running.core.delete_namespaced_pod(pod.metadata.name, "default",
                                               grace_period_seconds=0)
        for policy in (POLICY, L4_POLICY):
            with contextlib.suppress(ApiException):
                running.custom.delete_cluster_custom_object(GROUP, VERSION, "partitionpolicies",
                                                            policy)
        subprocess.run([cluster.binaries["helm"], "--kubeconfig", str(cluster.kubeconfig),
                        "uninstall", "tessera", "-n", NAMESPACE, "--wait", "--timeout",
                        "60s"], capture_output=True, timeout=120, check=False)


def test_the_agent_runs_from_its_image_and_is_ready_through_its_probes(
        shipped: Shipped) -> None:
    """helm --wait returned, so the DaemonSet is rolled out: its pod is Ready by the kubelet's
    own readiness probe, in a container of the image built from the Dockerfile."""
    agents = {p.spec.node_name: p for p in shipped.pods("agent")}
    assert set(agents) == {*NODES, L4_NODE}, shipped.describe()
    dra_agents = {p.spec.node_name: p for p in shipped.pods("agent-dra")}
    assert set(dra_agents) == {DRA_NODE}, shipped.describe()
    agents.update(dra_agents)
    for node, agent in agents.items():
        assert agent.status.phase == "Running", shipped.describe()
        (status,) = agent.status.container_statuses
        assert status.ready, shipped.describe()
        assert status.container_id.startswith("containerd://")
        assert status.image_id.endswith(shipped.images.image_id), (status.image_id,
                                                                    shipped.images.image_id)
        assert agent.spec.host_network
        log = shipped.container_log(NAMESPACE, agent.metadata.name, "agent")
        assert log, "the agent's own output, where the kubelet keeps it"
        assert "Traceback" not in log, log
        # The agent reported the simulated card through the API server it reached on
        # loopback, with the token the kubelet projected into its container.
        eventually(lambda node=node: shipped.custom.get_cluster_custom_object(
            GROUP, VERSION, "nodepartitions", node).get("status", {}).get("gpus"), 60,
            f"the agent's report on NodePartition {node}", describe=shipped.describe)


def test_the_agent_loads_the_driver_library_as_on_a_gpu_node(shipped: Shipped) -> None:
    """No simulator flag: the agent's pynvml dlopens libnvidia-ml.so.1 from the path the
    NVIDIA container toolkit mounts it at, and every NVML call it makes crosses into the
    node's simulator through that library."""
    for agent in [*shipped.pods("agent"), *shipped.pods("agent-dra")]:
        (container,) = agent.spec.containers
        assert "--nvml=real" in container.args
        assert not [a for a in container.args if "sim:" in a]
        node = agent.spec.node_name
        (status,) = agent.status.container_statuses
        maps = Path(f"/proc/{_pid(shipped, status.container_id, node)}/maps").read_text()
        assert "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1" in maps, node
        calls = set().union(*shipped.drivers[node].calls_by_client.values())
        assert {"nvmlInitWithFlags", "nvmlDeviceGetHandleByIndex_v2"} <= calls, calls


def _pid(shipped: Shipped, container_id: str, node: str = NODE) -> int:
    """The host pid of a container's first process (its node's containerd task list)."""
    task = container_id.removeprefix("containerd://")
    runtime = shipped.nodes[node].containers
    assert runtime is not None
    listed = runtime.ctr("tasks", "ls")
    return int(next(line.split()[1] for line in listed.splitlines() if line.startswith(task)))


def test_the_controller_runs_in_its_pods_as_non_root(shipped: Shipped) -> None:
    controllers = shipped.pods("controller")
    assert len(controllers) == 2, shipped.describe()
    assert len({c.spec.node_name for c in controllers}) == 2, "one per node (its port)"
    for controller in controllers:
        assert controller.status.phase == "Running", shipped.describe()
        (status,) = controller.status.container_statuses
        assert status.ready, shipped.describe()
        pid = _pid(shipped, status.container_id, controller.spec.node_name)
        uids = next(line.split()[1:] for line in Path(f"/proc/{pid}/status").read_text()
                    .splitlines() if line.startswith("Uid:"))
        assert set(uids) == {"65532"}, f"the controller's process runs as {uids}"


def _create_mig_pod(shipped: Shipped, name: str, pool: dict[str, str],
                    resource: str = "nvidia.com/mig-1g.10gb") -> client.V1Pod:
    """A pod asking one ``resource`` that prints its environment and what its MPS pipe
    directory holds (when it has one), on ``pool``'s nodes, once Running."""
    shipped.core.create_namespaced_pod("default", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": APP},
        "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                 "nodeSelector": pool,
                 "containers": [{
                     "name": "cuda", "image": shipped.images.image,
                     "imagePullPolicy": "Never",
                     "command": ["/bin/sh", "-c", 'env; ls "${CUDA_MPS_PIPE_DIRECTORY:-/none}"'
                                 "; sleep 600"],
                     "resources": {"limits": {resource: "1"}}}]}})
    return eventually(
        lambda: (p := shipped.core.read_namespaced_pod(name, "default")).status.phase
        == "Running" and p, 180, f"pod {name} Running", describe=shipped.describe)


def _run_mig_pod(shipped: Shipped, name: str) -> tuple[client.V1Pod, str]:
    """:func:`_create_mig_pod` on a device-plugin node, and the MIG device id PodResources
    lists for it."""
    pod = _create_mig_pod(shipped, name, POOL)
    with PodResourcesClient(shipped.nodes[pod.spec.node_name].pod_resources_socket
                            ) as pod_resources:
        listed = pod_resources.get("default", name)
    ids = [i for c in listed.containers for d in c.devices for i in d.device_ids]
    assert len(ids) == 1, listed
    return pod, ids[0]


def _environment(shipped: Shipped, pod: str) -> dict[str, str]:
    """What the pod's container printed of its environment."""
    return eventually(lambda: dict(line.split("=", 1) for line in shipped.container_log(
        "default", pod, "cuda").splitlines() if "=" in line), 30, "the container's output")


def _slices_on_the_card(shipped: Shipped, node: str) -> list[str]:
    runtime = shipped.nodes[node].containers
    assert runtime is not None
    state = json.loads(runtime.host_path(SIM_STATE).read_text())
    return [ci["uuid"] for g in state["gpus"] for gi in g["instances"]
            for ci in gi["compute_instances"]]


def test_a_mig_pod_runs_in_a_real_container_and_sees_the_slice_the_kubelet_gave_it(
        shipped: Shipped) -> None:
    """The whole path as a user meets it: the pod is gated at admission, the controller (in
    its pod) plans a slice, the agent (in its pod) makes it through NVML and advertises it,
    the scheduler binds the released pod, and the kubelet's Allocate answer reaches the
    container's environment: the very MIG device PodResources lists for it."""
    name = "mig-workload"
    began = time.monotonic()
    pod, device = _run_mig_pod(shipped, name)
    assert pod.spec.node_name in NODES
    ids = [device]
    assert ids[0].startswith("MIG-")
    env = _environment(shipped, name)
    assert env.get("NVIDIA_VISIBLE_DEVICES") == ids[0], env
    on_card = _slices_on_the_card(shipped, pod.spec.node_name)
    assert ids[0] in on_card, (ids[0], on_card)
    # The workload has its own network namespace, not the node's.
    assert not pod.spec.host_network
    assert (pod.status.pod_ip or "").startswith("198.18."), pod.status.pod_ip
    print(f"create to Running: {time.monotonic() - began:.1f} s")


def test_a_frozen_agent_is_restarted_by_its_liveness_probe_and_its_slices_survive(
        shipped: Shipped) -> None:
    """SIGSTOP: the agent is alive but answers nothing, as a hung one does. The kubelet's
    liveness probe (2 s x 2 here, set by the chart's agent.livenessProbe) restarts it; the
    new agent adopts the card as it is, and the slice a running pod holds stays."""
    pod, device = _run_mig_pod(shipped, "held-through-restart")
    node = pod.spec.node_name
    (agent,) = [p for p in shipped.pods("agent") if p.spec.node_name == node]
    (status,) = agent.status.container_statuses
    pid = _pid(shipped, status.container_id, node)
    os.kill(pid, signal.SIGSTOP)
    try:
        def restarted_and_ready() -> bool:
            (now,) = [p for p in shipped.pods("agent") if p.spec.node_name == node]
            (current,) = now.status.container_statuses
            return current.restart_count > status.restart_count and bool(current.ready)

        eventually(restarted_and_ready, 90, "the frozen agent restarted and Ready again",
                   describe=shipped.describe)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    assert device in _slices_on_the_card(shipped, node), "the slice in use survived"
    held = shipped.core.read_namespaced_pod(pod.metadata.name, "default")
    assert held.status.phase == "Running"
    with PodResourcesClient(shipped.nodes[node].pod_resources_socket) as pod_resources:
        listed = pod_resources.get("default", pod.metadata.name)
    assert [i for c in listed.containers for d in c.devices for i in d.device_ids] == [device]


def test_deleting_the_leader_s_pod_hands_over_the_lead_and_a_waiting_pod_is_placed(
        shipped: Shipped) -> None:
    """Two controller replicas, one Lease: the leader's pod is deleted while a GPU pod
    waits; the other replica takes the Lease and places it."""
    coordination = client.CoordinationV1Api(shipped.cluster.api_client())

    def holder() -> str:
        lease = coordination.read_namespaced_lease("tessera-controller", NAMESPACE)
        return str(lease.spec.holder_identity or "")

    leader = eventually(holder, 60, "a controller holds the Lease", describe=shipped.describe)
    replicas = {p.metadata.name for p in shipped.pods("controller")}
    assert leader in replicas, (leader, replicas)
    shipped.core.delete_namespaced_pod(leader, NAMESPACE)
    pod, device = _run_mig_pod(shipped, "placed-by-the-next-leader")
    assert device.startswith("MIG-")
    new = holder()
    assert new != leader, "the deleted replica does not hold the Lease"
    assert new in {p.metadata.name for p in shipped.pods("controller")}
    assert pod.status.phase == "Running"


def test_a_dra_pod_runs_in_a_real_container_with_the_cdi_injected_environment(
        shipped: Shipped) -> None:
    """The same unchanged pod on the DRA node: the scheduler allocates a MIG placement from
    the ResourceSlices the agent-dra pod publishes, the kubelet prepares the claim through the
    kubelet plugin the agent registered from inside its container, and containerd injects
    the CDI spec the agent wrote on the node: the container sees the MIG device made for it."""
    pod = _create_mig_pod(shipped, "dra-workload", {**RUNTIME_LABEL, **DRA_LABELS})
    assert pod.spec.node_name == DRA_NODE
    registry = shipped.nodes[DRA_NODE].kubelet_root_dir / "plugins_registry"
    assert [p.name for p in registry.iterdir() if p.name.startswith("gpu.tessera.dev")], (
        "the agent's kubelet plugin registration socket")
    env = _environment(shipped, pod.metadata.name)
    device = env.get("NVIDIA_VISIBLE_DEVICES", "")
    assert device.startswith("MIG-"), env
    assert device in _slices_on_the_card(shipped, DRA_NODE), "made on the node's card"


def test_an_mps_share_pod_sees_its_pipe_directory_and_its_limits(shipped: Shipped) -> None:
    """On the L4, the controller turns the idle card into 4 MPS shares; the agent in its
    container runs the (stand-in) MPS control daemon, whose pipe directory on the node the
    kubelet mounts into the share pod's container, with its limits in the environment."""
    pod = _create_mig_pod(shipped, "mps-share", {**RUNTIME_LABEL, **L4_POOL},
                          "nvidia.com/gpu.shared")
    assert pod.spec.node_name == L4_NODE
    output = eventually(lambda: (text := shipped.container_log("default", "mps-share", "cuda"))
                        and "CUDA_MPS_PIPE_DIRECTORY" in text and text, 30, "its output")
    env = dict(line.split("=", 1) for line in output.splitlines() if "=" in line)
    (gpu,) = shipped.custom.get_cluster_custom_object(
        GROUP, VERSION, "nodepartitions", L4_NODE)["status"]["gpus"]
    assert gpu["mode"] == "mps"
    assert env["NVIDIA_VISIBLE_DEVICES"] == gpu["uuid"]
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == gpu["mps"]["pipeDirectory"]
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"].endswith("=5000M")
    listed = {line.strip() for line in output.splitlines() if "=" not in line}
    assert "control" in listed, f"the daemon's pipe, mounted into the container: {listed}"
