"""The image as it ships: built by ``make image`` from ``daemonset/Dockerfile`` (buildah, on a
Debian base made locally), reproducible, and runnable: its entry point runs under runc and
reports the version the chart installs."""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
from pathlib import Path

import yaml

import tessera
from tessera.testing.cluster.fixtures import require_real_runtime

ROOT = Path(__file__).resolve().parents[1]
CHART = yaml.safe_load((ROOT / "charts" / "tessera" / "Chart.yaml").read_text())


def test_one_version_for_the_package_the_chart_and_the_image() -> None:
    assert CHART["appVersion"] == tessera.__version__, (
        "charts/tessera/Chart.yaml appVersion must be tessera.__version__")
    assert CHART["version"] == tessera.__version__, (
        "charts/tessera/Chart.yaml version must be tessera.__version__ (one release number)")


def test_the_image_s_entry_point_runs_under_runc_and_says_the_chart_s_app_version(
        tmp_path: Path) -> None:
    binaries, images = require_real_runtime()
    layout = tmp_path / "layout"
    with tarfile.open(images.directory / "tessera.tar") as archive:
        archive.extractall(layout, filter="tar")
    bundle = tmp_path / "bundle"
    subprocess.run(["umoci", "unpack", "--image", f"{layout}:{images.image}", str(bundle)],
                   check=True, capture_output=True, timeout=120)
    config = json.loads((bundle / "config.json").read_text())
    assert config["process"]["args"] == ["tessera"], "the entry point is the tessera CLI"
    assert config["process"]["user"]["uid"] == 65532, "non-root unless the chart says root"
    config["process"]["args"] = ["tessera", "--version"]
    config["process"]["terminal"] = False
    (bundle / "config.json").write_text(json.dumps(config))
    done = subprocess.run([binaries["runc"], "run", "--bundle", str(bundle),
                           f"tessera-version-{os.getpid()}"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"tessera {CHART['appVersion']}"


def test_two_builds_of_one_commit_give_the_same_image() -> None:
    _, images = require_real_runtime()
    again = subprocess.run([str(ROOT / "tools" / "image" / "build.sh"), "--rebuild-id"],
                           capture_output=True, text=True, timeout=600, check=False,
                           env={**os.environ, "PYTHON": str(ROOT / ".venv" / "bin" / "python")})
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == images.image_id, (
        f"a second build gave {again.stdout.strip()}, make image gave {images.image_id} "
        "(if the sources changed since `make image`, run it again: make test does)")
