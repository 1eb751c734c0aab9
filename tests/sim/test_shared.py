"""Simulating GPUs without MIG: shares sized from the trace, and the policies compared."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tessera.cli.main import main
from tessera.core import catalogue
from tessera.core.errors import InvalidInputError
from tessera.sim.engine import simulate
from tessera.sim.shared import (
    DynamicSharePolicy,
    SharedCluster,
    StaticSharePolicy,
    WholePolicy,
    shared_policy,
)
from tessera.sim.workload import Job, TraceRow, shared_request

L4 = catalogue.card("L4")
SHARED, WHOLE = "nvidia.com/gpu.shared", "nvidia.com/gpu"


def _cluster(nodes: int = 1, per_node: int = 2) -> SharedCluster:
    assert isinstance(L4, catalogue.WholeGpu)
    return SharedCluster(L4, nodes, per_node)


def _job(seq: int, resource: str, count: int, at: float = 0.0,
         lasting: float = 100.0) -> Job:
    compute = count if resource == SHARED else 1000 * count
    return Job(seq, f"j{seq}", at, lasting, ((resource, count),), compute)


def test_trace_rows_ask_milli_shares_or_whole_gpus() -> None:
    assert shared_request(TraceRow("a", 1, 300, 0, 1)) == ((("nvidia.com/gpu.shared", 300),),
                                                           300)
    assert shared_request(TraceRow("b", 1, 1000, 0, 1)) == ((("nvidia.com/gpu", 1),), 1000)
    assert shared_request(TraceRow("c", 4, 1000, 0, 1)) == ((("nvidia.com/gpu", 4),), 4000)


def test_static_sharing_sizes_shares_and_never_serves_a_whole_gpu_pod() -> None:
    cluster = _cluster()
    jobs = [_job(0, SHARED, 300), _job(1, SHARED, 600), _job(2, SHARED, 250),
            _job(3, WHOLE, 1)]
    result = simulate(StaticSharePolicy(cluster, "static:mps-4", 4), jobs,
                      capacity=cluster.capacity, horizon=1000.0)
    # 300 -> 2 of 4 shares, 600 -> 3, 250 -> 1: all fit on the two GPUs; the whole pod never
    assert result.placed == 3
    assert result.by_class()["whole"]["pods"] == 1


def test_without_sharing_every_pod_takes_a_whole_gpu() -> None:
    cluster = _cluster()
    jobs = [_job(n, SHARED, 100) for n in range(3)]
    result = simulate(WholePolicy(cluster), jobs, capacity=cluster.capacity, horizon=50.0)
    assert result.placed == 2, "two GPUs, two pods at a time"


def test_dynamic_sharing_switches_gpus_through_the_real_planner() -> None:
    cluster = _cluster()
    jobs = [_job(n, SHARED, 250, at=float(n)) for n in range(4)] + [
        _job(4, WHOLE, 1, at=5.0)]
    policy = DynamicSharePolicy(cluster, ways=4, batch_window=1.0, capacity_lag=2.0)
    result = simulate(policy, jobs, capacity=cluster.capacity, horizon=1000.0)
    assert result.placed == 5, "four shares on one GPU, the other stays whole"
    assert policy.planner_calls >= 1
    assert policy.created == 1, "one GPU shared, not both"
    late = simulate(DynamicSharePolicy(cluster, ways=4, batch_window=1.0, capacity_lag=2.0),
                    [_job(0, SHARED, 250)], capacity=cluster.capacity, horizon=100.0)
    assert late.waits[0] >= 3.0, "a switched GPU serves after the MPS daemon and the kubelet"


def test_policy_names_are_checked() -> None:
    cluster = _cluster()
    assert shared_policy("static:timeslice-8", cluster, batch_window=5, capacity_lag=10).name \
        == "static:timeslice-8"
    with pytest.raises(InvalidInputError, match=r"N must be 2\.\.48"):
        shared_policy("static:mps-99", cluster, batch_window=5, capacity_lag=10)
    with pytest.raises(InvalidInputError, match="unknown policy 'greedy'"):
        shared_policy("greedy", cluster, batch_window=5, capacity_lag=10)


def test_simulate_compares_sharing_policies_on_an_l4_cluster(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["simulate", "--cluster", "1x4xL4", "--no-progress", "--json",
                 "--report", str(tmp_path / "r.html")])
    assert code == 0
    figures = {p["policy"]: p for p in json.loads(capsys.readouterr().out)["policies"]}
    assert list(figures) == ["dynamic", "static:timeslice-4", "static:mps-4", "whole",
                             "fluid:gpu"]
    assert figures["dynamic"]["placed"] >= figures["static:timeslice-4"]["placed"]
    assert figures["dynamic"]["repartitions"] > 0
    page = (tmp_path / "r.html").read_text()
    assert "<title>share@" in page, "the report draws shared GPUs' shares over time"
    assert "<title>whole@0" in page
