"""mig-parted configs imported as static PartitionPolicies, refused strictly when malformed."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from tessera.api.migparted import policy_from_mig_parted
from tessera.core import catalogue, layout
from tessera.core.errors import InvalidInputError, UnknownProfileError

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
    policy = policy_from_mig_parted(CONFIG, "mixed", node_selector={"pool": "a100"}).policy
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


# NVIDIA GPU Operator's default-mig-parted-config, kept whole (source and date in its header).
OPERATOR_FILE = Path(__file__).parent / "data" / "gpu-operator-default-mig-parted-config.yaml"


def _operator_configs() -> dict[str, Any]:
    config_map = yaml.safe_load(OPERATOR_FILE.read_text(encoding="utf-8"))
    document = yaml.safe_load(config_map["data"]["config.yaml"])
    assert isinstance(document, dict)
    return document


def test_the_operator_file_holds_the_81_configs_it_was_taken_with() -> None:
    assert len(_operator_configs()["mig-configs"]) == 81


@pytest.mark.parametrize("config", sorted(_operator_configs()["mig-configs"]))
def test_every_config_of_the_gpu_operators_default_file_imports(config: str) -> None:
    document = _operator_configs()
    imported = policy_from_mig_parted(document, config)
    assert imported.skipped_device_ids == ()
    assert imported.policy.spec.mode == "static"
    raw_entries = document["mig-configs"][config]
    assert len(imported.policy.spec.static) == len(raw_entries)
    for index, entry in enumerate(imported.policy.spec.static):
        where = f"{config}[{index}]"
        if entry.device_filter:
            named = [catalogue.find_model("", int(pci, 16)) for pci in entry.device_filter]
            assert None not in named, where
            for model in {m for m in named if m is not None}:
                # the layout mig-parted would create is valid on every card the filter names
                slices = layout.layout_for_counts(model, entry.mig_devices)
                layout.check_layout(model, slices)
                assert layout.count_profiles(slices) == Counter(
                    {model.profile(n).name: c for n, c in entry.mig_devices.items() if c})
        elif entry.mig_devices:
            # an entry for every card: valid on the cards whose catalogue names its profiles
            fitting = [m for m in catalogue.models() if all(
                _has(m, name) for name in entry.mig_devices)]
            assert fitting, where
            for model in fitting:
                layout.check_layout(model, layout.layout_for_counts(model, entry.mig_devices))


def _has(model: catalogue.GpuModel, name: str) -> bool:
    try:
        model.profile(name)
    except UnknownProfileError:
        return False
    return True


def test_all_balanced_gives_each_card_its_own_mix() -> None:
    policy = policy_from_mig_parted(_operator_configs(), "all-balanced").policy
    by_filter = {tuple(e.device_filter): e.mig_devices for e in policy.spec.static}
    assert by_filter[("0x290110DE",)] == {"1g.23gb": 2, "2g.45gb": 1, "3g.90gb": 1}  # B200
    assert by_filter[("0x2BB510DE",)] == {"1g.24gb": 2, "2g.48gb": 1}  # RTX PRO 6000
    assert by_filter[("0x318210DE",)] == {"1g.34gb": 2, "2g.67gb": 1, "3g.135gb": 1}  # B300


UNKNOWN_CARD = {
    "version": "v1",
    "mig-configs": {"balanced": [
        {"device-filter": ["0xFFFF10DE"], "devices": "all", "mig-enabled": True,
         "mig-devices": {"1g.99gb": 7}},
        {"device-filter": ["0x20B210DE", "0xEEEE10DE"], "devices": "all",
         "mig-enabled": True, "mig-devices": {"3g.40gb": 2}},
    ]},
}


def test_entries_for_unknown_cards_are_skipped_and_named() -> None:
    imported = policy_from_mig_parted(UNKNOWN_CARD, None)
    assert imported.skipped_device_ids == ("0xFFFF10DE", "0xEEEE10DE")
    (entry,) = imported.policy.spec.static
    assert entry.device_filter == ["0x20B210DE"]
    assert entry.mig_devices == {"3g.40gb": 2}


def test_strict_refuses_a_card_the_catalogue_lacks() -> None:
    with pytest.raises(InvalidInputError) as error:
        policy_from_mig_parted(UNKNOWN_CARD, None, strict=True)
    assert error.value.field == "mig-configs.balanced[0].device-filter"
    assert "0xFFFF10DE" in str(error.value)


def test_a_config_only_for_unknown_cards_imports_nothing_and_says_so() -> None:
    only = {"version": "v1", "mig-configs": {"x": UNKNOWN_CARD["mig-configs"]["balanced"][:1]}}
    with pytest.raises(InvalidInputError) as error:
        policy_from_mig_parted(only, None)
    assert error.value.field == "mig-configs.x"
    assert "0xFFFF10DE" in str(error.value)


def test_a_profile_unknown_on_a_card_its_filter_names_is_refused() -> None:
    wrong = {"version": "v1", "mig-configs": {"x": [
        {"device-filter": "0x290110DE", "mig-enabled": True, "mig-devices": {"1g.10gb": 1}}]}}
    with pytest.raises(UnknownProfileError) as error:
        policy_from_mig_parted(wrong, None)
    assert error.value.field == "mig-configs.x[0].mig-devices.1g.10gb"
