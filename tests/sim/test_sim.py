"""The simulator: workload mapping and arrivals, the event loop's accounting, each policy's
rules (static exact-profile slices, greedy's counts-without-placements failure, the planner's
placements), the best static mix, and the report."""

from __future__ import annotations

import random
from collections import Counter
from importlib import resources
from pathlib import Path

import pytest

from tessera.core import layout
from tessera.core.catalogue import model
from tessera.core.errors import InvalidInputError
from tessera.core.planner.synthetic import standard_layouts
from tessera.sim.cluster import ClusterSpec, load_cluster, shorthand
from tessera.sim.dynamic import DynamicPolicy
from tessera.sim.engine import MULTI_GPU, RunResult, percentile, simulate, size_class
from tessera.sim.policies import (
    FluidClusterPolicy,
    FluidGpuPolicy,
    GreedyPolicy,
    SimPolicy,
    StaticPolicy,
)
from tessera.sim.report import render_class_table, render_table, write_report
from tessera.sim.static_mix import (
    STANDARD_LAYOUTS,
    best_static_mix,
    composition_matrix,
    compositions,
    pool_served,
    pool_table,
    rank_mixes,
)
from tessera.sim.workload import (
    Job,
    load_trace,
    map_request,
    offered_load,
    poisson,
    replay,
    synthetic,
)

A100 = model("A100-80GB")


def _bundled() -> Path:
    return Path(str(resources.files("tessera.sim") / "data" / "openb_default_sample.csv"))


def _job(seq: int, at: float, profile: str, duration: float = 10.0, count: int = 1) -> Job:
    return Job(seq, f"j{seq}", at, duration, ((profile, count),),
               A100.profile(profile).compute_slices * count)


def _exhaustive_ranking(cluster: ClusterSpec, jobs: list[Job], horizon: float
                        ) -> list[tuple[float, tuple[int, ...]]]:
    """The search as first written: every mix scored one by one in Python."""
    per_node = len(cluster.nodes[0].gpus)
    known = standard_layouts(cluster.main_model.name)
    names = [name for name in STANDARD_LAYOUTS if name in known]
    slices_per_node = [Counter({p: c * per_node for p, c in
                                Counter(s.profile for s in known[name]).items()})
                       for name in names]
    by_profile: dict[str, list[Job]] = {}
    for job in jobs:
        if job.arrival <= horizon and len(job.requests) == 1:
            by_profile.setdefault(job.requests[0][0], []).append(job)
    profiles = sorted(by_profile)
    scored = [(sum(pool_served(by_profile[p],
                               sum(n * slices_per_node[i][p] for i, n in enumerate(mix)),
                               horizon) for p in profiles), mix)
              for mix in compositions(len(cluster.nodes), len(names))]
    scored.sort(key=lambda item: (-item[0], item[1]))
    return scored


