"""The package metadata installs without warnings on current setuptools."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pytest

from tessera.cli import main as main_module

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def test_the_license_is_an_spdx_expression_not_a_deprecated_table() -> None:
    # setuptools >= 77 warns, on every install, about `license = {text = ...}`.
    project = tomllib.loads(PYPROJECT.read_text())
    assert project["project"]["license"] == "Apache-2.0"
    assert "setuptools>=77" in project["build-system"]["requires"]


def test_kubectl_finds_the_plugin_entry_point(monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    # kubectl runs `kubectl-<name>` from PATH for `kubectl <name> ...`
    project = tomllib.loads(PYPROJECT.read_text())
    assert project["project"]["scripts"]["kubectl-tessera"] == "tessera.cli.main:kubectl_main"
    monkeypatch.setattr(sys, "argv", ["kubectl-tessera", "catalogue", "L4"])
    assert main_module.kubectl_main() == 0
    assert "L4-24GB" in capsys.readouterr().out
