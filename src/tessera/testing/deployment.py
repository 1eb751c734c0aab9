"""Tessera deployed on a test cluster, the way the chart deploys it, for e2e tests and benchmarks.

The chart is installed with helm (CRDs, RBAC, service accounts, the admission policy) with its
workloads disabled; the controller and one agent per simulated GPU node then run as real local
processes carrying the chart's service-account tokens, so what they may do is exactly what the
chart grants. Each GPU node is a real kubelet (:class:`~tessera.testing.cluster.Node`) whose
agent drives an NVML simulator state file.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tessera.api.v1alpha1 import GROUP, VERSION
from tessera.controller.demand import GATE
from tessera.nvml.sim.server import NvmlServer
from tessera.nvml.sim.state import new_node_state
from tessera.nvml.sim.store import write_new_state_file
from tessera.testing import mps_control, nvml_library
from tessera.testing.cluster import Cluster, Node, Process

__all__ = ["CHART", "TesseraDeployment"]

CHART = Path(__file__).resolve().parents[3] / "charts" / "tessera"


def _token_kubeconfig(cluster: Cluster, core: client.CoreV1Api, namespace: str, account: str,
                      path: Path, *, bound_to: client.V1Pod | None = None) -> Path:
    """A kubeconfig with a token of ``account``; ``bound_to`` a pod, as a DaemonSet pod's
    projected token is, so that the API server adds the pod's node to the token."""
    bound = None
    if bound_to is not None:
        assert bound_to.metadata is not None
        bound = client.V1BoundObjectReference(kind="Pod", api_version="v1",
                                              name=bound_to.metadata.name,
                                              uid=bound_to.metadata.uid)
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(expiration_seconds=3600, audiences=[],
                                       bound_object_ref=bound))
    token = core.create_namespaced_service_account_token(account, namespace, request)
    assert token.status is not None
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    server = admin["clusters"][0]["cluster"]
    ca = server.get("certificate-authority-data") or base64.b64encode(
        Path(server["certificate-authority"]).read_bytes()).decode()
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": account,
        "clusters": [{"name": "test", "cluster": {"server": server["server"],
                                                  "certificate-authority-data": ca}}],
        "users": [{"name": account, "user": {"token": token.status.token}}],
        "contexts": [{"name": account, "context": {"cluster": "test", "user": account}}],
    }))
    return path


