"""``tessera simulate``: what-if replay of a workload on a simulated cluster, policy by policy.

Every policy runs through the same event loop (:mod:`tessera.sim.engine`) on the same jobs;
the table goes to stdout, the HTML report to ``--report`` (its path is printed), and a rich
progress bar to stderr while it runs (``--no-progress`` to silence it).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from importlib import resources
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from tessera.core import catalogue
from tessera.core.errors import InvalidInputError
from tessera.sim.cluster import SHORTHAND, ClusterSpec, load_cluster, shorthand
from tessera.sim.engine import RunResult, simulate
from tessera.sim.mixed import MixedCluster, mixed_jobs, mixed_policy
from tessera.sim.policies import (
    DEFAULT_BATCH_WINDOW_S,
    DEFAULT_CAPACITY_LAG_S,
    DEFAULT_RECONFIG_LATENCY_S,
    DynamicPolicy,
    FluidClusterPolicy,
    FluidGpuPolicy,
    GreedyPolicy,
    SimPolicy,
    StaticPolicy,
)
from tessera.sim.report import render_class_table, render_table, write_report
from tessera.sim.shared import SharedCluster, shared_policy
from tessera.sim.sizing import headline, parse_target, size_for
from tessera.sim.static_mix import best_static_mix
from tessera.sim.workload import (
    DEFAULT_MAX_DURATION_S,
    MAPPINGS,
    Job,
    TraceRow,
    load_trace,
    offered_load,
    poisson,
    replay,
    shared_request,
    synthetic,
)

DEFAULT_POLICIES = "dynamic,greedy,static:all-balanced,static:all-7g,fluid:gpu"
SHARED_DEFAULT_POLICIES = "dynamic,static:timeslice-4,static:mps-4,whole,fluid:gpu"
"""On GPUs without MIG (``--cluster 8x8xL4``)."""
BUNDLED = "bundled"


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "simulate",
        help="what-if replay of a workload trace under dynamic, static and greedy policies",
        description="Replay a workload on a simulated cluster, event by event, once per "
        "policy, and compare pods placed, waits, utilisation, fragmentation and "
        "repartitions. See the README's Simulation section.",
    )
    parser.add_argument("--cluster", default="2x8xA100-80GB",
                        help="NODESxGPUSxMODEL (e.g. 16x8xA100-SXM4-80GB) or a CLUSTER.json "
                        "as for `tessera plan` (default 2x8xA100-80GB)")
    parser.add_argument("--trace", default=BUNDLED,
                        help="an openb pod_list CSV, 'bundled' (default: a 416-pod sample of "
                        "openb default shipped with Tessera) or 'synthetic'")
    parser.add_argument("--policies", default=None,
                        help="comma-separated: dynamic, greedy, static:<layout> (all-1g, "
                        "all-2g, all-3g, all-4g, all-7g, all-balanced: those the card has), "
                        "static:best (best mix in hindsight), fluid:gpu, fluid:cluster "
                        f"(default {DEFAULT_POLICIES}, with all-7g read as the card's "
                        "whole-card layout, e.g. all-4g on an RTX PRO 6000)")
    parser.add_argument("--arrivals", choices=("poisson", "replay"), default="poisson",
                        help="poisson: trace order at the rate for --load (default); replay: "
                        "the trace's own timestamps")
    parser.add_argument("--load", type=float, default=1.3,
                        help="offered load for poisson arrivals (default 1.3)")
    parser.add_argument("--compress", type=float, default=1.0,
                        help="replay: divide every time by this (same load, sooner)")
    parser.add_argument("--rate-scale", type=float, default=1.0,
                        help="replay: divide gaps between arrivals by this (more load)")
    parser.add_argument("--mapping", choices=MAPPINGS, default="both",
                        help="gpu_milli to profile: smallest covering compute and memory "
                        "(both, default), compute only, or memory only")
    parser.add_argument("--max-duration", type=float, default=DEFAULT_MAX_DURATION_S,
                        help="cap on a pod's duration in seconds (default one day)")
    parser.add_argument("--batch-window", type=float, default=DEFAULT_BATCH_WINDOW_S,
                        help="seconds dynamic and greedy collect pods before planning")
    parser.add_argument("--reconfig-latency", type=float, default=DEFAULT_RECONFIG_LATENCY_S,
                        help="seconds per GPU-instance create/destroy")
    parser.add_argument("--capacity-lag", type=float, default=DEFAULT_CAPACITY_LAG_S,
                        help="seconds until the kubelet advertises a new slice")
    parser.add_argument("--pods", type=int, default=2000, help="synthetic: number of pods")
    parser.add_argument("--seed", type=int, default=1, help="arrivals and synthetic seed")
    parser.add_argument("--report", type=Path, default=Path("simulation-report.html"),
                        help="HTML report path (default simulation-report.html)")
    parser.add_argument("--size-for", metavar="TARGET",
                        help="answer how many GPUs each policy needs to keep TARGET "
                        "(p95-wait=60s or mean-wait=2m): the workload made for --cluster, "
                        "replayed on 1 .. 4x its nodes (MIG clusters and GPUs without MIG)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(run=run)


def _workload(args: argparse.Namespace, cluster: ClusterSpec) -> tuple[tuple[Job, ...], float,
                                                                        str]:
    model = cluster.main_model
    if args.trace == "synthetic":
        rate = args.load * cluster.capacity / (600.0 * 2.6)  # mean compute of the default mix
        jobs = synthetic(random.Random(args.seed), args.pods, model, rate=rate)
        return jobs, max(j.arrival for j in jobs), f"synthetic, {args.pods} pods, seed {args.seed}"
    rows, label = _rows(args)
    if args.arrivals == "replay":
        jobs = replay(rows, model, mapping=args.mapping, compress=args.compress,
                      rate_scale=args.rate_scale, max_duration=args.max_duration)
        return jobs, max(j.arrival for j in jobs) or 1.0, f"{label}, replayed"
    jobs, window = poisson(rows, model, capacity=cluster.capacity, load=args.load,
                           seed=args.seed, mapping=args.mapping, max_duration=args.max_duration)
    return jobs, window, f"{label}, Poisson arrivals in trace order, seed {args.seed}"


def _rows(args: argparse.Namespace) -> tuple[list[TraceRow], str]:
    if args.trace == BUNDLED:
        source = resources.files("tessera.sim") / "data" / "openb_default_sample.csv"
        with resources.as_file(source) as path:
            rows = load_trace(Path(path))
        label = "bundled openb default sample"
    else:
        rows = load_trace(Path(args.trace))
        label = str(args.trace)
    if not rows:
        raise InvalidInputError("--trace", f"{label} has no GPU pods")
    return rows, label


def _policy(name: str, cluster: ClusterSpec, args: argparse.Namespace) -> SimPolicy | None:
    timing = {"batch_window": args.batch_window, "reconfig_latency": args.reconfig_latency,
              "capacity_lag": args.capacity_lag}
    if name == "dynamic":
        return DynamicPolicy(cluster, **timing)
    if name == "greedy":
        return GreedyPolicy(cluster, **timing)
    if name == "fluid:gpu":
        return FluidGpuPolicy(cluster)
    if name == "fluid:cluster":
        return FluidClusterPolicy(cluster)
    if name == "static:best":
        return None
    if name.startswith("static:"):
        return StaticPolicy.uniform(cluster, name.split(":", 1)[1])
    raise InvalidInputError("--policies", f"unknown policy {name!r}",
                            ("dynamic", "greedy", "static:<layout>", "static:best",
                             "fluid:gpu", "fluid:cluster"))


def _default_policies(cluster: ClusterSpec) -> str:
    """:data:`DEFAULT_POLICIES` for this cluster's card: ``all-7g`` is the whole-card layout,
    which a card with fewer compute slices names by its own size."""
    whole = f"all-{cluster.main_model.full_profile.compute_slices}g"
    return DEFAULT_POLICIES.replace("all-7g", whole)


def _shared_cluster(text: str) -> SharedCluster | None:
    """``NODESxGPUSxCARD`` for a card without MIG (``8x8xL4``); None for anything else."""
    match = SHORTHAND.match(text)
    if match is None or Path(text).exists():
        return None
    card = catalogue.find_card(match.group(3))
    if not isinstance(card, catalogue.WholeGpu):
        return None
    nodes, per_node = int(match.group(1)), int(match.group(2))
    if nodes < 1 or per_node < 1:
        raise InvalidInputError("--cluster", "needs at least one node and one GPU")
    return SharedCluster(card, nodes, per_node)


def _shared_workload(args: argparse.Namespace, cluster: SharedCluster
                     ) -> tuple[tuple[Job, ...], float, str]:
    if args.trace == "synthetic":
        raise InvalidInputError("--trace", "GPUs without MIG are simulated on openb traces "
                                "(their shares of a GPU); give one, or 'bundled'")
    rows, label = _rows(args)
    if args.arrivals == "replay":
        jobs = replay(rows, None, compress=args.compress, rate_scale=args.rate_scale,
                      max_duration=args.max_duration, mapper=shared_request)
        return jobs, max(j.arrival for j in jobs) or 1.0, f"{label}, replayed"
    jobs, window = poisson(rows, None, capacity=cluster.capacity, load=args.load,
                           seed=args.seed, max_duration=args.max_duration,
                           mapper=shared_request)
    return jobs, window, f"{label}, Poisson arrivals in trace order, seed {args.seed}"


MIXED_DEFAULT_POLICIES = ("dynamic,greedy+static:timeslice-4,"
                          "static:all-balanced+static:timeslice-4,fluid:gpu")
"""On a cluster of MIG cards and cards without MIG: one policy per pool (MIG+other)."""


def _mixed_cluster(text: str) -> MixedCluster | None:
    """``4x8xA100-SXM4-80GB,4x8xL4``: one pool of MIG cards, one of cards without MIG."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if len(parts) < 2:
        return None
    kinds = [(p, _shared_cluster(p)) for p in parts]
    shared = [c for _, c in kinds if c is not None]
    mig = [p for p, c in kinds if c is None]
    if len(shared) != 1 or len(mig) != 1:
        raise InvalidInputError("--cluster", "a mixed cluster is one NODESxGPUSxMODEL of MIG "
                                "cards and one of cards without MIG, e.g. "
                                "4x8xA100-SXM4-80GB,4x8xL4")
    return MixedCluster(load_cluster(mig[0]), shared[0])


