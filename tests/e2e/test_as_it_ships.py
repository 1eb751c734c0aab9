"""Tessera as a platform team installs it: the chart, with the image built from
``daemonset/Dockerfile`` (``make image``), on a node whose kubelet runs containerd and runc
(``make containerd``), so the chart's own pods run in real containers.

What no other e2e module covers: the image's entry point and Python environment, the
DaemonSet's hostPath mounts (device-plugin and pod-resources sockets, the simulated GPU's
state), in-cluster configuration from a projected ServiceAccount token, the probes as the
kubelet runs them, and what a GPU workload's own container receives. Only the GPU is
simulated: the agent in its container drives the NVML simulator's state file on the node.
"""

from __future__ import annotations

import contextlib
import json
import os
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
from tessera.nvml.sim.state import new_node_state
from tessera.nvml.sim.store import write_new_state_file
from tessera.testing.cluster import Cluster, Node, free_ports
from tessera.testing.cluster._containerd import ContainerdBinaries, Images
from tessera.testing.deployment import CHART
from tests.e2e._util import eventually, selector

NAMESPACE = "tessera-shipped"
NODE = "real-gpu-1"
RUNTIME_LABEL = {"tessera.dev/runtime": "containerd"}
SIM_STATE = "/var/lib/tessera-sim/node.json"
"""Where the chart's agent finds the simulated GPU, on the node."""
POLICY = "shipped-dynamic"
APP = {"app": "as-it-ships"}


def _required() -> tuple[ContainerdBinaries, Images]:
    try:
        return ContainerdBinaries.locate(), Images.locate()
    except FileNotFoundError as missing:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI=true and the real runtime is missing: {missing}", pytrace=False)
        pytest.skip(str(missing))


def _helm(cluster: Cluster, *args: str) -> str:
    done = subprocess.run([cluster.binaries["helm"], "--kubeconfig", str(cluster.kubeconfig),
                           *args], capture_output=True, text=True, timeout=300, check=False)
    if done.returncode:
        raise AssertionError(f"helm {' '.join(args)}: {done.stdout}{done.stderr}")
    return done.stdout


class Shipped:
    """The chart installed with the built image on one containerd node."""

    def __init__(self, cluster: Cluster, node: Node, images: Images) -> None:
        self.cluster = cluster
        self.node = node
        self.images = images
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
        node = self.cluster.get_node(NODE) or {}
        return {"pods": seen, "allocatable": node.get("status", {}).get("allocatable")}

    def container_log(self, namespace: str, pod: str, container: str) -> str:
        """A container's output, read where the kubelet keeps it on the node (the API server
        would ask the kubelet at the node's address, which is not on loopback)."""
        found = sorted(self.node.root.glob(f"pod-logs/{namespace}_{pod}_*/{container}/*.log"))
        return "".join(line.split(" ", 3)[-1] for f in found
                       for line in f.read_text().splitlines(keepends=True))


@pytest.fixture(scope="module")
def shipped(cluster: Cluster) -> Iterator[Shipped]:
    _, images = _required()
    node = cluster.add_node(NODE, runtime="containerd",
                            labels={**RUNTIME_LABEL, "nvidia.com/gpu.present": "true"})
    state = node.containers.host_path(SIM_STATE) if node.containers else None
    assert state is not None
    write_new_state_file(state, new_node_state(NODE, ["A100-SXM4-80GB"], mig=True))
    repository, tag = images.image.rsplit(":", 1)
    agent_port, controller_port = free_ports(2)
    running = Shipped(cluster, node, images)
    try:
        _helm(cluster, "install", "tessera", str(CHART), "--namespace", NAMESPACE,
              "--create-namespace", "--wait", "--timeout", "240s",
              "--set", f"image.repository={repository}", "--set", f"image.tag={tag}",
              "--set", "image.pullPolicy=Never",
              "--set", "apiServer.host=127.0.0.1",
              "--set-string", f"apiServer.port={cluster.ports()['apiserver']}",
              "--set", f"agent.nvml=sim:{SIM_STATE}",
              "--set", "agent.nodeSelector.tessera\\.dev/runtime=containerd",
              "--set", f"agent.metricsPort={agent_port}", "--set", "agent.resyncSeconds=1",
              "--set", "controller.replicas=1", "--set", "controller.hostNetwork=true",
              "--set", f"controller.metricsPort={controller_port}")
        running.custom.create_cluster_custom_object(GROUP, VERSION, "partitionpolicies", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "PartitionPolicy",
            "metadata": {"name": POLICY},
            "spec": {"nodeSelector": {"matchLabels": RUNTIME_LABEL}, "mode": "dynamic"}})
        yield running
    finally:
        for pod in running.core.list_namespaced_pod("default", label_selector=selector(APP)
                                                    ).items:
            running.core.delete_namespaced_pod(pod.metadata.name, "default",
                                               grace_period_seconds=0)
        with contextlib.suppress(ApiException):
            running.custom.delete_cluster_custom_object(GROUP, VERSION, "partitionpolicies",
                                                        POLICY)
        subprocess.run([cluster.binaries["helm"], "--kubeconfig", str(cluster.kubeconfig),
                        "uninstall", "tessera", "-n", NAMESPACE, "--wait", "--timeout",
                        "60s"], capture_output=True, timeout=120, check=False)
        cluster.remove_node(NODE)
        with contextlib.suppress(ApiException):
            running.custom.delete_cluster_custom_object(GROUP, VERSION, "nodepartitions", NODE)


