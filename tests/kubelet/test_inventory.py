"""The inventory: what the plugins advertise, how health composes, when listeners fire."""

from __future__ import annotations

import threading

import pytest

from tessera.core.errors import InvalidInputError
from tessera.kubelet.inventory import DeviceKind, Inventory, MpsShare, PluginDevice

from .conftest import GPU_RES, MIG_1G, MIG_3G, gpu_uuid, mig, mig_uuid, mps


def test_device_ids_are_the_forms_nvidia_and_dcgm_understand() -> None:
    assert PluginDevice.gpu(gpu_uuid(0), 0).id == gpu_uuid(0)
    assert mig(0, 1).id == mig_uuid(0, 1)
    assert mps(0, 3).id == f"{gpu_uuid(0)}::3"
    assert mps(0, 3).kind is DeviceKind.MPS_SHARE


@pytest.mark.parametrize(("build", "field"), [
    (lambda: PluginDevice.mig(gpu_uuid(1), gpu_uuid(0), 0), "uuid"),
    (lambda: PluginDevice.mig(mig_uuid(0, 1), mig_uuid(0, 2), 0), "parent_uuid"),
    (lambda: PluginDevice(DeviceKind.GPU, gpu_uuid(0), gpu_uuid(1), 0), "parent_uuid"),
    (lambda: PluginDevice(DeviceKind.MPS_SHARE, gpu_uuid(0), gpu_uuid(0), 0, share=1), "share"),
    (lambda: PluginDevice.gpu("GPU-" + "x" * 60, 0), "id"),
    (lambda: MpsShare("relative/pipe", 1, 10), "mps.pipe_directory"),
    (lambda: MpsShare("/pipe", 1, 101), "mps.active_thread_percentage"),
])
def test_malformed_devices_are_refused_naming_the_field(build: object, field: str) -> None:
    with pytest.raises(InvalidInputError) as info:
        build()  # type: ignore[operator]
    assert info.value.field == field


def test_devices_are_listed_sorted_by_id() -> None:
    inventory = Inventory({MIG_1G: [mig(1, 1), mig(0, 2), mig(0, 1)]})
    assert [d.id for d in inventory.devices(MIG_1G)] == sorted(
        [mig_uuid(1, 1), mig_uuid(0, 2), mig_uuid(0, 1)])


def test_a_device_id_may_not_be_in_two_resources() -> None:
    with pytest.raises(InvalidInputError, match="in both"):
        Inventory({MIG_1G: [mig(0, 1)], MIG_3G: [mig(0, 1)]})


def test_invalid_resource_names_are_refused() -> None:
    with pytest.raises(InvalidInputError, match="resource_name"):
        Inventory({"gpu": []})


def test_resources_dropped_by_a_new_layout_stay_known_with_zero_devices() -> None:
    inventory = Inventory({MIG_1G: [mig(0, 1)], MIG_3G: [mig(1, 1)]})
    inventory.set_layout({MIG_3G: [mig(1, 1), mig(1, 2)]})
    assert inventory.resource_names() == (MIG_1G, MIG_3G)
    assert inventory.devices(MIG_1G) == ()
    assert len(inventory.devices(MIG_3G)) == 2


def test_a_gpu_mark_covers_its_mig_devices_and_mps_shares_and_clears_on_recovery() -> None:
    inventory = Inventory({MIG_1G: [mig(0, 1), mig(1, 1)], GPU_RES: [mps(0, 0), mps(1, 0)]})
    assert inventory.set_health(gpu_uuid(0), healthy=False, reason="Xid 79") == 2
    sick = {d.id for r in inventory.resource_names() for d in inventory.devices(r)
            if not d.healthy}
    assert sick == {mig_uuid(0, 1), f"{gpu_uuid(0)}::0"}
    assert inventory.unhealthy_marks() == {gpu_uuid(0): "Xid 79"}
    inventory.set_health(gpu_uuid(0), healthy=True)
    assert all(d.healthy for r in inventory.resource_names() for d in inventory.devices(r))


def test_a_mig_mark_covers_only_that_mig_device() -> None:
    inventory = Inventory({MIG_1G: [mig(0, 1), mig(0, 2)]})
    inventory.set_health(mig_uuid(0, 2), healthy=False)
    assert [d.healthy for d in inventory.devices(MIG_1G)] == [True, False]


def test_health_marks_survive_a_new_layout() -> None:
    inventory = Inventory({MIG_1G: [mig(0, 1)]})
    inventory.set_health(gpu_uuid(0), healthy=False)
    inventory.set_layout({MIG_1G: [mig(0, 1), mig(0, 2)]})
    assert not any(d.healthy for d in inventory.devices(MIG_1G))


def test_listeners_fire_on_every_change_and_not_after_unsubscribing() -> None:
    inventory = Inventory()
    fired = threading.Semaphore(0)
    unsubscribe = inventory.subscribe(fired.release)
    inventory.add_resource(MIG_1G)
    inventory.set_devices(MIG_1G, [mig(0, 1)])
    inventory.set_health(gpu_uuid(0), healthy=False)
    inventory.set_health(gpu_uuid(0), healthy=False)  # no change: no event
    assert [fired.acquire(blocking=False) for _ in range(4)] == [True, True, True, False]
    unsubscribe()
    inventory.set_devices(MIG_1G, [])
    assert not fired.acquire(blocking=False)


def test_a_listener_may_read_the_inventory_without_deadlocking() -> None:
    inventory = Inventory({MIG_1G: []})
    seen: list[int] = []
    inventory.subscribe(lambda: seen.append(len(inventory.devices(MIG_1G))))
    inventory.set_devices(MIG_1G, [mig(0, 1)])
    assert seen == [1]
