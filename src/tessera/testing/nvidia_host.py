"""A simulated node as NVIDIA's own tools see a node, for running them against the simulator.

``nvidia-mig-parted`` and NVIDIA's ``k8s-device-plugin`` (``make nvidia-tools``) load
``libnvidia-ml.so.1`` like any NVML client, which the simulated library answers. They also read
the host around the driver, which NVML does not cover, and which this builds from the node's
state file and binds over the real paths in a private mount namespace for each command:

* ``/proc/modules``: mig-parted asks for a loaded ``nvidia`` module before it trusts NVML
  (``IsNvidiaModuleLoaded``), else it falls back to poking PCI config space;
* ``/sys/bus/pci/devices``: mig-parted lists GPUs by PCI (go-nvlib's ``nvpci``: vendor, class,
  device, NUMA node, resources, driver link) and finds each by ``nvmlDeviceGetHandleByPciBusId``;
* ``/proc/driver/nvidia-caps/mig-minors``: the device plugin maps each MIG device to its
  ``/dev/nvidia-caps`` access files through it;
* the kubelet's device-plugin folder, when given, at ``/var/lib/kubelet/device-plugins``.

Nothing here models a GPU: that stays the simulator's (through the library, over its socket).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tessera.nvml.sim.state import NodeState
from tessera.testing import nvml_library

__all__ = ["TOOLS_ENV", "NvidiaHost", "mig_minors", "mig_parted_readable", "tools"]

TOOLS_ENV = "TESSERA_NVIDIA_TOOLS_BIN"
"""The folder of ``nvidia-mig-parted`` and ``nvidia-device-plugin``, set by ``make pytest``."""

_PROFILE_V010 = re.compile(r"^\d+(c\.\d+)?g\.\d+gb(\+me)?$")

_GPU_CLASS = "0x030200"  # a 3D controller, as data-centre GPUs enumerate
_GIS, _CIS = 15, 8


def mig_minors(gpus: int = 8) -> str:
    """The driver's ``/proc/driver/nvidia-caps/mig-minors``: the capability device minor of
    each GPU instance and compute instance a GPU can have (the driver lists them all)."""
    lines = ["config 1", "monitor 2"]
    for gpu in range(gpus):
        for gi in range(_GIS):
            base = 3 + gpu * _GIS * (_CIS + 1) + gi * (_CIS + 1)
            lines.append(f"gpu{gpu}/gi{gi}/access {base}")
            lines += [f"gpu{gpu}/gi{gi}/ci{ci}/access {base + 1 + ci}" for ci in range(_CIS)]
    return "\n".join(lines) + "\n"


def tools() -> Path:
    """The folder ``make nvidia-tools`` built, or FileNotFoundError naming that command."""
    folder = os.environ.get(TOOLS_ENV)
    if not folder or not (Path(folder) / "nvidia-mig-parted").is_file():
        raise FileNotFoundError(f"no NVIDIA tools in ${TOOLS_ENV} ({folder or 'unset'}): run "
                                "`make nvidia-tools` and set it to the folder it prints")
    return Path(folder)


def mig_parted_readable(document: Mapping[str, Any]) -> dict[str, Any]:
    """A mig-parted config with only the entries ``nvidia-mig-parted`` v0.10.0 can parse.

    v0.10.0 is the newest release the module proxy serves; its go-nvlib (v0.7.0,
    ``pkg/nvlib/device/mig_profile.go``, ``parseMigProfileAttributes``) knows the ``+me``
    attribute only, so the GPU operator's 2026 file, whose RTX PRO 6000 entries name
    ``1g.24gb-me``, ``+gfx`` and ``+me.all``, fails to load whole. Configs left with no entry
    are dropped."""
    configs: dict[str, list[Any]] = {}
    for name, entries in document["mig-configs"].items():
        kept = [entry for entry in entries
                if all(_PROFILE_V010.match(profile) for profile in entry.get("mig-devices") or {})]
        if kept:
            configs[name] = kept
    return {"version": document["version"], "mig-configs": configs}


def _sysfs_address(bus_id: str) -> str:
    """NVML's ``00000000:17:00.0`` as sysfs names it, ``0000:17:00.0``."""
    domain, rest = bus_id.split(":", 1)
    return f"{int(domain, 16):04x}:{rest.lower()}"


