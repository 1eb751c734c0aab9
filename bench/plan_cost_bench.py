"""What one plan costs the controller as the cluster grows, for the same stream of pods (#20).

The controller that ships (:class:`tessera.controller.loop.Controller`, driven by the
simulator's ``dynamic`` policy: in-memory API server, agents and kubelets, a simulated clock)
runs the same arrivals (the gpushare100 openb trace, Poisson at the rate that offers
``--load`` of the *smallest* cluster) on clusters of every size in ``--sizes`` (nodes of 8
A100-80GB). The pods and their batches are the same at every size, so each plan changes about
as many nodes whatever the cluster's size; what grows with the size is what a plan costs
beyond those nodes.

Measured per size: the wall time of every controller tick that planned (its whole cost:
the snapshot, the bounded batch, the planner, the decision, the spec writes), and the nodes
each of those plans wrote a spec to. Reported: median and p90 milliseconds per plan, nodes
written per plan, and the growth of the median against the smallest size (1.0 = flat).

With ``--baseline-src DIR`` (another checkout's ``src``) each size also runs that tree's
controller, in the same run, one after the other per size, for a side-by-side ratio.

Run: ``.venv/bin/python bench/plan_cost_bench.py [--sizes 250,500,1000,2000] [--pods 2000]
[--baseline-src DIR]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tessera.api.v1alpha1 import NodePartition, NodePartitionSpec
from tessera.sim.cluster import ClusterSpec, shorthand
from tessera.sim.dynamic import DynamicPolicy
from tessera.sim.engine import simulate
from tessera.sim.policies import Queues, Schedule
from tessera.sim.workload import load_trace, poisson

HERE = Path(__file__).resolve().parent
TRACE = "openb_pod_list_gpushare100.csv"
MODEL = "A100-80GB"


class Timed(DynamicPolicy):
    """The simulator's dynamic policy, timing each tick that planned."""

    def __init__(self, cluster: ClusterSpec) -> None:
        super().__init__(cluster)
        self.plans: list[tuple[float, int]] = []
        self._written = 0

    def write_spec(self, node: str, spec: NodePartitionSpec,
                   current: NodePartition | None) -> bool:
        self._written += 1
        return super().write_spec(node, spec, current)

    def schedule(self, now: float, queues: Queues) -> Schedule:
        before, written = self.planner_calls, self._written
        began = time.perf_counter()
        out = super().schedule(now, queues)
        if self.planner_calls != before:
            self.plans.append((time.perf_counter() - began, self._written - written))
        return out


def _one(nodes: int, smallest: int, pods: int, load: float, traces: Path) -> dict[str, Any]:
    """One size, in this process (Tessera from whatever ``src`` PYTHONPATH names)."""
    rows = load_trace(traces / TRACE)[:pods]
    small = shorthand(smallest, 8, MODEL)
    jobs, window = poisson(rows, small.main_model, capacity=small.capacity, load=load, seed=1)
    cluster = shorthand(nodes, 8, MODEL)
    policy = Timed(cluster)
    began = time.perf_counter()
    result = simulate(policy, jobs, capacity=cluster.capacity, horizon=window, track_gpus=0)
    ms = sorted(1000 * s for s, _ in policy.plans)
    return {"nodes": nodes, "gpus": nodes * 8, "pods": len(jobs), "placed": result.placed,
            "plans": len(ms), "median_ms": round(statistics.median(ms), 2) if ms else None,
            "p90_ms": round(ms[int(0.9 * (len(ms) - 1))], 2) if ms else None,
            "nodes_written_per_plan": round(statistics.mean(n for _, n in policy.plans), 2)
            if ms else None,
            "wall_s": round(time.perf_counter() - began, 1)}


def _run(src: str | None, args: argparse.Namespace, nodes: int, smallest: int
         ) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = src or str(HERE.parent / "src")
    out = subprocess.run(
        [sys.executable, __file__, "--one", str(nodes), "--smallest", str(smallest),
         "--pods", str(args.pods), "--load", str(args.load), "--traces", str(args.traces)],
        env=env, check=True, capture_output=True, text=True)
    found: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    found["controller"] = "baseline" if src else "this tree"
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="250,500,1000,2000")
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--load", type=float, default=0.9,
                        help="offered load on the smallest cluster (the same arrivals for all)")
    parser.add_argument("--traces", type=Path,
                        default=HERE.parent.parent / "shared" / "traces" / "alibaba-gpu-v2023")
    parser.add_argument("--baseline-src", default=None)
    parser.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--smallest", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(_one(args.one, args.smallest, args.pods, args.load, args.traces)))
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    smallest = min(sizes)
    results: list[dict[str, Any]] = []
    for nodes in sizes:
        for src in ([args.baseline_src, None] if args.baseline_src else [None]):
            found = _run(src, args, nodes, smallest)
            results.append(found)
            print(json.dumps(found), flush=True)
    print("\n| nodes (GPUs) | controller | plans | nodes written / plan | median ms / plan | "
          "p90 ms | median vs smallest |\n|---|---|---|---|---|---|---|")
    for row in results:
        first = next(r for r in results if r["controller"] == row["controller"]
                     and r["nodes"] == smallest)
        growth = (row["median_ms"] / first["median_ms"]) if first["median_ms"] else float("nan")
        print(f"| {row['nodes']:,} ({row['gpus']:,}) | {row['controller']} | {row['plans']} | "
              f"{row['nodes_written_per_plan']} | {row['median_ms']} | {row['p90_ms']} | "
              f"{growth:.2f}x |")
    (HERE / "plan_cost_results.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
