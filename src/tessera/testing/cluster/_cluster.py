"""A real Kubernetes control plane on loopback, and simulated GPU nodes that are real kubelets.

Why real components and not an HTTP fake: the controller, the agent's Kubernetes side, the chart
and RBAC must meet the API server's validation, admission, authorization and the scheduler and
kubelet device manager as they are; a fake would only agree with what we already believe. The
binaries come from their published Go modules at pinned versions (``tools/k8s/``).

Layout of a cluster's root directory (kept short: Unix socket paths must fit in 107 bytes)::

    ROOT/pki/          CA, serving and client certificates, service-account key
    ROOT/etcd/         etcd data
    ROOT/*.kubeconfig  one per identity; admin.kubeconfig is for tests and kubectl
    ROOT/logs/         one log per control-plane process
    ROOT/NODE/         per node: device-plugins/, root/ (kubelet --root-dir), cri.sock, logs/

A node's kubelet runs in its own mount namespace with ``NODE/device-plugins`` bind-mounted over
the hard-coded ``/var/lib/kubelet/device-plugins``, so several kubelets coexist on one machine
and a node's device plugins (outside) use ``NODE/device-plugins`` directly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import http.client
import json
import os
import shutil
import socket
import ssl
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from tessera.core.errors import TesseraError
from tessera.kubelet.plugins import socket_id
from tessera.testing.cluster import _pki, _process
from tessera.testing.cluster._cache import keyed_dir
from tessera.testing.cluster._containerd import NODE_IP, ContainerdBinaries, Images, Runtime
from tessera.testing.cluster._process import Process

KUBERNETES_VERSION = "v1.37.2"
"""The version ``tools/k8s/go.mod`` pins; the binary cache directory is named after it."""

BINARY_NAMES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler",
                "kubelet", "fakecri", "helm")

BIN_DIR_ENV = "TESSERA_K8S_BIN"
"""Environment variable naming another directory that holds the binaries."""

KEEP_ENV = "TESSERA_KEEP_CLUSTER"
"""Set to 1 to keep a stopped cluster's root directory (certificates, logs) for debugging."""

DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
"""Where every kubelet looks for plugins; it cannot be configured, hence the mount namespace."""

NOT_READY_TAINT = "node.kubernetes.io/not-ready"

_REPO_ROOT = Path(__file__).resolve().parents[4]


class ClusterError(TesseraError):
    """The test cluster could not start, or a component died; the message has its log tail."""


class BinariesMissingError(ClusterError):
    """The Go-built binaries are not there; ``make cluster-bins`` builds them."""


class PortTakenError(ClusterError):
    """A component could not bind its port: something else took it between :func:`free_ports`
    choosing it and the component binding it. Start-up retries with fresh ports."""


PORT_ATTEMPTS = 3
"""How often start-up picks fresh ports after a :class:`PortTakenError`."""


def cache_bin_dir() -> Path:
    """Where ``make cluster-bins`` puts the binaries: outside the checkout, keyed by the content
    of ``tools/k8s`` (the same key the Makefile computes), so every clone on a machine shares
    one build."""
    tools = _REPO_ROOT / "tools" / "k8s"
    sources = [tools / "go.mod", tools / "go.sum", tools / "build.sh", tools / "tools.go",
               *sorted(tools.glob("cmd/*/*.go"), key=str)]
    cache = Path(os.environ.get("CLUSTER_CACHE", Path.home() / ".cache" / "tessera" / "k8s"))
    return keyed_dir(cache, KUBERNETES_VERSION, sources)


def default_bin_dir() -> Path:
    """``$TESSERA_K8S_BIN``, else the shared cache (:func:`cache_bin_dir`), else
    ``tools/k8s/bin/<version>`` in this checkout."""
    override = os.environ.get(BIN_DIR_ENV)
    if override:
        return Path(override)
    with contextlib.suppress(OSError):
        cached = cache_bin_dir()
        if (cached / ".built").exists():
            return cached
    return _REPO_ROOT / "tools" / "k8s" / "bin" / KUBERNETES_VERSION


