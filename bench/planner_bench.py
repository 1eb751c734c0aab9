"""Planner speed: 1,250 nodes x 8 GPUs, 5,000 pending pods; median wall and CPU time, peak memory.

Run: ``.venv/bin/python bench/planner_bench.py [--runs 5] [--random] [--pods 40000]
[--bounded]``. ``--bounded`` plans as the controller does: the bounded batch
(:func:`tessera.core.planner.bounded_batch`) first, then the planner on it, the two timed
together.
``--random`` gives every split GPU a random layout (nearly every GPU distinct: the worst case
for the memo); the default draws NVIDIA's standard layouts, as a mig-parted fleet has. The
quality comparison (exact, static layouts, first-fit, Alibaba trace) is
``bench/simulate/planner_quality.py``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
import tracemalloc

from tessera.core.planner import Plan, bounded_batch, plan
from tessera.core.planner.synthetic import synthetic_cluster, synthetic_pods


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--random", action="store_true")
    parser.add_argument("--pods", type=int, default=5000,
                        help="pending pods (20000: the overloaded case, about half fit)")
    parser.add_argument("--bounded", action="store_true",
                        help="the controller's path: bounded batch, then plan")
    args = parser.parse_args()
    rng = random.Random(1)
    snapshot = synthetic_cluster(rng, 1250, gpus_per_node=8, split=0.5, in_use=0.5,
                                 standard=not args.random)
    pods = synthetic_pods(rng, args.pods, multi=0.1, priorities=(0, 10))
    walls, cpus = [], []
    result = None
    def once() -> Plan:
        if args.bounded:
            return plan(snapshot, list(bounded_batch(snapshot, pods).pods))
        return plan(snapshot, pods)

    for _ in range(args.runs):
        wall, cpu = time.perf_counter(), time.process_time()
        result = once()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    tracemalloc.start()
    once()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert result is not None
    print(f"layouts={'random' if args.random else 'standard'} runs={args.runs} "
          f"pods={args.pods} bounded={args.bounded} "
          f"median_wall_s={statistics.median(walls):.3f} "
          f"median_cpu_s={statistics.median(cpus):.3f} "
          f"peak_traced_mib={peak / 2**20:.1f} placed={len(result.placements)} "
          f"unplaced={len(result.unplaced)} gpus_changed={len(result.gpus)}")


if __name__ == "__main__":
    main()
