"""``tessera catalogue``: the table a person reads and the JSON a script reads."""

from __future__ import annotations

import json

import pytest

from tessera.cli.main import main
from tessera.core import catalogue


def test_the_table_shows_placements_ids_and_resource_names(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["catalogue", "A100-SXM4-40GB"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("A100-SXM4-40GB (NVIDIA A100-SXM4-40GB, NVIDIA A100-PCIE-40GB, ")
    row = next(line for line in out.splitlines() if line.split()[:1] == ["1g.10gb"])
    assert row.split() == ["1g.10gb", "15", "9", "1x2", "9856", "4", "14", "1/1/0/0/0",
                           "{0,2,4,6}:2", "nvidia.com/mig-1g.10gb"]


def test_unverified_rows_are_marked(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["catalogue", "H200-141GB"]) == 0
    out = capsys.readouterr().out
    assert "1g.18gb*" in out
    assert "not verified on a real card: memory_mib" in out


def test_json_has_the_documented_shape(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["catalogue", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["version"] == 1
    assert [m["name"] for m in document["models"]] == [m.name for m in catalogue.models()]
    a30 = document["models"][0]
    assert a30["pci_device_ids"] == ["0x20B710DE"]
    me = next(p for p in a30["profiles"] if p["name"] == "1g.6gb+me")
    assert me["resource_name"] == "nvidia.com/mig-1g.6gb.me"
    assert me["profile_id"] == 21
    assert me["nvml_constant"] == "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1"
    assert me["placements"][3] == {"start": 3, "size": 1, "gpu_instance_id": 6}
    assert me["engines"] == {"copy": 1, "decoders": 1, "encoders": 0, "jpeg": 1, "ofa": 1}


def test_an_unknown_model_is_a_usage_error_listing_the_models(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["catalogue", "K80"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tessera: error: model: unknown GPU model 'K80' (a catalogue name, ")
    assert "(valid: A30-24GB" in err


@pytest.mark.parametrize(("name", "model", "rows"), [
    ("b200", "B200-180GB", 7), ("gb200", "GB200-186GB", 7), ("b300", "B300-269GB", 7),
    ("gb300", "GB300-278GB", 7), ("rtx-pro-6000", "RTX-PRO-6000-96GB", 11),
    ("h20", "H20-96GB", 7),
])
def test_the_2026_cards_print_full_tables(capsys: pytest.CaptureFixture[str], name: str,
                                          model: str, rows: int) -> None:
    assert main(["catalogue", name]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"{model} (NVIDIA ")
    table = [line.split() for line in lines[2:] if not line.lstrip().startswith("*")]
    assert len(table) == rows
    for row, profile in zip(table, catalogue.model(model).profiles, strict=True):
        assert row[0].rstrip("*") == profile.name
        assert row[-1] == profile.resource_name
        assert row[-2] == "{" + ",".join(map(str, profile.starts)) + (
            f"}}:{profile.memory_slices}")


def test_the_markdown_table_lists_every_model_and_what_is_unverified(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["catalogue", "--markdown"]) == 0
    out = capsys.readouterr().out
    assert "| RTX-PRO-6000-96GB | NVIDIA RTX PRO 6000 Blackwell Server Edition, " in out
    assert "- **B300-269GB**: card-wide: placements, total_memory_mib; engines, memory_mib, " \
        "profile_id, sm_count of every profile." in out


def test_cards_without_mig_are_listed_as_shared_whole(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["catalogue", "L4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("Without MIG")
    assert lines[2].split() == ["L4-24GB", "NVIDIA", "L4", "0x27B8", "ada", "23034", "48"]
    assert main(["catalogue", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert [w["name"] for w in document["whole_gpus"]] == [
        w.name for w in catalogue.whole_gpus()]
    t4 = document["whole_gpus"][0]
    assert (t4["product_names"], t4["pci_device_ids"], t4["mps_supported"]) == (
        ["Tesla T4"], ["0x1EB810DE"], True)
