"""The chart's part in scale-up: the placeholders' PriorityClass, the controller's narrow
rights to make them, its settings, and nothing on GPU nodes that would block a scale-down."""

from __future__ import annotations

from typing import Any

import pytest

from tessera.testing.cluster._cluster import Binaries

from .test_chart import CHART, binaries, helm, render

__all__ = ["binaries"]


def _controller_args(docs: list[dict[str, Any]]) -> list[str]:
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return list(container["args"])


def test_placeholders_get_a_priority_below_every_workload_that_preempts_nothing(
        binaries: Binaries) -> None:
    (klass,) = [d for d in render(binaries) if d["kind"] == "PriorityClass"]
    assert klass["metadata"]["name"] == "tessera-placeholder"
    assert -10 <= klass["value"] < 0  # above Cluster Autoscaler's expendable cutoff
    assert klass["preemptionPolicy"] == "Never"
    assert klass["globalDefault"] is False
    args = _controller_args(render(binaries))
    assert "--scale-up-priority-class=tessera-placeholder" in args
    assert "--scale-up-ttl-seconds=900" in args
    assert not [d for d in render(binaries, "scaleUp.priorityClass.create=false")
                if d["kind"] == "PriorityClass"]


@pytest.mark.parametrize("value", ["scaleUp.priorityClass.value=-11",
                                   "scaleUp.priorityClass.value=0",
                                   "scaleUp.ttlSeconds=10"])
def test_a_placeholder_priority_autoscalers_would_ignore_is_refused(binaries: Binaries,
                                                                     value: str) -> None:
    result = helm(binaries, "template", "tessera", str(CHART), "--set", value)
    assert result.returncode != 0
    assert "/scaleUp/" in result.stderr


def test_the_controller_may_make_placeholders_only_in_its_own_namespace(
        binaries: Binaries) -> None:
    docs = render(binaries)
    (role,) = [d for d in docs if d["kind"] == "Role"
               and d["metadata"]["name"] == "tessera-controller-lease"]
    assert role["metadata"]["namespace"] == "tessera"
    rules = {(tuple(r["apiGroups"]), tuple(r["resources"])): set(r["verbs"])
             for r in role["rules"]}
    assert rules[(("",), ("pods",))] == {"create", "delete"}
    assert rules[(("",), ("pods/status",))] == {"patch"}
    assert rules[(("autoscaling.x-k8s.io",), ("provisioningrequests",))] == {"create", "delete"}
    (cluster_role,) = [d for d in docs if d["kind"] == "ClusterRole"
                       and d["metadata"]["name"] == "tessera-controller"]
    for rule in cluster_role["rules"]:
        if "pods" in rule["resources"]:
            assert "create" not in rule["verbs"]
            assert "delete" not in rule["verbs"]


def test_the_gate_exempts_placeholders_only_in_the_release_namespace(
        binaries: Binaries) -> None:
    (policy,) = [d for d in render(binaries) if d["kind"] == "MutatingAdmissionPolicy"]
    (condition,) = [c for c in policy["spec"]["matchConditions"]
                    if c["name"] == "not-a-placeholder"]
    assert "object.metadata.namespace != 'tessera'" in condition["expression"]
    assert "'tessera.dev/placeholder' in object.metadata.labels" in condition["expression"]


def test_nothing_on_a_gpu_node_blocks_its_scale_down(binaries: Binaries) -> None:
    """Autoscalers drain an empty node unless a pod there forbids it: the agent runs as a
    DaemonSet (drains skip those), with no disruption budget selecting it and no emptyDir."""
    docs = render(binaries)
    (daemonset,) = [d for d in docs if d["kind"] == "DaemonSet"]
    agent_labels = daemonset["spec"]["template"]["metadata"]["labels"]
    for budget in (d for d in docs if d["kind"] == "PodDisruptionBudget"):
        selector = budget["spec"]["selector"]["matchLabels"]
        assert not all(agent_labels.get(k) == v for k, v in selector.items())
    volumes = daemonset["spec"]["template"]["spec"].get("volumes") or []
    assert not [v for v in volumes if "emptyDir" in v]