def _mixed_run(args: argparse.Namespace, cluster: MixedCluster
               ) -> tuple[tuple[Job, ...], float, str, list[tuple[str, SimPolicy | None]]]:
    if args.trace == "synthetic" or args.arrivals == "replay":
        raise InvalidInputError("--trace/--arrivals", "a mixed cluster is simulated on an "
                                "openb trace with Poisson arrivals")
    rows, label = _rows(args)
    jobs, window, to_mig = mixed_jobs(rows, cluster, load=args.load, seed=args.seed,
                                      max_duration=args.max_duration)
    names = [n.strip() for n in (args.policies or MIXED_DEFAULT_POLICIES).split(",")
             if n.strip()]
    policies: list[tuple[str, SimPolicy | None]] = [(n, mixed_policy(
        n, cluster, to_mig, lambda m: _policy(m, cluster.mig, args),
        lambda o: shared_policy(o, cluster.shared, batch_window=args.batch_window,
                                capacity_lag=args.capacity_lag))) for n in names]
    source = (f"{label}, Poisson arrivals in trace order, seed {args.seed}; "
              f"{len(to_mig)} of the pods to the MIG pool")
    return jobs, window, source, policies


def _sizing(args: argparse.Namespace) -> int:
    target = parse_target(args.size_for)
    shared = _shared_cluster(args.cluster)
    if shared is None and "," in args.cluster:
        raise InvalidInputError("--size-for", "sizes one kind of card at a time, not a mixed "
                                "cluster")
    answers = []
    if shared is not None:
        jobs, horizon, _ = _shared_workload(args, shared)
        names = [n.strip() for n in (args.policies or SHARED_DEFAULT_POLICIES).split(",")
                 if n.strip()]
        limit, per_node = shared.nodes * 4, shared.per_node
        for name in names:
            def make(nodes: int, name: str = name) -> tuple[SimPolicy, int]:
                cluster = SharedCluster(shared.card, nodes, shared.per_node)
                return shared_policy(name, cluster, batch_window=args.batch_window,
                                     capacity_lag=args.capacity_lag), cluster.capacity
            answers.append(size_for(name, make, jobs, horizon, target, limit=limit,
                                    gpus_per_node=per_node))
    else:
        mig = load_cluster(args.cluster)
        per_node = len(mig.nodes[0].gpus)
        jobs, horizon, _ = _workload(args, mig)
        names = [n.strip() for n in (args.policies or _default_policies(mig)).split(",")
                 if n.strip()]
        limit = len(mig.nodes) * 4
        for name in names:
            if name == "static:best":
                raise InvalidInputError("--size-for", "static:best is a mix found for one "
                                        "cluster; size each static:<layout> instead")
            def make_mig(nodes: int, name: str = name) -> tuple[SimPolicy, int]:
                cluster = shorthand(nodes, per_node, mig.main_model.name)
                policy = _policy(name, cluster, args)
                assert policy is not None
                return policy, cluster.capacity
            answers.append(size_for(name, make_mig, jobs, horizon, target, limit=limit,
                                    gpus_per_node=per_node))
    lines = headline(answers, target, limit * per_node)
    if args.json:
        print(json.dumps({"target": str(target), "answers": [
            {"policy": a.policy, "gpus": a.gpus, **a.result.summary()} for a in answers]},
            indent=2))
    else:
        print("\n".join(lines))
    return 0


