"""Hollow GPU nodes (``tessera.testing.hollow``, the scale benchmark's nodes) against the real
API server and the real controller: each publishes allocatable that follows its slices,
reports through the agent's own status code, and takes the pods the controller places."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from tessera.api.v1alpha1 import GROUP, VERSION
from tessera.controller.demand import GATE
from tessera.testing.cluster import Cluster
from tessera.testing.deployment import TesseraDeployment
from tessera.testing.hollow import HollowNodes

from ._util import eventually, selector

LABELS = {"tessera.dev/hollow": "true"}
NAMES = ["hollow-a", "hollow-b", "hollow-c"]
APP = {"app": "hollow"}
SELECTOR = selector(APP)


def _pods(core: client.CoreV1Api) -> list[client.V1Pod]:
    return list(core.list_namespaced_pod("default", label_selector=SELECTOR).items)


@pytest.fixture(scope="module")
def hollow(cluster: Cluster) -> Iterator[tuple[TesseraDeployment, HollowNodes]]:
    running = TesseraDeployment(cluster, "tessera")
    running.install()
    nodes = HollowNodes(cluster.api_client(), NAMES, ["A100-80GB"] * 2, labels=LABELS,
                        resync_s=5.0)
    worker = threading.Thread(target=nodes.run, daemon=True)
    try:
        running.create_policy({
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "PartitionPolicy",
            "metadata": {"name": "hollow"},
            "spec": {"mode": "dynamic", "nodeSelector": {"matchLabels": LABELS}}})
        nodes.start()
        worker.start()
        running.start_controller("c1", "--batch-idle-seconds", "0.3")
        yield running, nodes
    finally:
        # The pods first, whatever the test did: a pod left Pending would be planned onto the
        # next module's nodes (the pods here have no node selector).
        running.core.delete_collection_namespaced_pod("default", label_selector=SELECTOR,
                                                      grace_period_seconds=0)
        nodes.stopped.set()
        worker.join(10)
        running.uninstall()
        running.custom.delete_cluster_custom_object(GROUP, VERSION, "partitionpolicies", "hollow")
        for name in NAMES:
            running.core.delete_node(name)


def test_hollow_nodes_report_their_cards_and_take_the_pods_the_controller_places(
        hollow: tuple[TesseraDeployment, HollowNodes]) -> None:
    running, nodes = hollow
    eventually(lambda: nodes.reported() == len(NAMES), 30, "every hollow node's report")
    for i in range(12):
        created = running.core.create_namespaced_pod("default", client.V1Pod(
            metadata=client.V1ObjectMeta(name=f"h-{i}", labels=APP),
            spec=client.V1PodSpec(containers=[client.V1Container(
                name="c", image="registry.invalid/x:1",
                resources=client.V1ResourceRequirements(
                    limits={"nvidia.com/mig-3g.40gb": "1"}))])))
        # Gated, so the controller places it: one the scheduler took itself could take the
        # slice the controller pinned another pod to (install waits for the policy for this).
        assert [g.name for g in created.spec.scheduling_gates or []] == [GATE]

    def bound() -> list[str]:
        return [p.spec.node_name for p in _pods(running.core) if p.spec.node_name]

    def state() -> dict[str, object]:
        """On a timeout: where each pod is, what each node offers and reports."""
        partitions: Any = running.custom.list_cluster_custom_object(
            GROUP, VERSION, "nodepartitions")
        return {
            "pods": {p.metadata.name: (p.spec.node_name, p.status.phase,
                                       [(c.type, c.status, c.reason, c.message)
                                        for c in p.status.conditions or []])
                     for p in _pods(running.core)},
            "allocatable": {n: running.core.read_node(n).status.allocatable for n in NAMES},
            "partitions": {i["metadata"]["name"]: (i.get("spec"), i.get("status"))
                           for i in partitions.get("items", [])
                           if i["metadata"]["name"] in NAMES}}

    placed = eventually(lambda: (found := bound()) and len(found) == 12 and found, 90,
                        "all twelve pods bound by the scheduler", describe=state)
    assert sorted(set(placed)) == NAMES  # 12 x 3g.40gb = 6 GPUs: two per node
    node = running.core.read_node("hollow-a")
    assert node.status.allocatable["nvidia.com/mig-3g.40gb"] == "4"
    writes = nodes.node_writes
    passes = nodes.passes
    eventually(lambda: nodes.passes >= passes + 2 * len(NAMES), 30, "two resyncs of each node")
    assert nodes.node_writes == writes, "nothing changed: no Node status written"
