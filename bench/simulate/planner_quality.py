"""Planner quality, one-shot: pods placed by fast vs exact vs best static layout vs greedy.

Each case is one planning problem (a small cluster, more pending pods than fit), small enough
for the exact solver (<= 24 GPUs). Two families, seeded: generated clusters and pods
(:mod:`tessera.core.planner.synthetic`: half the GPUs carry standard layouts with slices in
use) and the openb default trace mapped to A100-80GB / H100-80GB profiles on empty GPUs.
Static: pods take free slices only, after every GPU without a held slice gets one standard
layout (the best of the six per case). Greedy: :class:`tessera.sim.policies.GreedyPolicy`.

    .venv/bin/python bench/simulate/planner_quality.py [--cases 20]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

from tessera.core.catalogue import profile_name_from_resource
from tessera.core.planner import PendingPod, Snapshot, plan
from tessera.core.planner.synthetic import standard_layouts, synthetic_cluster, synthetic_pods
from tessera.sim.cluster import ClusterSpec, GpuSpec, NodeSpec
from tessera.sim.policies import GreedyPolicy, StaticPolicy, _MigPolicy
from tessera.sim.static_mix import STANDARD_LAYOUTS
from tessera.sim.workload import Job, load_trace, map_request, resolve_model

TRACE = Path(__file__).resolve().parents[3] / "shared/traces/alibaba-gpu-v2023/" \
    "openb_pod_list_default.csv"


def _jobs(pods: tuple[PendingPod, ...]) -> dict[tuple[tuple[str, int], ...], dict[str, Job]]:
    queues: dict[tuple[tuple[str, int], ...], dict[str, Job]] = {}
    for i, p in enumerate(pods):
        req = tuple(sorted((profile_name_from_resource(r), n) for r, n in p.requests))
        queues.setdefault(req, {})[p.key] = Job(i, p.key, float(i), 1.0, req, 0)
    return queues


def _spec(snapshot: Snapshot) -> ClusterSpec:
    return ClusterSpec(tuple(NodeSpec(n.name, tuple(
        GpuSpec(resolve_model(g.model), tuple(s.slice for s in g.slices)) for g in n.gpus))
        for n in snapshot.nodes))


def _hold(policy: _MigPolicy, snapshot: Snapshot) -> None:
    gid = 0
    for node in snapshot.nodes:
        for gpu in node.gpus:
            for s in gpu.slices:
                if s.in_use:
                    policy.preoccupy(gid, s.start)
            gid += 1


def case(snapshot: Snapshot, pods: tuple[PendingPod, ...]) -> dict[str, int]:
    out = {"fast": len(plan(snapshot, pods, "fast").placements),
           "exact": len(plan(snapshot, pods, "exact").placements)}
    spec = _spec(snapshot)
    greedy = GreedyPolicy(spec, batch_window=0, reconfig_latency=0, capacity_lag=0)
    _hold(greedy, snapshot)
    out["greedy"] = len(greedy.schedule(0.0, _jobs(pods)).starts)
    best = 0
    for name in STANDARD_LAYOUTS:
        layouts = []
        for node in snapshot.nodes:
            for gpu in node.gpus:
                held = [s.slice for s in gpu.slices if s.in_use]
                layouts.append(held if held else standard_layouts(gpu.model)[name])
        static = StaticPolicy(spec, name, layouts)
        _hold(static, snapshot)
        best = max(best, len(static.schedule(0.0, _jobs(pods)).starts))
    out["best static"] = best
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", type=int, default=20)
    args = parser.parse_args()
    began = time.perf_counter()
    families: dict[str, list[dict[str, int]]] = {"generated": [], "openb A100-80GB": [],
                                                 "openb H100-80GB": []}
    for seed in range(args.cases):
        rng = random.Random(seed)
        snap = synthetic_cluster(rng, 3, gpus_per_node=4, standard=True)
        families["generated"].append(case(snap, synthetic_pods(rng, 40, multi=0.1)))
    if TRACE.exists():
        rows = load_trace(TRACE)
        for name in ("A100-80GB", "H100-80GB"):
            model = resolve_model(name)
            for seed in range(args.cases):
                rng = random.Random(seed)
                picked = rng.sample(rows, 40)
                pods = tuple(PendingPod("t", f"p{i}", ((f"nvidia.com/mig-{p}", n),))
                             for i, (p, n) in enumerate(
                                 map_request(r.num_gpu, r.gpu_milli, model) for r in picked))
                snap = synthetic_cluster(rng, 2, gpus_per_node=8, models=(name,), split=0.0)
                families[f"openb {name}"].append(case(snap, pods))
    print("| cases | fast | exact | best static layout | greedy first-fit | fast / exact |")
    print("|---|---|---|---|---|---|")
    for label, rows_ in families.items():
        if not rows_:
            continue
        tot = {k: sum(r[k] for r in rows_) for k in rows_[0]}
        worst = min(r["fast"] / r["exact"] for r in rows_ if r["exact"])
        print(f"| {label} ({len(rows_)}) | {tot['fast']} | {tot['exact']} | "
              f"{tot['best static']} | {tot['greedy']} | {tot['fast'] / tot['exact']:.3f} "
              f"(worst case {worst:.3f}) |")
        verdict = "PASS" if tot["fast"] >= 0.99 * tot["exact"] else "MISS"
        print(f"{verdict} {label}: fast >= 99% of exact", file=sys.stderr)
    print(f"run time {time.perf_counter() - began:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
