"""``tessera simulate --size-for``: the fewest GPUs that keep a wait target, per policy."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from tessera.cli.main import main
from tessera.core.errors import InvalidInputError
from tessera.sim.policies import Queues, Schedule, Shape, SimPolicy
from tessera.sim.sizing import Target, parse_target, size_for
from tessera.sim.workload import Job


def test_targets_read_like_an_admin_writes_them() -> None:
    assert parse_target("p95-wait=60s") == Target("p95-wait", 60.0)
    assert parse_target("mean-wait=2m") == Target("mean-wait", 120.0)
    with pytest.raises(InvalidInputError, match="expected p95-wait=DURATION"):
        parse_target("p99=1")


def test_the_answer_comes_first_and_is_the_smallest_size_that_meets_it(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    report = tmp_path / "sizing.html"
    args = ["simulate", "--no-progress", "--policies", "dynamic,static:all-7g",
            "--size-for", "p95-wait=120s", "--report", str(report)]
    assert main(args) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("To keep p95 wait <= 120 s: dynamic needs ")
    assert out[-1] == f"report: {report}"
    page = report.read_text()
    assert page.index(out[0].replace("<=", "&lt;=")) < page.index("<table"), \
        "the report leads with the answer"
    assert page.count("<h3>") == 2, "each policy's layouts at the size it needs"
    assert main([*args, "--json"]) == 0
    answers = {a["policy"]: a for a in json.loads(capsys.readouterr().out)["answers"]}
    dynamic = answers["dynamic"]
    assert dynamic["gpus"] % 8 == 0, "whole nodes of the given cluster's kind"
    assert dynamic["p95_wait_s"] <= 120


class _StartsFromNodes(SimPolicy):
    """Starts every pod at once on ``nodes >= needed``, none otherwise."""

    name = "stub"

    def __init__(self, nodes: int, needed: int) -> None:
        super().__init__()
        self.ok = nodes >= needed

    def schedule(self, now: float, queues: Queues) -> Schedule:
        if not self.ok:
            return Schedule(())
        return Schedule(tuple((j, now) for q in queues.values() for j in q.values()))

    def release(self, job: Job) -> None:
        return None

    def unusable_free(self, shapes: Sequence[Shape]) -> int:
        return 0


def test_bisection_finds_the_fewest_nodes_and_says_when_none_suffice() -> None:
    jobs = [Job(i, f"j{i}", float(i), 10.0, (("x", 1),), 1) for i in range(5)]
    made: list[int] = []

    def make(nodes: int) -> tuple[SimPolicy, int]:
        made.append(nodes)
        return _StartsFromNodes(nodes, 5), nodes

    answer = size_for("stub", make, jobs, 100.0, Target("p95-wait", 1.0), limit=16,
                      gpus_per_node=8)
    assert (answer.nodes, answer.gpus) == (5, 40)
    assert len(made) <= 6, "a bisection, not a scan"
    none = size_for("stub", lambda n: (_StartsFromNodes(n, 99), n), jobs, 100.0,
                    Target("p95-wait", 1.0), limit=16, gpus_per_node=8)
    assert none.gpus is None


def test_sizing_gpus_without_mig(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["simulate", "--no-progress", "--cluster", "1x4xL4", "--policies",
                 "whole,static:mps-4", "--size-for", "mean-wait=10m", "--report",
                 str(tmp_path / "r.html")]) == 0
    assert capsys.readouterr().out.startswith("To keep mean wait <= 600 s: whole ")
