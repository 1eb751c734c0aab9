"""``tessera simulate --size-for``: the fewest GPUs from which every class of pod keeps its
target at every larger size, per policy, with what binds the answer and the curve behind it."""

from __future__ import annotations

import argparse
import itertools
import json
import re
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tessera.cli import simulate_cmd
from tessera.cli.main import main
from tessera.core import catalogue
from tessera.core.errors import InvalidInputError
from tessera.sim.cluster import load_cluster
from tessera.sim.engine import MULTI_GPU, RunResult, size_classes
from tessera.sim.policies import Queues, Schedule, Shape, SimPolicy
from tessera.sim.sizing import (
    ALL,
    SMALL,
    Goal,
    Target,
    answer,
    headline,
    judge,
    parse_goal,
    size_for,
    sweep,
)
from tessera.sim.sizing_report import class_table_text
from tessera.sim.workload import Job

ROOT = Path(__file__).resolve().parents[2]
A100 = ("1g", "2g", "3g", "4g", "7g", MULTI_GPU)


class TestGoals:
    def test_one_number_holds_every_single_gpu_class_and_leaves_multi_gpu_reported(
            self) -> None:
        goal = parse_goal("p95-wait=60s", A100)
        assert goal.targets == (Target(SMALL, "p95-wait", 60.0),)
        assert goal.targeted == ("1g", "2g", "3g", "4g", "7g")

    def test_targets_per_class_and_group_read_like_an_admin_writes_them(self) -> None:
        goal = parse_goal("small:p95-wait=2m, Multi-GPU:mean-wait=6h,7g:p95-wait=90", A100)
        assert goal.targets == (Target(SMALL, "p95-wait", 120.0),
                                Target(MULTI_GPU, "mean-wait", 6 * 3600.0),
                                Target("7g", "p95-wait", 90.0))
        assert str(goal).startswith("small pods' p95 wait <= 2 min and multi-GPU pods' mean")
        assert parse_goal("all:p95-wait=120s", A100).targeted == ()

    @pytest.mark.parametrize(("text", "says"), [
        ("9g:p95-wait=1m", "no class '9g' on this card"),
        ("p99=1", "unknown metric 'p99'"),
        ("small=p95-wait:2m", "expected [CLASS:]METRIC=DURATION"),
        ("small:max-wait=1m", "unknown metric 'max-wait'"),
        ("small:p95-wait=soon", "expected [CLASS:]METRIC=DURATION"),
        ("p95-wait=1m,", "expected [CLASS:]METRIC=DURATION"),
    ])
    def test_a_bad_target_names_the_flag_and_lists_the_classes(self, text: str,
                                                               says: str) -> None:
        with pytest.raises(InvalidInputError) as caught:
            parse_goal(text, A100)
        assert caught.value.field == "--size-for"
        assert says in str(caught.value)
        assert "1g, 2g, 3g, 4g, 7g, multi-GPU, small (every class of one GPU or less), all " \
            "(all pods pooled)" in str(caught.value)

    def test_the_cli_exits_2_on_a_class_the_card_does_not_have(
            self, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
        assert main(["simulate", "--no-progress", "--cluster", "1x4xL4", "--size-for",
                     "7g:p95-wait=1m", "--report", str(tmp_path / "r.html")]) == 2
        err = capsys.readouterr().err
        assert "--size-for" in err
        assert "classes: share, whole, multi-GPU, small" in err
        assert not (tmp_path / "r.html").exists()


def _run(class_waits: dict[str, list[float]]) -> RunResult:
    result = RunResult("p", sum(len(w) for w in class_waits.values()), 7, 100.0)
    result.class_waits = class_waits
    result.waits = [w for waits in class_waits.values() for w in waits]
    return result


class TestNoClassHidesBehindAnother:
    def test_a_group_target_holds_each_class_to_the_bound_not_their_pool(self) -> None:
        # Pooled, the small pods' p95 is 5 s (95 fast 1g pods); the 4g pods wait 10 minutes.
        run = _run({"1g": [5.0] * 95, "4g": [600.0] * 5})
        goal = parse_goal("small:p95-wait=2m", A100)
        assert [(m.class_name, m.value) for m in goal.misses(run)] == [("4g", 600.0)]
        assert parse_goal("all:p95-wait=2m", A100).met(run), "pooled, 4g hides"

    def test_a_class_with_no_target_that_waits_ten_times_longer_is_named(self) -> None:
        run = _run({"1g": [10.0] * 20, MULTI_GPU: [3600.0] * 2})
        goal = parse_goal("p95-wait=1m", A100)
        assert goal.met(run)
        assert goal.unseen(run) == ((MULTI_GPU, 3600.0, 10.0),)
        assert parse_goal("p95-wait=1m,multi-gpu:p95-wait=2h", A100).unseen(run) == ()
        assert goal.unseen(_run({"1g": [10.0] * 20, MULTI_GPU: [99.0]})) == ()

    def test_the_worst_miss_comes_first(self) -> None:
        run = _run({"2g": [150.0], "7g": [1200.0], MULTI_GPU: [7.0 * 3600]})
        goal = parse_goal("small:p95-wait=2m,multi-gpu:p95-wait=6h", A100)
        assert [m.class_name for m in goal.misses(run)] == ["7g", "2g", MULTI_GPU]


def _brute_force(met: Sequence[bool]) -> int | None:
    """The definition, size by size: the first index from which every size meets."""
    for i in range(len(met)):
        if all(met[i:]):
            return i
    return None


@given(st.lists(st.booleans(), max_size=12))
def test_the_answer_is_the_first_size_from_which_every_larger_size_meets(
        met: list[bool]) -> None:
    assert answer(met) == _brute_force(met)


def test_every_pattern_of_up_to_eight_sizes_against_the_definition() -> None:
    for n in range(9):
        for met in itertools.product((False, True), repeat=n):
            assert answer(met) == _brute_force(met), met


class _StartsOnSomeSizes(SimPolicy):
    """Starts every pod at once on the sizes in ``ok``, none on the others (their waits run
    to the horizon)."""

    name = "stub"

    def __init__(self, nodes: int, ok: set[int]) -> None:
        super().__init__()
        self.ok = nodes in ok

    def schedule(self, now: float, queues: Queues) -> Schedule:
        if not self.ok:
            return Schedule(())
        return Schedule(tuple((j, now) for q in queues.values() for j in q.values()))

    def release(self, job: Job) -> None:
        return None

    def unusable_free(self, shapes: Sequence[Shape]) -> int:
        return 0


def _jobs() -> list[Job]:
    return [Job(i, f"j{i}", float(i), 10.0, (("nvidia.com/mig-1g.10gb", 1),), 1)
            for i in range(5)]


def test_every_size_is_tried_and_a_size_that_a_larger_one_breaks_is_named_beside_it() -> None:
    made: list[int] = []

    def make(nodes: int) -> tuple[SimPolicy, int]:
        made.append(nodes)
        return _StartsOnSomeSizes(nodes, {2, 5, 6, 7, 8}), nodes

    goal = parse_goal("p95-wait=1s", A100)
    found = size_for("stub", make, _jobs(), 100.0, goal, limit=8, gpus_per_node=8)
    assert made == list(range(1, 9)), "every size, not a bisection"
    assert (found.nodes, found.gpus) == (5, 40)
    assert (found.also_met, found.not_met) == ((16,), (24, 32))
    assert found.binding_gpus == 32
    assert [m.class_name for m in found.binding] == ["1g"]
    text = headline([found], goal, 64)
    assert text[0] == "To keep small pods' p95 wait <= 1 s: stub needs 40 GPUs (1g binds)."
    assert text[1].endswith("also met at 16 GPUs, not at 24 and 32")


def test_never_met_names_what_misses_at_the_largest_size() -> None:
    goal = parse_goal("p95-wait=1s", A100)
    found = size_for("stub", lambda n: (_StartsOnSomeSizes(n, {3}), n), _jobs(), 100.0, goal,
                     limit=4, gpus_per_node=8)
    assert (found.gpus, found.binding_gpus, found.also_met) == (None, 32, ())
    assert headline([found], goal, 32)[0] == ("To keep small pods' p95 wait <= 1 s: stub needs "
                                              "more than 32 GPUs (1g binds).")


def _makefile(name: str) -> str:
    match = re.search(rf"^{name} := (.+)$", (ROOT / "Makefile").read_text(), re.M)
    assert match, f"Makefile lacks {name}"
    return match.group(1).strip()


@pytest.fixture(scope="module")
def demo_curves() -> dict[str, tuple[tuple[int, RunResult], ...]]:
    """Every size of the demo's cluster (``make demo``: the bundled workload made for 4 nodes
    of 8 A100-80GB, replayed on 1 to 16 nodes) under each of the demo's policies."""
    parser = argparse.ArgumentParser()
    simulate_cmd.register(parser.add_subparsers())
    args = parser.parse_args(["simulate", "--cluster", _makefile("DEMO_CLUSTER")])
    simulate_cmd._sources(args)
    cluster = load_cluster(args.cluster)
    jobs, horizon, _ = simulate_cmd._workload(args, cluster)
    curves = {}
    for name in _makefile("DEMO_POLICIES").split(","):
        curves[name] = sweep(simulate_cmd.mig_sizer(name, cluster, args), jobs, horizon,
                             limit=16, gpus_per_node=8)
    return curves


def _pooled(curve: Sequence[tuple[int, RunResult]]) -> dict[int, float]:
    return {gpus: round(r.p95_wait) for gpus, r in curve}


class TestTheDemosAnswerOnTheBundledWorkload:
    """The facts of the sizing issue, pinned on the bundled workload and seed."""

    def test_dynamic_at_24_32_and_40_gpus(
            self, demo_curves: dict[str, tuple[tuple[int, RunResult], ...]],
            capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
        pooled = _pooled(demo_curves["dynamic"])
        assert (pooled[24], pooled[32], pooled[40]) == (879, 539, 13)
        classes = {g: r.by_class() for g, r in demo_curves["dynamic"]}
        assert classes[32]["7g"]["p95_wait_s"] == 517.9
        assert classes[32][MULTI_GPU]["mean_wait_s"] == 5232.3
        assert classes[40][MULTI_GPU]["p95_wait_s"] < 6 * 3600
        # The issue measured 19 s at 24 GPUs with `--cluster 3x8xA100-SXM4-80GB`, which makes
        # its own, lighter workload (load 1.3 of 24 GPUs); sizing replays one workload.
        assert main(["simulate", "--no-progress", "--cluster", "3x8xA100-SXM4-80GB",
                     "--policies", "dynamic", "--json", "--report",
                     str(tmp_path / "r.html")]) == 0
        assert json.loads(capsys.readouterr().out)["policies"][0]["p95_wait_s"] == 19.0

    def test_each_answer_holds_at_every_larger_size_and_fails_just_below(
            self, demo_curves: dict[str, tuple[tuple[int, RunResult], ...]]) -> None:
        for text in (_makefile("DEMO_GOAL"), "p95-wait=2m", "all:p95-wait=120s"):
            goal = parse_goal(text, size_classes_a100())
            for name, curve in demo_curves.items():
                found = judge(name, curve, goal)
                ok = {g: _meets_by_hand(goal, r) for g, r in curve}
                if found.gpus is None:
                    assert not ok[curve[-1][0]], (text, name)
                    continue
                assert all(ok[g] for g in ok if g >= found.gpus), (text, name)
                assert found.gpus == 8 or not ok[found.gpus - 8], (text, name)
                assert found.also_met == tuple(g for g in ok if g < found.gpus and ok[g])

    def test_without_reservations_24_gpus_is_also_met_but_32_is_not(
            self, demo_curves: dict[str, tuple[tuple[int, RunResult], ...]]) -> None:
        goal = parse_goal("all:p95-wait=120s", size_classes_a100())
        found = judge("dynamic:reservations-0", demo_curves["dynamic:reservations-0"], goal)
        assert (found.gpus, found.also_met, found.not_met) == (40, (24,), (32,))
        assert _pooled(found.curve)[24] == 18
        lines = headline([found], goal, 128)
        assert lines[1].endswith("also met at 24 GPUs, not at 32")

    def test_the_readme_quotes_the_demos_answer(
            self, demo_curves: dict[str, tuple[tuple[int, RunResult], ...]]) -> None:
        goal = parse_goal(_makefile("DEMO_GOAL"), size_classes_a100())
        answers = [judge(n, c, goal) for n, c in demo_curves.items()]
        lines = headline(answers, goal, 128)
        readme = (ROOT / "README.md").read_text()
        quoted = readme.split("<!-- demo:begin -->", 1)[1].split("<!-- demo:end -->", 1)[0]
        assert quoted.strip() == "```\n" + "\n".join(lines) + "\n```", (
            "README's demo answer is stale: paste the headline `make demo` prints")
        by_name = {a.policy: a for a in answers}
        assert (by_name["dynamic"].gpus, by_name["greedy"].gpus) == (40, 48)
        assert [m.class_name for m in by_name["greedy"].binding] == [MULTI_GPU]
        table = class_table_text(answers, goal)
        assert "dynamic @ 40 GPUs" in table
        assert all(name in table for name in A100)

    def test_a_policy_that_meets_small_targets_while_multi_gpu_pods_starve_is_called_out(
            self, demo_curves: dict[str, tuple[tuple[int, RunResult], ...]]) -> None:
        goal = parse_goal("p95-wait=120s", size_classes_a100())
        greedy = judge("greedy", demo_curves["greedy"], goal)
        assert greedy.gpus == 24
        lines = headline([greedy], goal, 128)
        assert any(line.startswith("  ! greedy meets it at 24 GPUs while multi-GPU pods, with "
                                   "no target, wait p95 6.9 h") for line in lines), lines


def size_classes_a100() -> tuple[str, ...]:
    model = catalogue.find_card("A100-SXM4-80GB")
    assert not isinstance(model, catalogue.WholeGpu)
    return size_classes(model)


def _meets_by_hand(goal: Goal, run: RunResult) -> bool:
    """The goal checked from the run's own class table (rounded to 0.1 s), not through
    :meth:`Goal.misses`."""
    for target in goal.targets:
        if target.scope == ALL:
            value = run.p95_wait if target.metric == "p95-wait" else run.mean_wait
            if value > target.seconds + 0.05:
                return False
            continue
        classes = [c for c in A100 if c != MULTI_GPU] if target.scope == SMALL \
            else [target.scope]
        key = "p95_wait_s" if target.metric == "p95-wait" else "mean_wait_s"
        table = run.by_class()
        for name in classes:
            if name in table and table[name][key] > target.seconds + 0.05:
                return False
    return True


def test_the_cli_leads_with_the_answer_then_the_class_table_and_the_report(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    report = tmp_path / "sizing.html"
    args = ["simulate", "--no-progress", "--cluster", "1x8xA100-SXM4-80GB", "--trace",
            "synthetic", "--pods", "120", "--policies", "greedy,static:all-7g",
            "--size-for", "small:p95-wait=2m,multi-gpu:p95-wait=6h", "--report", str(report)]
    assert main(args) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("To keep small pods' p95 wait <= 2 min and multi-GPU pods' p95 "
                             "wait <= 6 h: greedy needs ")
    assert any(line.startswith("waits by class at each policy's answer") for line in out)
    assert out[-1] == f"report: {report}"
    page = report.read_text()
    assert page.index("class='classes'") < page.index("class='curve'") < page.index(
        "<table border"), "the class table and the curve come before the run's table"
    assert page.count("class=\"curve-panel\"") >= 3
    assert main([*args, "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert [t["class"] for t in figures["targets"]] == [SMALL, MULTI_GPU]
    greedy = figures["answers"][0]
    assert [c["gpus"] for c in greedy["curve"]] == [8, 16, 24, 32]
    assert greedy["gpus"] is None or greedy["gpus"] % 8 == 0


def test_sizing_gpus_without_mig(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["simulate", "--no-progress", "--cluster", "1x4xL4", "--policies",
                 "whole,static:mps-4", "--size-for", "share:mean-wait=10m", "--report",
                 str(tmp_path / "r.html")]) == 0
    assert capsys.readouterr().out.startswith("To keep share pods' mean wait <= 10 min: whole ")