def _mixed_jobs(rng: random.Random, count: int, horizon: float) -> list[Job]:
    """Every standard profile, some multi-slice and two-profile pods, ties in arrival."""
    profiles = ["1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]
    jobs = []
    for seq in range(count):
        at = float(rng.randrange(int(horizon * 1.1)))
        duration = float(rng.choice([1, 5, 30, 120, 600]))
        roll = rng.random()
        if roll < 0.1:
            jobs.append(Job(seq, f"j{seq}", at, duration, (("1g.10gb", 1), ("3g.40gb", 1)), 4))
        elif roll < 0.25:
            jobs.append(_job(seq, at, rng.choice(["7g.80gb", "3g.40gb"]), duration,
                             rng.randint(2, 3)))
        else:
            jobs.append(_job(seq, at, rng.choice(profiles), duration))
    return sorted(jobs, key=lambda j: (j.arrival, j.seq))


def _all_policies(nodes: int = 1, gpus: int = 2) -> list[SimPolicy]:
    cluster = shorthand(nodes, gpus, "A100-80GB")
    return [DynamicPolicy(cluster), GreedyPolicy(cluster),
            StaticPolicy.uniform(cluster, "all-balanced"), FluidGpuPolicy(cluster),
            FluidClusterPolicy(cluster)]


class TestWorkload:
    @pytest.mark.parametrize(("milli", "both", "compute", "memory"), [
        (110, "1g.10gb", "1g.10gb", "1g.10gb"),
        (140, "1g.20gb", "1g.10gb", "1g.20gb"),
        (230, "2g.20gb", "2g.20gb", "1g.20gb"),
        (470, "4g.40gb", "4g.40gb", "3g.40gb"),
        (550, "7g.80gb", "4g.40gb", "7g.80gb"),
        (1000, "7g.80gb", "7g.80gb", "7g.80gb"),
    ])
    def test_smallest_profile_covering_the_share(self, milli: int, both: str, compute: str,
                                                 memory: str) -> None:
        assert map_request(1, milli, A100) == (both, 1)
        assert map_request(1, milli, A100, "compute") == (compute, 1)
        assert map_request(1, milli, A100, "memory") == (memory, 1)

    def test_multi_gpu_pods_ask_for_full_profiles(self) -> None:
        assert map_request(8, 1000, A100) == ("7g.80gb", 8)

    def test_bundled_trace_is_gpu_pods_in_creation_order(self) -> None:
        rows = load_trace(_bundled())
        assert len(rows) == 416
        assert all(r.num_gpu > 0 and r.duration >= 1 for r in rows)
        assert [r.creation for r in rows] == sorted(r.creation for r in rows)

    def test_poisson_offers_exactly_the_target_load_and_is_seeded(self) -> None:
        rows = load_trace(_bundled())
        jobs, window = poisson(rows, A100, capacity=112, load=1.3, seed=4)
        assert offered_load(jobs, 112, window) == pytest.approx(1.3)
        assert [j.name for j in jobs] == [r.name for r in rows]  # trace order kept
        assert poisson(rows, A100, capacity=112, load=1.3, seed=4) == (jobs, window)
        assert poisson(rows, A100, capacity=112, load=1.3, seed=5)[0] != jobs

    def test_replay_compress_and_rate_scale(self) -> None:
        rows = load_trace(_bundled())[:20]
        base = replay(rows, A100)
        faster = replay(rows, A100, compress=10)
        denser = replay(rows, A100, rate_scale=2)
        assert base[0].arrival == 0
        assert faster[5].arrival == pytest.approx(base[5].arrival / 10)
        assert faster[5].duration == pytest.approx(base[5].duration / 10)
        assert denser[5].arrival == pytest.approx(base[5].arrival / 2)
        assert denser[5].duration == base[5].duration
        with pytest.raises(InvalidInputError):
            replay(rows, A100, compress=0)


class TestCluster:
    def test_shorthand_accepts_product_names(self) -> None:
        cluster = load_cluster("16x8xA100-SXM4-80GB")
        assert len(cluster.nodes) == 16
        assert cluster.capacity == 16 * 8 * 7
        assert cluster.main_model.name == "A100-80GB"

    def test_bad_cluster_names_the_option(self) -> None:
        with pytest.raises(InvalidInputError, match="--cluster"):
            load_cluster("no-such-file.json")

    def test_plan_file_gives_starting_layouts(self, tmp_path: Path) -> None:
        path = tmp_path / "c.json"
        path.write_text('{"nodes": [{"name": "a", "gpus": [{"index": 0, "model": "A100-80GB",'
                        ' "slices": [{"profile": "3g.40gb", "start": 4}]}]}]}')
        cluster = load_cluster(str(path))
        assert cluster.gpus[0].slices == (layout.Slice("3g.40gb", 4),)


class TestEventLoop:
    def test_static_queue_is_first_come_first_served(self) -> None:
        cluster = shorthand(1, 1, "A100-80GB")
        jobs = [_job(i, float(i), "3g.40gb") for i in range(5)]
        r = simulate(StaticPolicy.uniform(cluster, "all-balanced"), jobs,
                     capacity=cluster.capacity, horizon=100)
        assert r.waits == [0.0, 9.0, 18.0, 27.0, 36.0]  # one 3g slice: each waits its turn
        assert r.placed == 5
        assert r.placed_on_arrival == 1
        assert r.served == pytest.approx(5 * 3 * 10)

    def test_unplaced_pods_wait_until_the_horizon(self) -> None:
        cluster = shorthand(1, 1, "A100-80GB")
        r = simulate(StaticPolicy.uniform(cluster, "all-1g"), [_job(0, 10.0, "7g.80gb")],
                     capacity=cluster.capacity, horizon=100)
        assert r.placed == 0
        assert r.waits == [90.0]
        assert r.fragmentation > 0.9  # every free slice is useless to the pending 7g pod

    def test_waits_are_reported_by_size_class(self) -> None:
        cluster = shorthand(1, 1, "A100-80GB")
        jobs = [_job(0, 0.0, "3g.40gb"), _job(1, 1.0, "3g.40gb"), _job(2, 2.0, "7g.80gb")]
        r = simulate(StaticPolicy.uniform(cluster, "all-balanced"), jobs,
                     capacity=cluster.capacity, horizon=100)
        classes = r.by_class()
        assert list(classes) == ["3g", "7g"]  # smallest first
        assert classes["3g"] == {"pods": 2, "mean_wait_s": 4.5, "p95_wait_s": 9.0,
                                 "max_wait_s": 9.0}
        assert classes["7g"]["max_wait_s"] == 98.0  # never placed: censored at the horizon
        assert r.summary()["waits_by_class"] == classes
        table = render_class_table([r])
        assert "4 / 9 / 9" in table  # mean / p95 / max of the 3g class

    def test_a_pod_of_several_units_is_in_the_multi_gpu_class(self) -> None:
        job = Job(0, "wide", 0.0, 1.0, (("7g.80gb", 2),), 14)
        assert size_class(job) == MULTI_GPU
        assert size_class(_job(1, 0.0, "2g.20gb")) == "2g"

    def test_reconfiguration_latency_and_capacity_lag_delay_the_start(self) -> None:
        cluster = shorthand(1, 1, "A100-80GB")
        policy = DynamicPolicy(cluster, batch_idle=0.5, batch_max=3, reconfig_latency=2,
                               capacity_lag=10)
        r = simulate(policy, [_job(0, 0.0, "2g.20gb")], capacity=cluster.capacity, horizon=100)
        # the controller's batch closing, one create, the kubelet's next sync
        assert r.waits == [0.5 + 2 + 10]
        assert (r.created, r.destroyed, r.repartitions) == (1, 0, 1)

    def test_every_policy_is_deterministic(self) -> None:
        jobs = synthetic(random.Random(3), 150, A100, rate=0.05, mean_duration=300)
        horizon = jobs[-1].arrival

        def summaries() -> list[dict[str, float | int | str]]:
            out = []
            for p in _all_policies():
                s = simulate(p, jobs, capacity=14, horizon=horizon).summary()
                s.pop("wall_s")
                out.append(s)
            return out

        assert summaries() == summaries()

    def test_layouts_stay_valid_and_held_slices_survive(self) -> None:
        jobs = synthetic(random.Random(7), 200, A100, rate=0.08, mean_duration=200)
        for policy in _all_policies(nodes=1, gpus=3)[:2]:
            r = simulate(policy, jobs, capacity=21, horizon=jobs[-1].arrival, samples=400)
            assert r.placed > 100
            assert r.created > 0
            for samples in r.layouts.values():
                for _, shown in samples:
                    assert layout.is_valid(A100, [layout.Slice(p, s) for p, s, _, _ in shown])

    def test_percentile_is_nearest_rank(self) -> None:
        assert percentile([1, 2, 3, 4], 50) == 2
        assert percentile([], 95) == 0.0


class TestPolicies:
    def test_greedy_fails_where_counts_fit_but_placements_do_not(self) -> None:
        # A 1g first, then a 4g: NVML's own order puts the 1g at slice 0, where the 4g must
        # start; the planner puts the 1g out of the 4g's way.
        cluster = shorthand(1, 1, "A100-80GB")
        jobs = [_job(0, 0.0, "1g.10gb", 1000), _job(1, 30.0, "4g.40gb", 100)]
        greedy = simulate(GreedyPolicy(cluster, batch_window=0.0, reconfig_latency=0.0,
                                       capacity_lag=0.0), jobs, capacity=7, horizon=500)
        dynamic = simulate(DynamicPolicy(cluster, batch_idle=0.0, batch_max=0.0,
                                         reconfig_latency=0.0, capacity_lag=0.0),
                           jobs, capacity=7, horizon=500)
        assert greedy.placed == 1
        assert greedy.failed_creates >= 1
        assert dynamic.placed == 2
        assert dynamic.waits == [pytest.approx(0.0, abs=0.01)] * 2  # a tick after the plan

    def test_static_needs_the_exact_profile(self) -> None:
        cluster = shorthand(1, 1, "A100-80GB")
        r = simulate(StaticPolicy.uniform(cluster, "all-7g"), [_job(0, 0.0, "1g.10gb")],
                     capacity=7, horizon=50)
        assert r.placed == 0

    def test_fluid_gpu_ignores_placements_but_not_gpus(self) -> None:
        cluster = shorthand(1, 2, "A100-80GB")
        jobs = [_job(0, 0.0, "4g.40gb", 100), _job(1, 0.0, "4g.40gb", 100),
                _job(2, 0.0, "3g.40gb", 100), _job(3, 0.0, "4g.40gb", 100)]
        per_gpu = simulate(FluidGpuPolicy(cluster), jobs, capacity=14, horizon=50)
        pooled = simulate(FluidClusterPolicy(cluster), jobs, capacity=14, horizon=50)
        assert per_gpu.placed == 3  # 4+3 on one GPU, 4 on the other; no room for a third 4
        assert pooled.placed == 3
        assert pooled.served == pytest.approx(11 * 50)

    def test_unknown_static_layout_names_the_choices(self) -> None:
        with pytest.raises(InvalidInputError, match="all-balanced"):
            StaticPolicy.uniform(shorthand(1, 1, "A100-80GB"), "all-5g")


class TestBestStaticMix:
    def test_compositions_are_every_mix(self) -> None:
        assert len(list(compositions(4, 3))) == 15
        assert all(sum(c) == 4 for c in compositions(4, 3))

    def test_pool_is_k_servers_first_come_first_served(self) -> None:
        jobs = [_job(i, 0.0, "1g.10gb", 10) for i in range(3)]
        assert pool_served(jobs, 2, 15) == pytest.approx(10 + 10 + 5)
        assert pool_served(jobs, 0, 15) == 0

    def test_picks_the_layout_the_workload_needs_per_node(self) -> None:
        cluster = shorthand(3, 2, "A100-80GB")
        jobs = ([_job(i, float(i), "7g.80gb", 500) for i in range(4)]
                + [_job(10 + i, float(i), "3g.40gb", 500) for i in range(4)])
        best = best_static_mix(cluster, jobs, 400)
        assert best.mixes_scored == 56  # C(3 + 5, 5) mixes of 6 layouts on 3 nodes
        assert dict(best.nodes) == {"all-3g": 1, "all-7g": 2}
        assert best.result.served == pytest.approx(best.score)  # one-slice pods: exact

    @pytest.mark.parametrize(("total", "parts"), [(0, 1), (5, 1), (0, 4), (4, 3), (7, 6)])
    def test_composition_matrix_is_compositions_in_order(self, total: int, parts: int) -> None:
        rows = [tuple(int(n) for n in row) for row in composition_matrix(total, parts)]
        assert rows == list(compositions(total, parts))

    @pytest.mark.parametrize("seed", range(6))
    def test_pool_table_is_pool_served_bit_for_bit(self, seed: int) -> None:
        rng = random.Random(seed)
        jobs = [j for j in _mixed_jobs(rng, 80, 500.0) if len(j.requests) == 1]
        sizes = [0, 1, 2, 3, 5, 8, 13, 40, 200, 500]
        assert pool_table(jobs, sizes, 500.0) == [pool_served(jobs, k, 500.0) for k in sizes]

    @pytest.mark.parametrize(("seed", "nodes", "gpus"), [
        (1, 1, 1), (2, 2, 2), (3, 3, 1), (4, 4, 2), (5, 5, 3), (6, 6, 1), (7, 3, 8),
    ])
    def test_fast_search_is_the_exhaustive_one(self, seed: int, nodes: int, gpus: int) -> None:
        cluster = shorthand(nodes, gpus, "A100-80GB")
        horizon = 400.0
        jobs = _mixed_jobs(random.Random(seed), 30 * nodes * gpus, horizon)
        reference = _exhaustive_ranking(cluster, jobs, horizon)
        names, ranked, count = rank_mixes(cluster, jobs, horizon)
        assert names == list(STANDARD_LAYOUTS)
        assert count == len(reference)
        assert ranked == reference  # same mixes, same order, the same floats exactly
        assert rank_mixes(cluster, jobs, horizon, top=3)[1] == reference[:3]
        best = best_static_mix(cluster, jobs, horizon)
        assert best.score in [score for score, _ in reference[:3]]


class TestReport:
    def test_table_and_html(self, tmp_path: Path) -> None:
        jobs = synthetic(random.Random(1), 60, A100, rate=0.05, mean_duration=200)
        results: list[RunResult] = [simulate(p, jobs, capacity=14, horizon=jobs[-1].arrival)
                                    for p in _all_policies()]
        table = render_table(results)
        assert table.splitlines()[0].startswith("policy")
        assert "greedy" in table
        path = write_report(tmp_path / "out" / "r.html", results, title="t", details=["d"])
        page = path.read_text()
        assert page.count("<polyline") == len(results)
        assert page.count("<h3>") == 3  # layouts for the three MIG policies
        assert "fill-opacity" in page
        assert len(page) > 5000
