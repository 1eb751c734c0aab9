"""``tessera policy import-mig-parted``: NVIDIA's configs, as admins keep them, become policies."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tessera.cli.main import main

OPERATOR_FILE = (Path(__file__).parents[1] / "api" / "data"
                 / "gpu-operator-default-mig-parted-config.yaml")

UNKNOWN_CARD = """\
version: v1
mig-configs:
  balanced:
    - device-filter: ["0xFFFF10DE"]
      devices: all
      mig-enabled: true
      mig-devices: {"1g.99gb": 7}
    - device-filter: ["0x290110DE"]
      devices: all
      mig-enabled: true
      mig-devices: {"1g.23gb": 2, "2g.45gb": 1, "3g.90gb": 1}
"""


def test_the_operators_config_map_imports_as_it_is(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policy", "import-mig-parted", str(OPERATOR_FILE), "--config",
                 "all-balanced"]) == 0
    captured = capsys.readouterr()
    policy = yaml.safe_load(captured.out)
    assert policy["metadata"]["name"] == "all-balanced"
    assert policy["spec"]["mode"] == "static"
    assert len(policy["spec"]["static"]) == 12  # one entry per card family in the file
    assert captured.err == ""


def test_entries_for_unknown_cards_are_skipped_and_named_on_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(UNKNOWN_CARD)
    assert main(["policy", "import-mig-parted", str(path)]) == 0
    captured = capsys.readouterr()
    assert "skipped the entries for 0xFFFF10DE" in captured.err
    (entry,) = yaml.safe_load(captured.out)["spec"]["static"]
    assert entry["deviceFilter"] == ["0x290110DE"]


def test_strict_refuses_them_with_exit_2(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(UNKNOWN_CARD)
    assert main(["policy", "import-mig-parted", str(path), "--strict"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "mig-configs.balanced[0].device-filter" in captured.err
    assert "0xFFFF10DE" in captured.err
