"""``tessera agent --once --spec-file``: bad spec files are usage errors naming the file."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tessera.cli.main import main
from tessera.core import catalogue
from tessera.nvml.sim.store import load_state_file


@pytest.mark.parametrize(("content", "problem"), [
    (b"\xff\xfe\x00k\x00i\x00n\x00d", "is not UTF-8 text"),
    (b"spec: [unclosed", "is not valid YAML or JSON at line"),
    (b"- just\n- a list\n", "is not a NodePartition object"),
])
def test_a_bad_spec_file_exits_2_naming_the_file_and_the_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, problem: str,
) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_bytes(content)
    code = main(["agent", "--once", "--spec-file", str(spec), "--nvml", "sim:" + str(
        tmp_path / "node.json"), "--no-kubelet"])
    err = capsys.readouterr().err
    assert code == 2
    assert "--spec-file" in err
    assert str(spec) in err
    assert problem in err
    assert "Traceback" not in err


@pytest.mark.parametrize(("gpus", "slices"), [
    ("B200", ["3g.90gb@4", "2g.45gb@0", "1g.23gb+me@2", "1g.23gb@3"]),
    ("GB300", ["4g.139gb@0", "1g.70gb@4", "1g.35gb+me@6"]),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition",
     ["1g.24gb+me.all@0", "1g.24gb-me@3", "2g.48gb-me@6"]),
    ("rtx-pro-6000", ["2g.48gb+gfx@0", "1g.24gb+gfx@6", "1g.24gb@9"]),
    ("H20", ["3g.48gb@0", "2g.24gb@4", "1g.12gb@6"]),
])
def test_a_mixed_layout_applies_on_a_2026_card(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], gpus: str, slices: list[str],
) -> None:
    state = tmp_path / "node.json"
    assert main(["dev", "sim", "init", str(state), "--gpus", gpus]) == 0
    spec = tmp_path / "partition.yaml"
    spec.write_text(yaml.safe_dump({
        "apiVersion": "tessera.dev/v1alpha1", "kind": "NodePartition",
        "metadata": {"name": "node-a"},
        "spec": {"gpus": [{"index": 0, "mode": "mig", "slices": [
            {"profile": s.split("@")[0], "start": int(s.split("@")[1])} for s in slices]}]}}))
    code = main(["agent", "--once", "--spec-file", str(spec), "--nvml", f"sim:{state}",
                 "--no-kubelet"])
    assert code == 0, capsys.readouterr()
    (gpu,) = load_state_file(state).gpus
    model = catalogue.model(gpu.model)
    created = sorted(f"{model.profile_by_id(i.profile_id).name}@{i.start}"  # type: ignore[union-attr]
                     for i in gpu.instances)
    assert created == sorted(slices)
    for instance in gpu.instances:
        assert instance.id == model.gpu_instance_id(catalogue.Placement(instance.start,
                                                                        instance.size))


@pytest.mark.parametrize(("args", "field", "problem"), [
    (["--once", "--api", "dra"], "--once", "a DRA node has no layout to apply"),
    (["--api", "dra", "--node-name", "n", "--kubeconfig", "/nonexistent", "--dra-mps-shares",
      "64"], "--dra-mps-shares", "64 is not 0 to 48"),
    (["--api", "dra", "--node-name", "n", "--dra-mps-shares", "4"], "--dra-mps-shares",
     "MPS shares need --mps-root"),
])
def test_bad_dra_settings_exit_2_naming_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], field: str,
    problem: str,
) -> None:
    code = main(["agent", "--nvml", "sim:" + str(tmp_path / "node.json"), *args])
    err = capsys.readouterr().err
    assert code == 2
    assert field in err
    assert problem in err
    assert "Traceback" not in err
