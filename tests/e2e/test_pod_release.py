"""Releasing a gated pod on the real API server (``tessera.kube.pods.Pods.release``).

From the watch's copy the release is one guarded patch; when the pod changed since that copy,
the API server refuses the guard and the release is built again from a fresh read, so a node
selector added meanwhile is kept and a gate already lifted is not lifted twice.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from tessera.kube.pods import Pods
from tessera.testing.cluster import Cluster

GATE = "example.dev/hold"
"""Not Tessera's own gate: on the test cluster the chart's admission policy lets only the
controller's service account lift that one, and what is tested here is the patch."""
PIN = {"kubernetes.io/hostname": "gpu-node-7"}


@pytest.fixture
def core(cluster: Cluster) -> Iterator[client.CoreV1Api]:
    api = cluster.api_client()
    try:
        yield client.CoreV1Api(api)
    finally:
        api.close()


class Counting:
    """CoreV1Api, counting the requests a release makes."""

    def __init__(self, core: client.CoreV1Api) -> None:
        self.core = core
        self.calls: list[str] = []

    def read_namespaced_pod(self, name: str, namespace: str) -> Any:
        self.calls.append("GET")
        return self.core.read_namespaced_pod(name, namespace)

    def patch_namespaced_pod(self, name: str, namespace: str, body: Any) -> Any:
        self.calls.append("PATCH")
        return self.core.patch_namespaced_pod(name, namespace, body)


def _gated(core: client.CoreV1Api, selector: dict[str, str] | None = None) -> dict[str, Any]:
    """A gated pod, and the raw copy a watch would have delivered of it."""
    name = f"release-{uuid.uuid4().hex[:8]}"
    spec: dict[str, Any] = {"schedulingGates": [{"name": "other.example/gate"}, {"name": GATE}],
                            "containers": [{"name": "main", "image": "registry.invalid/x:1"}]}
    if selector:
        spec["nodeSelector"] = selector
    body: Any = {"apiVersion": "v1", "kind": "Pod",
                 "metadata": {"name": name, "namespace": "default"}, "spec": spec}
    core.create_namespaced_pod("default", body)
    raw: dict[str, Any] = core.api_client.sanitize_for_serialization(
        core.read_namespaced_pod(name, "default"))
    return raw


def _pods(core: client.CoreV1Api) -> tuple[Pods, Counting]:
    pods = Pods(core.api_client)
    counting = Counting(core)
    pods._core = counting  # type: ignore[assignment]
    return pods, counting


def test_a_release_from_the_watched_copy_is_one_request(core: client.CoreV1Api) -> None:
    seen = _gated(core, selector={"team": "ml"})
    name = seen["metadata"]["name"]
    pods, counting = _pods(core)
    try:
        assert pods.release("default", name, GATE, PIN, seen=seen)
        assert counting.calls == ["PATCH"]
        live = core.read_namespaced_pod(name, "default").spec
        assert [g.name for g in live.scheduling_gates] == ["other.example/gate"]
        assert live.node_selector == {"team": "ml", **PIN}
    finally:
        core.delete_namespaced_pod(name, "default", grace_period_seconds=0)


def test_a_pod_changed_since_the_watch_is_released_from_a_fresh_read(
        core: client.CoreV1Api) -> None:
    seen = _gated(core)
    name = seen["metadata"]["name"]
    # Someone tightens the gated pod's selector after the watch delivered it: a patch built
    # from the watched copy (no selector) would replace the whole selector and lose theirs.
    core.patch_namespaced_pod(name, "default", {"spec": {"nodeSelector": {"zone": "a"}}})
    pods, counting = _pods(core)
    try:
        assert pods.release("default", name, GATE, PIN, seen=seen)
        assert counting.calls == ["PATCH", "GET", "PATCH"]  # refused, read, released
        live = core.read_namespaced_pod(name, "default").spec
        assert live.node_selector == {"zone": "a", **PIN}
        assert [g.name for g in live.scheduling_gates] == ["other.example/gate"]
        # Released already: a second release from the same old copy changes nothing.
        assert not pods.release("default", name, GATE, PIN, seen=seen)
        assert core.read_namespaced_pod(name, "default").spec.node_selector == {
            "zone": "a", **PIN}
    finally:
        core.delete_namespaced_pod(name, "default", grace_period_seconds=0)


def test_a_pod_gone_is_not_released(core: client.CoreV1Api) -> None:
    seen = _gated(core)
    name = seen["metadata"]["name"]
    core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
    pods, counting = _pods(core)
    assert not pods.release("default", name, GATE, PIN, seen=seen)
    assert counting.calls == ["PATCH"]
