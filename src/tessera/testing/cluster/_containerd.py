"""A node's real container runtime: containerd and runc, built from their Go modules by
``tools/containerd``, with CNI plugins from theirs.

Each such node has its own containerd (root, state, socket), and its own mount and network
namespaces, shared by containerd, its shims and the node's kubelet. In the mount namespace the
host paths a node agent's DaemonSet mounts (:data:`NODE_PATHS`: the kubelet's directory, the
MPS pipes, CDI specs, the simulated GPU's state) are bind-mounted from the node's folder, so
several nodes coexist on one machine while the chart's pods see the paths of a real node,
unchanged. Containers run for real (runc, cgroups, overlayfs).

Networking never leaves the machine. The node's network is its own namespace: loopback, and
a veth pair inside it holding the node's address (:data:`NODE_IP`); the one way out is the
API server on 127.0.0.1 (:mod:`tessera.testing.cluster._netns`). Tessera's own pods use that
host network, as device plugins and node agents do, and reach the API server on loopback
(the chart's ``apiServer.host``); two nodes' host-network pods may listen on one port. Other
pods get a network namespace whose ``eth0`` is a veth on a bridge of their node's that has no
address, no gateway and no route out (the pod's address from host-local, in 198.18.0.0/16):
a pod reaches the pods of its own node and nothing else.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

from tessera.testing.cluster._cache import keyed_dir
from tessera.testing.cluster._netns import Forwarder
from tessera.testing.cluster._process import Process

__all__ = ["BIN_ENV", "IMAGES_ENV", "NODE_PATHS", "ContainerdBinaries", "Images", "Runtime",
           "shims"]

BIN_ENV = "TESSERA_CONTAINERD_BIN"
"""The directory holding :data:`NAMES` (``make containerd``)."""
IMAGES_ENV = "TESSERA_IMAGES"
"""The directory ``tools/image/build.sh`` (``make image``) wrote: tessera.tar, pause.tar,
image.env."""

NAMES = ("containerd", "containerd-shim-runc-v2", "ctr", "runc", "loopback", "bridge",
         "host-local")
NODE_PATHS = {
    "/var/lib/kubelet": "kubelet",
    "/run/tessera": "run-tessera",
    "/var/run/cdi": "cdi",
    "/var/lib/tessera-sim": "sim",
}
"""Host paths as each real-runtime node sees them, and the folder of the node's they are."""

NODE_IP = "198.19.0.1"
"""Every real-runtime node's address, inside its own network namespace (198.18.0.0/15 is set
aside for benchmarks and reaches nothing here)."""

_REPO_ROOT = Path(__file__).resolve().parents[4]


def _cache_dir() -> Path:
    """Where ``make containerd`` puts the binaries: keyed by the content of tools/containerd,
    as the Makefile computes it."""
    tools = _REPO_ROOT / "tools" / "containerd"
    version = next(line.split()[1] for line in (tools / "go.mod").read_text().splitlines()
                   if line.strip().startswith("github.com/containerd/containerd/v2 "))
    return keyed_dir(Path.home() / ".cache" / "tessera" / "containerd", version,
                     [tools / n for n in ("go.mod", "go.sum", "build.sh", "tools.go")])


@dataclasses.dataclass(frozen=True)
class ContainerdBinaries:
    directory: Path

    @classmethod
    def locate(cls) -> ContainerdBinaries:
        """The binaries (``$TESSERA_CONTAINERD_BIN``, else ``make containerd``'s cache), or
        FileNotFoundError naming what is missing and the command that makes it."""
        override = os.environ.get(BIN_ENV)
        directory = Path(override) if override else _cache_dir()
        missing = [n for n in NAMES if not (directory / n).is_file()]
        if missing:
            raise FileNotFoundError(f"{', '.join(missing)} not in {directory}: run "
                                    "`make containerd`")
        return cls(directory)

    def __getitem__(self, name: str) -> str:
        return str(self.directory / name)


@dataclasses.dataclass(frozen=True)
class Images:
    """The image archives every real-runtime node imports, from ``make image``."""

    directory: Path
    image: str
    """Tessera's image reference (``localhost/tessera:VERSION``)."""
    image_id: str
    pause: str

    @classmethod
    def locate(cls, directory: Path | None = None) -> Images:
        folder = directory or Path(os.environ.get(IMAGES_ENV, _REPO_ROOT / "build" / "image"))
        env = folder / "image.env"
        if not env.is_file() or not (folder / "tessera.tar").is_file():
            raise FileNotFoundError(f"no image in {folder}: run `make image`")
        values = dict(line.split("=", 1) for line in env.read_text().splitlines() if "=" in line)
        return cls(folder, values["IMAGE"], values["IMAGE_ID"], values["PAUSE_IMAGE"])

    @property
    def archives(self) -> tuple[Path, ...]:
        return (self.directory / "pause.tar", self.directory / "tessera.tar")


