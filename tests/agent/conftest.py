"""An agent's node for tests: a simulated node state file, the kubelet stand-in for the device
plugins and PodResources, and a started :class:`NodeRuntime` between them."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tessera.agent.node import NodeRuntime, RuntimeSettings
from tessera.agent.reconciler import Reconciler
from tessera.api.v1alpha1 import GpuSpec, NodePartition, NodePartitionSpec, ObjectMeta, SliceSpec
from tessera.core.layout import parse_slice
from tessera.kubelet.plugins import PluginSettings
from tessera.nvml import sim
from tessera.nvml.backend import PynvmlBackend, open_backend
from tessera.nvml.sim.state import new_node_state
from tessera.nvml.sim.store import FileStore, write_new_state_file
from tessera.testing import KubeletStandIn, short_socket_dir


@dataclass
class AgentNode:
    state_file: Path
    store: FileStore
    backend: PynvmlBackend
    kubelet: KubeletStandIn
    runtime: NodeRuntime
    reconciler: Reconciler

    def layout(self, index: int) -> set[str]:
        return {f"{i.profile}@{i.start}" for i in self.backend.gpu_instances(index)}


def partition(*gpus: GpuSpec, generation: int = 1, plan_id: str = "plan-1") -> NodePartition:
    return NodePartition(metadata=ObjectMeta(name="node-a", generation=generation),
                         spec=NodePartitionSpec(gpus=list(gpus), plan_id=plan_id))


def mig(index: int, *slices: str) -> GpuSpec:
    return GpuSpec(index=index, mode="mig", slices=[
        SliceSpec(profile=parse_slice(s).profile, start=parse_slice(s).start) for s in slices])


@pytest.fixture
def agent_node(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[AgentNode]:
    """Two A100-80GB and an H100, MIG off; ``indirect`` parametrisation names other cards."""
    cards = getattr(request, "param", ["A100-80GB", "A100-80GB", "H100-80GB"])
    state_file = tmp_path / "node.json"
    write_new_state_file(state_file, new_node_state("node-a", list(cards), mig=False))
    with short_socket_dir() as root:
        kubelet = KubeletStandIn(root / "device-plugins")
        kubelet.start()
        backend = open_backend(f"sim:{state_file}")
        runtime = NodeRuntime(backend, RuntimeSettings(
            plugins=PluginSettings(plugin_dir=str(root / "device-plugins")),
            pod_resources_socket=str(kubelet.pod_resources_socket), xid_poll_s=0.05))
        runtime.start()
        try:
            yield AgentNode(state_file, FileStore(state_file), backend, kubelet, runtime,
                            Reconciler(runtime))
        finally:
            runtime.stop()
            backend.close()
            sim.uninstall()
            kubelet.stop()
