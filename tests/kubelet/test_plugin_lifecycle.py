"""Our plugins against the kubelet stand-in over real sockets: registration and ListAndWatch.

What the kubelet needs from a plugin: serve before Register; one registration per resource
name with a valid name; a ListAndWatch stream that starts with the full list, follows every
change, and never ends while the plugin lives; re-registration soon after a kubelet restart.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tessera.kubelet.errors import InvalidResourceNameError
from tessera.kubelet.inventory import Inventory
from tessera.kubelet.plugins import PluginManager, PluginSettings
from tessera.testing import KubeletStandIn, Options

from .conftest import MIG_1G, MIG_3G, WAIT, StartPlugins, gpu_uuid, mig, mig_uuid


def test_each_resource_serves_on_its_own_socket_before_registering(
        kubelet: KubeletStandIn, plugins: PluginManager, plugin_dir: Path) -> None:
    for resource in (MIG_1G, MIG_3G):
        registration = kubelet.wait_for_registration(resource)
        assert registration.socket_present, "Register arrived before the plugin served"
        assert registration.accepted
        assert registration.version == "v1beta1"
        assert registration.endpoint == os.path.basename(plugins.socket_path(resource))
        assert (plugin_dir / registration.endpoint).is_socket()
    assert {r.endpoint for r in kubelet.registrations} == {
        "tessera-nvidia.com_mig-1g.10gb.sock", "tessera-nvidia.com_mig-3g.40gb.sock"}


def test_options_offer_preferred_allocation_and_match_the_register_request(
        kubelet: KubeletStandIn, plugins: PluginManager) -> None:
    registration = kubelet.wait_for_registration(MIG_1G)
    expected = Options(pre_start_required=False, get_preferred_allocation_available=True)
    assert registration.options == expected
    assert registration.request_options == expected


def test_the_first_list_is_complete_and_healthy(kubelet: KubeletStandIn,
                                                plugins: PluginManager) -> None:
    assert kubelet.devices(MIG_1G) == {mig_uuid(0, 1): "Healthy", mig_uuid(0, 2): "Healthy",
                                       mig_uuid(0, 3): "Healthy", mig_uuid(1, 1): "Healthy"}
    assert kubelet.capacity() == {MIG_1G: 4, MIG_3G: 1}


def test_a_layout_change_is_pushed_on_the_open_stream_without_restarting(
        kubelet: KubeletStandIn, plugins: PluginManager, inventory: Inventory) -> None:
    updates = kubelet.updates(MIG_1G)
    inventory.set_layout({MIG_1G: [mig(0, 1)], MIG_3G: [mig(1, 2), mig(0, 4)]})
    kubelet.wait_until(lambda k: k.allocatable() == {MIG_1G: 1, MIG_3G: 2}, WAIT)
    assert kubelet.devices(MIG_1G) == {mig_uuid(0, 1): "Healthy"}
    assert kubelet.updates(MIG_1G) == updates + 1  # same stream, one more message
    assert len(kubelet.registrations) == 2  # nobody re-registered
    assert not kubelet.endpoint_stopped(MIG_1G)


def test_a_resource_whose_devices_are_gone_stays_registered_with_zero(
        kubelet: KubeletStandIn, plugins: PluginManager, inventory: Inventory) -> None:
    inventory.set_layout({MIG_1G: [mig(0, 1)]})
    kubelet.wait_until(lambda k: k.capacity() == {MIG_1G: 1, MIG_3G: 0}, WAIT)
    assert not kubelet.endpoint_stopped(MIG_3G)
    inventory.set_devices(MIG_3G, [mig(1, 2)])
    kubelet.wait_until(lambda k: k.allocatable().get(MIG_3G) == 1, WAIT)


def test_a_new_resource_name_gets_its_own_plugin_without_touching_the_others(
        kubelet: KubeletStandIn, plugins: PluginManager, inventory: Inventory) -> None:
    inventory.set_devices("nvidia.com/mig-2g.20gb", [mig(2, 1)])
    registration = kubelet.wait_for_registration("nvidia.com/mig-2g.20gb", timeout=WAIT)
    assert registration.socket_present
    kubelet.wait_until(lambda k: k.allocatable().get("nvidia.com/mig-2g.20gb") == 1, WAIT)
    assert len([r for r in kubelet.registrations if r.resource_name == MIG_1G]) == 1


def test_an_unhealthy_gpu_leaves_capacity_and_comes_back_on_recovery(
        kubelet: KubeletStandIn, plugins: PluginManager, inventory: Inventory) -> None:
    inventory.set_health(gpu_uuid(0), healthy=False, reason="Xid 79")
    kubelet.wait_until(lambda k: k.allocatable() == {MIG_1G: 1, MIG_3G: 1}, WAIT)
    assert kubelet.capacity() == {MIG_1G: 4, MIG_3G: 1}
    assert kubelet.devices(MIG_1G)[mig_uuid(0, 2)] == "Unhealthy"
    inventory.set_health(gpu_uuid(0), healthy=True)
    kubelet.wait_until(lambda k: k.allocatable() == {MIG_1G: 4, MIG_3G: 1}, WAIT)


def test_after_a_kubelet_restart_every_plugin_re_registers_within_a_second(
        kubelet: KubeletStandIn, plugins: PluginManager, plugin_dir: Path) -> None:
    kubelet.restart()
    first = kubelet.wait_for_registration(MIG_1G, count=2, timeout=WAIT)
    second = kubelet.wait_for_registration(MIG_3G, count=2, timeout=WAIT)
    assert first.socket_present
    assert second.socket_present
    kubelet.wait_until(lambda k: k.allocatable() == {MIG_1G: 4, MIG_3G: 1}, WAIT)
    assert plugins.status()[MIG_1G].registrations == 2
    assert (plugin_dir / first.endpoint).is_socket()


def test_re_registration_is_fast(kubelet: KubeletStandIn, plugins: PluginManager) -> None:
    before = time.monotonic()
    kubelet.restart()
    registration = kubelet.wait_for_registration(MIG_1G, count=2, timeout=WAIT)
    # The 1 s target with margin for a loaded machine; normally ~0.1-0.2 s.
    assert registration.at - before < 3.0


def test_layout_changes_after_a_restart_reach_the_new_stream(
        kubelet: KubeletStandIn, plugins: PluginManager, inventory: Inventory) -> None:
    kubelet.restart()
    kubelet.wait_until(lambda k: k.allocatable() == {MIG_1G: 4, MIG_3G: 1}, WAIT)
    inventory.set_devices(MIG_1G, [mig(0, 1)])
    kubelet.wait_until(lambda k: k.allocatable().get(MIG_1G) == 1, WAIT)


def test_plugins_started_before_the_kubelet_register_once_it_serves(
        plugin_dir: Path, inventory: Inventory, start_plugins: StartPlugins) -> None:
    manager = start_plugins(inventory)
    assert not manager.wait_until_registered(0.3)
    assert manager.status()[MIG_1G].serving
    with KubeletStandIn(plugin_dir) as kubelet:
        # The stand-in deletes stale sockets at start, as the kubelet does; the plugins notice.
        kubelet.wait_for_registration(MIG_1G, timeout=WAIT)
        kubelet.wait_until(lambda k: k.allocatable() == {MIG_1G: 4, MIG_3G: 1}, WAIT)


def test_stopping_the_plugins_ends_the_stream_and_the_kubelet_marks_devices_unhealthy(
        kubelet: KubeletStandIn, plugins: PluginManager, plugin_dir: Path) -> None:
    plugins.stop()
    kubelet.wait_until(lambda k: k.allocatable() == {MIG_1G: 0, MIG_3G: 0}, WAIT)
    assert kubelet.capacity() == {MIG_1G: 4, MIG_3G: 1}
    assert kubelet.endpoint_stopped(MIG_1G)
    assert not any(p.name.startswith("tessera-") for p in plugin_dir.iterdir())


@pytest.mark.parametrize("name", ["gpu", "kubernetes.io/mig-1g", "nvidia.com/-x"])
def test_invalid_resource_names_are_refused_before_registering(
        kubelet: KubeletStandIn, plugin_dir: Path, name: str) -> None:
    with pytest.raises(InvalidResourceNameError, match="resource_name"):
        PluginManager(Inventory(), PluginSettings(plugin_dir=str(plugin_dir)),
                      resource_names=[name])
    assert kubelet.registrations == []


def test_a_resource_with_no_devices_yet_registers_and_advertises_zero(
        kubelet: KubeletStandIn, plugin_dir: Path, start_plugins: StartPlugins) -> None:
    inventory = Inventory()
    inventory.add_resource(MIG_1G)
    start_plugins(inventory)
    kubelet.wait_for_registration(MIG_1G, timeout=WAIT)
    kubelet.wait_until(lambda k: k.updates(MIG_1G) == 1, WAIT)
    assert kubelet.capacity() == {MIG_1G: 0}
    assert not kubelet.endpoint_stopped(MIG_1G)
