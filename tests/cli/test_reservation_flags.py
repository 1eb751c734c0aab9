"""``--reservations`` and ``--reserve-after-waits``: one meaning in the controller, its previews
(``tessera plan``, ``tessera status``) and its what-if (``tessera simulate``); bad values exit 2
naming the flag before anything is read or connected."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tessera.cli import controller_cmd, simulate_cmd, status_cmd
from tessera.cli.main import build_parser, main
from tessera.controller.loop import ControllerSettings
from tessera.sim.cluster import shorthand
from tessera.sim.dynamic import DynamicPolicy

from .test_plan_cmd import write

# One A100-40GB with a 1g.5gb in use: the 7g.40gb that came first cannot start until it ends,
# and the 1g.5gb that came after fits beside it now.
CLUSTER = {"nodes": [{"name": "node-a", "labels": {}, "gpus": [
    {"index": 0, "model": "A100-SXM4-40GB", "mode": "mig",
     "slices": [{"profile": "1g.5gb", "start": 0, "in_use": True}]}]}]}
PENDING = {"pods": [
    {"namespace": "default", "name": "large", "creation_time": 1,
     "requests": {"nvidia.com/mig-7g.40gb": 1}},
    {"namespace": "default", "name": "small", "creation_time": 2,
     "requests": {"nvidia.com/mig-1g.5gb": 1}},
]}


def plan_json(tmp_path: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> Any:
    assert main([*write(tmp_path, CLUSTER, PENDING), "--json", *flags]) == 0
    return json.loads(capsys.readouterr().out)


def dynamic_settings(name: str, *flags: str) -> tuple[int, float]:
    """(reservations, reserve_after_waits) of the controller that ``tessera simulate``'s
    policy ``name`` runs, under ``flags``."""
    args = build_parser().parse_args(["simulate", *flags])
    policy = simulate_cmd._policy(name, shorthand(1, 8, "A100-80GB"), args)
    assert isinstance(policy, DynamicPolicy)
    settings = policy.controller.settings
    return settings.reservations, settings.reserve_after_waits


def test_by_default_the_older_large_pod_holds_the_gpu_it_waits_for(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = plan_json(tmp_path, capsys)
    assert data["placements"] == []
    assert {u["pod"] for u in data["unplaced"]} == {"default/large", "default/small"}


def test_with_no_reservation_the_later_small_pod_starts_beside_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = plan_json(tmp_path, capsys, "--reservations", "0")
    assert [p["pod"] for p in data["placements"]] == ["default/small"]
    assert [u["pod"] for u in data["unplaced"]] == ["default/large"]


def test_a_snapshot_file_refuses_the_wait_flag_it_could_not_honour(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*write(tmp_path, CLUSTER, PENDING), "--reserve-after-waits", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tessera: error: --reserve-after-waits: a snapshot file has no waits")


def test_the_controller_plans_with_the_flags() -> None:
    args = build_parser().parse_args(["controller", "--reservations", "0",
                                      "--reserve-after-waits", "3.5"])
    settings = controller_cmd.settings_of(args)
    assert (settings.reservations, settings.reserve_after_waits) == (0, 3.5)


def test_the_controller_s_defaults_are_the_settings_defaults() -> None:
    settings = controller_cmd.settings_of(build_parser().parse_args(["controller"]))
    assert settings.reservations == ControllerSettings.reservations
    assert settings.reserve_after_waits == ControllerSettings.reserve_after_waits


def test_simulate_s_dynamic_policy_runs_the_controller_with_the_flags() -> None:
    assert dynamic_settings("dynamic", "--reservations", "2",
                            "--reserve-after-waits", "0") == (2, 0.0)


def test_simulate_says_which_reservation_settings_its_figures_are_for(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--cluster", "1x2xA100-SXM4-80GB", "--policies", "dynamic",
                 "--no-progress", "--report", str(tmp_path / "r.html"),
                 "--json", "--reservations", "0", "--reserve-after-waits", "3"]) == 0
    details = json.loads(capsys.readouterr().out)["details"]
    assert any("0 reservation(s) per plan (dynamic:reservations-N: N), after 3x the median "
               "wait" in d for d in details)


def test_one_simulation_compares_reservation_settings_side_by_side(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--cluster", "1x2xA100-SXM4-80GB", "--policies",
                 "dynamic,dynamic:reservations-0,dynamic:reservations-2", "--no-progress",
                 "--report", str(tmp_path / "r.html"), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["policies"]
    assert [r["policy"] for r in rows] == [
        "dynamic", "dynamic:reservations-0", "dynamic:reservations-2"]
    assert dynamic_settings("dynamic:reservations-2", "--reserve-after-waits", "0") == (2, 0.0)


def test_gpus_without_mig_refuse_the_flags_they_would_ignore(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--cluster", "2x8xL4", "--reservations", "0",
                 "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tessera: error: --reservations/--reserve-after-waits: apply to "
                          "the dynamic policy of MIG GPUs"), err


@pytest.mark.parametrize("name", ["dynamic:reservations-", "dynamic:reservations--1",
                                  "dynamic:reservations-\u00b2",
                                  "dynamic:reservations-one"])
def test_a_bad_reservation_count_in_a_policy_name_exits_2(
        name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--cluster", "1x2xA100-SXM4-80GB", "--policies", name,
                 "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"tessera: error: --policies: {name!r}: N in "), err


def test_status_previews_with_the_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[object] = []

    class ListedError(Exception):
        pass

    def live_cluster(kubeconfig: str | None, context: str | None, solver: str,
                     held: object) -> None:
        seen.append(held)
        raise ListedError

    monkeypatch.setattr(status_cmd, "live_cluster", live_cluster)
    with pytest.raises(ListedError):
        main(["status", "--reservations", "0", "--reserve-after-waits", "1"])
    assert seen == [{"reservations": 0, "reserve_after_waits": 1.0}]


@pytest.mark.parametrize("command", [
    ["controller"], ["plan"], ["status"], ["simulate"],
])
@pytest.mark.parametrize(("flags", "field"), [
    (["--reservations", "-1"], "--reservations"),
    (["--reserve-after-waits", "-0.5"], "--reserve-after-waits"),
    (["--reserve-after-waits", "nan"], "--reserve-after-waits"),
    (["--reserve-after-waits", "inf"], "--reserve-after-waits"),
])
def test_a_bad_value_exits_2_naming_the_flag_before_anything_runs(
        command: list[str], flags: list[str], field: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*command, *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"tessera: error: {field}: "), err
    assert "give" in err