def test_the_agent_runs_from_its_image_and_is_ready_through_its_probes(
        shipped: Shipped) -> None:
    """helm --wait returned, so the DaemonSet is rolled out: its pod is Ready by the kubelet's
    own readiness probe, in a container of the image built from the Dockerfile."""
    (agent,) = [p for p in shipped.pods("agent") if p.spec.node_name == NODE]
    assert agent.status.phase == "Running", shipped.describe()
    (status,) = agent.status.container_statuses
    assert status.ready, shipped.describe()
    assert status.container_id.startswith("containerd://")
    assert status.image_id.endswith(shipped.images.image_id), (status.image_id,
                                                                shipped.images.image_id)
    assert agent.spec.host_network
    log = shipped.container_log(NAMESPACE, agent.metadata.name, "agent")
    assert "Traceback" not in log, log
    # The agent reported the simulated card through the API server it reached on loopback,
    # with the token the kubelet projected into its container.
    eventually(lambda: shipped.custom.get_cluster_custom_object(
        GROUP, VERSION, "nodepartitions", NODE).get("status", {}).get("gpus"), 60,
        f"the agent's report on NodePartition {NODE}", describe=shipped.describe)


def test_the_controller_runs_in_its_pod_as_non_root(shipped: Shipped) -> None:
    (controller,) = shipped.pods("controller")
    assert controller.status.phase == "Running", shipped.describe()
    assert all(c.ready for c in controller.status.container_statuses)
    (status,) = controller.status.container_statuses
    task = status.container_id.removeprefix("containerd://")
    assert shipped.node.containers is not None
    listed = shipped.node.containers.ctr("tasks", "ls")
    pid = next(line.split()[1] for line in listed.splitlines() if line.startswith(task))
    uids = next(line.split()[1:] for line in Path(f"/proc/{pid}/status").read_text()
                .splitlines() if line.startswith("Uid:"))
    assert set(uids) == {"65532"}, f"the controller's process runs as {uids}"


def test_a_mig_pod_runs_in_a_real_container_and_sees_the_slice_the_kubelet_gave_it(
        shipped: Shipped) -> None:
    """The whole path as a user meets it: the pod is gated at admission, the controller (in
    its pod) plans a slice, the agent (in its pod) makes it through NVML and advertises it,
    the scheduler binds the released pod, and the kubelet's Allocate answer reaches the
    container's environment: the very MIG device PodResources lists for it."""
    name = "mig-workload"
    shipped.core.create_namespaced_pod("default", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": APP},
        "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                 "nodeSelector": RUNTIME_LABEL,
                 "containers": [{
                     "name": "cuda", "image": shipped.images.image,
                     "imagePullPolicy": "Never",
                     "command": ["/bin/sh", "-c", "env; ip -o addr 2>/dev/null; sleep 600"],
                     "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}}]}})
    began = time.monotonic()
    pod = eventually(
        lambda: (p := shipped.core.read_namespaced_pod(name, "default")).status.phase
        == "Running" and p, 180, f"pod {name} Running", describe=shipped.describe)
    assert pod.spec.node_name == NODE
    with PodResourcesClient(shipped.node.pod_resources_socket) as pod_resources:
        listed = pod_resources.get("default", name)
    ids = [i for c in listed.containers for d in c.devices for i in d.device_ids]
    assert len(ids) == 1, listed
    assert ids[0].startswith("MIG-")
    env = eventually(lambda: dict(line.split("=", 1) for line in shipped.container_log(
        "default", name, "cuda").splitlines() if "=" in line), 30, "the container's output")
    assert env.get("NVIDIA_VISIBLE_DEVICES") == ids[0], env
    state = json.loads(shipped.node.containers.host_path(SIM_STATE).read_text()) \
        if shipped.node.containers else {}
    on_card = [ci["uuid"] for g in state["gpus"] for gi in g["instances"]
               for ci in gi["compute_instances"]]
    assert ids[0] in on_card, (ids[0], on_card)
    # The workload has its own network namespace, not the node's.
    assert not pod.spec.host_network
    assert (pod.status.pod_ip or "").startswith("198.18."), pod.status.pod_ip
    print(f"create to Running: {time.monotonic() - began:.1f} s")
