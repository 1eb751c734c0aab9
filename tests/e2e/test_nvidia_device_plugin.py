"""NVIDIA's ``k8s-device-plugin`` (v0.17.4, MIG strategy ``mixed``, built from its module by
``make nvidia-tools``) and Tessera's agent, one after the other on the same simulated node and
its real kubelet.

The plugin finds the node's cards through go-nvlib and the simulated ``libnvidia-ml.so.1`` as it
would through a driver, so what it advertises is NVIDIA's reading of the simulated cards. Tessera
must advertise exactly the same resources and counts, under the same device ids (the MIG UUIDs
and the GPU's UUID), and a pod's container must be told the same device either way.
"""

from __future__ import annotations

import contextlib
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from tessera.core import catalogue
from tessera.kubelet.podresources import PodResourcesClient
from tessera.nvml.sim import operations
from tessera.nvml.sim.server import NvmlServer
from tessera.nvml.sim.state import new_node_state
from tessera.nvml.sim.store import FileStore, load_state_file, write_new_state_file
from tessera.testing import nvml_library, short_socket_dir
from tessera.testing.cluster import Cluster, Node
from tessera.testing.cluster.fixtures import require_nvidia_tools, require_nvml_library
from tessera.testing.nvidia_host import NvidiaHost
from tests._nvml_calls import documented
from tests.e2e._util import eventually

LAYOUT = {"version": "v1", "mig-configs": {"node": [
    {"devices": [0], "mig-enabled": True,
     "mig-devices": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}},
    {"devices": [1], "mig-enabled": False},
]}}
"""GPU 0, an A100-80GB, cut as the default config's ``all-balanced``; GPU 1, an H100, whole."""

EXPECTED = {"nvidia.com/mig-1g.10gb": 2, "nvidia.com/mig-2g.20gb": 1,
            "nvidia.com/mig-3g.40gb": 1, "nvidia.com/gpu": 1}


XID = 48
"""A double-bit ECC error: critical for both plugins (neither ignores it by default)."""
TESSERA_AFTER_XID = {"nvidia.com/gpu": 1}
NVIDIA_AFTER_XID = {"nvidia.com/mig-1g.10gb": 1, "nvidia.com/gpu": 1}


@dataclass(frozen=True)
class Allocation:
    """What one pod's container got: the device ids the kubelet recorded (PodResources) and
    what the plugin's ``Allocate`` answer told the runtime (``CreateContainer``)."""

    device_ids: tuple[str, ...]
    envs: dict[str, str]
    mounts: list[Any]
    devices: list[Any]
    cdi_devices: list[Any]
    annotations: dict[str, str]


@dataclass(frozen=True)
class Advertised:
    allocatable: dict[str, int]
    device_ids: dict[str, set[str]]
    """Per resource, the ids the kubelet holds as allocatable (PodResources
    ``GetAllocatableResources``)."""
    allocations: dict[str, Allocation]
    """Per resource, a pod asking one of it."""


def _nvidia_allocatable(cluster: Cluster, node: Node) -> dict[str, int]:
    status = (cluster.get_node(node.name) or {}).get("status", {})
    return {name: int(value) for name, value in status.get("allocatable", {}).items()
            if name.startswith("nvidia.com/") and int(value)}


def _pod(core: client.CoreV1Api, node: Node, resource: str) -> str:
    name = f"{resource.split('/')[1].replace('.', '-')}-{uuid.uuid4().hex[:6]}"
    core.create_namespaced_pod("default", client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(
            termination_grace_period_seconds=0, node_name=node.name,
            containers=[client.V1Container(
                name="cuda", image="registry.k8s.io/pause:3.10",
                resources=client.V1ResourceRequirements(limits={resource: "1"}))])))
    return name


def _advertised(cluster: Cluster, node: Node, core: client.CoreV1Api) -> Advertised:
    """Wait until the node offers :data:`EXPECTED`, then run a pod per resource and read what
    each got; the pods are gone again on return."""
    eventually(lambda: _nvidia_allocatable(cluster, node) == EXPECTED, 60,
               f"allocatable {EXPECTED}")
    with PodResourcesClient(node.pod_resources_socket) as pod_resources:
        device_ids: dict[str, set[str]] = {}
        for entry in pod_resources.allocatable():
            device_ids.setdefault(entry.resource_name, set()).update(entry.device_ids)
        pods = {resource: _pod(core, node, resource) for resource in EXPECTED}
        allocations = {}
        try:
            for resource, name in pods.items():
                eventually(lambda n=name: core.read_namespaced_pod(n, "default").status.phase
                           == "Running", 60, f"pod {name} Running")
                listed = pod_resources.get("default", name)
                ids = tuple(sorted(i for c in listed.containers for d in c.devices
                                   for i in d.device_ids))
                (created,) = [c for c in node.created_containers() if c["pod"] == name]
                allocations[resource] = Allocation(
                    ids, created.get("envs") or {}, created.get("mounts") or [],
                    created.get("devices") or [], created.get("cdiDevices") or [],
                    created.get("annotations") or {})
        finally:
            for name in pods.values():
                core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
            eventually(lambda: not [p for p in core.list_namespaced_pod("default").items
                                    if p.metadata.name in pods.values()], 60, "pods gone")
    return Advertised(_nvidia_allocatable(cluster, node), device_ids, allocations)


