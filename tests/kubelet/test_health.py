"""Xid events mark devices unhealthy the way NVIDIA's plugin does, configurably."""

from __future__ import annotations

import pytest

from tessera.core.errors import InvalidInputError
from tessera.kubelet.health import NVIDIA_IGNORED_XIDS, XidFilter, record_xid
from tessera.kubelet.inventory import Inventory

from .conftest import MIG_1G, gpu_uuid, mig, mig_uuid


@pytest.mark.parametrize("xid", sorted(NVIDIA_IGNORED_XIDS))
def test_application_xids_are_ignored_by_default(xid: int) -> None:
    assert not XidFilter().is_critical(xid)


@pytest.mark.parametrize("xid", [48, 63, 64, 74, 79, 94, 95])
def test_hardware_xids_are_critical_by_default(xid: int) -> None:
    assert XidFilter().is_critical(xid)


def test_settings_add_ignored_xids_and_force_others() -> None:
    xids = XidFilter.from_settings(disable="79, 48", enable="13")
    assert not xids.is_critical(79)
    assert not xids.is_critical(48)
    assert xids.is_critical(13)  # forced, although NVIDIA ignores it
    assert xids.is_critical(94)


@pytest.mark.parametrize("setting", ["all", "xids", "ALL"])
def test_checks_can_be_disabled_except_forced_xids(setting: str) -> None:
    xids = XidFilter.from_settings(disable=setting, enable="79")
    assert not xids.is_critical(48)
    assert xids.is_critical(79)


def test_malformed_settings_are_refused_naming_the_setting() -> None:
    with pytest.raises(InvalidInputError, match="disable_healthchecks: 'x13'"):
        XidFilter.from_settings(disable="x13")


def test_a_gpu_wide_xid_marks_every_device_on_that_gpu() -> None:
    inventory = Inventory({MIG_1G: [mig(0, 1), mig(0, 2), mig(1, 1)]})
    assert record_xid(inventory, gpu_uuid(0), 79, XidFilter())
    health = {d.id: d.healthy for d in inventory.devices(MIG_1G)}
    assert health == {mig_uuid(0, 1): False, mig_uuid(0, 2): False, mig_uuid(1, 1): True}


def test_an_ignored_xid_changes_nothing() -> None:
    inventory = Inventory({MIG_1G: [mig(0, 1)]})
    assert not record_xid(inventory, gpu_uuid(0), 31, XidFilter())
    assert all(d.healthy for d in inventory.devices(MIG_1G))