def run(args: argparse.Namespace) -> int:
    if args.size_for:
        return _sizing(args)
    shared = _shared_cluster(args.cluster)
    mixed = _mixed_cluster(args.cluster) if shared is None else None
    cluster: ClusterSpec | SharedCluster | MixedCluster
    policies: list[tuple[str, SimPolicy | None]]
    if mixed is not None:
        cluster = mixed
        jobs, horizon, source, policies = _mixed_run(args, mixed)
    elif shared is not None:
        cluster = shared
        jobs, horizon, source = _shared_workload(args, shared)
        names = [n.strip() for n in (args.policies or SHARED_DEFAULT_POLICIES).split(",")
                 if n.strip()]
        policies = [(n, shared_policy(n, shared, batch_window=args.batch_window,
                                      capacity_lag=args.capacity_lag)) for n in names]
    else:
        mig = load_cluster(args.cluster)
        cluster = mig
        jobs, horizon, source = _workload(args, mig)
        names = [n.strip() for n in (args.policies or _default_policies(mig)).split(",")
                 if n.strip()]
        policies = [(n, _policy(n, mig, args)) for n in names]
    results: list[RunResult] = []
    with Progress(TextColumn("{task.description:<22}"), BarColumn(), TimeElapsedColumn(),
                  disable=args.no_progress, console=None, transient=False) as bar:
        for name, policy in policies:
            task = bar.add_task(name, total=1.0)

            def tick(done: float, task: Any = task) -> None:
                bar.update(task, completed=done)

            if policy is None:
                assert isinstance(cluster, ClusterSpec)
                results.append(best_static_mix(cluster, jobs, horizon).result)
                tick(1.0)
            else:
                results.append(simulate(policy, jobs, capacity=cluster.capacity,
                                        horizon=horizon, progress=tick))
    offered = (args.load if isinstance(cluster, MixedCluster)  # by construction, in milli
               else offered_load(jobs, cluster.capacity, horizon))
    details = [f"cluster: {cluster.describe()}", f"workload: {source}, {len(jobs)} pods, "
               f"offered load {offered:.2f}, "
               f"window {horizon / 3600:.2f} h",
               f"dynamic/greedy: batch window {args.batch_window} s, reconfiguration "
               f"{args.reconfig_latency} s per GPU-instance operation, capacity lag "
               f"{args.capacity_lag} s", f"mapping: {args.mapping}"]
    report = write_report(args.report, results, title="Tessera what-if simulation",
                          details=details)
    if args.json:
        print(json.dumps({"details": details, "report": str(report),
                          "policies": [r.summary() for r in results]}, indent=2))
    else:
        print("\n".join(details))
        print(render_table(results))
        print(render_class_table(results))
        print(f"report: {report}")
    sys.stdout.flush()
    return 0