@dataclasses.dataclass(frozen=True)
class Binaries:
    """The directory holding the seven binaries ``tools/k8s/build.sh`` builds."""

    directory: Path

    @classmethod
    def locate(cls, directory: Path | None = None) -> Binaries:
        """The binaries in ``directory`` (default :func:`default_bin_dir`), all present, or
        :class:`BinariesMissingError` naming the missing ones and the command that builds them."""
        found = cls(directory or default_bin_dir())
        missing = found.missing()
        if missing:
            raise BinariesMissingError(
                f"{found.directory}: missing {', '.join(missing)}; build them with "
                f"`make cluster-bins` (10-25 minutes on 2 cores the first time)")
        return found

    def missing(self) -> list[str]:
        return [n for n in BINARY_NAMES if not os.access(self.directory / n, os.X_OK)]

    def __getitem__(self, name: str) -> str:
        return str(self.directory / name)


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports that were free a moment ago on 127.0.0.1.

    All sockets stay bound until every port is chosen, so the ports are distinct; another
    process may still take one before our component binds it, which start-up then reports.
    """
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind(("127.0.0.1", 0))
            ports.append(sock.getsockname()[1])
        return ports


def _wait(what: str, check: Callable[[], bool], timeout: float,
          watch: Sequence[Process] = (), interval: float = 0.1) -> float:
    """Poll ``check`` until it is true; returns the seconds it took. Fails early, with the log
    tail, if a process in ``watch`` exits meanwhile."""
    start = time.monotonic()
    deadline = start + timeout
    while True:
        for process in watch:
            if not process.alive():
                error = (PortTakenError if "address already in use" in process.log_tail()
                         else ClusterError)
                raise error(
                    f"{process.name} exited with status {process.poll()} while waiting for "
                    f"{what}; log {process.log_path}:\n{process.log_tail()}")
        try:
            if check():
                return time.monotonic() - start
        except (OSError, http.client.HTTPException):
            pass
        if time.monotonic() > deadline:
            tails = "".join(f"\n--- {p.name} ({p.log_path}):\n{p.log_tail(15)}" for p in watch)
            raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what}{tails}")
        time.sleep(interval)


def _https_get(host: str, port: int, path: str, context: ssl.SSLContext) -> tuple[int, str]:
    conn = http.client.HTTPSConnection(host, port, context=context, timeout=2)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read().decode(errors="replace")
    finally:
        conn.close()


def _http_get(host: str, port: int, path: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection(host, port, timeout=2)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read().decode(errors="replace")
    finally:
        conn.close()


def write_kubeconfig(path: Path, server: str, ca: Path, *, cert: Path, key: Path,
                     user: str) -> Path:
    """A kubeconfig with absolute paths to its certificate files (works for kubectl as is)."""
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "tessera-test",
        "clusters": [{"name": "tessera-test",
                      "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": user,
                   "user": {"client-certificate": str(cert), "client-key": str(key)}}],
        "contexts": [{"name": "tessera-test",
                      "context": {"cluster": "tessera-test", "user": user}}],
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path


class NodeHook(Protocol):
    """Called once a node is Ready, to start what runs beside its kubelet.

    This is where ``tessera agent`` (with the NVML simulator) will be started for each node:
    ``node.spawn("agent", ["tessera", "agent", "--node", node.name, "--plugin-dir",
    str(node.device_plugin_dir), ...])``; spawned processes stop with the node.
    """

    def __call__(self, node: Node) -> None: ...


class Node:
    """A simulated GPU node: a real kubelet on its own fake container runtime, or (with a
    :class:`~tessera.testing.cluster._containerd.Runtime`) on its own containerd, where pods
    run in real containers.

    Nothing here knows about GPUs: whatever registers device plugins in
    :attr:`device_plugin_dir` (a test, the agent, or the chart's agent DaemonSet) makes it a
    GPU node.
    """

    def __init__(self, cluster: Cluster, name: str, root: Path, kubelet_port: int,
                 labels: Mapping[str, str], *, runtime: Runtime | None = None) -> None:
        self.cluster = cluster
        self.name = name
        self.root = root
        self.kubelet_port = kubelet_port
        self.labels = dict(labels)
        self.containers = runtime
        """The node's containerd; None on the fake runtime."""
        if runtime is None:
            self.device_plugin_dir = root / "device-plugins"
            """Bind-mounted over the kubelet's ``/var/lib/kubelet/device-plugins``."""
            self.kubelet_root_dir = root / "root"
            self.cri_socket = root / "cri.sock"
        else:
            self.device_plugin_dir = runtime.host_path(DEVICE_PLUGIN_DIR)
            self.kubelet_root_dir = runtime.host_path("/var/lib/kubelet")
            self.cri_socket = runtime.socket
        self.pod_resources_socket = self.kubelet_root_dir / "pod-resources" / "kubelet.sock"
        """The kubelet's PodResources v1 endpoint."""
        self.containers_file = root / "containers.jsonl"
        """One JSON line per container the kubelet created (see :meth:`created_containers`)."""
        self.kubeconfig = root / "kubelet.kubeconfig"
        self.config_file = root / "kubelet.yaml"
        self.logs = root / "logs"
        self._work_dir = root / "work"
        self.runtime: Process | None = None
        self.kubelet: Process | None = None
        self.kubelet_starts = 0
        self.ready_in_s: float | None = None
        """Seconds from the kubelet's first start to the Node being Ready."""
        self._spawned: list[Process] = []

    def __repr__(self) -> str:
        return f"Node({self.name!r}, root={str(self.root)!r})"

    @property
    def kubelet_socket(self) -> Path:
        """Where device plugins call ``Register``."""
        return self.device_plugin_dir / "kubelet.sock"

    def processes(self) -> tuple[Process, ...]:
        return tuple(p for p in (*self._spawned, self.kubelet, self.runtime) if p is not None)

    # --- lifecycle ------------------------------------------------------------------------

    def _prepare(self) -> None:
        for folder in (self.device_plugin_dir, self.kubelet_root_dir, self.logs,
                       self._work_dir, self.root / "pod-logs", self.root / "certs"):
            folder.mkdir(parents=True, exist_ok=True)
        c = self.cluster
        files = c.ca.issue(f"node-{self.name}", f"system:node:{self.name}",
                           organizations=("system:nodes",))
        write_kubeconfig(self.kubeconfig, c.server, c.ca.files.cert, cert=files.cert,
                         key=files.key, user=f"system:node:{self.name}")
        endpoint = f"unix://{self.cri_socket}"
        settings: dict[str, Any] = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "failSwapOn": False,
            "failCgroupV1": False,  # CI machines here still run cgroup v1
            # No QoS cgroup hierarchy of its own: on the fake runtime nothing runs, and on
            # containerd each container still gets its own cgroups (runc, cgroupfs driver).
            "cgroupsPerQOS": False,
            "enforceNodeAllocatable": [],
            "cgroupDriver": "cgroupfs",
            "containerRuntimeEndpoint": endpoint,
            "imageServiceEndpoint": endpoint,
            "authentication": {"x509": {"clientCAFile": str(c.ca.files.cert)},
                               "anonymous": {"enabled": False},
                               "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "address": "127.0.0.1",
            "port": self.kubelet_port,
            "readOnlyPort": 0,
            "healthzPort": 0,
            "resolvConf": "",
            "localStorageCapacityIsolation": False,
            "podLogsDir": str(self.root / "pod-logs"),
            "nodeStatusUpdateFrequency": c.node_status_update_frequency,
            "nodeStatusReportFrequency": c.node_status_update_frequency,
            "syncFrequency": "5s",
        }
        self.config_file.write_text(yaml.safe_dump(settings, sort_keys=False))

    def _start_runtime(self) -> None:
        if self.containers is not None:
            self.runtime = self.containers.start(self.logs, self.cluster.ports()["apiserver"])
            return
        self.runtime = Process(
            f"{self.name}/fakecri",
            [self.cluster.binaries["fakecri"], "-log-dir", str(self.root / "container-logs"),
             "-record", str(self.containers_file), str(self.cri_socket)],
            log_path=self.logs / "fakecri.log")
        _wait(f"{self.name}'s fake runtime socket", self.cri_socket.is_socket, 10,
              [self.runtime])

    def _start_kubelet(self) -> None:
        kubelet = [
            self.cluster.binaries["kubelet"],
            "--kubeconfig", str(self.kubeconfig),
            "--config", str(self.config_file),
            "--root-dir", str(self.kubelet_root_dir) if self.containers is None
            else "/var/lib/kubelet",
            "--cert-dir", str(self.root / "certs"),
            # No --node-ip 127.0.0.1: the kubelet refuses a loopback node IP and then skips
            # some node status fields; it reports the host's address instead.
            "--hostname-override", self.name,
        ]
        if self.labels:
            kubelet += ["--node-labels", ",".join(f"{k}={v}" for k, v in self.labels.items())]
        if self.containers is not None:
            # containerd's namespaces: the node's paths are bound there, its network is the
            # node's own (the API server relayed in on loopback).
            argv = ["nsenter", f"--mount={self.containers.mount_namespace}",
                    f"--net={self.containers.network_namespace}", "--", *kubelet,
                    "--node-ip", NODE_IP]
        else:
            # $0 is the plugin folder, "$@" the kubelet's command line: nothing to quote.
            script = (f'mkdir -p {DEVICE_PLUGIN_DIR} && mount --bind "$0" {DEVICE_PLUGIN_DIR} '
                      '&& exec "$@"')
            argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script,
                    str(self.device_plugin_dir), *kubelet]
        self.kubelet_starts += 1
        self.kubelet = Process(f"{self.name}/kubelet", argv, cwd=self._work_dir,
                               log_path=self.logs / f"kubelet.{self.kubelet_starts}.log")

    def start(self, timeout: float = 60.0) -> None:
        """Start the runtime and kubelet; return once the Node is Ready and schedulable."""
        self._prepare()
        self._start_runtime()
        started = time.monotonic()
        self._start_kubelet()
        self.wait_ready(timeout)
        self.ready_in_s = time.monotonic() - started
        self.untaint()

    def wait_ready(self, timeout: float = 60.0, *, since: datetime.datetime | None = None
                   ) -> float:
        """Wait until the Node's Ready condition is True (with a heartbeat at or after
        ``since``, when given, so a restarted kubelet is known to be reporting again)."""
        watch = [p for p in (self.kubelet, self.runtime) if p is not None]
        return _wait(f"node {self.name} Ready", lambda: self._ready(since), timeout, watch,
                     interval=0.2)

    def _ready(self, since: datetime.datetime | None) -> bool:
        node = self.cluster.get_node(self.name)
        if node is None:
            return False
        for condition in node.get("status", {}).get("conditions", []):
            if condition.get("type") == "Ready" and condition.get("status") == "True":
                if since is None:
                    return True
                beat = datetime.datetime.fromisoformat(condition["lastHeartbeatTime"])
                return beat >= since.replace(microsecond=0)
        return False

    def untaint(self) -> None:
        """Remove the not-ready taint that admission puts on every new Node; nothing else
        would, since the node-lifecycle controller is off (it would also evict pods whenever a
        test stops a kubelet)."""
        node = self.cluster.get_node(self.name) or {}
        taints = node.get("spec", {}).get("taints") or []
        kept = [t for t in taints if t.get("key") != NOT_READY_TAINT]
        if len(kept) != len(taints):
            self.cluster.core_v1().patch_node(self.name, {"spec": {"taints": kept or None}})

    def created_containers(self) -> list[dict[str, Any]]:
        """Every CreateContainer the runtime received, oldest first: ``containerId``,
        ``namespace``, ``pod``, ``container``, ``envs``, ``mounts``, ``devices``,
        ``cdiDevices``, ``annotations``. This is what device plugins' Allocate responses
        turned into, as a real runtime would have been told."""
        try:
            lines = self.containers_file.read_text().splitlines()
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in lines if line.strip()]

    def stop_kubelet(self) -> None:
        """Stop only the kubelet (the runtime and its 'containers' stay, as on a real node)."""
        if self.kubelet is not None:
            self.kubelet.stop()

    def restart_kubelet(self, *, wait_ready: bool = True, timeout: float = 60.0) -> None:
        """Stop and start the kubelet, as a node upgrade or crash would.

        The new kubelet deletes every socket in :attr:`device_plugin_dir` and re-creates
        ``kubelet.sock``; plugins must notice and register again. Returns once the new
        ``kubelet.sock`` exists and (with ``wait_ready``) the new kubelet has reported Ready.
        """
        sock = str(self.kubelet_socket)
        old = socket_id(sock)
        self.stop_kubelet()
        since = datetime.datetime.now(datetime.UTC)
        self._start_kubelet()
        assert self.kubelet is not None
        _wait(f"{self.name}'s new kubelet.sock",
              lambda: self.kubelet_socket.is_socket() and socket_id(sock) != old,
              timeout, [self.kubelet])
        if wait_ready:
            self.wait_ready(timeout, since=since)

    def spawn(self, name: str, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
              cwd: Path | None = None) -> Process:
        """Start a process that belongs to this node (the agent); it stops before the kubelet
        when the node or cluster stops, and its log is ``logs/NAME.log``."""
        process = Process(f"{self.name}/{name}", argv, log_path=self.logs / f"{name}.log",
                          env=env, cwd=cwd or self.root)
        self._spawned.append(process)
        return process

    def stop(self) -> None:
        """Stop everything of this node: spawned processes, then kubelet, then runtime."""
        _process.stop_all(list(self._spawned))
        self.stop_kubelet()
        if self.containers is not None:
            self.containers.stop()
        elif self.runtime is not None:
            self.runtime.stop()

    def memory_mib(self) -> dict[str, float]:
        """Resident memory per process of this node."""
        return {p.name: _process.rss_mib(p.pid) for p in self.processes() if p.alive()}


