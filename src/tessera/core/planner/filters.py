"""Which nodes a pod may land on: nodeSelector, required node affinity, taints and tolerations.

These mirror kube-scheduler's NodeAffinity and TaintToleration filters (only the hard ones: the
planner must never promise a node the scheduler will refuse). Preferred affinity and
PreferNoSchedule taints are soft in the scheduler and ignored here.
"""

from __future__ import annotations

from collections.abc import Mapping

from tessera.core.planner.model import MatchExpression, Node, PendingPod, Taint, Toleration

__all__ = ["rejection", "tolerates"]

_HARD_EFFECTS = ("NoSchedule", "NoExecute")


def _matches(expression: MatchExpression, labels: Mapping[str, str]) -> bool:
    value = labels.get(expression.key)
    op = expression.operator
    if op == "In":
        return value is not None and value in expression.values
    if op == "NotIn":
        return value is None or value not in expression.values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    # Gt / Lt compare integers; a label that is not one (or a malformed value) never matches.
    if value is None or len(expression.values) != 1:
        return False
    try:
        left, right = int(value), int(expression.values[0])
    except ValueError:
        return False
    return left > right if op == "Gt" else left < right


def _tolerated(taint: Taint, toleration: Toleration) -> bool:
    if toleration.effect and toleration.effect != taint.effect:
        return False
    if not toleration.key:
        return toleration.operator == "Exists"
    if toleration.key != taint.key:
        return False
    return toleration.operator == "Exists" or toleration.value == taint.value


def tolerates(pod: PendingPod, taint: Taint) -> bool:
    return taint.effect not in _HARD_EFFECTS or any(
        _tolerated(taint, t) for t in pod.tolerations
    )


def rejection(pod: PendingPod, node: Node) -> str | None:
    """Why the scheduler would refuse ``pod`` on ``node`` (a short phrase), or None."""
    labels = node.label_map
    for key, value in pod.node_selector:
        if labels.get(key) != value:
            return "nodeSelector"
    # An empty term matches no node, as in Kubernetes; the terms are ORed, expressions ANDed.
    if pod.affinity_terms and not any(
        term and all(_matches(e, labels) for e in term) for term in pod.affinity_terms
    ):
        return "node affinity"
    for taint in node.taints:
        if not tolerates(pod, taint):
            return f"taint {taint.key}={taint.value}:{taint.effect}"
    return None
