"""The planner's objective against first fit, case by case: dynamic vs greedy on the grid.

For each case of the simulation grid (openb traces x cluster sizes x loads, Poisson arrivals,
seed 1 unless ``--seeds`` names others: each seed is a case of its own) and each reservation
bound given, runs ``dynamic`` (Tessera's planner) and ``greedy`` (nos-style first fit) side by
side and prints, per case: compute served by each (and the difference in points), p95 wait
ratio, and the size class whose longest wait grew most against greedy's. Then a PASS/MISS line
per target of issue #13 that this can check: served >= greedy - 0.5 point on every case,
>= 1 point more on average, p95 <= greedy's, no class's max wait over 1.5x greedy's.

    .venv/bin/python bench/simulate/objective_bench.py                       # reservations 1
    .venv/bin/python bench/simulate/objective_bench.py --reservations 0,1,2 --sizes 64,128
    .venv/bin/python bench/simulate/objective_bench.py --batches 0.5/3,5/5  # controller batching
    .venv/bin/python bench/simulate/objective_bench.py --seeds 1,2,3  # seed-to-seed spread
    .venv/bin/python bench/simulate/objective_bench.py --reserve-after 0,2  # reserve at once/later

``dynamic`` is the controller itself (:mod:`tessera.sim.dynamic`); ``--batches`` sets its
batch window (idle/max seconds; the controller's defaults are 0.5/3), ``--reserve-after`` the
controller's ``reserve_after_waits`` (a pod reserves once it has waited that many times the
median recent wait; 0: at once). Each case runs in a fresh worker process.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from tessera.controller.loop import ControllerSettings
from tessera.sim.cluster import shorthand
from tessera.sim.dynamic import DynamicPolicy
from tessera.sim.engine import simulate
from tessera.sim.policies import GreedyPolicy
from tessera.sim.workload import load_trace, poisson

TRACES = ("default", "gpushare40", "gpushare100")
LOADS = (1.0, 1.3)
SEED = 1
MODEL = "A100-80GB"
Case = tuple[str, int, float, int, str, int, float]
T = TypeVar("T")


def _listed(text: str, kind: Callable[[str], T]) -> list[T]:
    """A comma-separated option's values."""
    return [kind(item) for item in text.split(",")]


