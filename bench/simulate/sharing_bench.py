"""Sharing GPUs without MIG: dynamic sharing vs static time-slicing vs whole GPUs, one run.

On a cluster of L4s (no MIG) and an openb trace (Poisson arrivals in trace order, seed 1), runs
side by side: ``dynamic`` (Tessera's planner turning idle whole GPUs into MPS shares and back),
``static:timeslice-N`` (NVIDIA's plugin time-slicing every GPU N ways), ``whole`` (no sharing)
and ``fluid:gpu`` (the per-GPU limit), each policy in its own process, and prints pods placed,
compute served, mean and p95 wait. Figures: bench/README.md, "Sharing GPUs without MIG".

    .venv/bin/python bench/simulate/sharing_bench.py                 # 64 L4, gpushare100, 130%
    .venv/bin/python bench/simulate/sharing_bench.py --trace default --gpus 32 --load 1.0
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from tessera.core import catalogue
from tessera.sim.engine import simulate
from tessera.sim.shared import SharedCluster, shared_policy
from tessera.sim.workload import load_trace, poisson, shared_request

SEED = 1


def run(policy_name: str, args: argparse.Namespace) -> dict[str, Any]:
    card = catalogue.card(args.card)
    assert isinstance(card, catalogue.WholeGpu)
    cluster = SharedCluster(card, args.gpus // 8, 8)
    rows = load_trace(args.traces / f"openb_pod_list_{args.trace}.csv")
    jobs, window = poisson(rows, None, capacity=cluster.capacity, load=args.load, seed=SEED,
                           mapper=shared_request)
    policy = shared_policy(policy_name, cluster, batch_window=5.0, capacity_lag=10.0)
    started = time.perf_counter()
    result = simulate(policy, jobs, capacity=cluster.capacity, horizon=window, track_gpus=0)
    summary = result.summary()
    summary["wall_s"] = round(time.perf_counter() - started, 1)
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--card", default="L4")
    parser.add_argument("--gpus", type=int, default=64)
    parser.add_argument("--trace", default="gpushare100")
    parser.add_argument("--load", type=float, default=1.3)
    parser.add_argument("--policies", default="dynamic,static:timeslice-4,whole,fluid:gpu")
    parser.add_argument("--traces", type=Path,
                        default=Path(__file__).resolve().parents[3] / "shared/traces/"
                        "alibaba-gpu-v2023")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    names = [n for n in args.policies.split(",") if n]
    with ProcessPoolExecutor(max_workers=len(names)) as pool:
        results = dict(zip(names, pool.map(run, names, [args] * len(names)), strict=True))
    print(f"{args.gpus} x {args.card}, openb {args.trace}, load {args.load}, seed {SEED}")
    print(f"{'policy':<20} {'placed':>11} {'served':>7} {'mean wait':>10} {'p95 wait':>9}"
          f" {'switches':>8} {'wall':>7}")
    for name, s in results.items():
        print(f"{name:<20} {s['placed']:>5}/{s['jobs']:<5} {s['served_share'] * 100:>6.1f}% "
              f"{s['mean_wait_s']:>9.0f}s {s['p95_wait_s']:>8.0f}s {s['repartitions']:>8} "
              f"{s['wall_s']:>6.1f}s")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
