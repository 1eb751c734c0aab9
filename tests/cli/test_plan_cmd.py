"""``tessera plan``: reads the two files, prints the plan, exits 2 on bad input naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tessera.cli.main import main

CLUSTER = {"nodes": [{"name": "node-a", "labels": {}, "gpus": [
    {"index": 0, "model": "A100-SXM4-40GB", "mode": "mig",
     "slices": [{"profile": "3g.20gb", "start": 4, "in_use": True}]}]}]}
PENDING = {"pods": [
    {"namespace": "default", "name": "p1", "priority": 0,
     "requests": {"nvidia.com/mig-1g.5gb": 2}},
    {"namespace": "default", "name": "p9", "requests": {"nvidia.com/mig-7g.40gb": 1}},
]}


def write(tmp_path: Path, cluster: object = CLUSTER, pending: object = PENDING) -> list[str]:
    (tmp_path / "c.json").write_text(json.dumps(cluster))
    (tmp_path / "p.json").write_text(json.dumps(pending))
    return ["plan", "--cluster", str(tmp_path / "c.json"), "--pending", str(tmp_path / "p.json")]


@pytest.mark.parametrize("solver", ["fast", "exact"])
def test_json_output_is_the_documented_plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], solver: str
) -> None:
    assert main([*write(tmp_path), "--json", "--solver", solver]) == 0
    data = json.loads(capsys.readouterr().out)
    (target,) = data["gpus"]
    assert {"profile": "3g.20gb", "start": 4} in target["slices"]
    (placement,) = data["placements"]
    assert placement["pod"] == "default/p1"
    assert [s["profile"] for s in placement["slices"]] == ["1g.5gb", "1g.5gb"]
    assert data["unplaced"][0]["pod"] == "default/p9"
    assert "3g.20gb@4" in data["unplaced"][0]["reason"]


def test_the_table_names_changes_placements_and_reasons(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(write(tmp_path)) == 0
    out = capsys.readouterr().out
    assert "node-a/gpu0 A100-SXM4-40GB:" in out
    assert "default/p1 -> node-a: gpu0 1g.5gb@" in out
    assert "default/p9: no node with a free mig-7g.40gb placement" in out


def test_bad_input_exits_2_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = json.loads(json.dumps(CLUSTER))
    bad["nodes"][0]["gpus"][0]["slices"][0]["profile"] = "3g.40gb"
    assert main(write(tmp_path, cluster=bad)) == 2
    assert "nodes[0].gpus[0].slices[0].profile" in capsys.readouterr().err


def test_a_file_that_is_not_json_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = write(tmp_path)
    (tmp_path / "p.json").write_text("{nope")
    assert main(args) == 2
    assert "--pending" in capsys.readouterr().err


def test_live_mode_takes_both_files_or_neither(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    cluster = tmp_path / "c.json"
    cluster.write_text('{"nodes": []}')
    assert main(["plan", "--cluster", str(cluster)]) == 2
    assert "give both files, or neither" in capsys.readouterr().err
    assert main(["plan", "--kubeconfig", str(tmp_path / "absent")]) == 2
    assert "--kubeconfig" in capsys.readouterr().err
