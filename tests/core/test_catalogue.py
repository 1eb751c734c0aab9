"""The MIG catalogue: every supported card's profiles, ids, counts and placements.

The expectations below are written the way ``nvidia-smi mig -lgip`` / ``-lgipp`` print them
(profile, ID, instance count, ``{starts}:size``), copied from the reference facts gathered from
NVIDIA's documentation and real transcripts, so a typo in the table shows up as a mismatch here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tessera.core import catalogue, layout
from tessera.core.errors import UnknownModelError, UnknownProfileError

LGIPP: dict[str, list[tuple[str, int, int, str]]] = {
    "A30-24GB": [
        ("1g.6gb", 14, 4, "{0,1,2,3}:1"),
        ("1g.6gb+me", 21, 1, "{0,1,2,3}:1"),
        ("2g.12gb", 5, 2, "{0,2}:2"),
        ("2g.12gb+me", 6, 1, "{0,2}:2"),
        ("4g.24gb", 0, 1, "{0}:4"),
    ],
    "A100-SXM4-40GB": [
        ("1g.5gb", 19, 7, "{0,1,2,3,4,5,6}:1"),
        ("1g.5gb+me", 20, 1, "{0,1,2,3,4,5,6}:1"),
        ("1g.10gb", 15, 4, "{0,2,4,6}:2"),
        ("2g.10gb", 14, 3, "{0,2,4}:2"),
        ("3g.20gb", 9, 2, "{0,4}:4"),
        ("4g.20gb", 5, 1, "{0}:4"),
        ("7g.40gb", 0, 1, "{0}:8"),
    ],
    "A100-80GB": [
        ("1g.10gb", 19, 7, "{0,1,2,3,4,5,6}:1"),
        ("1g.10gb+me", 20, 1, "{0,1,2,3,4,5,6}:1"),
        ("1g.20gb", 15, 4, "{0,2,4,6}:2"),
        ("2g.20gb", 14, 3, "{0,2,4}:2"),
        ("3g.40gb", 9, 2, "{0,4}:4"),
        ("4g.40gb", 5, 1, "{0}:4"),
        ("7g.80gb", 0, 1, "{0}:8"),
    ],
    "H100-80GB": [
        ("1g.10gb", 19, 7, "{0,1,2,3,4,5,6}:1"),
        ("1g.10gb+me", 20, 1, "{0,1,2,3,4,5,6}:1"),
        ("1g.20gb", 15, 4, "{0,2,4,6}:2"),
        ("2g.20gb", 14, 3, "{0,2,4}:2"),
        ("3g.40gb", 9, 2, "{0,4}:4"),
        ("4g.40gb", 5, 1, "{0}:4"),
        ("7g.80gb", 0, 1, "{0}:8"),
    ],
    "H100-NVL-94GB": [
        ("1g.12gb", 19, 7, "{0,1,2,3,4,5,6}:1"),
        ("1g.12gb+me", 20, 1, "{0,1,2,3,4,5,6}:1"),
        ("1g.24gb", 15, 4, "{0,2,4,6}:2"),
        ("2g.24gb", 14, 3, "{0,2,4}:2"),
        ("3g.47gb", 9, 2, "{0,4}:4"),
        ("4g.47gb", 5, 1, "{0}:4"),
        ("7g.94gb", 0, 1, "{0}:8"),
    ],
    "H200-141GB": [
        ("1g.18gb", 19, 7, "{0,1,2,3,4,5,6}:1"),
        ("1g.18gb+me", 20, 1, "{0,1,2,3,4,5,6}:1"),
        ("1g.35gb", 15, 4, "{0,2,4,6}:2"),
        ("2g.35gb", 14, 3, "{0,2,4}:2"),
        ("3g.71gb", 9, 2, "{0,4}:4"),
        ("4g.71gb", 5, 1, "{0}:4"),
        ("7g.141gb", 0, 1, "{0}:8"),
    ],
    "GH200-96GB": [
        ("1g.12gb", 19, 7, "{0,1,2,3,4,5,6}:1"),
        ("1g.12gb+me", 20, 1, "{0,1,2,3,4,5,6}:1"),
        ("1g.24gb", 15, 4, "{0,2,4,6}:2"),
        ("2g.24gb", 14, 3, "{0,2,4}:2"),
        ("3g.48gb", 9, 2, "{0,4}:4"),
        ("4g.48gb", 5, 1, "{0}:4"),
        ("7g.96gb", 0, 1, "{0}:8"),
    ],
    "GH200-144GB": [
        ("1g.18gb", 19, 7, "{0,1,2,3,4,5,6}:1"),
        ("1g.18gb+me", 20, 1, "{0,1,2,3,4,5,6}:1"),
        ("1g.36gb", 15, 4, "{0,2,4,6}:2"),
        ("2g.36gb", 14, 3, "{0,2,4}:2"),
        ("3g.72gb", 9, 2, "{0,4}:4"),
        ("4g.72gb", 5, 1, "{0}:4"),
        ("7g.144gb", 0, 1, "{0}:8"),
    ],
    "H100-96GB": [
        ("1g.12gb", 19, 7, "{0,1,2,3,4,5,6}:1"),
        ("1g.12gb+me", 20, 1, "{0,1,2,3,4,5,6}:1"),
        ("1g.24gb", 15, 4, "{0,2,4,6}:2"),
        ("2g.24gb", 14, 3, "{0,2,4}:2"),
        ("3g.48gb", 9, 2, "{0,4}:4"),
        ("4g.48gb", 5, 1, "{0}:4"),
        ("7g.96gb", 0, 1, "{0}:8"),
    ],
    "PG506-96GB": [
        ("1g.12gb", 19, 7, "{0,1,2,3,4,5,6}:1"),
        ("1g.12gb+me", 20, 1, "{0,1,2,3,4,5,6}:1"),
        ("1g.24gb", 15, 4, "{0,2,4,6}:2"),
        ("2g.24gb", 14, 3, "{0,2,4}:2"),
        ("3g.48gb", 9, 2, "{0,4}:4"),
        ("4g.48gb", 5, 1, "{0}:4"),
        ("7g.96gb", 0, 1, "{0}:8"),
    ],
    "H20-96GB": [
        ("1g.12gb", 19, 7, "{0,1,2,3,4,5,6}:1"),
        ("1g.12gb+me", 20, 1, "{0,1,2,3,4,5,6}:1"),
        ("1g.24gb", 15, 4, "{0,2,4,6}:2"),
        ("2g.24gb", 14, 3, "{0,2,4}:2"),
        ("3g.48gb", 9, 2, "{0,4}:4"),
        ("4g.48gb", 5, 1, "{0}:4"),
        ("7g.96gb", 0, 1, "{0}:8"),
    ],
    "B200-180GB": [
        ("1g.23gb", 19, 7, "{0,1,2,3,4,5,6}:1"),
        ("1g.23gb+me", 20, 1, "{0,1,2,3,4,5,6}:1"),
        ("1g.45gb", 15, 4, "{0,2,4,6}:2"),
        ("2g.45gb", 14, 3, "{0,2,4}:2"),
        ("3g.90gb", 9, 2, "{0,4}:4"),
        ("4g.90gb", 5, 1, "{0}:4"),
        ("7g.180gb", 0, 1, "{0}:8"),
    ],
    "GB200-186GB": [
        ("1g.23gb", 19, 7, "{0,1,2,3,4,5,6}:1"),
        ("1g.23gb+me", 20, 1, "{0,1,2,3,4,5,6}:1"),
        ("1g.47gb", 15, 4, "{0,2,4,6}:2"),
        ("2g.47gb", 14, 3, "{0,2,4}:2"),
        ("3g.93gb", 9, 2, "{0,4}:4"),
        ("4g.93gb", 5, 1, "{0}:4"),
        ("7g.186gb", 0, 1, "{0}:8"),
    ],
    "B300-269GB": [
        ("1g.34gb", 19, 7, "{0,1,2,3,4,5,6}:1"),
        ("1g.34gb+me", 20, 1, "{0,1,2,3,4,5,6}:1"),
        ("1g.67gb", 15, 4, "{0,2,4,6}:2"),
        ("2g.67gb", 14, 3, "{0,2,4}:2"),
        ("3g.135gb", 9, 2, "{0,4}:4"),
        ("4g.135gb", 5, 1, "{0}:4"),
        ("7g.269gb", 0, 1, "{0}:8"),
    ],
    "GB300-278GB": [
        ("1g.35gb", 19, 7, "{0,1,2,3,4,5,6}:1"),
        ("1g.35gb+me", 20, 1, "{0,1,2,3,4,5,6}:1"),
        ("1g.70gb", 15, 4, "{0,2,4,6}:2"),
        ("2g.70gb", 14, 3, "{0,2,4}:2"),
        ("3g.139gb", 9, 2, "{0,4}:4"),
        ("4g.139gb", 5, 1, "{0}:4"),
        ("7g.278gb", 0, 1, "{0}:8"),
    ],
    # a 12-unit placement grid: one compute slice's memory is 3 units (real -lgipp)
    "RTX-PRO-6000-96GB": [
        ("1g.24gb", 14, 4, "{0,3,6,9}:3"),
        ("1g.24gb+me", 21, 1, "{0,3,6,9}:3"),
        ("1g.24gb+gfx", 47, 4, "{0,3,6,9}:3"),
        ("1g.24gb+me.all", 65, 1, "{0,3,6,9}:3"),
        ("1g.24gb-me", 67, 4, "{0,3,6,9}:3"),
        ("2g.48gb", 5, 2, "{0,6}:6"),
        ("2g.48gb+gfx", 35, 2, "{0,6}:6"),
        ("2g.48gb+me.all", 64, 1, "{0,6}:6"),
        ("2g.48gb-me", 66, 2, "{0,6}:6"),
        ("4g.96gb", 0, 1, "{0}:12"),
        ("4g.96gb+gfx", 32, 1, "{0}:12"),
    ],
}

REFERENCE = Path(__file__).resolve().parents[3] / "shared" / "reference" / "mig_profiles.json"


def _lgipp(profile: catalogue.MigProfile) -> str:
    return "{" + ",".join(str(s) for s in profile.starts) + f"}}:{profile.memory_slices}"


def test_every_supported_model_is_in_the_catalogue() -> None:
    assert [m.name for m in catalogue.models()] == list(LGIPP)


@pytest.mark.parametrize("model_name", list(LGIPP))
def test_profiles_ids_counts_and_placements_match_nvidia_smi(model_name: str) -> None:
    model = catalogue.model(model_name)
    actual = [(p.name, p.profile_id, p.max_count, _lgipp(p)) for p in model.profiles]
    assert actual == LGIPP[model_name]


@pytest.mark.parametrize("model", catalogue.models(), ids=lambda m: m.name)
def test_profile_names_follow_nvidias_naming_rule(model: catalogue.GpuModel) -> None:
    for profile in model.profiles:
        assert catalogue.expected_profile_name(model, profile) == profile.name


@pytest.mark.parametrize("model", catalogue.models(), ids=lambda m: m.name)
def test_geometry_is_consistent(model: catalogue.GpuModel) -> None:
    for profile in model.profiles:
        for placement in profile.placements:
            assert placement.size == profile.memory_slices
            assert placement.start >= 0
            assert placement.end <= model.memory_slices
        assert profile.compute_slices <= model.compute_slices
        assert profile.memory_mib < model.total_memory_mib
        assert profile.max_count <= len(profile.placements)
    assert model.full_profile.memory_slices == model.memory_slices


def test_nvml_constants_match_pynvml() -> None:
    pynvml = pytest.importorskip("pynvml")
    for name, value in catalogue.GPU_INSTANCE_PROFILE_CONSTANTS.items():
        assert getattr(pynvml, f"NVML_GPU_INSTANCE_PROFILE_{name}") == value
    for name, value in catalogue.COMPUTE_INSTANCE_PROFILE_CONSTANTS.items():
        assert getattr(pynvml, f"NVML_COMPUTE_INSTANCE_PROFILE_{name}") == value


def test_one_profile_has_two_ids_and_they_differ_per_model() -> None:
    a30 = catalogue.model("A30-24GB")
    a100 = catalogue.model("A100-SXM4-40GB")
    assert a30.profile("2g.12gb").profile_id == 5
    assert a100.profile("4g.20gb").profile_id == 5
    assert a100.profile("1g.10gb").nvml_constant_name == "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2"
    assert a100.profile("1g.10gb").nvml_constant == 9


def test_resource_names_are_nvidias_mixed_strategy_names() -> None:
    h100 = catalogue.model("H100-80GB")
    assert h100.profile("1g.10gb").resource_name == "nvidia.com/mig-1g.10gb"
    assert h100.profile("1g.10gb+me").resource_name == "nvidia.com/mig-1g.10gb.me"
    assert catalogue.profile_name_from_resource("nvidia.com/mig-1g.10gb.me") == "1g.10gb+me"
    assert h100.profile("nvidia.com/mig-3g.40gb").name == "3g.40gb"
    assert catalogue.WHOLE_GPU_RESOURCE == "nvidia.com/gpu"


@pytest.mark.parametrize(("profile", "resource"), [
    # NVIDIA's device plugin: strings.ReplaceAll("mig-"+profile, "+", "."); a dash is kept
    ("1g.24gb", "nvidia.com/mig-1g.24gb"),
    ("1g.24gb+me", "nvidia.com/mig-1g.24gb.me"),
    ("1g.24gb+gfx", "nvidia.com/mig-1g.24gb.gfx"),
    ("1g.24gb+me.all", "nvidia.com/mig-1g.24gb.me.all"),
    ("1g.24gb-me", "nvidia.com/mig-1g.24gb-me"),
    ("4g.96gb+gfx", "nvidia.com/mig-4g.96gb.gfx"),
])
def test_every_variant_has_nvidias_resource_name_and_back(profile: str, resource: str) -> None:
    rtx = catalogue.model("RTX-PRO-6000-96GB")
    assert rtx.profile(profile).resource_name == resource
    assert rtx.profile(resource).name == profile
    assert catalogue.profile_name_from_resource(resource) == profile


def test_each_variant_is_named_by_its_nvml_constant() -> None:
    rtx = catalogue.model("RTX-PRO-6000-96GB")
    assert {p.name: p.variant for p in rtx.profiles if p.name.startswith("1g.")} == {
        "1g.24gb": "", "1g.24gb+me": "+me", "1g.24gb+gfx": "+gfx",
        "1g.24gb+me.all": "+me.all", "1g.24gb-me": "-me"}
    assert rtx.full_profile.name == "4g.96gb"  # the plain one, not its +gfx twin
    assert [p.name for p in rtx.profiles if p.plain] == ["1g.24gb", "2g.48gb", "4g.96gb"]


def test_all_media_engines_leave_the_other_slices_only_no_media_ones() -> None:
    rtx = catalogue.model("RTX-PRO-6000-96GB")
    everything = layout.Slice("1g.24gb+me.all", 0)
    assert layout.conflict_with(rtx, [everything], layout.Slice("1g.24gb-me", 3)) is None
    refused = layout.conflict_with(rtx, [everything], layout.Slice("1g.24gb", 3))
    assert refused is not None
    assert "engines" in refused.message
    assert layout.is_valid(rtx, [everything, layout.Slice("2g.48gb-me", 6),
                                 layout.Slice("1g.24gb-me", 3)])
    assert not layout.is_valid(rtx, [layout.Slice("1g.24gb+me", 0),
                                     layout.Slice("1g.24gb+me.all", 3)])  # one OFA


def test_the_rtx_pro_grid_has_twelve_units_and_the_observed_gi_ids() -> None:
    rtx = catalogue.model("RTX-PRO-6000-96GB")
    ids = {str(pl): rtx.gpu_instance_id(pl) for p in rtx.profiles if p.plain
           for pl in p.placements}
    assert ids == {"0:3": 3, "3:3": 4, "6:3": 5, "9:3": 6, "0:6": 1, "6:6": 2, "0:12": 0}
    assert layout.is_valid(rtx, [layout.Slice("2g.48gb", 0), layout.Slice("1g.24gb", 6),
                                 layout.Slice("1g.24gb", 9)])  # as created on a real card


def test_an_earlier_drivers_names_are_aliases_derived_by_the_same_rule() -> None:
    gb200 = catalogue.model("GB200-186GB")
    for profile in gb200.profiles:
        earlier = catalogue.expected_profile_name(gb200, profile, total_gib=189)
        if earlier != profile.name:
            assert profile.aliases == (earlier,)
            assert gb200.profile(earlier) is profile
        else:
            assert profile.aliases == ()
    assert gb200.profile("7g.189gb").name == "7g.186gb"
    assert layout.layout_for_counts(gb200, {"1g.24gb": 2, "1g.23gb": 1}) == (
        layout.layout_for_counts(gb200, {"1g.23gb": 3}))
    with pytest.raises(UnknownProfileError):
        catalogue.model("B200-180GB").profile("7g.189gb")  # an alias is one model's


def test_aliases_never_shadow_a_profile_of_the_same_model() -> None:
    for model in catalogue.models():
        names = [p.name for p in model.profiles]
        aliases = [a for p in model.profiles for a in p.aliases]
        assert len(set(names + aliases)) == len(names) + len(aliases), model.name


@pytest.mark.parametrize(("name", "model"), [
    ("h20", "H20-96GB"), ("NVIDIA H20", "H20-96GB"), ("b200", "B200-180GB"),
    ("gb200", "GB200-186GB"), ("b300", "B300-269GB"), ("gb300", "GB300-278GB"),
    ("rtx-pro-6000", "RTX-PRO-6000-96GB"),
    ("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", "RTX-PRO-6000-96GB"),
    ("0x2BB1", "RTX-PRO-6000-96GB"), ("0x2329", "H20-96GB"), ("0x233D", "H100-96GB"),
    ("0x20B6", "PG506-96GB"), ("NVIDIA A800-SXM4-40GB", "A100-SXM4-40GB"),
    ("0x20BD", "A100-SXM4-40GB"), ("NVIDIA H800", "H100-80GB"), ("0x233A", "H100-NVL-94GB"),
])
def test_2026_cards_and_the_a800_h800_twins_resolve(name: str, model: str) -> None:
    assert catalogue.model(name).name == model


def test_gpu_instance_ids_follow_the_observed_slot_tree() -> None:
    a100 = catalogue.model("A100-SXM4-40GB")
    ids = {str(pl): a100.gpu_instance_id(pl) for p in a100.profiles for pl in p.placements}
    assert ids == {
        "0:8": 0, "0:4": 1, "4:4": 2, "0:2": 3, "2:2": 4, "4:2": 5, "6:2": 6,
        "0:1": 7, "1:1": 8, "2:1": 9, "3:1": 10, "4:1": 11, "5:1": 12, "6:1": 13,
    }
    a30 = catalogue.model("A30-24GB")
    ids = {str(pl): a30.gpu_instance_id(pl) for p in a30.profiles for pl in p.placements}
    assert ids == {"0:4": 0, "0:2": 1, "2:2": 2, "0:1": 3, "1:1": 4, "2:1": 5, "3:1": 6}


def test_real_cards_map_to_models_by_pci_id_then_name() -> None:
    assert catalogue.find_model("whatever", 0x20F110DE) == catalogue.model("A100-SXM4-40GB")
    assert catalogue.find_model("NVIDIA H100 NVL") == catalogue.model("H100-NVL-94GB")
    assert catalogue.find_model("NVIDIA H200 NVL") == catalogue.model("H200-141GB")
    assert catalogue.find_model("h200") == catalogue.model("H200-141GB")
    assert catalogue.find_model("NVIDIA L4") is None
    assert catalogue.find_model("a100") is None  # ambiguous prefix


@pytest.mark.parametrize("name", [
    "A100-80GB", "a100-80gb",  # catalogue name, any case
    "NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB", "a100 80gb pcie",  # NVML's, with or without NVIDIA
    "0x20B2", "0x20b210de",  # PCI device id, bare or with NVIDIA's vendor id
    "A100-8",  # a unique prefix
])
def test_one_resolver_reads_every_way_a_model_is_named(name: str) -> None:
    assert catalogue.model(name) == catalogue.model("A100-80GB")


def test_an_ambiguous_prefix_names_the_candidates() -> None:
    with pytest.raises(UnknownModelError, match=r"ambiguous.*A100-SXM4-40GB, A100-80GB"):
        catalogue.model("A100", field_name="--gpus")


def test_unknown_model_and_profile_name_the_field_and_the_choices() -> None:
    with pytest.raises(UnknownModelError) as model_error:
        catalogue.model("A200", field_name="spec.gpus[0].model")
    assert model_error.value.field == "spec.gpus[0].model"
    assert "A100-SXM4-40GB" in str(model_error.value)
    with pytest.raises(UnknownProfileError) as profile_error:
        catalogue.model("A30-24GB").profile("1g.10gb")
    assert "1g.6gb" in str(profile_error.value)
    assert profile_error.value.field == "profile"


def test_unverified_values_are_marked() -> None:
    h200 = catalogue.model("H200-141GB")
    assert "placements" in h200.unverified
    assert {"memory_mib", "profile_id", "placements"} <= h200.profile("1g.18gb").unverified
    assert catalogue.model("A100-SXM4-40GB").verified
    assert not catalogue.model("H100-80GB").verified  # the PCIe card's SM counts


@pytest.mark.skipif(not REFERENCE.exists(), reason="shared/reference is not beside this checkout")
def test_every_value_matches_the_reference_facts() -> None:
    """Each model the reference describes matches it: structure always, and every value the
    reference itself read off a card (it marks the others unverified; where a newer source
    such as a real ``-lgip`` transcript gave the catalogue a value, that one stands)."""
    reference = json.loads(REFERENCE.read_text())["gpus"]
    compared = 0
    for model in catalogue.models():
        facts = next((f for name, f in reference.items() if name == model.name), None)
        if facts is None:
            continue
        compared += 1
        assert set(facts["product_names"]) <= set(model.product_names)
        assert {int(pci.split()[0], 16) for pci in facts["pci_device_ids"]} <= set(
            model.pci_device_ids)
        assert model.memory_slices == facts["memory_slices"]
        assert model.compute_slices == facts["compute_slices"]
        assert model.max_gpu_instances == facts["max_gpu_instances"]
        for placement_text, gi_id in facts.get("gi_id_by_placement", {}).items():
            start, size = (int(x) for x in placement_text.split(":"))
            assert model.gpu_instance_id(catalogue.Placement(start, size)) == gi_id
        if not facts.get("profiles"):
            continue
        assert model.total_memory_mib == facts.get("total_memory_mib", model.total_memory_mib)
        assert [p.name for p in model.profiles] == [p["name"] for p in facts["profiles"]]
        for profile, row in zip(model.profiles, facts["profiles"], strict=True):
            assert profile.nvml_constant_name == row["nvml_const"]
            assert profile.nvml_constant == row["nvml_id"]
            assert profile.compute_slices == row["compute_slices"]
            assert profile.memory_slices == row["memory_slices"]
            assert profile.max_count == row["max_count"]
            if row.get("unverified"):
                continue
            assert profile.profile_id == row["profile_id"]
            assert profile.memory_mib == row["memory_mib"]
            assert profile.sm_count == row["sm_count"]
            assert profile.engines == catalogue.Engines(
                row["copy_engines"], row["decoders"], row["encoders"], row["jpeg"], row["ofa"])
            assert [(p.start, p.size) for p in profile.placements] == [
                (p["start"], p["size"]) for p in row["placements"]]
            assert profile.verified == (not facts.get("placements_unverified")
                                        and not model.unverified)
    assert compared == len(reference)


@pytest.mark.parametrize(("name", "card"), [
    ("L4", "L4-24GB"), ("NVIDIA L4", "L4-24GB"), ("Tesla T4", "T4-16GB"),
    ("NVIDIA Tesla T4", "T4-16GB"),  # as driver 465 named it
    ("0x2237", "A10G-24GB"), ("a10", "A10-24GB"), ("Tesla V100-PCIE-32GB", "V100-32GB"),
    ("0x1DF5", "V100-16GB"), ("l40s", "L40S-48GB"), ("A100-80GB", "A100-80GB"),
])
def test_one_resolver_reads_cards_with_and_without_mig(name: str, card: str) -> None:
    assert catalogue.card(name).name == card


def test_cards_without_mig_are_not_mig_models() -> None:
    assert catalogue.find_model("NVIDIA L4") is None
    l4 = catalogue.card("L4")
    assert isinstance(l4, catalogue.WholeGpu)
    assert (l4.total_memory_mib, l4.architecture, l4.mps_supported) == (23034, "ada", True)
    with pytest.raises(UnknownModelError) as error:
        catalogue.card("v100")
    assert "ambiguous: it starts V100-16GB, V100-32GB" in str(error.value)
    names = [c.name for c in (*catalogue.models(), *catalogue.whole_gpus())]
    assert len(names) == len(set(names))
    ids = [i for c in (*catalogue.models(), *catalogue.whole_gpus()) for i in c.pci_device_ids]
    assert len(ids) == len(set(ids)), "a PCI id names one card"


def test_memory_sized_share_resources_are_named_and_read_back() -> None:
    assert catalogue.shared_resource() == "nvidia.com/gpu.shared"
    assert catalogue.shared_resource(8) == "nvidia.com/gpu.shared-8gb"
    assert catalogue.share_size_gib("nvidia.com/gpu.shared-8gb") == 8
    assert catalogue.share_size_gib("nvidia.com/gpu.shared") is None
    assert catalogue.share_size_gib("nvidia.com/gpu.shared-0gb") is None
    assert catalogue.is_gpu_share("nvidia.com/gpu.shared-12gb")
    assert not catalogue.is_gpu_share("nvidia.com/mig-1g.10gb.shared")
    assert catalogue.shares_of(23034, 8) == 2
    assert catalogue.shares_of(1_000_000, 1) == catalogue.MPS_MAX_CLIENTS
