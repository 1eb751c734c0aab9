"""The agent on a simulated node with the kubelet stand-in: apply, protect pods, report."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tessera.agent.reconciler import Reconciler
from tessera.api.v1alpha1 import GpuSpec, NodePartitionStatus
from tessera.nvml.sim import operations
from tessera.nvml.sim.state import SimFault, new_node_state
from tessera.nvml.sim.store import FileStore, load_state_file, write_new_state_file
from tessera.testing import Container, Pod

from .conftest import AgentNode, mig, partition

MIG_1G = "nvidia.com/mig-1g.10gb"


def condition(status: NodePartitionStatus, kind: str) -> tuple[str, str, str]:
    found = next(c for c in status.conditions if c.type == kind)
    return found.status, found.reason, found.message


def test_a_spec_is_applied_and_advertised_without_restarting_anything(
    agent_node: AgentNode,
) -> None:
    spec = partition(mig(0, "3g.40gb@4", "1g.10gb@0", "1g.10gb@1", "2g.20gb@2"),
                     mig(1, "7g.80gb@0"), GpuSpec(index=2, mode="none"))
    result = agent_node.reconciler.reconcile(spec)
    assert condition(result.status, "Applied")[:2] == ("True", "Applied")
    assert result.status.applied_plan_id == "plan-1"
    assert agent_node.layout(0) == {"3g.40gb@4", "1g.10gb@0", "1g.10gb@1", "2g.20gb@2"}
    assert agent_node.layout(1) == {"7g.80gb@0"}
    agent_node.kubelet.wait_until(lambda k: k.allocatable() == {
        MIG_1G: 2, "nvidia.com/mig-2g.20gb": 1, "nvidia.com/mig-3g.40gb": 1,
        "nvidia.com/mig-7g.80gb": 1, "nvidia.com/gpu": 1}, timeout=10)
    observed = result.status.gpus[0]
    assert observed.mode == "mig"
    assert {s.uuid for s in observed.slices} == set(agent_node.kubelet.devices(MIG_1G)) | {
        s.uuid for s in observed.slices if s.profile != "1g.10gb"}
    again = agent_node.reconciler.reconcile(spec)
    assert again.done == []  # idempotent: a second apply changes nothing


def _two_1g_one_held(agent_node: AgentNode) -> tuple[Pod, str]:
    """GPU 0 cut into two 1g.10gb slices, one admitted to pod ml/infer-0: the pod and its
    slice (``profile@start``)."""
    agent_node.reconciler.reconcile(partition(mig(0, "1g.10gb@0", "1g.10gb@1")))
    agent_node.kubelet.wait_until(lambda k: k.allocatable().get(MIG_1G) == 2, timeout=10)
    pod = Pod("ml", "infer-0", (Container("main", {MIG_1G: 1}),))
    held = agent_node.kubelet.admit(pod)["main"][MIG_1G][0]
    held_slice = next(f"{i.profile}@{i.start}" for i in agent_node.backend.gpu_instances(0)
                      if i.uuid == held)
    return pod, held_slice


def test_a_slice_held_by_a_pod_survives_a_repartition_that_wants_its_space(
    agent_node: AgentNode,
) -> None:
    pod, held_slice = _two_1g_one_held(agent_node)

    result = agent_node.reconciler.reconcile(
        partition(mig(0, "7g.80gb@0"), generation=2, plan_id="plan-2"))
    assert agent_node.layout(0) == {held_slice}, "the free 1g slice went, the held one stayed"
    status, reason, message = condition(result.status, "Blocked")
    assert (status, reason) == ("True", "InUse")
    assert "in use by pod ml/infer-0" in message
    assert condition(result.status, "Applied")[:2] == ("False", "Blocked")
    (observed,) = [s for s in result.status.gpus[0].slices]
    assert observed.allocated
    assert observed.pods == ["ml/infer-0"]

    agent_node.kubelet.remove_pod(pod.uid)
    done = agent_node.reconciler.reconcile(
        partition(mig(0, "7g.80gb@0"), generation=2, plan_id="plan-2"))
    assert agent_node.layout(0) == {"7g.80gb@0"}
    assert condition(done.status, "Applied")[0] == "True"
    assert condition(done.status, "Blocked")[0] == "False"


def test_a_kubelet_restarting_with_no_pods_listed_yet_frees_no_slice(
    agent_node: AgentNode,
) -> None:
    """A restarted kubelet answers PodResources before it knows its pods (an empty list): the
    agent must not take that for free slices while a repartition wants their space."""
    _, held_slice = _two_1g_one_held(agent_node)
    agent_node.reconciler.reconcile(partition(mig(0, "1g.10gb@0", "1g.10gb@1")))  # seen held

    agent_node.kubelet.restart(pods_known=False)
    wants_it = partition(mig(0, "7g.80gb@0"), generation=2, plan_id="plan-2")
    result = agent_node.reconciler.reconcile(wants_it)
    assert held_slice in agent_node.layout(0), "the held slice survived the kubelet restart"
    status, reason, message = condition(result.status, "Blocked")
    assert (status, reason) == ("True", "InUse")
    assert "PodResources" in message

    agent_node.kubelet.know_pods()
    again = agent_node.reconciler.reconcile(wants_it)
    assert agent_node.layout(0) == {held_slice}, "held by its pod, listed again"
    assert "in use by pod ml/infer-0" in condition(again.status, "Blocked")[2]


def test_a_cuda_job_outside_kubernetes_protects_its_slice(agent_node: AgentNode) -> None:
    agent_node.reconciler.reconcile(partition(mig(0, "7g.80gb@0")))
    (instance,) = agent_node.backend.gpu_instances(0)
    assert instance.uuid is not None
    with agent_node.store.mutate() as state:
        operations.add_process(state, instance.uuid, pid=4242, used_mib=100)
    blocked = agent_node.reconciler.reconcile(partition(mig(0, "1g.10gb@0"), generation=2))
    assert agent_node.layout(0) == {"7g.80gb@0"}
    assert "1 CUDA process(es) outside Kubernetes" in condition(blocked.status, "Blocked")[2]
    with agent_node.store.mutate() as state:
        operations.remove_process(state, instance.uuid, pid=4242)
    agent_node.reconciler.reconcile(partition(mig(0, "1g.10gb@0"), generation=2))
    assert agent_node.layout(0) == {"1g.10gb@0"}


def test_nvml_errors_mid_apply_are_recovered_by_observing_again(agent_node: AgentNode) -> None:
    with agent_node.store.mutate() as state:
        state.faults += [
            SimFault(function="nvmlDeviceCreateGpuInstanceWithPlacement", code=23, after=1),
            SimFault(function="nvmlGpuInstanceDestroy", code=19),
        ]
    agent_node.reconciler.reconcile(partition(mig(0, "7g.80gb@0")))
    result = agent_node.reconciler.reconcile(
        partition(mig(0, "2g.20gb@0", "2g.20gb@2", "3g.40gb@4"), generation=2))
    assert agent_node.layout(0) == {"2g.20gb@0", "2g.20gb@2", "3g.40gb@4"}
    assert condition(result.status, "Applied")[0] == "True"
    assert any(o.code == 19 for o in result.outcomes)
    assert load_state_file(agent_node.state_file).faults == []


def test_conditions_keep_their_transition_time_while_unchanged(agent_node: AgentNode) -> None:
    spec = partition(mig(0, "7g.80gb@0"))
    first = agent_node.reconciler.reconcile(spec)
    later = Reconciler(agent_node.runtime, clock=lambda: "2030-01-01T00:00:00Z").reconcile(
        spec.model_copy(update={"status": first.status}))
    before = {c.type: c.last_transition_time for c in first.status.conditions}
    after = {c.type: c.last_transition_time for c in later.status.conditions}
    assert before == after


def test_an_xid_marks_the_device_unhealthy_and_degraded(agent_node: AgentNode) -> None:
    agent_node.reconciler.reconcile(partition(mig(0, "1g.10gb@0", "1g.10gb@1")))
    agent_node.kubelet.wait_until(lambda k: k.allocatable().get(MIG_1G) == 2, timeout=10)
    uuid = sorted(agent_node.kubelet.devices(MIG_1G))[0]
    with agent_node.store.mutate() as state:
        operations.inject_xid(state, uuid, 48)
    agent_node.kubelet.wait_until(lambda k: k.allocatable().get(MIG_1G) == 1,
                                         timeout=5)
    result = agent_node.reconciler.reconcile(partition(mig(0, "1g.10gb@0", "1g.10gb@1")))
    status, reason, message = condition(result.status, "Degraded")
    assert (status, reason) == ("True", "UnhealthyGpu")
    assert "GPU 0 is unhealthy (last Xid 48)" in message


def _agent_once(spec: Path, state: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tessera.cli.main", "agent", "--once", "--spec-file", str(spec),
         "--nvml", f"sim:{state}", "--no-kubelet", "--log-level", "ERROR"],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})


def test_an_agent_killed_after_any_step_converges_on_restart(tmp_path: Path) -> None:
    """Kill the agent right after its k-th change to the card, for every k, then restart it."""
    spec = tmp_path / "partition.yaml"
    spec.write_text(yaml.safe_dump(partition(
        mig(0, "3g.40gb@4", "2g.20gb@0", "1g.10gb@2"), mig(1, "4g.40gb@0", "3g.40gb@4"),
    ).to_wire()))
    state = tmp_path / "node.json"
    kill_point = 0
    while True:
        start = new_node_state("node-a", ["A100-80GB", "A100-80GB"], mig=False)
        start.faults = [SimFault(function="mutating", action="kill-after", after=kill_point)]
        write_new_state_file(state, start)
        crashed = _agent_once(spec, state)
        if crashed.returncode != -9:
            assert crashed.returncode == 0, crashed.stderr
            break  # the agent finished before the k-th change: every point was covered
        with FileStore(state).mutate() as working:
            working.faults = []
        restarted = _agent_once(spec, state)
        assert restarted.returncode == 0, (kill_point, restarted.stdout, restarted.stderr)
        card = load_state_file(state)
        layouts = [{(i.profile_id, i.start) for i in g.instances} for g in card.gpus]
        assert layouts == [{(9, 4), (14, 0), (19, 2)}, {(5, 0), (9, 4)}], kill_point
        assert all(i.compute_instances for g in card.gpus for i in g.instances), kill_point
        kill_point += 1
    assert kill_point == 2 + 2 * 5, "two mode switches and five slices of two calls each"


@pytest.mark.parametrize("document", [
    "spec: {gpus: [{index: 0, mode: mig, slices: [{profile: 1g.10gb, start: 12}]}]}",
    "spec: {gpus: [{index: 0, mode: tiles}]}",
])
def test_the_cli_names_the_bad_field_of_a_spec_file(tmp_path: Path, document: str) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text(document)
    state = tmp_path / "node.json"
    write_new_state_file(state, new_node_state("n", ["A100-80GB"]))
    result = _agent_once(spec, state)
    assert result.returncode == 2
    assert result.stderr.startswith(f"tessera: error: {spec}: spec.gpus.0.")


def test_a_profile_the_card_lacks_is_reported_invalid_and_nothing_is_touched(
    tmp_path: Path,
) -> None:
    spec = tmp_path / "partition.yaml"
    spec.write_text("spec: {gpus: [{index: 0, mode: mig, slices: [{profile: 1g.5gb, start: 0}]},"
                    " {index: 1, mode: mig, slices: [{profile: 7g.80gb, start: 0}]}]}")
    state = tmp_path / "node.json"
    write_new_state_file(state, new_node_state("n", ["A100-80GB", "A100-80GB"]))
    result = _agent_once(spec, state)
    assert result.returncode == 1
    status = yaml.safe_load(result.stdout)["status"]
    invalid = next(c for c in status["conditions"] if c["type"] == "Invalid")
    assert invalid["message"].startswith(
        "spec.gpus[0].slices[0].profile: A100-80GB has no MIG profile '1g.5gb' (valid: 1g.10gb")
    card = load_state_file(state)
    assert card.gpus[0].instances == []
    assert len(card.gpus[1].instances) == 1, "the valid GPU is still applied"