def _folder(node: str) -> str:
    """A node's folder name: the node's own when short; a long one (an autoscaler's generated
    name) is cut and given a digest, so socket paths under it stay within the 107 bytes a
    Unix socket path may have."""
    if len(node) <= 24:
        return node
    return f"{node[:15]}-{hashlib.sha256(node.encode()).hexdigest()[:8]}"


class Cluster:
    """etcd, kube-apiserver, kube-controller-manager and kube-scheduler on 127.0.0.1, plus
    nodes added with :meth:`add_node`. Use as a context manager, or call :meth:`start` and
    (always, in a ``finally``) :meth:`stop`::

        with Cluster() as cluster:
            node = cluster.add_node("gpu-node-1")
            cluster.core_v1().list_node()
            # device plugins register at node.kubelet_socket; pods land on the node

    ``root`` defaults to a fresh folder under /tmp, removed by :meth:`stop` unless
    ``keep_root`` (or ``$TESSERA_KEEP_CLUSTER=1``).
    """

    def __init__(self, root: Path | None = None, *, binaries: Binaries | None = None,
                 node_status_update_frequency: str = "1s", keep_root: bool | None = None,
                 service_cluster_ip_range: str = "10.96.0.0/16") -> None:
        self.binaries = binaries or Binaries.locate()
        self._own_root = root is None
        self.root = root or Path(tempfile.mkdtemp(prefix="tsc-", dir="/tmp"))
        self.keep_root = (os.environ.get(KEEP_ENV) == "1") if keep_root is None else keep_root
        self.node_status_update_frequency = node_status_update_frequency
        self.service_cluster_ip_range = service_cluster_ip_range
        self.nodes: dict[str, Node] = {}
        self.timings: dict[str, float] = {}
        """Seconds per start-up phase: etcd, kube-apiserver, controllers, total."""
        self.etcd: Process | None = None
        self.apiserver: Process | None = None
        self.controller_manager: Process | None = None
        self.scheduler: Process | None = None
        self._ports: dict[str, int] = {}
        self._api: Any = None
        self._started = False
        self._stopped = False
        self._ssl: ssl.SSLContext | None = None

    # --- addresses ------------------------------------------------------------------------

    @property
    def server(self) -> str:
        """The API server's URL."""
        return f"https://127.0.0.1:{self._ports['apiserver']}"

    @property
    def kubeconfig(self) -> Path:
        """Admin (``system:masters``) kubeconfig, usable by kubectl, helm and the client."""
        return self.root / "admin.kubeconfig"

    def ports(self) -> dict[str, int]:
        """Every TCP port the control plane and the nodes listen on, by owner."""
        ports = dict(self._ports)
        for node in self.nodes.values():
            ports[f"{node.name}/kubelet"] = node.kubelet_port
        return ports

    def processes(self) -> tuple[Process, ...]:
        """Every process started for this cluster, nodes first, etcd last."""
        own = (self.scheduler, self.controller_manager, self.apiserver, self.etcd)
        nodes = tuple(p for n in self.nodes.values() for p in n.processes())
        return nodes + tuple(p for p in own if p is not None)

    def memory_mib(self) -> dict[str, float]:
        """Resident memory (MiB) of every running process of this cluster, by name."""
        return {p.name: _process.rss_mib(p.pid) for p in self.processes() if p.alive()}

    # --- API access -----------------------------------------------------------------------

    def api_client(self) -> Any:
        """A new ``kubernetes.client.ApiClient`` for the admin kubeconfig."""
        return config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=str(self.kubeconfig))

    def core_v1(self) -> Any:
        """A ``CoreV1Api`` on a client shared by this cluster's own calls."""
        if self._api is None:
            self._api = self.api_client()
        return client.CoreV1Api(self._api)

    def get_node(self, name: str) -> dict[str, Any] | None:
        """The Node object as plain JSON, or None if it does not exist (yet)."""
        try:
            response = self.core_v1().read_node(name, _preload_content=False)
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        node: dict[str, Any] = json.loads(response.data)
        return node

    def wait_until(self, what: str, check: Callable[[], bool], timeout: float = 30.0) -> float:
        """Poll ``check`` until it is true, failing early with its log if the API server exits
        meanwhile; the seconds it took. For what only the API server settles (an admission
        policy loaded, an object defaulted)."""
        return _wait(what, check, timeout, [p for p in (self.apiserver,) if p is not None])

    def wait_for_service_account(self, namespace: str, name: str = "default",
                                 timeout: float = 30.0) -> None:
        """Wait until the controller manager has created ``namespace``'s service account;
        admission refuses pods that name a service account that does not exist yet."""
        def exists() -> bool:
            try:
                self.core_v1().read_namespaced_service_account(name, namespace)
            except ApiException as error:
                if error.status == 404:
                    return False
                raise
            return True

        _wait(f"service account {namespace}/{name}", exists, timeout,
              [p for p in (self.controller_manager,) if p is not None])

    # --- lifecycle ------------------------------------------------------------------------

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 60.0) -> Cluster:
        """Start the control plane and wait until it serves; on any failure everything
        started so far is stopped before the error propagates."""
        if self._started:
            return self
        self._started = True
        begin = time.monotonic()
        try:
            self._pki()
            for attempt in range(1, PORT_ATTEMPTS + 1):
                names = ("etcd", "etcd-peer", "apiserver", "controller-manager", "scheduler")
                self._ports = dict(zip(names, free_ports(len(names)), strict=True))
                try:
                    self._start_etcd(timeout)
                    self._start_apiserver(timeout)
                    self._start_controllers(timeout)
                    break
                except PortTakenError:
                    if attempt == PORT_ATTEMPTS:
                        raise
                    self._stop_control_plane()
                    shutil.rmtree(self.root / "etcd", ignore_errors=True)
        except BaseException:
            self.stop()
            raise
        self.timings["total"] = time.monotonic() - begin
        return self

    def _stop_control_plane(self) -> None:
        _process.stop_all([p for p in (self.scheduler, self.controller_manager) if p])
        for process in (self.apiserver, self.etcd):
            if process is not None:
                process.stop()
        self.scheduler = self.controller_manager = self.apiserver = self.etcd = None

    def _pki(self) -> None:
        pki = self.root / "pki"
        self.ca = _pki.CertificateAuthority(pki)
        self._sa_key = _pki.write_signing_key(pki / "service-account.key")
        self._serving = self.ca.issue("apiserver", "kube-apiserver", server_hosts=(
            "127.0.0.1", "localhost", "kubernetes", "kubernetes.default",
            "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"))
        self._kubelet_client = self.ca.issue("apiserver-kubelet-client",
                                             "kube-apiserver-kubelet-client",
                                             organizations=("system:masters",))
        self._identities = {
            "admin": ("tessera-admin", ("system:masters",)),
            "controller-manager": ("system:kube-controller-manager", ()),
            "scheduler": ("system:kube-scheduler", ()),
        }
        self._ssl = ssl.create_default_context(cafile=str(self.ca.files.cert))
        self._admin = self.ca.issue("admin", "tessera-admin", organizations=("system:masters",))
        self._ssl.load_cert_chain(str(self._admin.cert), str(self._admin.key))

    def _kubeconfig_for(self, identity: str) -> Path:
        user, groups = self._identities[identity]
        files = self.ca.issue(identity, user, organizations=groups)
        return write_kubeconfig(self.root / f"{identity}.kubeconfig", self.server,
                                self.ca.files.cert, cert=files.cert, key=files.key, user=user)

    def _log(self, name: str) -> Path:
        return self.root / "logs" / f"{name}.log"

    def _start_etcd(self, timeout: float) -> None:
        client = f"http://127.0.0.1:{self._ports['etcd']}"
        peer = f"http://127.0.0.1:{self._ports['etcd-peer']}"
        began = time.monotonic()
        self.etcd = Process("etcd", [
            self.binaries["etcd"], "--name", "default", "--data-dir", str(self.root / "etcd"),
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"default={peer}",
            "--unsafe-no-fsync",  # a throw-away store: durability buys nothing, fsync costs
            "--log-level", "warn",
        ], log_path=self._log("etcd"))
        port = self._ports["etcd"]
        _wait("etcd /health", lambda: '"health":"true"' in _http_get("127.0.0.1", port,
                                                                      "/health")[1],
              timeout, [self.etcd])
        self.timings["etcd"] = time.monotonic() - began

    def _start_apiserver(self, timeout: float) -> None:
        began = time.monotonic()
        self.apiserver = Process("kube-apiserver", [
            self.binaries["kube-apiserver"],
            "--etcd-servers", f"http://127.0.0.1:{self._ports['etcd']}",
            "--bind-address", "127.0.0.1",
            "--advertise-address", "127.0.0.1",
            "--secure-port", str(self._ports["apiserver"]),
            "--cert-dir", str(self.root / "apiserver"),
            "--tls-cert-file", str(self._serving.cert),
            "--tls-private-key-file", str(self._serving.key),
            "--client-ca-file", str(self.ca.files.cert),
            "--kubelet-client-certificate", str(self._kubelet_client.cert),
            "--kubelet-client-key", str(self._kubelet_client.key),
            "--service-account-key-file", str(self._sa_key),
            "--service-account-signing-key-file", str(self._sa_key),
            "--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
            "--authorization-mode", "Node,RBAC",
            "--enable-admission-plugins", "NodeRestriction",
            "--service-cluster-ip-range", self.service_cluster_ip_range,
            "--allow-privileged",
            # The `kubernetes` Service would get 127.0.0.1 as endpoint, which validation
            # refuses; nothing here runs inside the cluster to use it.
            "--endpoint-reconciler-type", "none",
            "--profiling=false",
        ], log_path=self._log("kube-apiserver"))
        assert self._ssl is not None
        context, port = self._ssl, self._ports["apiserver"]
        _wait("kube-apiserver /readyz",
              lambda: _https_get("127.0.0.1", port, "/readyz", context) == (200, "ok"),
              timeout, [self.apiserver, self.etcd] if self.etcd else [self.apiserver],
              interval=0.1)
        self.timings["kube-apiserver"] = time.monotonic() - began
        write_kubeconfig(self.kubeconfig, self.server, self.ca.files.cert,
                         cert=self._admin.cert, key=self._admin.key, user="tessera-admin")

    def _start_controllers(self, timeout: float) -> None:
        began = time.monotonic()
        kcm_config = str(self._kubeconfig_for("controller-manager"))
        self.controller_manager = Process("kube-controller-manager", [
            self.binaries["kube-controller-manager"],
            "--kubeconfig", kcm_config,
            "--authentication-kubeconfig", kcm_config,
            "--authorization-kubeconfig", kcm_config,
            "--bind-address", "127.0.0.1",
            "--secure-port", str(self._ports["controller-manager"]),
            # No node IPAM (pods get no CIDR; nothing runs) and no node lifecycle (it would
            # evict pods and taint nodes whenever a test stops a kubelet).
            "--controllers", "*,-nodeipam,-nodelifecycle",
            "--service-account-private-key-file", str(self._sa_key),
            "--root-ca-file", str(self.ca.files.cert),
            "--use-service-account-credentials",
            "--cluster-signing-cert-file", str(self.ca.files.cert),
            "--cluster-signing-key-file", str(self.ca.files.key),
            "--leader-elect=false",
        ], log_path=self._log("kube-controller-manager"))
        scheduler_config = str(self._kubeconfig_for("scheduler"))
        self.scheduler = Process("kube-scheduler", [
            self.binaries["kube-scheduler"],
            "--kubeconfig", scheduler_config,
            "--authentication-kubeconfig", scheduler_config,
            "--authorization-kubeconfig", scheduler_config,
            "--bind-address", "127.0.0.1",
            "--secure-port", str(self._ports["scheduler"]),
            "--leader-elect=false",
        ], log_path=self._log("kube-scheduler"))
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE  # their self-signed serving certs; /healthz only
        for process, key in ((self.controller_manager, "controller-manager"),
                             (self.scheduler, "scheduler")):
            port = self._ports[key]
            _wait(f"{process.name} /healthz",
                  lambda port=port: _https_get("127.0.0.1", port, "/healthz",  # type: ignore[misc]
                                               insecure) == (200, "ok"),
                  timeout, [process])
        # The service-account controllers are the ones a pod needs first.
        self.wait_for_service_account("default", timeout=timeout)
        self.timings["controllers"] = time.monotonic() - began

    def add_node(self, name: str, *, labels: Mapping[str, str] | None = None,
                 hooks: Iterable[NodeHook] = (), timeout: float = 60.0,
                 runtime: str = "fake") -> Node:
        """Start a node (its runtime + kubelet), wait until it is Ready and untainted, then
        run each hook on it. On failure the node's processes are stopped again.

        ``runtime``: ``fake`` (no container runs: fast, for most tests and hollow nodes) or
        ``containerd`` (real containers; ``make containerd image`` first, see
        :mod:`tessera.testing.cluster._containerd`)."""
        if runtime not in ("fake", "containerd"):
            raise ClusterError(f"add_node: runtime {runtime!r} is neither fake nor containerd")
        if not self._started or self._stopped:
            raise ClusterError("add_node: the cluster is not running")
        if name in self.nodes:
            raise ClusterError(f"add_node: node {name!r} exists already")
        for attempt in range(1, PORT_ATTEMPTS + 1):
            folder = self.root / _folder(name)
            containers = None if runtime == "fake" else Runtime(
                folder, ContainerdBinaries.locate(), Images.locate(), name)
            node = Node(self, name, folder, free_ports(1)[0], labels or {}, runtime=containers)
            self.nodes[name] = node
            try:
                node.start(timeout)
                break
            except PortTakenError:
                node.stop()
                if attempt == PORT_ATTEMPTS:
                    raise
                shutil.rmtree(node.root, ignore_errors=True)
            except BaseException:
                node.stop()
                raise
        try:
            for hook in hooks:
                hook(node)
        except BaseException:
            node.stop()
            raise
        return node

    def remove_node(self, name: str) -> None:
        """Stop a node's processes and delete its Node object."""
        node = self.nodes.pop(name)
        node.stop()
        with contextlib.suppress(Exception):
            self.core_v1().delete_node(name)

    def stop(self) -> None:
        """Stop nodes, then scheduler, controller manager, API server and etcd; remove the
        root directory (unless kept). Safe to call more than once and after a failed start."""
        if self._stopped:
            return
        self._stopped = True
        for node in reversed(list(self.nodes.values())):
            node.stop()
        self._stop_control_plane()
        if self._api is not None:
            with contextlib.suppress(Exception):
                self._api.close()
            self._api = None
        if self._own_root and not self.keep_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def state(self) -> dict[str, Any]:
        """What ``tessera dev cluster down`` needs to clean up without this object."""
        return {
            "version": 1,
            "server": self.server,
            "kubeconfig": str(self.kubeconfig),
            "root": str(self.root),
            "pids": {p.name: p.pid for p in self.processes()},
            "ports": self.ports(),
            "nodes": {n.name: {"device_plugin_dir": str(n.device_plugin_dir),
                               "pod_resources_socket": str(n.pod_resources_socket)}
                      for n in self.nodes.values()},
            "timings": self.timings,
        }
