"""Fixtures for the device plugin tests: a kubelet stand-in and our plugins on real sockets.

Everything runs over Unix sockets in a short directory under /tmp (socket paths must fit in
107 bytes). Waits are on conditions with generous timeouts, never fixed sleeps, so the suite is
fast when the machine is idle and still passes when it is loaded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tessera.kubelet.inventory import Inventory, MpsShare, PluginDevice
from tessera.kubelet.plugins import PluginManager, PluginSettings
from tessera.testing import KubeletStandIn, short_socket_dir

MIG_1G = "nvidia.com/mig-1g.10gb"
MIG_3G = "nvidia.com/mig-3g.40gb"
GPU_RES = "nvidia.com/gpu"
MPS_RES = "nvidia.com/gpu.mps"
WAIT = 10.0
"""Timeout for anything that normally takes milliseconds (generous for a loaded CI box)."""


def gpu_uuid(n: int) -> str:
    return f"GPU-{n:08x}-0000-4000-8000-000000000000"


def mig_uuid(gpu: int, n: int) -> str:
    return f"MIG-{gpu:04x}{n:04x}-1111-4000-8000-000000000000"


def mig(gpu: int, n: int, **extra: object) -> PluginDevice:
    return PluginDevice.mig(mig_uuid(gpu, n), gpu_uuid(gpu), gpu, **extra)  # type: ignore[arg-type]


def mps(gpu: int, share: int, *, pipe: str = "/run/tessera/mps/pipe") -> PluginDevice:
    limits = MpsShare(pipe_directory=pipe, pinned_memory_mib=10240, active_thread_percentage=25,
                      shm_directory="/run/tessera/mps/shm")
    return PluginDevice.mps_share(gpu_uuid(gpu), share, gpu_uuid(gpu), gpu, limits)


@pytest.fixture
def socket_root() -> Iterator[Path]:
    with short_socket_dir() as root:
        yield root


@pytest.fixture
def plugin_dir(socket_root: Path) -> Path:
    return socket_root / "device-plugins"


@pytest.fixture
def kubelet(plugin_dir: Path) -> Iterator[KubeletStandIn]:
    with KubeletStandIn(plugin_dir, dial_timeout=5.0) as standin:
        yield standin


@pytest.fixture
def inventory() -> Inventory:
    """Two A100s: GPU 0 with three 1g slices, GPU 1 with one 1g and one 3g slice."""
    return Inventory({
        MIG_1G: [mig(0, 1), mig(0, 2), mig(0, 3), mig(1, 1)],
        MIG_3G: [mig(1, 2)],
    })


StartPlugins = Callable[..., PluginManager]


@pytest.fixture
def start_plugins(plugin_dir: Path) -> Iterator[StartPlugins]:
    """Start a PluginManager (stopped at teardown): ``start_plugins(inventory, **settings)``."""
    managers: list[PluginManager] = []

    def start(inventory: Inventory, **settings: object) -> PluginManager:
        manager = PluginManager(inventory,
                                PluginSettings(plugin_dir=str(plugin_dir), **settings))  # type: ignore[arg-type]
        managers.append(manager)
        manager.start()
        return manager

    yield start
    for manager in managers:
        manager.stop()


@pytest.fixture
def plugins(kubelet: KubeletStandIn, inventory: Inventory,
            start_plugins: StartPlugins) -> PluginManager:
    """Our plugins for ``inventory``, registered and listed by the stand-in."""
    manager = start_plugins(inventory)
    assert manager.wait_until_registered(WAIT)
    kubelet.wait_until(lambda k: k.allocatable() == {MIG_1G: 4, MIG_3G: 1}, WAIT,
                       "first device lists")
    return manager
