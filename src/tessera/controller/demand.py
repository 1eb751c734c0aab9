"""Which pods wait for GPU capacity, and what they ask for, read off raw Pod payloads.

A pod counts once it asks for any ``nvidia.com/`` GPU resource and is either held by Tessera's
scheduling gate (added at admission) or Pending and Unschedulable (namespaces that opted out
of the gate). Requests follow Kubernetes' effective-request rule: the larger of the largest
init container and the sum of the app containers, per resource.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from tessera.core import catalogue
from tessera.core.planner import MatchExpression, PendingPod, Toleration

__all__ = [
    "GATE",
    "PLACEHOLDER_LABEL",
    "created_at",
    "gpu_requests",
    "is_gated",
    "is_placeholder",
    "is_terminal",
    "is_waiting",
    "pending_pod",
    "pod_key",
    "scheduled_at",
]

GATE = "tessera.dev/placement"
"""The scheduling gate Tessera's admission policy adds to GPU pods."""
PLACEHOLDER_LABEL = "tessera.dev/placeholder"
"""On the controller's scale-up placeholder pods (value: their policy): never demand of their
own, never gated (tessera.controller.scaleup)."""

RawPod = Mapping[str, Any]


def pod_key(pod: RawPod) -> str:
    meta = pod.get("metadata", {})
    return f"{meta.get('namespace', 'default')}/{meta.get('name', '')}"


def _is_gpu_resource(name: str) -> bool:
    return name.startswith(catalogue.RESOURCE_DOMAIN + "/")


def _quantity(value: Any) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0  # extended resources are integers; anything else is not ours to count


def _requests(container: Mapping[str, Any]) -> dict[str, int]:
    resources = container.get("resources") or {}
    merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    return {k: _quantity(v) for k, v in merged.items() if _is_gpu_resource(k)}


def gpu_requests(pod: RawPod) -> dict[str, int]:
    spec = pod.get("spec", {})
    total: dict[str, int] = {}
    for container in spec.get("containers") or []:
        for name, value in _requests(container).items():
            total[name] = total.get(name, 0) + value
    for container in spec.get("initContainers") or []:
        for name, value in _requests(container).items():
            total[name] = max(total.get(name, 0), value)
    return {k: v for k, v in total.items() if v > 0}


def is_terminal(pod: RawPod) -> bool:
    return pod.get("status", {}).get("phase") in ("Succeeded", "Failed") or bool(
        pod.get("metadata", {}).get("deletionTimestamp"))


def is_gated(pod: RawPod) -> bool:
    gates = pod.get("spec", {}).get("schedulingGates") or []
    return any(g.get("name") == GATE for g in gates)


def _unschedulable(pod: RawPod) -> bool:
    for condition in pod.get("status", {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return bool(condition.get("reason") == "Unschedulable")
    return False


def is_placeholder(pod: RawPod, namespace: str) -> bool:
    """One of the controller's scale-up placeholders: the label, in the controller's own
    namespace (where the admission gate exempts it; elsewhere the label means nothing)."""
    meta = pod.get("metadata", {})
    return meta.get("namespace") == namespace and PLACEHOLDER_LABEL in (meta.get("labels") or {})


def is_waiting(pod: RawPod, placeholders: str | None = None) -> bool:
    """A GPU pod that no node holds yet and that Tessera should find room for (a scale-up
    placeholder, in the namespace ``placeholders``, stands for such pods and is none itself)."""
    if (is_terminal(pod) or pod.get("spec", {}).get("nodeName") or not gpu_requests(pod)
            or (placeholders is not None and is_placeholder(pod, placeholders))):
        return False
    return is_gated(pod) or _unschedulable(pod)


def _timestamp(text: str | None) -> float:
    if not text:
        return 0.0
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def created_at(pod: RawPod) -> float | None:
    """The pod's creation time (epoch seconds), or None before the API server set it."""
    text = pod.get("metadata", {}).get("creationTimestamp")
    return _timestamp(text) if text else None


def scheduled_at(pod: RawPod) -> float | None:
    """When the scheduler bound the pod (epoch seconds, to the second): its ``PodScheduled``
    condition's last transition to True; None while it is not bound."""
    if not pod.get("spec", {}).get("nodeName"):
        return None
    for condition in pod.get("status", {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled":
            text = condition.get("lastTransitionTime")
            return _timestamp(text) if condition.get("status") == "True" and text else None
    return None


def _cpu_milli(value: Any) -> int:
    text = str(value)
    if text.endswith("m"):
        return int(float(text[:-1]))
    try:
        return int(float(text) * 1000)
    except ValueError:
        return 0


_MEMORY_UNITS = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024, "Ti": 1024 * 1024, "K": 1000 / 2**20,
                 "M": 10**6 / 2**20, "G": 10**9 / 2**20, "T": 10**12 / 2**20}


def _memory_mib(value: Any) -> int:
    text = str(value)
    for suffix, factor in _MEMORY_UNITS.items():
        if text.endswith(suffix):
            try:
                return int(float(text[: -len(suffix)]) * factor)
            except ValueError:
                return 0
    try:
        return int(float(text) / 2**20)
    except ValueError:
        return 0


def pending_pod(pod: RawPod) -> PendingPod:
    """The pod as the planner sees it: what it asks for and where it may go."""
    meta = pod.get("metadata", {})
    spec = pod.get("spec", {})
    cpu = memory = 0
    for container in spec.get("containers") or []:
        requests = (container.get("resources") or {}).get("requests") or {}
        cpu += _cpu_milli(requests.get("cpu", 0))
        memory += _memory_mib(requests.get("memory", 0))
    terms: list[tuple[MatchExpression, ...]] = []
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    for term in required.get("nodeSelectorTerms") or []:
        terms.append(tuple(
            MatchExpression(key=e["key"], operator=e["operator"],
                            values=tuple(e.get("values") or ()))
            for e in term.get("matchExpressions") or []))
    tolerations = tuple(
        Toleration(key=t.get("key", "") or "", operator=t.get("operator", "Equal") or "Equal",
                   value=t.get("value", "") or "", effect=t.get("effect", "") or "")
        for t in spec.get("tolerations") or [])
    return PendingPod(
        namespace=meta.get("namespace", "default"),
        name=meta.get("name", ""),
        requests=tuple(sorted(gpu_requests(pod).items())),
        priority=int(spec.get("priority") or 0),
        creation_time=_timestamp(meta.get("creationTimestamp")),
        cpu_milli=cpu,
        memory_mib=memory,
        node_selector=tuple(sorted((spec.get("nodeSelector") or {}).items())),
        affinity_terms=tuple(terms),
        tolerations=tolerations,
    )
