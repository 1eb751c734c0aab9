"""Pod writes the controller makes: pin a pod to its node and lift Tessera's scheduling gate;
create and delete its scale-up placeholder pods.

While a pod is gated its scheduling directives may still be tightened (Kubernetes allows adding
a nodeSelector to a gated pod), so pinning and ungating go in one JSON patch, guarded by a test
of the gate's position: the pod is either released onto the planned node or left as it was.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

__all__ = ["Pods"]


class Pods:
    def __init__(self, api: client.ApiClient) -> None:
        self._core = client.CoreV1Api(api)

    def release(self, namespace: str, name: str, gate: str, labels: Mapping[str, str], *,
                seen: Mapping[str, Any] | None = None) -> bool:
        """Add ``labels`` to the node selector (a node's hostname pins it there; the DRA node
        selector hands it to DRA nodes) and ungate; False if the pod is gone or no longer
        carries the gate.

        ``seen``: the pod as the caller's watch last showed it. The patch is then built from
        it and guarded by its resourceVersion, one round trip instead of a read and a write
        (half the requests of a burst's releases: bench/scale_bench.py); when the pod changed
        since, the API server refuses the patch and it is built again from a fresh read."""
        version = (seen or {}).get("metadata", {}).get("resourceVersion")
        if seen is not None and version:
            spec = seen.get("spec") or {}
            gates = [g.get("name") for g in spec.get("schedulingGates") or []]
            ops = _release_ops(spec.get("nodeSelector"), gates, gate, labels)
            if ops is None:
                return False
            guarded = [{"op": "test", "path": "/metadata/resourceVersion", "value": version},
                       *ops]
            try:
                self._core.patch_namespaced_pod(name, namespace, guarded)
                return True
            except ApiException as exc:
                if exc.status == 404:
                    return False
                if exc.status not in (409, 422):
                    raise
        try:
            pod = self._core.read_namespaced_pod(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        live = pod.spec or client.V1PodSpec(containers=[])
        ops = _release_ops(live.node_selector, [g.name for g in live.scheduling_gates or []],
                           gate, labels)
        if ops is None:
            return False
        try:
            self._core.patch_namespaced_pod(name, namespace, ops)
        except ApiException as exc:
            if exc.status in (404, 409, 422):
                return False
            raise
        return True

    def create(self, body: Mapping[str, Any]) -> str:
        """Create a pod from a raw body (``generateName`` allowed); its ``namespace/name``."""
        namespace = body["metadata"]["namespace"]
        raw: Any = dict(body)  # the client posts a plain dict as it is
        created = self._core.create_namespaced_pod(namespace, raw)
        assert created.metadata is not None
        return f"{namespace}/{created.metadata.name}"

    def mark_unschedulable(self, namespace: str, name: str, message: str) -> None:
        """Set PodScheduled=False, reason Unschedulable: what a scheduler writes when no node
        fits, for a pod no scheduler will look at (a scale-up placeholder)."""
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body: Any = {"status": {"conditions": [{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": message, "lastTransitionTime": stamp}]}}
        self._core.patch_namespaced_pod_status(name, namespace, body)

    def delete(self, namespace: str, name: str) -> bool:
        """Delete at once (no grace: nothing runs in it); False if it was gone already."""
        try:
            self._core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True


def _release_ops(node_selector: Mapping[str, str] | None, gates: list[str], gate: str,
                 labels: Mapping[str, str]) -> list[dict[str, Any]] | None:
    """The JSON patch that pins and ungates a pod with this selector and these gates; None
    when the gate is gone (released already)."""
    ops: list[dict[str, Any]] = []
    if gate not in gates:
        return None
    if node_selector is None:
        if labels:
            ops.append({"op": "add", "path": "/spec/nodeSelector", "value": dict(labels)})
    else:
        for key, value in labels.items():
            escaped = key.replace("~", "~0").replace("/", "~1")
            ops.append({"op": "add", "path": f"/spec/nodeSelector/{escaped}", "value": value})
    position = gates.index(gate)
    ops.append({"op": "test", "path": f"/spec/schedulingGates/{position}/name", "value": gate})
    ops.append({"op": "remove", "path": f"/spec/schedulingGates/{position}"})
    return ops