class TesseraDeployment:
    """Install with :meth:`install`; add nodes and controllers; :meth:`uninstall` at the end."""

    def __init__(self, cluster: Cluster, namespace: str = "tessera") -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.api = cluster.api_client()
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.scratch = cluster.root / "tessera"
        self.agent_kubeconfig = self.scratch / "agent.kubeconfig"
        self.controller_kubeconfig = self.scratch / "controller.kubeconfig"
        self.nodes: dict[str, Node] = {}
        self.states: dict[str, Path] = {}
        self.controllers: list[Process] = []
        self._scratch_roots: list[Path] = []
        self.drivers: dict[str, NvmlServer] = {}
        """The simulated driver of each node added with ``nvml="library"``."""

    def helm(self, *args: str) -> str:
        result = subprocess.run(
            [self.cluster.binaries["helm"], "--kubeconfig", str(self.cluster.kubeconfig),
             *args], capture_output=True, text=True, timeout=180, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"helm {' '.join(args)}: {result.stdout}{result.stderr}")
        return result.stdout

    def install(self, *settings: str) -> TesseraDeployment:
        """``settings``: more ``--set`` values, e.g. ``dra.enabled=true``."""
        extra = [arg for value in settings for arg in ("--set", value)]
        self.helm("install", "tessera", str(CHART), "--namespace", self.namespace,
                  "--create-namespace", "--set", "agent.enabled=false",
                  "--set", "controller.enabled=false", *extra, "--wait", "--timeout", "120s")
        self.cluster.wait_for_service_account(self.namespace, "tessera-agent")
        self.cluster.wait_for_service_account(self.namespace, "tessera-controller")
        self.wait_for_gate()
        self.scratch.mkdir(exist_ok=True)
        _token_kubeconfig(self.cluster, self.core, self.namespace, "tessera-agent",
                          self.agent_kubeconfig)
        _token_kubeconfig(self.cluster, self.core, self.namespace, "tessera-controller",
                          self.controller_kubeconfig)
        return self

    def wait_for_gate(self, timeout_s: float = 60.0) -> None:
        """Until the chart's admission policy gates a new GPU pod. helm's ``--wait`` does not
        cover it: the API server loads a new MutatingAdmissionPolicy and its binding through
        its own informers a moment later (0.4 to 0.9 s on an idle machine), and a pod created
        meanwhile goes to the scheduler ungated. The scheduler binds such a pod wherever a
        slice shows, while the controller counts it on the node it planned: the slice it took
        may be one the controller then pins a gated pod to, and a pinned pod cannot move.
        Asked by a server-side dry run, which runs admission and stores nothing."""
        probe: Any = {"apiVersion": "v1", "kind": "Pod",
                      "metadata": {"name": "tessera-gate-probe", "namespace": "default"},
                      "spec": {"containers": [{
                          "name": "probe", "image": "registry.invalid/probe:1",
                          "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}

        def gated() -> bool:
            created = self.core.create_namespaced_pod("default", probe, dry_run="All")
            gates = created.spec.scheduling_gates if created.spec is not None else None
            return any(g.name == GATE for g in gates or [])

        self.cluster.wait_until("the chart's admission policy to gate a GPU pod after helm "
                                "install", gated, timeout_s)

    def uninstall(self) -> None:
        for process in self.controllers:
            process.stop()
        for name in list(self.nodes):
            self.cluster.remove_node(name)
            del self.nodes[name]
            with contextlib.suppress(ApiException):
                self.core.delete_namespaced_pod(f"tessera-agent-{name}", self.namespace,
                                                grace_period_seconds=0)
            (self.scratch / f"agent-{name}.kubeconfig").unlink(missing_ok=True)
        subprocess.run([self.cluster.binaries["helm"], "--kubeconfig",
                        str(self.cluster.kubeconfig), "uninstall", "tessera", "-n",
                        self.namespace], capture_output=True, timeout=120, check=False)
        for driver in self.drivers.values():
            driver.close()
        self.drivers.clear()
        for root in self._scratch_roots:
            mps_control.kill_registered(root / "daemons")
            shutil.rmtree(root, ignore_errors=True)

    def add_gpu_node(self, name: str, labels: Mapping[str, str], models: Sequence[str],
                     *, mig: bool = False, resync_s: float = 1.0, mps: bool = False,
                     api: str = "device-plugin", dra_mps_shares: int = 4,
                     runtime: str = "fake", nvml: str = "sim") -> Node:
        """A real kubelet with ``tessera agent`` beside it on a simulated node of ``models``;
        ``mps`` gives the agent MPS, with the stand-in ``nvidia-cuda-mps-control``; ``api``
        ``dra`` runs the agent as the node's DRA driver (registered in the kubelet's plugin
        registry under its root dir) instead of its device plugins, offering GPUs without MIG
        as ``dra_mps_shares`` MPS shares when ``mps``. ``runtime``: the kubelet's, ``fake`` or
        ``containerd`` (pods then run in real containers; the agent stays a process beside
        the kubelet, with the node's own paths). ``nvml``: how the agent reaches the
        simulated cards, ``sim`` (``--nvml sim:FILE``) or ``library`` (``--nvml real``: the
        loader finds the simulated ``libnvidia-ml.so.1``, which talks to a simulator serving
        the node's state file, :attr:`drivers`, as the production path runs on a node)."""

        def start_agent(node: Node) -> None:
            kubeconfig = self.agent_kubeconfig_for(node.name)
            state = node.root / "gpus.json"
            write_new_state_file(state, new_node_state(node.name, list(models), mig=mig))
            self.states[node.name] = state
            extra: list[str] = []
            env: dict[str, str] | None = None
            spec = f"sim:{state}"
            if nvml == "library":
                socket = Path(tempfile.mkdtemp(prefix="ts-nvml-", dir="/tmp")) / "nvml.sock"
                self._scratch_roots.append(socket.parent)
                self.drivers[node.name] = NvmlServer(state, socket)
                spec = "real"
                env = {**os.environ, "LD_LIBRARY_PATH": str(nvml_library.locate().parent),
                       nvml_library.SOCKET_ENV: str(socket)}
            if mps:
                # Unix socket paths are short: the daemons' pipes live under /tmp.
                root = Path(tempfile.mkdtemp(prefix="ts-mps-", dir="/tmp"))
                self._scratch_roots.append(root)
                binary = mps_control.install(node.root / "bin")
                extra = ["--mps-root", str(root), "--mps-control", str(binary)]
                env = dict(env or os.environ)
                env[mps_control.REGISTRY_ENV] = str(root / "daemons")
            if api == "dra":
                extra += ["--api", "dra",
                          "--plugins-registry", str(node.kubelet_root_dir / "plugins_registry"),
                          "--dra-plugin-dir",
                          str(node.kubelet_root_dir / "plugins" / "gpu.tessera.dev"),
                          "--cdi-dir", str(node.containers.host_path("/var/run/cdi")
                                           if node.containers else node.root / "cdi")]
                if mps:
                    extra += ["--dra-mps-shares", str(dra_mps_shares)]
            node.spawn("agent", [
                sys.executable, "-m", "tessera.cli.main", "agent", "--node-name", node.name,
                "--kubeconfig", str(kubeconfig), "--nvml", spec,
                "--plugin-dir", str(node.device_plugin_dir),
                "--pod-resources-socket", str(node.pod_resources_socket),
                "--resync-seconds", str(resync_s), "--metrics-port", "0",
                "--log-level", "INFO", *extra], env=env)

        node = self.cluster.add_node(name, labels=labels, hooks=[start_agent], runtime=runtime)
        self.nodes[name] = node
        return node

    def restart_agent(self, node: str, *, crash: bool = True) -> Process:
        """Stop the node's agent (``crash``: SIGKILL, no clean-up of any kind) and start it
        again with the same command line."""
        owner = self.nodes[node]
        old = next(p for p in owner.processes() if p.name == f"{node}/agent" and p.alive())
        if crash:
            old.signal(signal.SIGKILL)
        old.stop()
        return owner.spawn("agent", old.argv[old.argv.index(sys.executable):])

    def agent_kubeconfig_for(self, node: str) -> Path:
        """The agent's credentials on ``node``, as the DaemonSet gives them: a token bound to
        an agent pod running there (the chart's policy confines the agent to that node)."""
        path = self.scratch / f"agent-{node}.kubeconfig"
        if path.exists():
            return path
        body = client.V1Pod(
            metadata=client.V1ObjectMeta(name=f"tessera-agent-{node}", namespace=self.namespace,
                                         labels={"app.kubernetes.io/component": "agent"}),
            spec=client.V1PodSpec(
                node_name=node, service_account_name="tessera-agent",
                tolerations=[client.V1Toleration(operator="Exists")],
                containers=[client.V1Container(name="agent", image="registry.invalid/agent:1")]))
        try:
            pod = self.core.create_namespaced_pod(self.namespace, body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            pod = self.core.read_namespaced_pod(f"tessera-agent-{node}", self.namespace)
        return _token_kubeconfig(self.cluster, self.core, self.namespace, "tessera-agent", path,
                                 bound_to=pod)

    def start_controller(self, identity: str, *extra: str) -> Process:
        process = Process(f"controller-{identity}", [
            sys.executable, "-m", "tessera.cli.main", "controller",
            "--kubeconfig", str(self.controller_kubeconfig), "--namespace", self.namespace,
            "--metrics-port", "0", "--identity", identity, "--log-level", "INFO", *extra],
            log_path=self.cluster.root / "logs" / f"controller-{identity}.log")
        self.controllers.append(process)
        return process

    def partition(self, node: str) -> dict[str, Any]:
        return cast(dict[str, Any], self.custom.get_cluster_custom_object(
            GROUP, VERSION, "nodepartitions", node))

    def reported(self, node: str) -> bool:
        """The node's agent has reported its cards."""
        try:
            return bool(self.partition(node).get("status", {}).get("gpus"))
        except ApiException:
            return False

    def create_policy(self, body: Mapping[str, Any]) -> None:
        self.custom.create_cluster_custom_object(GROUP, VERSION, "partitionpolicies",
                                                 dict(body))
