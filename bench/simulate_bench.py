"""What-if benchmark: every policy on openb traces, cluster sizes and offered loads, one run.

Reads ``../shared/traces/alibaba-gpu-v2023`` (or ``--traces DIR``); writes the raw figures to
``bench/simulate/results.json`` and prints the markdown tables of ``bench/README.md``'s
Simulation section and a PASS/MISS line per target. Poisson arrivals in trace order at the
rate for each offered load (seeded), plus one replay of the real timestamps.

    .venv/bin/python bench/simulate_bench.py            # the full grid
    .venv/bin/python bench/simulate_bench.py --quick    # gpushare100, 128 GPUs, 130% only
    .venv/bin/python bench/simulate_bench.py --budget 3600 --workers 2

Cases run smallest cluster first; ``--budget`` starts no case after that many seconds of wall
time (those are listed as not run), and the JSON is rewritten after every case, so a stopped
run keeps what finished. The full grid also writes every case's table and the side-by-side
tables (one per measure: cases down, policies across) to ``bench/simulate/grid.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from tessera.sim.cluster import ClusterSpec, shorthand
from tessera.sim.dra import DraPolicy
from tessera.sim.dynamic import DynamicPolicy
from tessera.sim.engine import RunResult, simulate
from tessera.sim.policies import (
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
    out.extend([DraPolicy(cluster), DraPolicy(cluster, curated=True)])
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


Case = tuple[str, int, float]
TARGET: Case = ("gpushare100", 128, 1.3)


def _label(case: Case) -> str:
    trace, gpus, load = case
    return f"{trace} {gpus} GPUs load {load:.0%}"


def run_grid_case(case: Case, traces: Path, deadline: float) -> dict[str, Any]:
    """One case of the grid, in a worker: its tables as text, its raw rows, its target
    lines; ``{"skipped": True}`` when it would start after ``deadline`` (``time.time()``)."""
    if time.time() > deadline:
        return {"case": case, "skipped": True}
    trace, gpus, load = case
    t0 = time.perf_counter()
    cluster = shorthand(gpus // 8, 8, MODEL)
    rows = load_trace(traces / f"openb_pod_list_{trace}.csv")
    jobs, window = poisson(rows, cluster.main_model, capacity=cluster.capacity, load=load,
                           seed=SEED)
    target = case == TARGET
    results = run_case(cluster, jobs, window, target)
    wall = time.perf_counter() - t0
    label = _label(case)
    text = [f"### {label} (Poisson, seed {SEED}, window {window / 3600:.1f} h, "
            f"{len(jobs)} pods, {wall:.0f} s)\n\n{HEADER}", *(_row(r) for r in results), ""]
    raw: list[dict[str, object]] = [
        {"trace": trace, "gpus": gpus, "load": load, "arrivals": "poisson", "seed": SEED,
         "window_s": window, "pods": len(jobs), **r.summary()} for r in results]
    lines = targets(results, label) if target else []
    if target:
        spans = replay(rows, cluster.main_model)
        horizon = max(j.arrival for j in spans)
        text.append(f"### {label.split(' load', maxsplit=1)[0]}, replay of the trace's "
                    f"timestamps ({horizon / 86400:.0f} days)\n\n{HEADER}")
        for p in [DynamicPolicy(cluster), GreedyPolicy(cluster),
                  StaticPolicy.uniform(cluster, "all-balanced"), FluidGpuPolicy(cluster)]:
            r = simulate(p, spans, capacity=cluster.capacity, horizon=horizon, track_gpus=0)
            text.append(_row(r))
            raw.append({"trace": trace, "gpus": gpus, "arrivals": "replay",
                        "window_s": horizon, **r.summary()})
        text.append("")
    return {"case": case, "skipped": False, "text": "\n".join(text), "rows": raw,
            "lines": lines, "wall_s": round(time.perf_counter() - t0, 1)}


MEASURES = (("compute served (share of capacity x window)", "served_share", "{:.3f}"),
            ("pods placed by the end", "placed", "{}"),
            ("pods placed on arrival", "placed_on_arrival", "{}"),
            ("mean wait, s", "mean_wait_s", "{:.0f}"),
            ("p95 wait, s", "p95_wait_s", "{:.0f}"))
COLUMNS = ("dynamic", "greedy", *(f"static:{n}" for n in STANDARD_LAYOUTS), "static:best",
           "fluid:gpu", "fluid:cluster")


def _poisson_rows(d: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The case's Poisson rows by policy, the best mix under ``static:best``."""
    return {str(r["policy"]).split("(")[0]: r for r in d["rows"]
            if r["arrivals"] == "poisson" and r["policy"] != "dynamic(latency 0)"}