class Runtime:
    """One node's containerd, in the node's own mount namespace (see the module's doc)."""

    def __init__(self, root: Path, binaries: ContainerdBinaries, images: Images,
                 name: str) -> None:
        self.root = root
        self.binaries = binaries
        self.images = images
        self.name = name
        self.socket = root / "containerd.sock"
        self.config = root / "containerd.toml"
        self.process: Process | None = None
        self.forwarder: Forwarder | None = None
        self.bridge = "tsb" + hashlib.sha256(str(root).encode()).hexdigest()[:10]
        """The pods' bridge, in the node's network namespace (no address; gone with it)."""

    def host_path(self, path: str) -> Path:
        """Where a node path (``/var/lib/kubelet/...``) lies in the node's folder."""
        for prefix, folder in NODE_PATHS.items():
            if path == prefix or path.startswith(prefix + "/"):
                return self.root / folder / path[len(prefix):].lstrip("/")
        raise ValueError(f"{path} is not one of the node's own paths {sorted(NODE_PATHS)}")

    def _write_config(self) -> None:
        cni = self.root / "cni"
        cni.mkdir(parents=True, exist_ok=True)
        (cni / "10-isolated.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": "isolated",
            "plugins": [{"type": "bridge", "bridge": self.bridge, "isGateway": False,
                         "isDefaultGateway": False, "ipMasq": False, "hairpinMode": False,
                         "ipam": {
                "type": "host-local", "dataDir": str(self.root / "cni-ipam"),
                "ranges": [[{"subnet": "198.18.0.0/16"}]]}}]}))
        run = self.root / "ctr"
        self.config.write_text(f"""version = 3
root = "{run / 'root'}"
state = "{run / 'state'}"
[grpc]
  address = "{self.socket}"
[ttrpc]
  address = "{self.socket}.ttrpc"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{self.images.pause}"
[plugins.'io.containerd.cri.v1.runtime']
  enable_selinux = false
  # Never below containerd's own score: lowering it needs CAP_SYS_RESOURCE, which the
  # machines here do not grant (runc: "failed to update /proc/self/oom_score_adj").
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "{self.binaries['runc']}"
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{self.binaries.directory}"]
    conf_dir = "{cni}"
    max_conf_num = 1
""")

    def start(self, logs: Path, api_port: int, timeout: float = 30.0) -> Process:
        """containerd in new mount and network namespaces, with :data:`NODE_PATHS` bound from
        the node's folder and the API server at 127.0.0.1:``api_port`` relayed in; returns
        once its socket answers and the images are imported."""
        for folder in NODE_PATHS.values():
            (self.root / folder).mkdir(parents=True, exist_ok=True)
        self._write_config()
        binds = " && ".join(f'mkdir -p {path} && mount --bind "$0/{folder}" {path}'
                            for path, folder in NODE_PATHS.items())
        network = ("ip link set lo up && ip link add tsn0 type veth peer name tsn1 && "
                   f"ip addr add {NODE_IP}/30 dev tsn0 && ip link set tsn0 up && "
                   "ip link set tsn1 up")
        argv = ["unshare", "--mount", "--net", "--propagation", "private", "sh", "-c",
                f'{network} && {binds} && exec "$@"', str(self.root),
                self.binaries["containerd"], "--config", str(self.config)]
        env = {**os.environ, "PATH": f"{self.binaries.directory}:{os.environ.get('PATH', '')}"}
        self.process = Process(f"{self.name}/containerd", argv, log_path=logs / "containerd.log",
                               env=env)
        deadline = time.monotonic() + timeout
        while not self.socket.is_socket():
            if not self.process.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}'s containerd did not start; see "
                                   f"{logs / 'containerd.log'}")
            time.sleep(0.1)
        self.forwarder = Forwarder(self.network_namespace, api_port, ("127.0.0.1", api_port))
        for archive in self.images.archives:
            self.ctr("images", "import", str(archive), timeout=120)
        return self.process

    def ctr(self, *args: str, timeout: float = 30) -> str:
        """``ctr`` against this node's containerd, namespace k8s.io (the CRI's)."""
        done = subprocess.run([self.binaries["ctr"], "--address", str(self.socket),
                               "--namespace", "k8s.io", *args], capture_output=True,
                              text=True, timeout=timeout, check=False)
        if done.returncode:
            raise RuntimeError(f"ctr {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    @property
    def mount_namespace(self) -> str:
        """The mount namespace the kubelet joins (``nsenter --mount=...``)."""
        assert self.process is not None
        return f"/proc/{self.process.pid}/ns/mnt"

    @property
    def network_namespace(self) -> str:
        """The node's network namespace (``nsenter --net=...``)."""
        assert self.process is not None
        return f"/proc/{self.process.pid}/ns/net"

    def stop(self) -> None:
        """Kill every container of this node (their shims outlive containerd by design),
        then containerd; the mount namespace goes with its last process."""
        if self.process is not None and self.process.alive():
            with contextlib.suppress(Exception):
                for task in self.ctr("tasks", "ls", "--quiet").split():
                    with contextlib.suppress(Exception):
                        self.ctr("tasks", "kill", "--all", "--signal", "SIGKILL", task)
                time.sleep(0.5)
                for task in self.ctr("tasks", "ls", "--quiet").split():
                    with contextlib.suppress(Exception):
                        self.ctr("tasks", "delete", "--force", task)
            self.process.stop()
        if self.forwarder is not None:
            self.forwarder.close()
            self.forwarder = None
        for pid in shims(self.socket):
            with contextlib.suppress(ProcessLookupError):
                for child in _children(pid):
                    os.kill(child, signal.SIGKILL)
                os.kill(pid, signal.SIGKILL)

def shims(under: Path) -> list[int]:
    """The runc shims of every containerd whose socket lies at or under ``under`` (a shim's
    command line names its containerd's socket): what outlives a stopped containerd."""
    mark = str(under).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            cmdline = (entry / "cmdline").read_bytes()
            if b"containerd-shim-runc-v2" in cmdline and mark in cmdline:
                found.append(int(entry.name))
    return found


def _children(pid: int) -> list[int]:
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            text = (task / "children").read_text().split()
            found.extend(int(t) for t in text)
    return found
