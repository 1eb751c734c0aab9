"""Time-slicing on the agent: replicas of a whole GPU on the kubelet, as NVIDIA's plugin offers."""

from __future__ import annotations

import pytest

from tessera.api.v1alpha1 import GpuSpec, NodePartition, NodePartitionStatus, TimesliceSpec
from tessera.testing import Container, Pod

from .conftest import AgentNode, partition

SHARED = "nvidia.com/gpu.shared"


def _condition(status: NodePartitionStatus, kind: str) -> tuple[str, str]:
    found = next(c for c in status.conditions if c.type == kind)
    return found.status, found.message


def _sliced(replicas: int, rename: bool = True, generation: int = 1) -> NodePartition:
    return partition(GpuSpec(index=0, mode="timeslice", timeslice=TimesliceSpec(
        replicas=replicas, rename_by_default=rename)), generation=generation)


@pytest.mark.parametrize("agent_node", [["L4-24GB"]], indirect=True)
def test_an_l4_is_advertised_as_replicas_its_pods_take_turns_on(agent_node: AgentNode) -> None:
    result = agent_node.reconciler.reconcile(_sliced(4))
    assert _condition(result.status, "Applied")[0] == "True"
    observed = result.status.gpus[0]
    assert observed.mode == "timeslice"
    assert observed.timeslice is not None
    assert (observed.timeslice.replicas, observed.timeslice.resource) == (4, SHARED)
    agent_node.kubelet.wait_until(lambda k: k.allocatable().get(SHARED) == 4, timeout=10,
                                  what="four replicas")
    assert sorted(agent_node.kubelet.devices(SHARED)) == [
        f"{observed.uuid}::{n}" for n in range(4)]
    first = Pod("ml", "a", (Container("main", {SHARED: 1}),))
    second = Pod("ml", "b", (Container("main", {SHARED: 1}),))
    agent_node.kubelet.admit(first)
    agent_node.kubelet.admit(second)
    for pod in (first, second):
        envs = agent_node.kubelet.run_options(pod, "main").envs
        assert envs["NVIDIA_VISIBLE_DEVICES"] == observed.uuid, "the whole card, in turns"
        assert "CUDA_MPS_PIPE_DIRECTORY" not in envs
    back = agent_node.reconciler.reconcile(partition(GpuSpec(index=0, mode="none"),
                                                     generation=2))
    status, message = _condition(back.status, "Blocked")
    assert status == "True"
    assert "GPU 0 is time-sliced for ml/a, ml/b" in message
    agent_node.kubelet.remove_pod(first.uid)
    agent_node.kubelet.remove_pod(second.uid)
    done = agent_node.reconciler.reconcile(partition(GpuSpec(index=0, mode="none"),
                                                     generation=2))
    assert _condition(done.status, "Applied")[0] == "True"
    assert done.status.gpus[0].mode == "none"
    agent_node.kubelet.wait_until(
        lambda k: k.allocatable().get("nvidia.com/gpu") == 1 and not k.allocatable().get(SHARED),
        timeout=10, what="the whole L4 again")


@pytest.mark.parametrize("agent_node", [["T4-16GB"]], indirect=True)
def test_replicas_can_keep_nvidias_whole_gpu_name(agent_node: AgentNode) -> None:
    result = agent_node.reconciler.reconcile(_sliced(3, rename=False))
    assert _condition(result.status, "Applied")[0] == "True"
    agent_node.kubelet.wait_until(lambda k: k.allocatable().get("nvidia.com/gpu") == 3,
                                  timeout=10, what="three nvidia.com/gpu replicas")


def test_a_mig_card_is_taken_whole_before_it_is_time_sliced(agent_node: AgentNode) -> None:
    result = agent_node.reconciler.reconcile(_sliced(2))
    assert _condition(result.status, "Applied")[0] == "True"
    assert result.status.gpus[0].mig_mode is not None
    assert result.status.gpus[0].mig_mode.current is False
    assert result.status.gpus[0].mode == "timeslice"
