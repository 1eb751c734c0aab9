"""The PodResources client against the stand-in's PodResources server."""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera.kubelet.errors import PodResourcesError
from tessera.kubelet.plugins import PluginManager
from tessera.kubelet.podresources import (
    ContainerDevices,
    DeviceOwner,
    PodResourcesClient,
)
from tessera.testing import Container, KubeletStandIn, Pod

from .conftest import MIG_1G, MIG_3G, mig_uuid


def test_list_shows_which_container_holds_which_device(kubelet: KubeletStandIn,
                                                       plugins: PluginManager) -> None:
    pod = Pod("ml", "train", (Container("main", {MIG_3G: 1}), Container("side")))
    kubelet.admit(pod)
    with PodResourcesClient(kubelet.pod_resources_socket) as client:
        (listed,) = client.list()
        assert (listed.namespace, listed.name) == ("ml", "train")
        main, side = listed.containers
        assert main.devices == (ContainerDevices(MIG_3G, (mig_uuid(1, 2),)),)
        assert side.devices == ()
        assert client.get("ml", "train") == listed
        assert client.device_owners() == {MIG_3G: {mig_uuid(1, 2): DeviceOwner("ml", "train",
                                                                                 "main")}}
        assert client.device_owners([MIG_1G]) == {}


def test_allocatable_lists_each_healthy_device_once(kubelet: KubeletStandIn,
                                                    plugins: PluginManager) -> None:
    with PodResourcesClient(kubelet.pod_resources_socket) as client:
        devices = client.allocatable()
    assert sorted((d.resource_name, d.device_ids) for d in devices) == sorted(
        [(MIG_1G, (mig_uuid(g, n),)) for g, n in ((0, 1), (0, 2), (0, 3), (1, 1))]
        + [(MIG_3G, (mig_uuid(1, 2),))])


def test_freed_pods_disappear(kubelet: KubeletStandIn, plugins: PluginManager) -> None:
    pod = Pod("ml", "done", (Container("main", {MIG_1G: 1}),))
    kubelet.admit(pod)
    kubelet.remove_pod(pod.uid)
    with PodResourcesClient(kubelet.pod_resources_socket) as client:
        assert client.list() == ()


def test_get_of_an_unknown_pod_is_an_error(kubelet: KubeletStandIn) -> None:
    with PodResourcesClient(kubelet.pod_resources_socket) as client, \
            pytest.raises(PodResourcesError, match="pod nope in namespace ml not found"):
        client.get("ml", "nope")


def test_a_missing_socket_is_a_clear_error(socket_root: Path) -> None:
    expected = r"absent\.sock: List: (UNAVAILABLE|DEADLINE_EXCEEDED)"
    with PodResourcesClient(socket_root / "absent.sock", timeout=0.5) as client, \
            pytest.raises(PodResourcesError, match=expected):
        client.list()


def test_the_client_reconnects_after_a_kubelet_restart(kubelet: KubeletStandIn,
                                                       plugins: PluginManager) -> None:
    with PodResourcesClient(kubelet.pod_resources_socket) as client:
        assert client.list() == ()
        kubelet.restart()
        kubelet.admit(Pod("ml", "after", (Container("main"),)))
        assert [p.name for p in client.list()] == ["after"]
