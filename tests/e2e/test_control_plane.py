"""The control plane itself: it serves, reports the pinned version, and leaves nothing behind."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from kubernetes import client

from tessera.testing.cluster import (
    KUBERNETES_VERSION,
    Binaries,
    Cluster,
    listening_ports,
    live,
    pid_alive,
)


def test_control_plane_serves_the_pinned_version(cluster: Cluster) -> None:
    api = cluster.api_client()
    try:
        version = client.VersionApi(api).get_code()
        # Without the -X ldflags the server says v0.0.0 and Helm's kubeVersion checks break.
        assert version.git_version == KUBERNETES_VERSION
        assert (version.major, version.minor) == ("1", "37")
        # The controller manager is working: it made the default service account.
        client.CoreV1Api(api).read_namespaced_service_account("default", "default")
    finally:
        api.close()
    assert {"etcd", "kube-apiserver", "controllers", "total"} <= set(cluster.timings)
    assert all(p.alive() for p in cluster.processes())


def test_admin_is_cluster_admin_and_rbac_is_enforced(cluster: Cluster) -> None:
    api = cluster.api_client()
    try:
        review = client.AuthorizationV1Api(api).create_self_subject_access_review(
            client.V1SelfSubjectAccessReview(spec=client.V1SelfSubjectAccessReviewSpec(
                resource_attributes=client.V1ResourceAttributes(verb="*", resource="*"))))
        assert review.status.allowed
        # The scheduler's identity is bound by RBAC's bootstrap policy, not an admin.
        denied = client.AuthorizationV1Api(api).create_subject_access_review(
            client.V1SubjectAccessReview(spec=client.V1SubjectAccessReviewSpec(
                user="system:kube-scheduler",
                resource_attributes=client.V1ResourceAttributes(
                    verb="delete", resource="namespaces"))))
        assert not denied.status.allowed
    finally:
        api.close()


def test_stop_leaves_no_process_port_or_folder_even_after_a_failure(
        cluster_binaries: Binaries) -> None:
    """A second, short-lived control plane, stopped by an exception inside ``with``."""
    other = Cluster(binaries=cluster_binaries)
    pids: list[int] = []
    ports: set[int] = set()

    def fail_while_running() -> None:
        nonlocal pids, ports
        with other:
            pids = [p.pid for p in other.processes()]
            ports = set(other.ports().values())
            assert ports <= listening_ports()
            raise RuntimeError("test failure")

    with pytest.raises(RuntimeError, match="test failure"):
        fail_while_running()
    assert len(pids) == 4
    assert [pid for pid in pids if pid_alive(pid)] == []
    assert ports & listening_ports() == set()
    assert not other.root.exists()
    assert [p for p in live() if p.pid in pids] == []


def test_helm_installs_a_chart_that_requires_this_kubernetes_version(
        cluster: Cluster, tmp_path: Path) -> None:
    """Helm checks ``kubeVersion`` against what the server reports: the -X version flags."""
    chart = tmp_path / "smoke"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text(
        "apiVersion: v2\nname: smoke\nversion: 0.1.0\nkubeVersion: '>= 1.37.0-0'\n")
    (chart / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: helm-smoke}\ndata: {ok: 'yes'}\n")
    helm = [cluster.binaries["helm"], "--kubeconfig", str(cluster.kubeconfig),
            "--namespace", "default"]
    env = {**os.environ, "HELM_CACHE_HOME": str(tmp_path / "cache"),
           "HELM_CONFIG_HOME": str(tmp_path / "config"),
           "HELM_DATA_HOME": str(tmp_path / "data")}
    installed = subprocess.run([*helm, "install", "smoke", str(chart)], env=env,
                               capture_output=True, text=True, timeout=60, check=False)
    assert installed.returncode == 0, installed.stderr
    api = cluster.api_client()
    try:
        config_map = client.CoreV1Api(api).read_namespaced_config_map("helm-smoke", "default")
        assert config_map.data == {"ok": "yes"}
    finally:
        api.close()
        subprocess.run([*helm, "uninstall", "smoke"], env=env, capture_output=True,
                       timeout=60, check=False)
