"""The kubelet's allocations as the agent reads them: a restarting kubelet's empty answer is
not taken for free slices."""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera.agent.allocations import KubeletAllocations
from tessera.kubelet.errors import PodResourcesError
from tessera.kubelet.podresources import ContainerDevices, ContainerResources, PodResources

MIG_1G = "nvidia.com/mig-1g.10gb"


def holding(name: str, *devices: str) -> PodResources:
    return PodResources("ml", name, (ContainerResources("main", (
        ContainerDevices(MIG_1G, devices),)),))


class Kubelet:
    """The PodResources socket (a file whose identity is the kubelet's) and what it lists."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.pods: tuple[PodResources, ...] = ()
        self.error: str | None = None
        self.restart_during_list = False
        path.write_text("")

    def restart(self) -> None:
        new = self.path.with_suffix(".new")
        new.write_text("")
        new.replace(self.path)  # a new inode, as the kubelet's re-created socket

    def list(self) -> tuple[PodResources, ...]:
        if self.error is not None:
            raise PodResourcesError(str(self.path), self.error)
        if self.restart_during_list:
            self.restart_during_list = False
            self.restart()
        return self.pods


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def kubelet(tmp_path: Path) -> Kubelet:
    return Kubelet(tmp_path / "kubelet.sock")


def reader(kubelet: Kubelet, clock: Clock | None = None) -> KubeletAllocations:
    return KubeletAllocations(kubelet, str(kubelet.path), settle_s=60.0,
                              clock=clock or Clock())


def test_each_device_maps_to_the_pods_holding_it(kubelet: Kubelet) -> None:
    kubelet.pods = (holding("a", "MIG-1", "MIG-2"), holding("b", "MIG-2"))
    assert reader(kubelet).read() == {"MIG-1": ("ml/a",), "MIG-2": ("ml/a", "ml/b")}


def test_an_unreadable_kubelet_is_unknown(kubelet: Kubelet) -> None:
    kubelet.error = "connection refused"
    assert reader(kubelet).read() is None


def test_after_a_restart_nothing_is_known_until_the_held_devices_are_listed_again(
    kubelet: Kubelet,
) -> None:
    allocations = reader(kubelet)
    kubelet.pods = (holding("a", "MIG-1"),)
    assert allocations.read() == {"MIG-1": ("ml/a",)}
    kubelet.restart()
    kubelet.pods = ()  # the new kubelet's pod manager is still empty
    assert allocations.read() is None
    assert allocations.read() is None
    kubelet.pods = (holding("a", "MIG-1"), holding("b", "MIG-3"))
    assert allocations.read() == {"MIG-1": ("ml/a",), "MIG-3": ("ml/b",)}
    kubelet.pods = ()
    assert allocations.read() == {}, "trusted again: a pod that ends frees its device"


def test_a_pod_that_ended_during_the_restart_holds_the_node_back_at_most_settle_s(
    kubelet: Kubelet,
) -> None:
    clock = Clock()
    allocations = reader(kubelet, clock)
    kubelet.pods = (holding("a", "MIG-1"), holding("b", "MIG-2"))
    allocations.read()
    kubelet.restart()
    kubelet.pods = (holding("b", "MIG-2"),)  # pod a ended while the kubelet was down
    assert allocations.read() is None
    clock.now += 59.0
    assert allocations.read() is None
    clock.now += 1.0
    assert allocations.read() == {"MIG-2": ("ml/b",)}


def test_a_restart_during_a_list_is_not_trusted(kubelet: Kubelet) -> None:
    allocations = reader(kubelet)
    kubelet.pods = (holding("a", "MIG-1"),)
    allocations.read()
    kubelet.restart_during_list = True
    kubelet.pods = ()
    assert allocations.read() is None, "the answer may be the new kubelet's, before its pods"
    assert allocations.read() is None, "and the new kubelet is still settling"


def test_the_first_answer_is_trusted(kubelet: Kubelet) -> None:
    # An agent (re)started beside a running kubelet has no earlier answer to wait for.
    kubelet.restart()
    assert reader(kubelet).read() == {}


def test_a_node_with_no_devices_held_before_the_restart_settles_at_once(
    kubelet: Kubelet,
) -> None:
    allocations = reader(kubelet)
    assert allocations.read() == {}
    kubelet.restart()
    assert allocations.read() == {}
