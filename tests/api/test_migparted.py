"""mig-parted configs imported as static PartitionPolicies, refused strictly when malformed."""

from __future__ import annotations

import pytest

from tessera.api.migparted import policy_from_mig_parted
from tessera.core.errors import InvalidInputError

CONFIG = {
    "version": "v1",
    "mig-configs": {
        "all-1g.10gb": [{"devices": "all", "mig-enabled": True,
                         "mig-devices": {"1g.10gb": 7}}],
        "mixed": [
            {"device-filter": "0x20B210DE", "devices": [0, 1], "mig-enabled": True,
             "mig-devices": {"3g.40gb": 2}},
            {"devices": [2, 3], "mig-enabled": False},
        ],
    },
}


def test_a_config_becomes_a_static_policy() -> None:
    policy = policy_from_mig_parted(CONFIG, "mixed", node_selector={"pool": "a100"})
    assert policy.metadata.name == "mixed"
    assert policy.spec.mode == "static"
    first, second = policy.spec.static
    assert (first.device_filter, first.devices, first.mig_devices) == (
        ["0x20B210DE"], [0, 1], {"3g.40gb": 2})
    assert (second.mig_enabled, second.devices) == (False, [2, 3])
    assert policy.spec.node_selector.match_labels == {"pool": "a100"}


@pytest.mark.parametrize(("change", "field", "text"), [
    ({"version": "v2"}, "version", "'v2' is not supported"),
    ({"mig-configs": {"x": [{"devices": "all", "mig-enabled": True, "colour": 1}]}},
     "mig-configs.x[0].colour", "unknown field"),
    ({"mig-configs": {"x": [{"devices": "some", "mig-enabled": True}]}},
     "mig-configs.x[0].devices", "expected 'all'"),
    ({"mig-configs": {"x": [{"devices": "all", "mig-enabled": True,
                             "mig-devices": {"9g.1gb": 1}}]}},
     "mig-configs.x[0].mig-devices.9g.1gb", "no supported GPU has this profile"),
    ({"mig-configs": {"x": [{"device-filter": ["0x20B210DE"], "mig-enabled": True,
                             "mig-devices": {"4g.40gb": 2}}]}},
     "mig-configs.x[0].mig-devices.4g.40gb", "holds 0..1 x 4g.40gb, not 2"),
])
def test_malformed_configs_name_the_field(change: dict[str, object], field: str,
                                          text: str) -> None:
    with pytest.raises(InvalidInputError) as error:
        policy_from_mig_parted({**CONFIG, **change}, None if "mig-configs" in change else
                               "mixed")
    assert error.value.field == field
    assert text in str(error.value)


def test_a_file_with_several_configs_needs_one_named() -> None:
    with pytest.raises(InvalidInputError) as error:
        policy_from_mig_parted(CONFIG, None)
    assert error.value.choices == ("all-1g.10gb", "mixed")