def _after_xid(cluster: Cluster, node: Node, state: Path, expected: dict[str, int]
               ) -> dict[str, int]:
    """Post Xid :data:`XID` on GPU 0 (an event on the card, no instance named) and return
    what the node offers once it settles at ``expected`` (or, after 30 s, whatever it offers
    then, for the assertion to show)."""
    store = FileStore(state)
    with store.mutate() as working:
        operations.inject_xid(working, working.gpus[0].uuid, XID)
    with contextlib.suppress(AssertionError):
        eventually(lambda: _nvidia_allocatable(cluster, node) == expected, 30,
                   f"allocatable {expected} after Xid {XID}")
    return _nvidia_allocatable(cluster, node)


@contextlib.contextmanager
def _nvidia_device_plugin(host: NvidiaHost, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    plugin = host.device_plugin(log)
    try:
        yield plugin
    finally:
        plugin.terminate()
        plugin.wait(timeout=30)


@pytest.fixture
def node(cluster: Cluster) -> Iterator[Node]:
    added = cluster.add_node("nvidia-dp-node")
    yield added
    cluster.remove_node(added.name)


@pytest.fixture
def core(cluster: Cluster) -> Iterator[client.CoreV1Api]:
    api = cluster.api_client()
    yield client.CoreV1Api(api)
    api.close()


def test_nvidia_s_plugin_and_tessera_s_advertise_and_hand_out_the_same_devices(
        cluster: Cluster, node: Node, core: client.CoreV1Api, tmp_path: Path) -> None:
    library = require_nvml_library()
    mig_parted = require_nvidia_tools() / "nvidia-mig-parted"
    state = tmp_path / "node.json"
    write_new_state_file(state, new_node_state(node.name, ["A100-80GB", "H100-80GB"]))
    config = tmp_path / "layout.yaml"
    config.write_text(yaml.safe_dump(LAYOUT))
    with short_socket_dir() as sockets, NvmlServer(state, sockets / "nvml.sock") as server:
        host = NvidiaHost(tmp_path / "host", load_state_file(state), library,
                          sockets / "nvml.sock", kubelet_device_plugins=node.device_plugin_dir)
        applied = host.run([str(mig_parted), "apply", "-f", str(config), "-c", "node"],
                           env={"MIG_PARTED_SKIP_RESET": "true"})
        assert applied.returncode == 0, applied.stderr
        cards = load_state_file(state).gpus
        assert not cards[1].mig_pending, "mig-parted took GPU 1 out of MIG mode"

        mig_parted_calls = set().union(*server.calls_by_client.values())
        with _nvidia_device_plugin(host, node.logs / "nvidia-device-plugin.log") as plugin:
            nvidia = _advertised(cluster, node, core)
            nvidia_after_xid = _after_xid(cluster, node, state, NVIDIA_AFTER_XID)
        plugin_calls = server.calls_by_client[plugin.pid]
        eventually(lambda: not _nvidia_allocatable(cluster, node), 60,
                   "NVIDIA's plugin gone, its devices no longer allocatable")
        with nvml_library.agent_runtime(sockets / "nvml.sock", node.device_plugin_dir,
                                        node.pod_resources_socket):
            tessera = _advertised(cluster, node, core)
            tessera_after_xid = _after_xid(cluster, node, state, TESSERA_AFTER_XID)

    truth: dict[str, set[str]] = {"nvidia.com/gpu": {cards[1].uuid}}
    for instance in cards[0].instances:
        profile = catalogue.model("A100-80GB").profile_by_id(instance.profile_id)
        assert profile is not None
        for compute in instance.compute_instances:
            truth.setdefault(profile.resource_name, set()).add(compute.uuid)

    assert plugin_calls == documented("device-plugin"), "the README's table says which"
    assert "nvmlDeviceSetMigMode" in mig_parted_calls <= documented("mig-parted")
    assert nvidia.allocatable == tessera.allocatable == EXPECTED
    assert {r: nvidia.device_ids.get(r) for r in EXPECTED} == truth, "NVIDIA reads the cards"
    assert {r: tessera.device_ids.get(r) for r in EXPECTED} == truth
    for resource in EXPECTED:
        answers = [nvidia.allocations[resource], tessera.allocations[resource]]
        for answer in answers:
            (device,) = answer.device_ids
            assert device in truth[resource]
            assert answer.envs.get("NVIDIA_VISIBLE_DEVICES") == device
        assert _plugin_part(answers[0]) == _plugin_part(answers[1]), resource
    # A critical Xid on GPU 0 (the A100): Tessera withdraws every slice of that card; NVIDIA's
    # plugin withdraws one device per resource of it, and so keeps offering a 1g.10gb of a
    # failed card (internal/rm/health.go keys its event map by the parent GPU's UUID,
    # ``parentToDeviceMap[uuid] = d``, so each GPU's last device of a resource is the only one
    # an event on the GPU reaches). A finding about NVIDIA's plugin v0.17.4, pinned here.
    assert tessera_after_xid == TESSERA_AFTER_XID
    assert nvidia_after_xid == NVIDIA_AFTER_XID


def _plugin_part(allocation: Allocation) -> dict[str, Any]:
    """What a device plugin's ``Allocate`` added to the container, with the device named
    generically (the kubelet may pick another 1g slice the second time): envs, device nodes,
    CDI devices and annotations that are not the kubelet's own, and mounts outside its pod
    folder."""
    (device,) = allocation.device_ids

    def named(text: str) -> str:
        return text.replace(device, "<device>")

    return {
        "envs": {k: named(v) for k, v in allocation.envs.items()
                 if not k.startswith("KUBERNETES_")},
        "devices": allocation.devices,
        "cdi": [named(str(d)) for d in allocation.cdi_devices],
        "annotations": {k: named(v) for k, v in allocation.annotations.items()
                        if not k.startswith("io.kubernetes.")},
        "mounts": [m for m in allocation.mounts if "/pods/" not in str(m)],
    }
