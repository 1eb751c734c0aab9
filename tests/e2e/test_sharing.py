"""Sharing cards without MIG, end to end: an L4 under a dynamic policy on a real control plane.

The chart's admission policy gates the pods; the controller turns the idle L4 into MPS shares
for six pods asking ``nvidia.com/gpu.shared``, the agent runs the (stand-in) MPS daemon and its
plugin advertises the shares to the real kubelet, and every container gets its own limits. When
they are gone, a pod asking for the whole card gets it back.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tessera.cli.main import main
from tessera.sim.history import load_history
from tessera.testing.cluster import Cluster
from tessera.testing.deployment import TesseraDeployment

from ._util import eventually

NAMESPACE = "tessera"
POOL = {"tessera.dev/pool": "l4"}
SHARED = "nvidia.com/gpu.shared"
GROUP, VERSION = "tessera.dev", "v1alpha1"


@pytest.fixture(scope="module")
def system(cluster: Cluster) -> Iterator[TesseraDeployment]:
    running = TesseraDeployment(cluster, NAMESPACE)
    running.install()
    try:
        running.add_gpu_node("l4-a", POOL, ["L4-24GB"], mps=True)
        running.create_policy({
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "PartitionPolicy",
            "metadata": {"name": "l4-sharing"},
            "spec": {"nodeSelector": {"matchLabels": POOL}, "mode": "dynamic",
                     "allowedModes": ["mps"],
                     "mps": {"shares": 6, "threadPercentage": 16, "memoryMiB": 3800}}})
        running.start_controller("c1", "--batch-idle-seconds", "0.3",
                                 "--batch-max-seconds", "2")
        eventually(lambda: running.reported("l4-a"), 30, "NodePartition l4-a")
        yield running
    finally:
        running.uninstall()


def _pod(name: str, resource: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "labels": {"app": "share"}},
            "spec": {"nodeSelector": POOL, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": "registry.invalid/infer:1",
                                     "resources": {"limits": {resource: "1"}}}]}}


def _running(system: TesseraDeployment, names: set[str]) -> bool:
    pods = system.core.list_namespaced_pod("default", label_selector="app=share").items
    return {p.metadata.name for p in pods if p.status.phase == "Running"} >= names


def _env(system: TesseraDeployment, pod: str) -> dict[str, str]:
    created = [c for c in system.nodes["l4-a"].created_containers()
               if c["pod"] == pod and c["container"] == "main"]
    assert created, f"no container created for {pod}"
    return dict(created[-1]["envs"])


def test_six_pods_share_one_l4_by_mps_then_a_pod_gets_it_whole(
        system: TesseraDeployment) -> None:
    names = {f"share-{n}" for n in range(6)}
    for name in sorted(names):
        system.core.create_namespaced_pod("default", _pod(name, SHARED))
    eventually(lambda: _running(system, names), 90, "six share pods Running")
    (gpu,) = system.partition("l4-a")["status"]["gpus"]
    assert gpu["mode"] == "mps"
    assert gpu["mps"]["shares"] == 6
    for name in names:
        env = _env(system, name)
        assert env["NVIDIA_VISIBLE_DEVICES"] == gpu["uuid"]
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "16"
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"].endswith("=3800M")
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == gpu["mps"]["pipeDirectory"]

    for name in names:
        system.core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
    eventually(lambda: not system.core.list_namespaced_pod(
        "default", label_selector="app=share").items, 60, "the share pods gone")
    system.core.create_namespaced_pod("default", _pod("whole", "nvidia.com/gpu"))
    eventually(lambda: _running(system, {"whole"}), 90, "the whole-card pod Running")
    (gpu,) = system.partition("l4-a")["status"]["gpus"]
    assert gpu["mode"] == "none"
    assert _env(system, "whole")["NVIDIA_VISIBLE_DEVICES"] == gpu["uuid"]
    system.core.delete_namespaced_pod("whole", "default", grace_period_seconds=0)


INNER = {"tessera.dev/pool": "a100-inner"}
INNER_SHARED = "nvidia.com/mig-3g.40gb.shared"


def test_mps_inside_a_3g_slice_serves_three_pods_beside_mig_pods(
        system: TesseraDeployment) -> None:
    """A static policy runs MPS inside the A100's 3g.40gb; its three shares and the card's
    other slices serve pods side by side."""
    system.add_gpu_node("a100-inner", INNER, ["A100-80GB"], mig=True, mps=True)
    system.create_policy({
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "PartitionPolicy",
        "metadata": {"name": "inner-mps"},
        "spec": {"nodeSelector": {"matchLabels": INNER}, "mode": "static",
                 "static": [{"migDevices": {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2},
                             "mpsDevices": {"3g.40gb": {"shares": 3}}}]}})
    eventually(lambda: system.reported("a100-inner"), 30, "NodePartition a100-inner")

    def inner_slice() -> dict[str, Any] | None:
        gpus = system.partition("a100-inner")["status"]["gpus"]
        found = [s for s in gpus[0].get("slices", []) if s["profile"] == "3g.40gb"]
        return found[0] if found and found[0].get("mps") else None

    inner = eventually(inner_slice, 60, "the 3g.40gb running MPS")
    names = {f"inner-{n}" for n in range(3)} | {"plain-0", "plain-1"}
    for n in range(3):
        body = _pod(f"inner-{n}", INNER_SHARED)
        body["spec"]["nodeSelector"] = INNER
        system.core.create_namespaced_pod("default", body)
    for n in range(2):
        body = _pod(f"plain-{n}", "nvidia.com/mig-1g.10gb")
        body["spec"]["nodeSelector"] = INNER
        system.core.create_namespaced_pod("default", body)
    created = system.nodes["a100-inner"].created_containers
    eventually(lambda: _running(system, names), 90, "three share pods and two MIG pods Running")
    for n in range(3):
        env = [c for c in created() if c["pod"] == f"inner-{n}"][-1]["envs"]
        assert env["NVIDIA_VISIBLE_DEVICES"] == inner["uuid"]
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == inner["mps"]["pipeDirectory"]
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "33"
    plain = {[c for c in created() if c["pod"] == f"plain-{n}"][-1]["envs"][
        "NVIDIA_VISIBLE_DEVICES"] for n in range(2)}
    assert len(plain) == 2
    assert inner["uuid"] not in plain
    assert all(uuid.startswith("MIG-") for uuid in plain)
    for name in names:
        system.core.delete_namespaced_pod(name, "default", grace_period_seconds=0)


def test_tessera_plan_on_the_live_cluster_says_what_the_controller_then_does(
        system: TesseraDeployment, capsys: pytest.CaptureFixture[str]) -> None:
    """With the controller stopped, two share pods wait gated; ``tessera plan --kubeconfig``
    (read-only) predicts the L4 shared and both pods on it; the restarted controller does it."""
    for process in system.controllers:
        process.stop()
    system.controllers.clear()
    eventually(lambda: not system.core.list_namespaced_pod(
        "default", label_selector="app=share").items, 60, "earlier share pods gone")
    names = {"preview-0", "preview-1"}
    for name in sorted(names):
        system.core.create_namespaced_pod("default", _pod(name, SHARED))
    assert main(["plan", "--kubeconfig", str(system.cluster.kubeconfig), "--json"]) == 0
    predicted = json.loads(capsys.readouterr().out)
    placed = {p["pod"]: p["node"] for p in predicted["placements"]}
    assert placed == {"default/preview-0": "l4-a", "default/preview-1": "l4-a"}
    (switched,) = [g for g in predicted["gpus"] if g["node"] == "l4-a"]
    assert (switched["mode"], switched["shares"]) == ("mps", 6)
    assert system.partition("l4-a")["status"]["gpus"][0]["mode"] == "none", "nothing written"

    system.start_controller("c2", "--batch-idle-seconds", "0.3", "--batch-max-seconds", "2")
    eventually(lambda: _running(system, names), 90, "the previewed pods Running")
    (gpu,) = system.partition("l4-a")["status"]["gpus"]
    assert (gpu["mode"], gpu["mps"]["shares"]) == ("mps", 6)

    # tessera status: the shares and their holders, and a pod that waits, with the reason
    system.core.create_namespaced_pod("default", _pod("too-big", "nvidia.com/gpu.shared-8gb"))
    kubeconfig = str(system.cluster.kubeconfig)
    assert main(["status", "--kubeconfig", kubeconfig, "-o", "json"]) == 0
    status = json.loads(capsys.readouterr().out)
    (l4,) = [g for g in status["gpus"] if g["node"] == "l4-a"]
    assert (l4["mode"], l4["slices"][0]["slice"], l4["slices"][0]["shares"]) == (
        "mps", SHARED, 6)
    waiting = dict(map(tuple, status["waiting"]))
    assert "default/too-big" in waiting
    assert "gpu.shared-8gb" in waiting["default/too-big"]
    assert main(["status", "--kubeconfig", kubeconfig, "--node", "l4-a"]) == 0
    assert "l4-a" in capsys.readouterr().out
    for name in [*names, "too-big"]:
        system.core.delete_namespaced_pod(name, "default", grace_period_seconds=0)


def test_simulate_export_writes_the_live_gpu_pods_that_simulate_replays(
        system: TesseraDeployment, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A share pod running, a two-GPU pod waiting (the pool has one L4) and a pod asking what
    the simulator does not model: the export has the first two with their times and requests,
    counts the third as skipped, and ``simulate --workload`` replays the file."""
    system.core.create_namespaced_pod("default", _pod("export-run", SHARED))
    waits = _pod("export-wait", "nvidia.com/gpu")
    waits["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "2"
    system.core.create_namespaced_pod("default", waits)
    system.core.create_namespaced_pod("default", _pod("export-inner", INNER_SHARED))
    eventually(lambda: _running(system, {"export-run"}), 90, "the share pod Running")
    out = tmp_path / "pods.csv"
    assert main(["simulate", "export", "--kubeconfig", str(system.cluster.kubeconfig),
                 "-o", str(out)]) == 0
    assert "skipped 1" in capsys.readouterr().err
    pods = {p.name: p for p in load_history(out).pods}
    run, wait = pods["default/export-run"], pods["default/export-wait"]
    assert (str(run.request), run.finished) == ("shared", None)
    assert run.started is not None
    assert run.created <= run.started
    assert (str(wait.request), wait.started, wait.finished) == ("gpu:2", None, None)
    assert "default/export-inner" not in pods
    assert main(["simulate", "--workload", str(out), "--cluster", "1x1xL4", "--json",
                 "--no-progress", "--report", str(tmp_path / "r.html")]) == 0
    assert json.loads(capsys.readouterr().out)["policies"]
    for name in ("export-run", "export-wait", "export-inner"):
        system.core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