def run(case: Case, traces: Path) -> tuple[Case, dict[str, dict[str, Any]]]:
    trace, gpus, load, reservations, batch, seed, after = case
    idle, most = (float(x) for x in batch.split("/"))
    cluster = shorthand(gpus // 8, 8, MODEL)
    rows = load_trace(traces / f"openb_pod_list_{trace}.csv")
    jobs, window = poisson(rows, cluster.main_model, capacity=cluster.capacity, load=load,
                           seed=seed)
    out: dict[str, dict[str, Any]] = {}
    dynamic = DynamicPolicy(cluster, reservations=reservations, batch_idle=idle, batch_max=most,
                            reserve_after_waits=after)
    for name, policy in (("dynamic", dynamic),
                         ("greedy", GreedyPolicy(cluster))):
        began = time.perf_counter()
        r = simulate(policy, jobs, capacity=cluster.capacity, horizon=window, track_gpus=0)
        out[name] = {"served": r.served_share, "placed": r.placed, "p95": r.p95_wait,
                     "classes": {k: v["max_wait_s"] for k, v in r.by_class().items()},
                     "wall": time.perf_counter() - began}
    return case, out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--traces", type=Path,
                        default=Path(__file__).resolve().parents[3] / "shared/traces/"
                        "alibaba-gpu-v2023")
    parser.add_argument("--reservations", default="1", help="comma-separated bounds")
    parser.add_argument("--sizes", default="64,128,256", help="cluster sizes in GPUs")
    parser.add_argument("--batches", default="0.5/3",
                        help="comma-separated controller batch windows, IDLE/MAX seconds")
    parser.add_argument("--traces-only", default=",".join(TRACES), dest="only",
                        help="comma-separated traces to run")
    parser.add_argument("--seeds", default=str(SEED),
                        help="comma-separated arrival seeds (each is a case of its own)")
    parser.add_argument("--loads", default=",".join(str(x) for x in LOADS),
                        help="comma-separated offered loads")
    parser.add_argument("--reserve-after", default=str(ControllerSettings.reserve_after_waits),
                        dest="after", help="comma-separated reserve_after_waits factors")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    bounds = _listed(args.reservations, int)
    sizes = _listed(args.sizes, int)
    batches = _listed(args.batches, str)
    seeds = _listed(args.seeds, int)
    loads = _listed(args.loads, float)
    afters = _listed(args.after, float)
    cases = [(t, g, load, b, w, seed, a) for w in batches for b in bounds for a in afters
             for g in sizes for t in _listed(args.only, str) for load in loads for seed in seeds]
    began = time.perf_counter()
    results: dict[tuple[int, str, float], list[tuple[Case, dict[str, dict[str, Any]]]]] = {
        (b, w, a): [] for b in bounds for w in batches for a in afters}
    print("| batch | reservations | reserve after | case | dynamic | greedy | points | "
          "placed d/g | p95 d/g | worst class (max wait d/g) | s |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|")
    # A fresh process per case: nothing a case leaves in a worker reaches the next one.
    with ProcessPoolExecutor(max(1, args.workers), max_tasks_per_child=1) as pool:
        for case, out in pool.map(run, cases, [args.traces] * len(cases)):
            d, g = out["dynamic"], out["greedy"]
            worst = max((d["classes"][c] / max(g["classes"].get(c, 1.0), 1.0), c)
                        for c in d["classes"])
            results[(case[3], case[4], case[6])].append((case, out))
            seed = f" seed {case[5]}" if seeds != [SEED] else ""
            print(f"| {case[4]} | {case[3]} | {case[6]:g} | "
                  f"{case[0]} {case[1]} GPUs {case[2]:.0%}{seed} | "
                  f"{d['served']:.4f} | "
                  f"{g['served']:.4f} | {100 * (d['served'] - g['served']):+.2f} | "
                  f"{d['placed']}/{g['placed']} | {d['p95'] / max(g['p95'], 1.0):.2f} | "
                  f"{worst[1]} {worst[0]:.2f} | {d['wall']:.0f} |", flush=True)
    for (bound, batch, after), done in results.items():
        deltas = [o["dynamic"]["served"] - o["greedy"]["served"] for _, o in done]
        checks = [
            ("served >= greedy - 0.5 point on every case", min(deltas) >= -0.005,
             f"worst {100 * min(deltas):+.2f}"),
            ("served >= greedy + 1 point on average", sum(deltas) / len(deltas) >= 0.01,
             f"mean {100 * sum(deltas) / len(deltas):+.2f}"),
            ("p95 wait <= greedy's on every case",
             all(o["dynamic"]["p95"] <= o["greedy"]["p95"] for _, o in done),
             f"{sum(o['dynamic']['p95'] <= o['greedy']['p95'] for _, o in done)}/{len(done)}"),
            ("no class's max wait over 1.5x greedy's", all(
                d <= 1.5 * max(o["greedy"]["classes"].get(c, 1.0), 1.0)
                for _, o in done for c, d in o["dynamic"]["classes"].items()),
             f"{sum(all(d <= 1.5 * max(o['greedy']['classes'].get(c, 1.0), 1.0) for c, d in o['dynamic']['classes'].items()) for _, o in done)}/{len(done)} cases"),  # noqa: E501
        ]
        for what, ok, figure in checks:
            print(f"{'PASS' if ok else 'MISS'} batch={batch} reservations={bound} "
                  f"reserve_after={after:g}: {what} ({figure})")
    print(f"total run time {time.perf_counter() - began:.0f} s, {len(cases)} cases")
    return 0


if __name__ == "__main__":
    sys.exit(main())