class NvidiaHost:
    """The files around a simulated node's driver, in ``root``, and a way to run a command
    that sees them (and the simulated driver through ``socket``) where a node has them."""

    def __init__(self, root: Path, state: NodeState, library: Path, socket: Path,
                 kubelet_device_plugins: Path | None = None) -> None:
        self.root = root
        self.library = library
        self.socket = socket
        self.kubelet_device_plugins = kubelet_device_plugins
        self._write(state)

    def _write(self, state: NodeState) -> None:
        devices = self.root / "sys-bus-pci-devices"
        drivers = self.root / "sys-bus-pci-drivers" / "nvidia"
        drivers.mkdir(parents=True, exist_ok=True)
        devices.mkdir(parents=True, exist_ok=True)
        for gpu in state.gpus:
            folder = devices / _sysfs_address(gpu.bus_id)
            folder.mkdir(exist_ok=True)
            files = {"vendor": "0x10de", "class": _GPU_CLASS,
                     "device": f"0x{gpu.device_id >> 16:04x}", "numa_node": "-1",
                     "resource": "0x0000000000000000 0x0000000000000000 0x0000000000000000"}
            for name, text in files.items():
                (folder / name).write_text(text + "\n")
            if not (folder / "driver").is_symlink():
                (folder / "driver").symlink_to(drivers)
        (self.root / "proc-modules").write_text(
            "nvidia 54001664 1 nvidia_uvm, Live 0x0000000000000000 (POE)\n")
        (self.root / "mig-minors").write_text(mig_minors(max(8, len(state.gpus))))
        (self.root / "real-proc").mkdir(exist_ok=True)

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` in a private mount namespace that shows this host's files in place.

        ``/proc/modules`` does not exist on a kernel without modules, and procfs takes no
        new files, so ``/proc`` becomes a tmpfs of links into the real one (``/proc/self``
        still resolves for the reader), with ``modules`` and ``driver/nvidia-caps`` as files
        of its own. Where the kubelet's folder is missing here, a tmpfs over its parent makes
        it. All inside the namespace: nothing is created on this machine."""
        steps = ['mount --rbind /proc "$1/real-proc"',
                 "mount -t tmpfs tmpfs /proc",
                 'for e in $(ls -A "$1/real-proc"); do case "$e" in modules|driver) ;; '
                 '*) ln -s "$1/real-proc/$e" "/proc/$e" ;; esac; done',
                 'cp "$1/proc-modules" /proc/modules',
                 "mkdir -p /proc/driver/nvidia-caps",
                 'cp "$1/mig-minors" /proc/driver/nvidia-caps/mig-minors',
                 'mount --bind "$1/sys-bus-pci-devices" /sys/bus/pci/devices']
        sources = [self.root]
        if self.kubelet_device_plugins is not None:
            steps += ["if [ -d /var/lib/kubelet ]; then mount -t tmpfs tmpfs /var/lib/kubelet; "
                      "else mount -t tmpfs tmpfs /var/lib; fi",
                      "mkdir -p /var/lib/kubelet/device-plugins",
                      'mount --bind "$2" /var/lib/kubelet/device-plugins']
            sources.append(self.kubelet_device_plugins)
        script = " && ".join(steps) + f' && shift {len(sources)} && exec "$@"'
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "host",
                *(str(source) for source in sources), *argv]

    def environment(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """What a client of the simulated driver needs: the library on the loader's path,
        and the simulator's socket."""
        return {**os.environ, "LD_LIBRARY_PATH": str(self.library.parent),
                nvml_library.SOCKET_ENV: str(self.socket), **(extra or {})}

    def run(self, argv: Sequence[str], *, timeout: float = 120,
            env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.command(argv), env=self.environment(env), text=True,
                              capture_output=True, timeout=timeout, check=False)

    def device_plugin(self, log: Path) -> subprocess.Popen[bytes]:
        """NVIDIA's device plugin on this host (``make nvidia-tools``), as the GPU operator runs
        it for MIG: strategy ``mixed``, devices found through NVML, an init error fatal."""
        return self.popen([str(tools() / "nvidia-device-plugin"), "--mig-strategy=mixed",
                           "--device-discovery-strategy=nvml", "--fail-on-init-error=true"], log)

    def popen(self, argv: Sequence[str], log: Path,
              env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
        with log.open("ab") as out:
            return subprocess.Popen(self.command(argv), env=self.environment(env), stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
