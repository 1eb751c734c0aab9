"""``tessera status``: slices, their state and holders per GPU; waiting pods and why."""

from __future__ import annotations

import io

from rich.console import Console

from tessera.api.v1alpha1 import NodePartition
from tessera.cli.status_cmd import build_status, render
from tessera.core.planner import AssignedSlice, Plan, PodPlacement, Unplaced

A100 = {"index": 0, "uuid": "GPU-00000000-0000-0000-0000-000000000000",
        "name": "NVIDIA A100-SXM4-80GB", "model": "A100-80GB", "mode": "mig",
        "migMode": {"current": True, "pending": True}}
L4 = {"index": 1, "uuid": "GPU-00000000-0000-0000-0000-000000000001", "name": "NVIDIA L4",
      "mode": "mps", "mps": {"shares": 6, "threadPercentage": 16, "memoryMiB": 3800,
                             "daemon": "Running", "pipeDirectory": "/run/x"}}


def _partition() -> NodePartition:
    return NodePartition.model_validate({
        "metadata": {"name": "node-a"},
        "spec": {"planId": "p-2", "gpus": [{"index": 0, "mode": "mig", "slices": [
            {"profile": "3g.40gb", "start": 4}, {"profile": "1g.10gb", "start": 0},
            {"profile": "1g.10gb", "start": 1}]}]},
        "status": {"appliedPlanId": "p-1", "gpus": [
            {**A100, "slices": [
                {"profile": "3g.40gb", "start": 4, "gpuInstanceId": 2, "uuid": "MIG-a",
                 "allocated": True, "pods": ["ml/infer"]},
                {"profile": "1g.10gb", "start": 0, "gpuInstanceId": 7, "uuid": "MIG-b"},
                {"profile": "2g.20gb", "start": 2, "gpuInstanceId": 4, "uuid": "MIG-c",
                 "allocated": True, "pods": ["ml/old"]}]},
            L4]}})


PREVIEW = Plan(gpus=(), placements=(PodPlacement("ml/next", "node-a", (
    AssignedSlice(0, "nvidia.com/mig-1g.10gb", "1g.10gb", 1),)),),
    unplaced=(Unplaced("ml/big", "no node can hold 2 x mig-7g.80gb: ..."),), solver="fast")


def test_each_slice_shows_its_state_and_holder() -> None:
    status = build_status({"node-a": _partition()}, PREVIEW)
    a100, l4 = status.gpus
    assert [(s.slice, s.state, s.pods) for s in a100.slices] == [
        ("1g.10gb@0", "free", []), ("2g.20gb@2", "blocked", ["ml/old"]),
        ("3g.40gb@4", "allocated", ["ml/infer"]), ("1g.10gb@1", "creating", [])]
    assert (l4.model, l4.mode, l4.slices[0].slice, l4.slices[0].shares) == (
        "NVIDIA L4", "mps", "nvidia.com/gpu.shared", 6)
    assert status.waiting == [("ml/big", "no node can hold 2 x mig-7g.80gb: ..."),
                              ("ml/next", "goes to node-a with the next plan")]
    assert status.in_flight == [("node-a", "p-2", "p-1")]


def test_the_table_reads_like_kubectl_get() -> None:
    out = io.StringIO()
    render(build_status({"node-a": _partition()}, PREVIEW), wide=True,
           console=Console(file=out, width=160, color_system=None))
    text = out.getvalue()
    assert text.splitlines()[0].split() == ["NODE", "GPU", "MODEL", "MODE", "SLICE", "STATE",
                                            "SHARES", "PODS"]
    assert "node-a  0    A100-80GB  mig   3g.40gb@4" in text
    assert "WAITING POD" in text
    assert "plan in flight on node-a: p-2 (the agent last applied p-1)" in text


def test_a_node_filter_keeps_that_node() -> None:
    status = build_status({"node-a": _partition()}, PREVIEW, node="node-b")
    assert (status.gpus, status.waiting, status.in_flight) == ([], [], [])


def test_a_dra_node_shows_its_claims_slices_or_that_any_placement_is_free() -> None:
    dra = NodePartition.model_validate({
        "metadata": {"name": "dra-a"},
        "status": {"api": "dra", "gpus": [
            {**A100, "slices": [{"profile": "3g.40gb", "start": 4, "gpuInstanceId": 2,
                                 "uuid": "MIG-a", "allocated": True,
                                 "pods": ["ml/claim-x"]}]},
            {**A100, "index": 1, "uuid": "GPU-00000000-0000-0000-0000-000000000009"}]}})
    status = build_status({"dra-a": dra}, Plan(gpus=(), placements=(), unplaced=(),
                                                solver="fast"))
    busy, idle = status.gpus
    assert (busy.mode, [(s.slice, s.state, s.pods) for s in busy.slices]) == (
        "mig (dra)", [("3g.40gb@4", "allocated", ["ml/claim-x"])])
    assert [(s.slice, s.state) for s in idle.slices] == [("any placement", "free")]
