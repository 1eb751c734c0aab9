"""Karpenter on the test cluster: the real autoscaler, built from its Go module with its kwok
cloud provider (``make karpenter``, ``tools/karpenter``), for the scale-up e2e test.

The kwok provider "launches" an instance by creating the Node object Karpenter expects (with
the instance type's labels, capacity and a ``kwok://`` provider id) and nothing else; a test
then starts a real kubelet and agent under that node's name, so the node Karpenter made is the
one that joins. Karpenter runs as a local process with the cluster's admin credentials (its
own RBAC is not what is under test), no leader election, and an instance-type file of GPU
machines.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tessera.core.errors import TesseraError
from tessera.testing.cluster import Cluster, Process
from tessera.testing.cluster._cluster import free_ports

__all__ = ["BINARY_ENV", "Karpenter", "KarpenterMissingError", "gpu_instance_type"]

BINARY_ENV = "TESSERA_KARPENTER"
"""The binary ``make karpenter`` built (it prints the path); its ``crds/`` folder is beside it."""
NODE_CLASS = "default"


class KarpenterMissingError(TesseraError):
    pass


def locate() -> Path:
    path = Path(os.environ.get(BINARY_ENV, ""))
    if not os.environ.get(BINARY_ENV) or not path.is_file() or not (path.parent / "crds").is_dir():
        raise KarpenterMissingError(
            f"Karpenter is missing ({BINARY_ENV}={os.environ.get(BINARY_ENV, '')!r}): run "
            "`make karpenter`, then set TESSERA_KARPENTER to the path it prints (make test "
            "does both)")
    return path


def gpu_instance_type(name: str, gpus: int, *, cpu: int = 32, memory_gi: int = 256,
                      price: float = 10.0) -> dict[str, Any]:
    """One entry of the kwok provider's instance-types file: a GPU machine offered on demand
    in one zone (the file's format: kwok/cloudprovider/helpers.go, InstanceTypeOptions, whose
    offerings are cloudprovider.Offering's Go field names with their requirements)."""
    return {
        "name": name, "architecture": "amd64", "operatingSystems": ["linux"],
        "offerings": [{"Price": price, "Available": True, "Requirements": [
            {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
            {"key": "topology.kubernetes.io/zone", "operator": "In",
             "values": ["test-zone-a"]}]}],
        "resources": {"cpu": str(cpu), "memory": f"{memory_gi}Gi", "pods": "110",
                      "nvidia.com/gpu": str(gpus)},
    }


class Karpenter:
    """:meth:`start` installs the CRDs and runs Karpenter; :meth:`node_pool` defines a pool."""

    def __init__(self, cluster: Cluster, instance_types: Sequence[Mapping[str, Any]]) -> None:
        self.cluster = cluster
        self.binary = locate()
        self.instance_types = list(instance_types)
        self.api = cluster.api_client()
        self.custom = client.CustomObjectsApi(self.api)
        self.process: Process | None = None

    def start(self) -> Karpenter:
        self._install_crds()
        self.custom.create_cluster_custom_object(
            "karpenter.kwok.sh", "v1alpha1", "kwoknodeclasses",
            {"apiVersion": "karpenter.kwok.sh/v1alpha1", "kind": "KWOKNodeClass",
             "metadata": {"name": NODE_CLASS}})
        # Nothing in the kwok provider marks its node class Ready, and a NodePool whose class
        # is not Ready provisions nothing: say so, as a real provider's controller would.
        self.custom.patch_cluster_custom_object_status(
            "karpenter.kwok.sh", "v1alpha1", "kwoknodeclasses", NODE_CLASS,
            {"status": {"conditions": [{
                "type": "Ready", "status": "True", "reason": "Ready", "message": "",
                "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1}]}})
        root = self.cluster.root / "karpenter"
        root.mkdir(exist_ok=True)
        types = root / "instance-types.json"
        types.write_text(json.dumps(self.instance_types))
        metrics, health = free_ports(2)
        env = {**os.environ, "KUBECONFIG": str(self.cluster.kubeconfig),
               "DISABLE_LEADER_ELECTION": "true", "METRICS_PORT": str(metrics),
               "HEALTH_PROBE_PORT": str(health), "INSTANCE_TYPES_FILE_PATH": str(types),
               "SYSTEM_NAMESPACE": "kube-system", "LOG_LEVEL": "debug",
               "BATCH_IDLE_DURATION": "1s", "BATCH_MAX_DURATION": "3s"}
        self.process = Process("karpenter", [str(self.binary)], env=env,
                               log_path=self.cluster.root / "logs" / "karpenter.log")
        return self

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

    def _install_crds(self) -> None:
        extensions = client.ApiextensionsV1Api(self.api)
        names: list[str] = []
        for path in sorted((self.binary.parent / "crds").glob("*.yaml")):
            for document in yaml.safe_load_all(path.read_text()):
                if not document:
                    continue
                names.append(cast(str, document["metadata"]["name"]))
                try:
                    extensions.create_custom_resource_definition(document)
                except ApiException as exc:
                    if exc.status != 409:
                        raise
        for name in names:
            self._wait_established(extensions, name)

    @staticmethod
    def _wait_established(extensions: client.ApiextensionsV1Api, name: str) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            crd = extensions.read_custom_resource_definition(name)
            conditions = (crd.status.conditions or []) if crd.status else []
            if any(c.type == "Established" and c.status == "True" for c in conditions):
                return
            time.sleep(0.2)
        raise TesseraError(f"CRD {name} not established after 30 s")

    def node_pool(self, name: str, *, labels: Mapping[str, str], instance_types: Sequence[str],
                  consolidate_after: str = "10m", gpu_limit: int = 64) -> None:
        """A NodePool of these instance types whose nodes carry ``labels`` (what a Tessera
        PartitionPolicy selects), limited to ``gpu_limit`` GPUs."""
        self.custom.create_cluster_custom_object("karpenter.sh", "v1", "nodepools", {
            "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": name},
            "spec": {
                "template": {
                    "metadata": {"labels": dict(labels)},
                    "spec": {
                        "requirements": [
                            {"key": "node.kubernetes.io/instance-type", "operator": "In",
                             "values": list(instance_types)},
                            {"key": "karpenter.sh/capacity-type", "operator": "In",
                             "values": ["on-demand"]}],
                        "nodeClassRef": {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass",
                                         "name": NODE_CLASS},
                        "expireAfter": "Never",
                    },
                },
                "limits": {"nvidia.com/gpu": str(gpu_limit)},
                "disruption": {"consolidationPolicy": "WhenEmpty",
                               "consolidateAfter": consolidate_after},
            },
        })

    def node_claims(self) -> list[dict[str, Any]]:
        listed = self.custom.list_cluster_custom_object("karpenter.sh", "v1", "nodeclaims")
        return list(cast(dict[str, Any], listed).get("items") or [])
