"""The simulated ``libnvidia-ml.so.1`` (``make nvml-lib``) in tests: where it is, and loading it.

The library is the second door to the NVML simulator (:mod:`tessera.nvml.sim.server`): a
program loads it as it loads the driver's, and every call goes to the server over a Unix socket.
:func:`load` points this process's pynvml at it exactly as pynvml's own loader does
(``CDLL("libnvidia-ml.so.1")``), so the backend's production path runs in process too.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Iterator
from pathlib import Path

from tessera.agent.node import NodeRuntime, RuntimeSettings
from tessera.kubelet.plugins import PluginSettings
from tessera.nvml import sim
from tessera.nvml.backend import open_backend
from tessera.testing.kubelet import KubeletStandIn, short_socket_dir

__all__ = ["LIB_ENV", "SOCKET_ENV", "agent_beside_stand_in", "agent_runtime", "load", "locate"]

LIB_ENV = "TESSERA_NVML_LIB"
"""The library file, set by ``make pytest``; else ``build/nvml/libnvidia-ml.so.1``."""

SOCKET_ENV = "TESSERA_NVML_SIM_SOCKET"
"""Where the library finds the simulator's socket (read by the library at each connect)."""

_REPO_ROOT = Path(__file__).resolve().parents[3]


def locate() -> Path:
    """The built library, or FileNotFoundError naming the command that builds it."""
    path = Path(os.environ.get(LIB_ENV) or _REPO_ROOT / "build" / "nvml" / "libnvidia-ml.so.1")
    if not path.is_file():
        raise FileNotFoundError(f"no simulated libnvidia-ml.so.1 at {path}: run `make nvml-lib`")
    return path


def load(socket_path: str | os.PathLike[str]) -> ctypes.CDLL:
    """Make this process's pynvml call the library, talking to the server on ``socket_path``."""
    os.environ[SOCKET_ENV] = str(socket_path)
    library = ctypes.CDLL(str(locate()))
    sim.point_pynvml_at(library)
    return library


@contextlib.contextmanager
def agent_runtime(socket_path: str | os.PathLike[str], plugin_dir: Path,
                  pod_resources_socket: Path) -> Iterator[NodeRuntime]:
    """Tessera's agent runtime (its device plugins and observation) in this process, reaching
    the cards through the library on ``socket_path``: the agent's production NVML path."""
    load(socket_path)
    backend = open_backend("real")
    runtime = NodeRuntime(backend, RuntimeSettings(
        plugins=PluginSettings(plugin_dir=str(plugin_dir)),
        pod_resources_socket=str(pod_resources_socket), xid_poll_s=0.05))
    runtime.start()
    try:
        runtime.refresh()
        yield runtime
    finally:
        runtime.stop()
        backend.close()
        sim.uninstall()


@contextlib.contextmanager
def agent_beside_stand_in(socket_path: str | os.PathLike[str]) -> Iterator[NodeRuntime]:
    """:func:`agent_runtime` with the kubelet stand-in (:class:`KubeletStandIn`) taking its
    device plugins and answering PodResources, in a short socket folder of their own: the
    agent on a node without a real kubelet."""
    with short_socket_dir() as root:
        kubelet = KubeletStandIn(root / "device-plugins")
        kubelet.start()
        try:
            with agent_runtime(socket_path, root / "device-plugins",
                               kubelet.pod_resources_socket) as runtime:
                yield runtime
        finally:
            kubelet.stop()
