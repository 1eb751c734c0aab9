"""What-if benchmark: every policy on openb traces, cluster sizes and offered loads, one run.

Reads ``../shared/traces/alibaba-gpu-v2023`` (or ``--traces DIR``); writes the raw figures to
``bench/simulate/results.json`` and prints the markdown tables of ``bench/README.md``'s
Simulation section and a PASS/MISS line per target. Poisson arrivals in trace order at the
rate for each offered load (seeded), plus one replay of the real timestamps.

    .venv/bin/python bench/simulate_bench.py            # the full grid
    .venv/bin/python bench/simulate_bench.py --quick    # gpushare100, 128 GPUs, 130% only
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from tessera.sim.cluster import ClusterSpec, shorthand
from tessera.sim.engine import RunResult, simulate
from tessera.sim.policies import (
    DynamicPolicy,
    FluidClusterPolicy,
    FluidGpuPolicy,
    GreedyPolicy,
    SimPolicy,
    StaticPolicy,
)
from tessera.sim.static_mix import STANDARD_LAYOUTS, best_static_mix
from tessera.sim.workload import Job, load_trace, poisson, replay

TRACES = ("default", "gpushare40", "gpushare100")
SIZES = (64, 128, 256)
LOADS = (1.0, 1.3)
SEED = 1
MODEL = "A100-80GB"


def _policies(cluster: ClusterSpec, zero_latency: bool) -> list[SimPolicy]:
    out: list[SimPolicy] = [DynamicPolicy(cluster)]
    if zero_latency:
        zero = DynamicPolicy(cluster, reconfig_latency=0.0, capacity_lag=0.0)
        zero.name = "dynamic(latency 0)"
        out.append(zero)
    out.append(GreedyPolicy(cluster))
    out.extend(StaticPolicy.uniform(cluster, name) for name in STANDARD_LAYOUTS)
    out.extend([FluidGpuPolicy(cluster), FluidClusterPolicy(cluster)])
    return out


def run_case(cluster: ClusterSpec, jobs: tuple[Job, ...], window: float,
             zero_latency: bool) -> list[RunResult]:
    results = [simulate(p, jobs, capacity=cluster.capacity, horizon=window, track_gpus=0)
               for p in _policies(cluster, zero_latency)]
    began = time.perf_counter()
    mix = best_static_mix(cluster, jobs, window)
    mix.result.wall_s = time.perf_counter() - began
    results.append(mix.result)
    return results


def _row(r: RunResult) -> str:
    s = r.summary()
    return (f"| {s['policy']} | {s['served_share']:.3f} | {s['placed']} | "
            f"{s['placed_on_arrival']} | {s['mean_wait_s']:.0f} | {s['p95_wait_s']:.0f} | "
            f"{s['created']}/{s['destroyed']} |")


HEADER = ("| policy | compute served | placed | on arrival | mean wait s | p95 wait s | "
          "slices +/- |\n|---|---|---|---|---|---|---|")


def targets(results: list[RunResult], label: str) -> list[str]:
    by = {r.policy: r for r in results}
    best = next(r for r in results if r.policy.startswith("static:best"))
    statics = [r for r in results if r.policy.startswith("static:")]
    lines = []
    for name in ("dynamic(latency 0)", "dynamic"):
        d = by[name]
        checks = [
            ("placed / fluid:gpu placed", d.placed / by["fluid:gpu"].placed, 0.98),
            ("served / best static mix", d.served / best.served, 1.08),
            ("placed / all-balanced placed", d.placed / by["static:all-balanced"].placed, 1.3),
        ]
        for what, value, goal in checks:
            verdict = "PASS" if value >= goal else "MISS"
            lines.append(f"{verdict} {label} {name}: {what} = {value:.3f} (target >= {goal})")
        worst = min(s.mean_wait for s in statics)
        verdict = "PASS" if d.mean_wait < worst else "MISS"
        lines.append(f"{verdict} {label} {name}: mean wait {d.mean_wait:.0f} s < lowest static "
                     f"{worst:.0f} s")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--traces", type=Path,
                        default=Path(__file__).resolve().parents[2] / "shared/traces/"
                        "alibaba-gpu-v2023")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).resolve().parent / "simulate/results.json")
    args = parser.parse_args()
    began = time.perf_counter()
    grid = ([("gpushare100", 128, 1.3)] if args.quick else
            [(t, g, load) for t in TRACES for g in SIZES for load in LOADS])
    raw: list[dict[str, object]] = []
    lines: list[str] = []
    for trace, gpus, load in grid:
        cluster = shorthand(gpus // 8, 8, MODEL)
        rows = load_trace(args.traces / f"openb_pod_list_{trace}.csv")
        jobs, window = poisson(rows, cluster.main_model, capacity=cluster.capacity, load=load,
                               seed=SEED)
        target = (trace, gpus, load) == ("gpushare100", 128, 1.3)
        t0 = time.perf_counter()
        results = run_case(cluster, jobs, window, target)
        label = f"{trace} {gpus} GPUs load {load:.0%}"
        print(f"### {label} (Poisson, seed {SEED}, window {window / 3600:.1f} h, "
              f"{len(jobs)} pods, {time.perf_counter() - t0:.0f} s)\n\n{HEADER}", flush=True)
        for r in results:
            print(_row(r))
            raw.append({"trace": trace, "gpus": gpus, "load": load, "arrivals": "poisson",
                        "seed": SEED, "window_s": window, **r.summary()})
        print(flush=True)
        if target:
            lines.extend(targets(results, label))
            spans = replay(rows, cluster.main_model)
            horizon = max(j.arrival for j in spans)
            print(f"### {label.split(' load', maxsplit=1)[0]}, replay of the trace's timestamps "
                  f"({horizon / 86400:.0f} days)\n\n{HEADER}")
            for p in [DynamicPolicy(cluster), GreedyPolicy(cluster),
                      StaticPolicy.uniform(cluster, "all-balanced"), FluidGpuPolicy(cluster)]:
                r = simulate(p, spans, capacity=cluster.capacity, horizon=horizon, track_gpus=0)
                print(_row(r))
                raw.append({"trace": trace, "gpus": gpus, "arrivals": "replay",
                            "window_s": horizon, **r.summary()})
            print(flush=True)
    print("\n".join(lines))
    total = time.perf_counter() - began
    print(f"total run time {total:.0f} s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"run_time_s": round(total), "rows": raw}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
