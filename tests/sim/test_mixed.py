"""Mixed clusters: a MIG pool and a pool of cards without MIG, one policy per pool."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from tessera.cli.main import main
from tessera.cli.simulate_cmd import _mixed_cluster
from tessera.sim.mixed import MixedPolicy, mixed_jobs
from tessera.sim.policies import Queues, Schedule, Shape, SimPolicy
from tessera.sim.workload import Job, TraceRow


class _Nothing(SimPolicy):
    name = "nothing"

    def schedule(self, now: float, queues: Queues) -> Schedule:
        return Schedule(())

    def release(self, job: Job) -> None:
        return None

    def unusable_free(self, shapes: Sequence[Shape]) -> int:
        return 0


def test_pods_go_to_one_pool_in_proportion_to_the_gpus_and_load_counts_both() -> None:
    cluster = _mixed_cluster("1x8xA100-SXM4-80GB,3x8xL4")
    assert cluster is not None
    rows = [TraceRow(f"p{i}", 1, 500, float(i), 600.0) for i in range(2000)]
    jobs, window, to_mig = mixed_jobs(rows, cluster, load=1.0, seed=1)
    assert 400 < len(to_mig) < 600, "a quarter of the GPUs are MIG cards"
    mig = next(j for j in jobs if j.name in to_mig)
    shared = next(j for j in jobs if j.name not in to_mig)
    assert mig.requests == (("4g.40gb", 1),)  # 500 milli of an A100-80GB, as MIG maps it
    assert shared.requests == (("nvidia.com/gpu.shared", 500),)
    demand = sum((j.compute * 1000 / 7 if j.name in to_mig else j.compute) * j.duration
                 for j in jobs)
    assert demand / (cluster.capacity * window) == pytest.approx(1.0)


def test_a_mixed_run_compares_a_policy_per_pool(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["simulate", "--cluster", "1x4xA100-SXM4-80GB,1x4xL4", "--no-progress",
                 "--json", "--report", str(tmp_path / "r.html"),
                 "--policies", "dynamic,static:all-balanced+whole,fluid:gpu"])
    assert code == 0
    figures = {p["policy"]: p for p in json.loads(capsys.readouterr().out)["policies"]}
    assert list(figures) == ["dynamic", "static:all-balanced+whole", "fluid:gpu"]
    assert figures["dynamic"]["placed"] > figures["static:all-balanced+whole"]["placed"]
    assert figures["dynamic"]["served_share"] <= 1.0


@pytest.mark.parametrize(("cluster", "policies", "problem"), [
    ("1x8xA100-SXM4-80GB,1x8xH100-80GB", "dynamic", "one NODESxGPUSxMODEL of MIG cards"),
    ("1x8xA100-SXM4-80GB,1x8xL4", "greedy", "give one policy per pool"),
    ("1x8xA100-SXM4-80GB,1x8xL4", "static:best+whole", "not simulated on a mixed cluster"),
])
def test_what_a_mixed_run_cannot_do_is_a_usage_error(
        cluster: str, policies: str, problem: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--cluster", cluster, "--policies", policies,
                 "--no-progress"]) == 2
    assert problem in capsys.readouterr().err


def test_a_mig_job_weighs_its_slices_in_milli_gpus() -> None:
    cluster = _mixed_cluster("1x2xA100-SXM4-80GB,1x2xL4")
    assert cluster is not None
    assert cluster.capacity == 4000
    rows = [TraceRow("a", 1, 1000, 0.0, 60.0), TraceRow("b", 1, 1000, 1.0, 60.0)]
    jobs, _, to_mig = mixed_jobs(rows, cluster, load=1.0, seed=3)
    policy = MixedPolicy("x", _Nothing(), _Nothing(), to_mig, cluster.milli_per_slice)
    for job in jobs:
        expected = 1000.0 if job.name not in to_mig else 7 * 1000 / 7
        assert policy.weight(job) == pytest.approx(expected)
