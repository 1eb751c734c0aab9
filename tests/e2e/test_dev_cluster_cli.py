"""``tessera dev cluster up --detach`` / ``down``, as a developer runs them, in subprocesses."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config

from tessera.testing.cluster import Binaries, listening_ports, pid_alive
from tessera.testing.cluster._containerd import shims
from tessera.testing.cluster.fixtures import require_real_runtime
from tests.e2e._util import eventually


def _tessera(*args: str, bin_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tessera.cli.main", "dev", "cluster", *args],
                          capture_output=True, text=True, timeout=100, check=False,
                          env={**os.environ, "TESSERA_K8S_BIN": str(bin_dir)})


@pytest.fixture
def state_dir(cluster_binaries: Binaries) -> Iterator[Path]:
    """A short folder (node sockets live under it), always brought down afterwards."""
    directory = Path(tempfile.mkdtemp(prefix="tdc-", dir="/tmp"))
    yield directory
    _tessera("down", "--dir", str(directory), bin_dir=cluster_binaries.directory)


def test_up_detach_serves_kubectl_and_down_leaves_nothing(
        state_dir: Path, cluster_binaries: Binaries) -> None:
    up = _tessera("up", "--detach", "--dir", str(state_dir), "--nodes", "1",
                  bin_dir=cluster_binaries.directory)
    assert up.returncode == 0, up.stderr
    kubeconfig = state_dir / "kubeconfig"
    assert f"KUBECONFIG={kubeconfig}" in up.stdout
    state = json.loads((state_dir / "state.json").read_text())
    pids = [state["supervisor_pid"], *state["pids"].values()]
    ports = set(state["ports"].values())
    assert len(state["pids"]) == 6  # 4 control-plane processes, a kubelet and its runtime

    api = config.new_client_from_config(config_file=str(kubeconfig))
    try:
        nodes = client.CoreV1Api(api).list_node().items
    finally:
        api.close()
    assert [n.metadata.name for n in nodes] == ["tessera-node-1"]

    down = _tessera("down", "--dir", str(state_dir), bin_dir=cluster_binaries.directory)
    assert down.returncode == 0, down.stderr
    assert "leftover" not in down.stdout  # the owner stopped everything itself
    assert [pid for pid in pids if pid_alive(pid)] == []
    assert ports & listening_ports() == set()
    assert not state_dir.exists()


def test_killing_the_owner_kills_every_component(
        state_dir: Path, cluster_binaries: Binaries) -> None:
    """SIGKILL runs no Python cleanup: only the parent-death signal stops the components."""
    up = _tessera("up", "--detach", "--dir", str(state_dir), "--nodes", "0",
                  bin_dir=cluster_binaries.directory)
    assert up.returncode == 0, up.stderr
    state = json.loads((state_dir / "state.json").read_text())
    components = list(state["pids"].values())
    assert len(components) == 4
    os.kill(state["supervisor_pid"], signal.SIGKILL)
    eventually(lambda: not [pid for pid in components if pid_alive(pid)], 10,
               "every component to die with its owner")
    eventually(lambda: not set(state["ports"].values()) & listening_ports(), 10,
               "every port to close")


def test_up_with_containerd_runs_a_real_container_and_down_leaves_no_shim(
        state_dir: Path, cluster_binaries: Binaries) -> None:
    """``--runtime containerd``: the node's pods run in real containers (Tessera's image,
    imported into the node's containerd), and ``down`` stops them too (their runc shims
    outlive containerd by design)."""
    _, images = require_real_runtime()
    up = _tessera("up", "--detach", "--dir", str(state_dir), "--nodes", "1", "--runtime",
                  "containerd", bin_dir=cluster_binaries.directory)
    assert up.returncode == 0, up.stderr
    api = config.new_client_from_config(config_file=str(state_dir / "kubeconfig"))
    try:
        core = client.CoreV1Api(api)
        core.create_namespaced_pod("default", {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "hello"},
            "spec": {"nodeName": "tessera-node-1", "restartPolicy": "Never",
                     "containers": [{"name": "hello", "image": images.image,
                                     "imagePullPolicy": "Never",
                                     "command": ["/bin/sh", "-c", "echo hello; sleep 600"]}]}})
        eventually(lambda: core.read_namespaced_pod("hello", "default").status.phase
                   == "Running", 60, "the pod Running in a real container")
        (status,) = core.read_namespaced_pod("hello", "default").status.container_statuses
        assert status.container_id.startswith("containerd://")
    finally:
        api.close()
    assert shims(state_dir), "the container's runc shim runs"
    down = _tessera("down", "--dir", str(state_dir), bin_dir=cluster_binaries.directory)
    assert down.returncode == 0, down.stderr
    assert shims(state_dir) == []

