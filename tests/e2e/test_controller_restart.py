"""A controller restart on a busy cluster: what the new controller believes must match the cards.

Two nodes of one whole A100-80GB each, the chart's admission policy and a dynamic policy (the
scenario of issue #14): a burst of twelve pods fills both cards and leaves four waiting; the
controller stops; two running pods are force-deleted and a new pod arrives; a new controller
starts. It must hand the two freed slices to two of the waiting pods, and then leave the
pods that still do not fit alone instead of planning them again every tick.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from tessera.testing.cluster import Cluster
from tessera.testing.deployment import TesseraDeployment

from ._util import eventually

NAMESPACE = "tessera"
POOL = {"tessera.dev/pool": "solo"}
GROUP, VERSION = "tessera.dev", "v1alpha1"
POLICY = "solo-dynamic"
BURST = [("big", "3g.40gb", 2), ("mid", "2g.20gb", 2), ("small", "1g.10gb", 8)]
"""Twelve pods, 18 compute slices asked of two cards of 7."""


@pytest.fixture(scope="module")
def system(cluster: Cluster) -> Iterator[TesseraDeployment]:
    running = TesseraDeployment(cluster, NAMESPACE)
    running.install()
    try:
        for name in ("solo-a", "solo-b"):
            running.add_gpu_node(name, POOL, ["A100-80GB"])
        running.create_policy({
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "PartitionPolicy",
            "metadata": {"name": POLICY},
            "spec": {"nodeSelector": {"matchLabels": POOL}, "mode": "dynamic"}})
        for name in list(running.nodes):
            eventually(lambda n=name: running.reported(n), 30, f"NodePartition {name}")
        yield running
    finally:
        for pod in running.core.list_namespaced_pod("default", label_selector="app=solo").items:
            running.core.delete_namespaced_pod(pod.metadata.name, "default",
                                               grace_period_seconds=0)
        with contextlib.suppress(ApiException):
            running.custom.delete_cluster_custom_object(GROUP, VERSION, "partitionpolicies",
                                                        POLICY)
        running.uninstall()


def _pod(name: str, profile: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "labels": {"app": "solo"}},
            "spec": {"nodeSelector": POOL, "containers": [{
                "name": "main", "image": "registry.invalid/infer:1",
                "resources": {"limits": {f"nvidia.com/mig-{profile}": "1"}}}]}}


def _pods(system: TesseraDeployment) -> dict[str, Any]:
    items = system.core.list_namespaced_pod("default", label_selector="app=solo").items
    return {p.metadata.name: p for p in items}


def _running(system: TesseraDeployment) -> set[str]:
    return {n for n, p in _pods(system).items() if p.status.phase == "Running"}


def _gated(system: TesseraDeployment) -> set[str]:
    return {n for n, p in _pods(system).items()
            if any(g.name == "tessera.dev/placement" for g in p.spec.scheduling_gates or [])}


def _plans(log: str) -> int:
    return sum(1 for line in log.splitlines() if "planned " in line)


def _in_flight(system: TesseraDeployment) -> bool:
    """A plan written that the node's agent has not reported applied yet."""
    for node in system.nodes:
        partition = system.partition(node)
        wanted = partition.get("spec", {}).get("planId")
        if wanted and wanted != partition.get("status", {}).get("appliedPlanId"):
            return True
    return False


def _settled(system: TesseraDeployment, pods: int) -> tuple[frozenset[str], frozenset[str]]:
    """Wait until every pod is Running or gated, no plan is in flight, and that stays so for
    8 s: (running, gated). A pod the controller placed stays gated while its node applies the
    plan and the kubelet advertises the slice; settling earlier would take that for "waits"."""
    seen: list[tuple[frozenset[str], frozenset[str]]] = []

    def probe() -> bool:
        state = (frozenset(_running(system)), frozenset(_gated(system)))
        complete = len(state[0]) + len(state[1]) == pods and not _in_flight(system)
        seen.append(state if complete else (frozenset(), frozenset()))
        return complete and len(seen) >= 40 and len(set(seen[-40:])) == 1

    eventually(probe, 90, f"{pods} pods Running or gated, unchanged for 5 s")
    return seen[-1]


@pytest.mark.timeout(300)
def test_a_restarted_controller_hands_freed_slices_to_waiting_pods(
    system: TesseraDeployment,
) -> None:
    first = system.start_controller("r1", "--batch-idle-seconds", "0.3",
                                    "--batch-max-seconds", "2")
    created = 0
    for prefix, profile, count in BURST:  # the larger pods first, then the small ones
        for i in range(count):
            system.core.create_namespaced_pod("default", _pod(f"{prefix}-{i}", profile))
        created += count
        running, waiting = _settled(system, created)
    assert {"big-0", "big-1", "mid-0", "mid-1"} <= running, first.log_tail(40)
    assert waiting, "more was asked than two cards hold"
    assert all(n.startswith("small-") for n in waiting), (sorted(running), sorted(waiting))
    first.stop()

    freed = sorted(n for n in running if n.startswith("small-"))[:2]
    assert len(freed) == 2
    for name in freed:
        system.core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
    system.core.create_namespaced_pod("default", _pod("late", "1g.10gb"))
    eventually(lambda: len(_pods(system)) == 11, 30, "the force-deleted pods gone")
    assert "late" in _gated(system), "the admission policy gates it while no controller runs"

    second = system.start_controller("r2", "--batch-idle-seconds", "0.3",
                                     "--batch-max-seconds", "2", "--resync-seconds", "30")
    after, still = _settled(system, 11)
    assert len(after) == len(running), second.log_tail(20)
    assert still == (waiting | {"late"}) - after
    assert len(still) == len(waiting) - 1
    assert "late" in still, "arrival order: the older waiting pods took the two slices"
    # The new controller knows how long pods waited before it: from the bound pods' binding
    # times on the real API server, not from releases of its own.
    log = second.log_path.read_text(errors="replace")
    assert f"recent waits: {len(running) - 2} taken from the pods bound" in log, \
        second.log_tail(20)

    # Settled: nothing changes, so nothing is planned again (no hot loop), for 8 s.
    before = _plans(second.log_path.read_text(errors="replace"))
    time.sleep(8)
    plans = _plans(second.log_path.read_text(errors="replace")) - before
    second.stop()
    assert plans == 0, second.log_tail(20)