def side_by_side(done: list[dict[str, Any]]) -> str:
    """One table per measure: a row per case, a column per policy; then slices and the
    best static mix per case."""
    short = [c.removeprefix("static:") for c in COLUMNS]
    out: list[str] = []
    for title, key, fmt in MEASURES:
        out += [f"{title}:", "", "| case | pods | " + " | ".join(short) + " |",
                "|---|---|" + "---|" * len(COLUMNS)]
        for d in done:
            by = _poisson_rows(d)
            cells = [fmt.format(by[c][key]) if c in by else "-" for c in COLUMNS]
            out.append(f"| {_label(d['case'])} | {by['dynamic']['pods']} | "
                       + " | ".join(cells) + " |")
        out.append("")
    out += ["slices created/destroyed (dynamic, greedy; static and fluid make none), the "
            "best static mix, and the case's wall time:", "",
            "| case | dynamic +/- | greedy +/- | best static mix (nodes) | case wall s |",
            "|---|---|---|---|---|"]
    for d in done:
        by = {str(r["policy"]): r for r in d["rows"] if r["arrivals"] == "poisson"}
        best = next(p for p in by if p.startswith("static:best"))
        mix = best.removeprefix("static:best(").removesuffix(")").replace("+", " + ")
        dyn, greedy = by["dynamic"], by["greedy"]
        out.append(f"| {_label(d['case'])} | {dyn['created']}/{dyn['destroyed']} | "
                   f"{greedy['created']}/{greedy['destroyed']} | {mix} | {d['wall_s']:.0f} |")
    return "\n".join(out) + "\n"


def ratios(done: list[dict[str, Any]]) -> str:
    """The target case's ratios, for every case (dynamic at default latency)."""
    out = ["| case | placed / fluid:gpu placed | served / best static | "
           "placed / all-balanced placed | mean wait / lowest static mean wait |",
           "|---|---|---|---|---|"]
    for d in done:
        by = _poisson_rows(d)
        dyn = by["dynamic"]
        lowest = min(float(r["mean_wait_s"]) for p, r in by.items() if p.startswith("static:"))
        fluid = float(dyn["placed"]) / float(by["fluid:gpu"]["placed"])
        served = float(dyn["served_share"]) / float(by["static:best"]["served_share"])
        balanced = float(dyn["placed"]) / max(1.0, float(by["static:all-balanced"]["placed"]))
        wait = float(dyn["mean_wait_s"]) / max(1.0, lowest)
        out.append(f"| {_label(d['case'])} | {fluid:.3f} | {served:.3f} | {balanced:.2f} | "
                   f"{wait:.2f} |")
    return "\n".join(out) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--traces", type=Path,
                        default=Path(__file__).resolve().parents[2] / "shared/traces/"
                        "alibaba-gpu-v2023")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--budget", type=float, default=float("inf"),
                        help="seconds of wall time after which no further case starts")
    parser.add_argument("--workers", type=int, default=1, help="cases run at once")
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).resolve().parent / "simulate/results.json")
    args = parser.parse_args()
    began = time.perf_counter()
    deadline = time.time() + args.budget
    order = {c: i for i, c in enumerate(
        [(t, g, load) for t in TRACES for g in SIZES for load in LOADS])}
    grid: list[Case] = ([TARGET] if args.quick else
                        sorted(order, key=lambda c: (c[1], order[c])))
    done: list[dict[str, Any]] = []
    skipped: list[Case] = []

    def save(finished: bool) -> None:
        ordered = sorted(done, key=lambda d: order[d["case"]])
        ran = {d["case"] for d in done}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "run_time_s": round(time.perf_counter() - began), "finished": finished,
            "workers": args.workers, "cpus": os.cpu_count(),
            "not_run": [list(c) for c in grid if c not in ran],
            "case_wall_s": {_label(d["case"]): d["wall_s"] for d in ordered},
            "rows": [row for d in ordered for row in d["rows"]]}, indent=1) + "\n")

    with ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
        futures = [pool.submit(run_grid_case, c, args.traces, deadline) for c in grid]
        for future in futures:
            d = future.result()
            if d["skipped"]:
                skipped.append(d["case"])
                print(f"not run (budget spent): {_label(d['case'])}", flush=True)
                continue
            done.append(d)
            print(d["text"], flush=True)
            save(False)
    done.sort(key=lambda d: order[d["case"]])
    total = time.perf_counter() - began
    lines = [line for d in done for line in d["lines"]]
    print("\n".join(lines))
    print(f"total run time {total:.0f} s ({len(done)} of {len(grid)} cases, "
          f"{args.workers} worker(s), {os.cpu_count()} CPUs)")
    save(True)
    if not args.quick:
        tables = side_by_side(done) + "\n" + ratios(done)
        print(tables)
        not_run = "".join(f"- not run (budget spent): {_label(c)}\n" for c in skipped)
        (args.out.parent / "grid.md").write_text(
            f"# Simulation grid\n\n`bench/simulate_bench.py`, seed {SEED}, total run time "
            f"{total:.0f} s, {len(done)} of {len(grid)} cases, {args.workers} worker(s).\n\n"
            f"{not_run}\n## Side by side\n\n{tables}\n## Cases\n\n"
            + "\n".join(d["text"] for d in done) + "\n" + "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
