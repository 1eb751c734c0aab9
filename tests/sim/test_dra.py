"""``dra`` and ``dra:curated``: kube-scheduler choosing MIG placements through DRA counters.

The uncurated scheduler spreads pods to the least-allocated node and splits fresh GPUs; the
curated one is steered by the controller's taints onto GPUs already split. Within a node the
allocator takes the first device that fits, in published order; slices are made when the
claim is prepared and destroyed when the pod ends.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from tessera.cli.main import main
from tessera.core import layout
from tessera.core.catalogue import model
from tessera.sim.cluster import shorthand
from tessera.sim.dra import CURATED, UNCURATED, DraPolicy
from tessera.sim.engine import RunResult, simulate
from tessera.sim.workload import Job, synthetic

A100 = model("A100-80GB")


def _job(seq: int, at: float, profile: str, duration: float = 1000.0, count: int = 1) -> Job:
    return Job(seq, f"j{seq}", at, duration, ((profile, count),),
               A100.profile(profile).compute_slices * count)


def _run(policy: DraPolicy, jobs: list[Job], horizon: float = 100.0) -> RunResult:
    gpus = len(policy.gpus)
    return simulate(policy, jobs, capacity=7 * gpus, horizon=horizon, track_gpus=gpus)


def _slices(policy: DraPolicy, gpu: int) -> list[tuple[str, int]]:
    shown = policy.layout(gpu)
    assert shown is not None
    return [(profile, start) for profile, start, _, _ in shown]


def _nodes_of(policy: DraPolicy, job: str) -> set[int]:
    return {gpu.node for gpu, _ in policy.held[job]}


class TestNodeChoice:
    def test_uncurated_spreads_a_small_pod_onto_an_idle_gpu_of_the_emptier_node(self) -> None:
        policy = DraPolicy(shorthand(2, 1, "A100-80GB"))
        _run(policy, [_job(0, 0.0, "1g.10gb"), _job(1, 10.0, "1g.10gb")])
        # node 0's GPU is split and has room for six more 1g, yet node 1 is less allocated
        assert _slices(policy, 0) == [("1g.10gb", 6)]
        assert _slices(policy, 1) == [("1g.10gb", 6)]

    def test_curated_packs_it_onto_the_split_gpu(self) -> None:
        policy = DraPolicy(shorthand(2, 1, "A100-80GB"), curated=True)
        _run(policy, [_job(0, 0.0, "1g.10gb"), _job(1, 10.0, "1g.10gb")])
        assert _slices(policy, 0) == [("1g.10gb", 5), ("1g.10gb", 6)]
        assert _slices(policy, 1) == []

    def test_ties_go_to_the_lowest_node(self) -> None:
        policy = DraPolicy(shorthand(3, 1, "A100-80GB"))
        _run(policy, [_job(0, 0.0, "3g.40gb")])
        assert _nodes_of(policy, "j0") == {0}


class TestDevices:
    def test_first_fit_follows_the_published_order(self) -> None:
        policy = DraPolicy(shorthand(1, 1, "A100-80GB"))
        _run(policy, [_job(0, 0.0, "1g.10gb"), _job(1, 1.0, "1g.10gb"),
                      _job(2, 2.0, "3g.40gb")])
        # 1g placements from the highest start down, then the first 3g placement left (4 is
        # taken by the 1g at 5 and 6): the low-start large placements stay free longest
        assert _slices(policy, 0) == [("1g.10gb", 5), ("1g.10gb", 6), ("3g.40gb", 0)]

    def test_gpus_are_tried_by_index_on_the_chosen_node(self) -> None:
        policy = DraPolicy(shorthand(1, 2, "A100-80GB"))
        _run(policy, [_job(0, 0.0, "4g.40gb"), _job(1, 1.0, "4g.40gb")])
        assert _slices(policy, 0) == [("4g.40gb", 0)]  # one 4g a card: the second goes on
        assert _slices(policy, 1) == [("4g.40gb", 0)]

    def test_a_multi_unit_pod_takes_all_its_devices_on_one_node(self) -> None:
        policy = DraPolicy(shorthand(2, 2, "A100-80GB"))
        r = _run(policy, [_job(0, 0.0, "1g.10gb"), _job(1, 1.0, "1g.10gb"),
                          _job(2, 2.0, "7g.80gb", count=2), _job(3, 3.0, "4g.40gb", count=2)])
        # each node has one idle GPU left: two whole GPUs exist, never on one node
        assert "j2" not in policy.held
        assert r.placed == 3
        assert _nodes_of(policy, "j3") == {0}  # ties: node 0; both of its GPUs, one 4g each
        assert _slices(policy, 0) == [("1g.10gb", 6), ("4g.40gb", 0)]
        assert _slices(policy, 1) == [("4g.40gb", 0)]


class TestCuration:
    def test_a_7g_pod_is_served_when_only_idle_gpus_remain(self) -> None:
        policy = DraPolicy(shorthand(1, 2, "A100-80GB"), curated=True)
        r = _run(policy, [_job(0, 0.0, "1g.10gb"), _job(1, 1.0, "7g.80gb")])
        assert r.placed == 2
        assert _slices(policy, 1) == [("7g.80gb", 0)]

    def test_a_pod_only_tainted_devices_can_hold_is_served_without_the_taints(self) -> None:
        # node 0's GPU is split with room for one 1g, so the idle GPU of node 1 is tainted
        # for 1g; a pod of two 1g fits only there, and curation gives way
        policy = DraPolicy(shorthand(2, 1, "A100-80GB"), curated=True)
        jobs = [_job(k, float(k), "1g.10gb") for k in range(6)]
        r = _run(policy, [*jobs, _job(6, 10.0, "1g.10gb", count=2)])
        assert r.placed == 7
        assert _nodes_of(policy, "j6") == {1}
        assert _slices(policy, 1) == [("1g.10gb", 5), ("1g.10gb", 6)]


class TestSlices:
    def test_a_slice_is_made_at_prepare_and_destroyed_at_release(self) -> None:
        policy = DraPolicy(shorthand(1, 1, "A100-80GB"), reconfig_latency=2.0)
        r = _run(policy, [_job(0, 0.0, "7g.80gb", duration=10.0),
                          _job(1, 1.0, "7g.80gb", duration=10.0)])
        # j0: one create (2 s); j1 waits for j0 to end at 12, its slice's destroy, its create
        assert r.waits == [2.0, 16.0 - 1.0]
        assert (r.created, r.destroyed, r.repartitions) == (2, 2, 4)
        assert _slices(policy, 0) == []
        assert policy.uses[0].used == frozenset()  # the counters are free again
        assert policy.uses[0].can_host("7g.80gb")

    def test_layouts_stay_valid_and_every_run_is_deterministic(self) -> None:
        jobs = synthetic(random.Random(7), 300, A100, rate=0.08, mean_duration=200)

        def run(curated: bool) -> RunResult:
            policy = DraPolicy(shorthand(2, 2, "A100-80GB"), curated=curated)
            return simulate(policy, jobs, capacity=28, horizon=jobs[-1].arrival,
                            samples=400, track_gpus=4)

        for curated in (False, True):
            first, again = run(curated), run(curated)
            assert first.placed > 150
            assert first.waits == again.waits
            for samples in first.layouts.values():
                for _, shown in samples:
                    assert layout.is_valid(A100, [layout.Slice(p, s) for p, s, _, _ in shown])
                    assert all(held for *_, held in shown)  # DRA keeps no free slices

    def test_fragmentation_counts_free_compute_no_pending_pod_can_use(self) -> None:
        policy = DraPolicy(shorthand(1, 1, "A100-80GB"))
        r = _run(policy, [_job(0, 0.0, "1g.10gb"), _job(1, 1.0, "7g.80gb")])
        assert r.placed == 1
        assert r.fragmentation == pytest.approx(6 / 7, abs=0.02)  # six slices, useless to 7g


def test_both_names_run_end_to_end_through_the_cli(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = tmp_path / "r.html"
    code = main(["simulate", "--no-progress", "--json", "--report", str(report),
                 "--policies", f"greedy,{UNCURATED},{CURATED}"])
    out, _ = capsys.readouterr()
    assert code == 0
    rows = {row["policy"]: row for row in json.loads(out)["policies"]}
    assert list(rows) == ["greedy", UNCURATED, CURATED]
    for name in (UNCURATED, CURATED):
        assert rows[name]["placed"] > 300
        assert 0 < rows[name]["fragmentation"] < 0.2
        assert rows[name]["created"] >= rows[name]["placed"]  # a slice per unit placed
        assert rows[name]["failed_creates"] == 0
    assert "<svg" in report.read_text()


def test_an_unknown_policy_lists_the_dra_names(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--no-progress", "--policies", "dra:packed"]) == 2
    _, err = capsys.readouterr()
    assert f"{UNCURATED}, {CURATED}" in err
