"""``tessera simulate`` as a user runs it: the bundled trace, the table, JSON, the report; a
user's own pod history (``--workload``) and its exporter (``tessera simulate export``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tessera.cli import plan_cmd, simulate_cmd
from tessera.cli.main import build_parser, main
from tessera.cli.simulate_cmd import history_row, history_rows
from tessera.core import catalogue
from tessera.sim.history import load_history, parse_time


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["simulate", "--no-progress", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_default_run_prints_the_table_and_writes_the_report(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = tmp_path / "r.html"
    code, out, _ = _run(capsys, "--report", str(report))
    assert code == 0
    assert "bundled openb default sample" in out
    assert f"report: {report}" in out
    for policy in ("dynamic", "greedy", "static:all-balanced", "static:all-7g", "fluid:gpu"):
        assert any(line.startswith(policy) for line in out.splitlines())
    page = report.read_text()
    assert page.startswith("<!doctype html>")
    assert "<svg" in page
    legend = page.split("<p class='legend'>", 1)[1].split("</p>", 1)[0]
    assert "1g (one compute slice), held" in legend
    assert "7g, free" in legend
    assert len(page) > 10_000


def test_json_is_deterministic_for_a_seed(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    args = ("--json", "--report", str(tmp_path / "r.html"), "--trace", "synthetic",
            "--pods", "300", "--seed", "9", "--policies", "dynamic,greedy,static:best")

    def figures() -> list[dict[str, object]]:
        code, out, _ = _run(capsys, *args)
        assert code == 0
        rows: list[dict[str, object]] = json.loads(out)["policies"]
        for row in rows:
            row.pop("wall_s")
        return rows

    first = figures()
    assert [r["policy"] for r in first][:2] == ["dynamic", "greedy"]
    assert str(first[2]["policy"]).startswith("static:best(")
    assert first == figures()


def test_replay_with_compression(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "--arrivals", "replay", "--compress", "50", "--policies",
                        "greedy,fluid:cluster", "--report", str(tmp_path / "r.html"))
    assert code == 0
    assert "replayed" in out


@pytest.mark.parametrize(("args", "field"), [
    (("--policies", "dynamic,bogus"), "--policies"),
    (("--policies", "static:all-5g"), "--policies"),
    (("--cluster", "0x8xA100-80GB"), "--cluster"),
    (("--cluster", "2x8xV100"), "--cluster"),
    (("--trace", "/nonexistent.csv"), "--trace"),
])
def test_bad_input_exits_2_naming_the_option(args: tuple[str, ...], field: str,
                                             tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, *args, "--report", str(tmp_path / "r.html"))
    assert code == 2
    assert field in err


@pytest.mark.parametrize("model", [m.name for m in catalogue.models()])
def test_every_catalogued_card_simulates_with_the_default_policies(
        model: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "--cluster", f"1x2x{model}", "--trace", "synthetic",
                          "--pods", "60", "--seed", "3", "--json",
                          "--report", str(tmp_path / "r.html"))
    assert code == 0, err
    results = {p["policy"]: p for p in json.loads(out)["policies"]}
    whole = f"static:all-{catalogue.model(model).full_profile.compute_slices}g"
    assert set(results) == {"dynamic", "greedy", "static:all-balanced", whole, "fluid:gpu"}
    assert results["dynamic"]["placed"] > 0


POD_HISTORY = """name,created,started,finished,request
default/notebook-0,2025-05-01T09:00:00Z,2025-05-01T09:00:05Z,2025-05-01T10:00:00Z,1g.10gb
ml/train-1,2025-05-01T09:01:00Z,2025-05-01T09:01:30Z,,gpu:2
infer/embed-2,2025-05-01T09:02:00Z,2025-05-01T09:02:01Z,2025-05-01T09:40:00Z,shared:10gb
ml/sweep-3,2025-05-01T09:03:00Z,2025-05-01T09:03:02Z,2025-05-01T09:20:00Z,2x3g.40gb
ml/eval-4,2025-05-01T09:30:00Z,,,1g.10gb
"""


class TestWorkload:
    """``--workload pods.csv``: the user's own history instead of a trace."""

    def test_a_small_history_runs_end_to_end(self, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
        pods = tmp_path / "pods.csv"
        pods.write_text(POD_HISTORY)
        code, out, err = _run(capsys, "--workload", str(pods), "--cluster", "1x4xA100-80GB",
                              "--json", "--report", str(tmp_path / "r.html"))
        assert code == 0, err
        figures = json.loads(out)
        assert any(f"{pods}, replayed on its own clock" in d for d in figures["details"])
        assert any("1 never started" in d for d in figures["details"])
        dynamic = next(p for p in figures["policies"] if p["policy"] == "dynamic")
        assert dynamic["placed"] == 5

    def test_on_cards_without_mig_and_with_size_for(self, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
        pods = tmp_path / "pods.csv"
        pods.write_text(POD_HISTORY)
        code, out, err = _run(capsys, "--workload", str(pods), "--cluster", "1x2xL4",
                              "--report", str(tmp_path / "r.html"))
        assert code == 0, err
        assert "L4" in out
        code, out, err = _run(capsys, "--workload", str(pods), "--cluster", "1x2xA100-80GB",
                              "--size-for", "p95-wait=60s", "--json", "--report",
                              str(tmp_path / "s.html"))
        assert code == 0, err
        assert {a["policy"] for a in json.loads(out)["answers"]} >= {"dynamic", "greedy"}

    def test_the_bundled_sample_runs(self, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
        code, out, err = _run(capsys, "--workload", "bundled", "--policies", "dynamic",
                              "--report", str(tmp_path / "r.html"))
        assert code == 0, err
        assert "bundled sample pod history" in out

    def test_a_bad_row_exits_2_naming_the_line_the_column_and_the_fix(
            self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        pods = tmp_path / "pods.csv"
        pods.write_text(POD_HISTORY.replace("gpu:2", "2 GPUs"))
        code, _, err = _run(capsys, "--workload", str(pods), "--report",
                            str(tmp_path / "r.html"))
        assert code == 2
        assert f"--workload {pods} line 3 (pod ml/train-1), column request" in err
        assert "gpu:2" in err  # the forms it accepts

    @pytest.mark.parametrize("extra", [("--trace", "synthetic"), ("--load", "2"),
                                       ("--arrivals", "poisson")])
    def test_trace_options_beside_it_are_refused_not_ignored(
            self, extra: tuple[str, ...], tmp_path: Path,
            capsys: pytest.CaptureFixture[str]) -> None:
        code, _, err = _run(capsys, "--workload", "bundled", *extra)
        assert code == 2
        assert extra[0] in err
        assert "--rate-scale" in err

    def test_a_mixed_cluster_refuses_it(self, capsys: pytest.CaptureFixture[str]) -> None:
        code, _, err = _run(capsys, "--workload", "bundled", "--cluster",
                            "1x2xA100-80GB,1x2xL4")
        assert code == 2
        assert "--workload" in err


def _pod(name: str, resources: dict[str, str], *, created: str = "2025-05-01T09:00:00Z",
         statuses: list[dict[str, Any]] | None = None, phase: str = "Running",
         init: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if statuses is not None:
        status["containerStatuses"] = statuses
    if init is not None:
        status["initContainerStatuses"] = init
    return {"metadata": {"name": name, "namespace": "ml", "creationTimestamp": created},
            "spec": {"containers": [{"name": "main",
                                     "resources": {"limits": resources}}]},
            "status": status}


def _running(at: str) -> dict[str, Any]:
    return {"state": {"running": {"startedAt": at}}}


def _done(started: str, finished: str) -> dict[str, Any]:
    return {"state": {"terminated": {"startedAt": started, "finishedAt": finished}}}


T = "2025-05-01T09:{:02d}:00+00:00".format


class TestExportRows:
    """``tessera simulate export``'s translation of pods (as the API lists them) into rows."""

    def test_a_finished_pod_has_its_containers_first_start_and_last_finish(self) -> None:
        pod = _pod("a", {"nvidia.com/mig-1g.10gb": "1"}, phase="Succeeded",
                   statuses=[_done(T(2), T(30)), _done(T(1), T(40))])
        row = history_row(pod)
        assert (row.name, str(row.request)) == ("ml/a", "1g.10gb")
        assert row.created == parse_time(T(0))[0]
        assert (row.started, row.finished) == (parse_time(T(1))[0], parse_time(T(40))[0])

    def test_a_pod_with_a_container_still_running_is_unfinished(self) -> None:
        pod = _pod("a", {"nvidia.com/gpu": "2"}, statuses=[_done(T(2), T(30)), _running(T(3))])
        row = history_row(pod)
        assert (row.started, row.finished, str(row.request)) == (parse_time(T(2))[0], None,
                                                                 "gpu:2")

    def test_a_restarted_container_started_when_it_first_did(self) -> None:
        restarted = {"state": {"waiting": {"reason": "CrashLoopBackOff"}},
                     "lastState": {"terminated": {"startedAt": T(5), "finishedAt": T(9)}}}
        row = history_row(_pod("a", {"nvidia.com/gpu.shared-10gb": "1"},
                               statuses=[restarted]))
        assert (row.started, row.finished, str(row.request)) == (parse_time(T(5))[0], None,
                                                                  "shared:10gb")

    def test_an_init_container_starts_the_pod(self) -> None:
        row = history_row(_pod("a", {"nvidia.com/gpu.shared": "2"}, statuses=[_running(T(9))],
                               init=[_done(T(4), T(8))]))
        assert (row.started, str(row.request)) == (parse_time(T(4))[0], "2xshared")

    def test_a_pending_pod_never_started(self) -> None:
        row = history_row(_pod("a", {"nvidia.com/mig-3g.40gb": "2"}, phase="Pending"))
        assert (row.started, row.finished, str(row.request)) == (None, None, "2x3g.40gb")

    def test_gpu_pods_in_creation_order_others_ignored_unmodelled_ones_counted(self) -> None:
        pods = [
            _pod("late", {"nvidia.com/gpu": "1"}, created=T(9), statuses=[_running(T(9))]),
            _pod("early", {"nvidia.com/gpu": "1"}, created=T(1), statuses=[_running(T(1))]),
            _pod("cpu", {"cpu": "2"}),
            _pod("inner", {"nvidia.com/mig-3g.40gb.shared": "1"}),
            _pod("failed", {"nvidia.com/gpu": "1"}, phase="Failed"),
        ]
        rows, skipped = history_rows(pods)
        assert [r.name for r in rows] == ["ml/early", "ml/late"]
        assert sum(skipped.values()) == 2
        assert any("inside a MIG slice" in why for why in skipped)
        assert "ended without starting" in skipped

    def test_export_writes_the_csv_that_workload_reads(
            self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
            capsys: pytest.CaptureFixture[str]) -> None:
        pods = [_pod("a", {"nvidia.com/mig-1g.10gb": "1"}, statuses=[_done(T(1), T(30))],
                     phase="Succeeded"),
                _pod("b", {"nvidia.com/gpu": "1"}, statuses=[_running(T(2))]),
                _pod("c", {"nvidia.com/gpu": "1"}, phase="Pending"),
                _pod("d", {"nvidia.com/mig-3g.40gb.shared": "1"})]
        seen: list[tuple[str | None, str | None]] = []

        class Api:
            def close(self) -> None:
                pass

        def connect(kubeconfig: str | None, context: str | None) -> Api:
            seen.append((kubeconfig, context))
            return Api()

        # The export lists through the live-cluster helper of `tessera plan`, pods only.
        monkeypatch.setattr(plan_cmd, "api_client", connect)
        monkeypatch.setattr(plan_cmd, "api_listers", lambda api: (
            ("pod", lambda: pods), ("node", lambda: pytest.fail("only pods are listed"))))
        out = tmp_path / "pods.csv"
        assert main(["simulate", "export", "--kubeconfig", "kc", "--context", "ctx",
                     "-o", str(out)]) == 0
        assert seen == [("kc", "ctx")]
        err = capsys.readouterr().err
        assert "exported 3 GPU pods (1 running, 1 waiting)" in err
        assert "skipped 1" in err
        assert [p.name for p in load_history(out).pods] == ["ml/a", "ml/b", "ml/c"]
        assert main(["simulate", "export"]) == 0
        assert capsys.readouterr().out.startswith("name,created,started,finished,request\n")

    def test_simulate_without_the_word_export_parses_as_before(self) -> None:
        args = build_parser().parse_args(["simulate", "--cluster", "1x2xL4", "--json"])
        assert args.run is simulate_cmd.run
        assert args.simulate_command is None
        args = build_parser().parse_args(["simulate", "export", "-o", "x.csv"])
        assert args.run is simulate_cmd.run_export
