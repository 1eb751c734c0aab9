"""``tessera device-plugin`` as its own process, on a simulated node other processes change.

The kubelet stand-in plays the kubelet; the node is a state file that this test, like an admin
or an agent in another process, changes from outside.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tessera.nvml import sim
from tessera.nvml.backend import open_backend
from tessera.nvml.sim import operations
from tessera.nvml.sim.state import new_node_state
from tessera.nvml.sim.store import FileStore, write_new_state_file
from tessera.testing import KubeletStandIn, short_socket_dir

MIG_1G = "nvidia.com/mig-1g.10gb"


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[Path, KubeletStandIn]]:
    state = tmp_path / "node.json"
    write_new_state_file(state, new_node_state("node-p", ["A100-80GB", "H100-80GB"]))
    backend = open_backend(f"sim:{state}")
    try:
        backend.create_slice(0, "1g.10gb", 0)
        backend.create_slice(0, "3g.40gb", 4)
    finally:
        backend.close()
        sim.uninstall()
    with short_socket_dir() as root:
        kubelet = KubeletStandIn(root / "device-plugins")
        kubelet.start()
        process = subprocess.Popen(
            [sys.executable, "-m", "tessera.cli.main", "device-plugin", "--nvml", f"sim:{state}",
             "--plugin-dir", str(kubelet.plugin_dir), "--no-kubelet", "--poll-seconds", "0.2",
             "--xid-recovery-seconds", "1.5", "--log-level", "WARNING"],
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            yield state, kubelet
        finally:
            process.send_signal(signal.SIGTERM)
            assert process.wait(30) == 0, "the plugin exits cleanly on SIGTERM"
            kubelet.stop()


def test_the_plugins_advertise_the_cards_as_they_are(node: tuple[Path, KubeletStandIn]) -> None:
    _, kubelet = node
    kubelet.wait_until(lambda k: k.allocatable() == {MIG_1G: 1, "nvidia.com/mig-3g.40gb": 1},
                       timeout=20, what="the node's MIG devices advertised")
    # The stand-in records a registration once it has dialled back, which can be a moment
    # after the first ListAndWatch answer it started has already come in.
    kubelet.wait_until(
        lambda k: {MIG_1G, "nvidia.com/mig-3g.40gb"} <= {r.resource_name
                                                        for r in k.registrations if r.accepted},
        timeout=20, what="both plugins' registrations accepted")


def test_a_slice_another_process_creates_is_advertised(node: tuple[Path, KubeletStandIn]) -> None:
    state, kubelet = node
    kubelet.wait_until(lambda k: k.allocatable().get(MIG_1G) == 1, timeout=20)
    backend = open_backend(f"sim:{state}")
    try:
        created = backend.create_slice(0, "1g.10gb", 1)
    finally:
        backend.close()
        sim.uninstall()
    kubelet.wait_until(lambda k: k.allocatable().get(MIG_1G) == 2, timeout=5,
                       what="the new slice advertised")
    assert created.uuid in kubelet.devices(MIG_1G)


def test_an_xid_from_outside_marks_the_device_unhealthy_then_it_recovers(
    node: tuple[Path, KubeletStandIn],
) -> None:
    state, kubelet = node
    kubelet.wait_until(lambda k: k.allocatable().get(MIG_1G) == 1, timeout=20)
    (uuid,) = kubelet.devices(MIG_1G)
    time.sleep(0.6)  # the plugin's event set registers at start; let it be waiting
    with FileStore(state).mutate() as working:
        operations.inject_xid(working, uuid, 48)
    injected = time.monotonic()
    kubelet.wait_until(lambda k: k.devices(MIG_1G).get(uuid) == "Unhealthy", timeout=5)
    assert time.monotonic() - injected <= 1.0, "Unhealthy on ListAndWatch within 1 s"
    assert kubelet.allocatable().get(MIG_1G) == 0
    kubelet.wait_until(lambda k: k.devices(MIG_1G).get(uuid) == "Healthy", timeout=10,
                       what="recovery after the quiet period")
