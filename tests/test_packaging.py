"""The package metadata installs without warnings on current setuptools."""

from __future__ import annotations

import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def test_the_license_is_an_spdx_expression_not_a_deprecated_table() -> None:
    # setuptools >= 77 warns, on every install, about `license = {text = ...}`.
    project = tomllib.loads(PYPROJECT.read_text())
    assert project["project"]["license"] == "Apache-2.0"
    assert "setuptools>=77" in project["build-system"]["requires"]
