"""``tessera simulate``: what-if replay of a workload on a simulated cluster, policy by policy.

Every policy runs through the same event loop (:mod:`tessera.sim.engine`) on the same jobs;
the table goes to stdout, the HTML report to ``--report`` (its path is printed), and a rich
progress bar to stderr while it runs (``--no-progress`` to silence it).

The workload is an openb trace (``--trace``), a synthetic one, or the user's own pod history
(``--workload pods.csv``, the format of :mod:`tessera.sim.history`), which ``tessera simulate
export`` writes from a live cluster. ``export`` is a subcommand of ``simulate`` that only
exists when named first, so every ``tessera simulate --option ...`` reads as it always did.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from tessera.cli import reservation_flags
from tessera.cli.plan_cmd import live_cache
from tessera.controller import demand
from tessera.core import catalogue
from tessera.core.catalogue import GpuModel, WholeGpu
from tessera.core.errors import InvalidInputError
from tessera.sim.cluster import SHORTHAND, ClusterSpec, load_cluster, shorthand
from tessera.sim.dra import CURATED, UNCURATED, DraPolicy
from tessera.sim.dynamic import DEFAULT_BATCH_IDLE_S, DEFAULT_BATCH_MAX_S, DynamicPolicy
from tessera.sim.engine import RunResult, simulate, size_classes
from tessera.sim.history import (
    HistoryPod,
    history_jobs,
    load_history,
    mig_requests,
    parse_time,
    request_from_resources,
    shared_requests,
    write_history,
)
from tessera.sim.mixed import MixedCluster, mixed_jobs, mixed_policy
from tessera.sim.policies import (
    DEFAULT_BATCH_WINDOW_S,
    DEFAULT_CAPACITY_LAG_S,
    DEFAULT_RECONFIG_LATENCY_S,
    FluidClusterPolicy,
    FluidGpuPolicy,
    GreedyPolicy,
    SimPolicy,
    StaticPolicy,
)
from tessera.sim.report import render_class_table, render_table, write_report
from tessera.sim.shared import SharedCluster, shared_policy
from tessera.sim.sizing import Goal, SizeAnswer, headline, parse_goal, size_for
from tessera.sim.sizing_report import class_table_html, class_table_text, curve_html
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
_T = TypeVar("_T")
DEFAULT_LOAD = 1.3
SAMPLE_HISTORY = "sample_history.csv"
"""The pod history ``--workload bundled`` replays, beside the bundled trace."""


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
    parser.add_argument("--trace", default=None,
                        help="an openb pod_list CSV, 'bundled' (default: a 416-pod sample of "
                        "openb default shipped with Tessera) or 'synthetic'")
    parser.add_argument("--workload", metavar="PODS.csv",
                        help="replay your own pod history instead of a trace, on its own "
                        "clock: a CSV of name,created,started,finished,request (see the "
                        "README's Simulation section; `tessera simulate export` writes one "
                        "from a cluster), or 'bundled' for a small sample. --compress, "
                        "--rate-scale, --max-duration, --mapping and --size-for apply; "
                        "--trace, --load and --arrivals poisson are refused beside it")
    parser.add_argument("--policies", default=None,
                        help="comma-separated: dynamic, greedy, static:<layout> (all-1g, "
                        "all-2g, all-3g, all-4g, all-7g, all-balanced: those the card has), "
                        "static:best (best mix in hindsight), dra, dra:curated (kube-scheduler "
                        "allocating MIG placements through DRA, without or with the "
                        "controller's curation), fluid:gpu, fluid:cluster "
                        f"(default {DEFAULT_POLICIES}, with all-7g read as the card's "
                        "whole-card layout, e.g. all-4g on an RTX PRO 6000)")
    parser.add_argument("--arrivals", choices=("poisson", "replay"), default=None,
                        help="poisson: trace order at the rate for --load (default); replay: "
                        "the trace's own timestamps")
    parser.add_argument("--load", type=float, default=None,
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
                        help="seconds greedy and the shared-GPU policies collect pods before "
                        "planning (dynamic batches as the controller does: "
                        f"{DEFAULT_BATCH_IDLE_S:g} s idle, {DEFAULT_BATCH_MAX_S:g} s at most)")
    parser.add_argument("--reconfig-latency", type=float, default=DEFAULT_RECONFIG_LATENCY_S,
                        help="seconds per GPU-instance create/destroy")
    parser.add_argument("--capacity-lag", type=float, default=DEFAULT_CAPACITY_LAG_S,
                        help="seconds until the kubelet advertises a new slice")
    parser.add_argument("--pods", type=int, default=2000, help="synthetic: number of pods")
    parser.add_argument("--seed", type=int, default=1, help="arrivals and synthetic seed")
    parser.add_argument("--report", type=Path, default=Path("simulation-report.html"),
                        help="HTML report path (default simulation-report.html)")
    parser.add_argument("--size-for", metavar="TARGETS",
                        help="answer how many GPUs each policy needs to keep TARGETS, "
                        "comma-separated [CLASS:]METRIC=DURATION (METRIC p95-wait or "
                        "mean-wait; CLASS 1g ... 7g, multi-gpu, share, whole, small for every "
                        "class of one GPU or less, the default, or all for every pod pooled), "
                        "e.g. small:p95-wait=2m,multi-gpu:p95-wait=6h: the workload made for "
                        "--cluster, replayed on every size from 1 to 4x its nodes (MIG "
                        "clusters and GPUs without MIG)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    reservation_flags.add(parser, same_as="the dynamic policy's, as the controller's flags")
    parser.set_defaults(run=run)
    _register_export(parser)


EXPORT_HELP = (
    "Write the GPU pods the cluster has now (every namespace; any container asking an "
    "nvidia.com/ resource) as a --workload CSV: created, the containers' start and finish, "
    "and the request. Read-only. It sees only pods that still exist: deleted pods (and "
    "their times) are gone, so run it periodically (e.g. a CronJob; concatenated exports "
    "merge, a pod's most complete row wins) or build the CSV from your audit logs. Pods "
    "asking what the simulator does not model (MPS shares inside a MIG slice, several kinds "
    "of GPU resource) are skipped and counted.")


def _register_export(parser: argparse.ArgumentParser) -> None:
    """``simulate export``: a subcommand that is optional, so ``simulate`` without it parses
    exactly as before (argparse only takes a positional word as the subcommand)."""
    parser.usage = ("%(prog)s [options]\n       %(prog)s export [--kubeconfig K] [--context C] "
                    "[-o PODS.csv]")
    sub = parser.add_subparsers(dest="simulate_command", metavar="export", required=False,
                                title="subcommand")
    export = sub.add_parser("export", help="write the live cluster's GPU pods as a "
                            "--workload CSV (read-only)", description=EXPORT_HELP)
    export.add_argument("--kubeconfig", help="the cluster's kubeconfig (default: in-cluster "
                        "or the default kubeconfig)")
    export.add_argument("--context", help="the kubeconfig context to use")
    export.add_argument("-o", "--output", default="-",
                        help="the CSV to write (default: stdout)")
    export.set_defaults(run=run_export)


def _history(args: argparse.Namespace, card: GpuModel | WholeGpu
             ) -> tuple[tuple[Job, ...], float, str]:
    """``--workload``: the user's own pods on their own clock, asking as ``card``'s do."""
    if args.workload == BUNDLED:
        history = _bundled(SAMPLE_HISTORY, load_history)
        label = "bundled sample pod history"
    else:
        history = load_history(Path(args.workload))
        label = str(args.workload)
    convert = (mig_requests(card, args.mapping) if isinstance(card, GpuModel)
               else shared_requests(card))
    replayed = history_jobs(history, convert, compress=args.compress,
                            rate_scale=args.rate_scale, max_duration=args.max_duration)
    notes = [f"{label}, replayed on its own clock"]
    if replayed.estimated:
        notes.append(f"{replayed.estimated} never started (median durations of finished "
                     "pods like them)")
    if replayed.skipped:
        notes.append(f"{replayed.skipped} never started and skipped (no pod finished)")
    return replayed.jobs, replayed.window, "; ".join(notes)


def _workload(args: argparse.Namespace, cluster: ClusterSpec) -> tuple[tuple[Job, ...], float,
                                                                        str]:
    model = cluster.main_model
    if args.workload:
        return _history(args, model)
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


def _bundled(name: str, load: Callable[[Path], _T]) -> _T:
    """A file shipped in ``tessera.sim``'s data folder, read by ``load``."""
    with resources.as_file(resources.files("tessera.sim") / "data" / name) as path:
        return load(Path(path))


def _rows(args: argparse.Namespace) -> tuple[list[TraceRow], str]:
    if args.trace == BUNDLED:
        rows = _bundled("openb_default_sample.csv", load_trace)
        label = "bundled openb default sample"
    else:
        rows = load_trace(Path(args.trace))
        label = str(args.trace)
    if not rows:
        raise InvalidInputError("--trace", f"{label} has no GPU pods")
    return rows, label


def _names(args: argparse.Namespace, default: str) -> list[str]:
    """The policies ``--policies`` names, or ``default``'s."""
    return [n.strip() for n in (args.policies or default).split(",") if n.strip()]


def _shared(name: str, cluster: SharedCluster, args: argparse.Namespace) -> SimPolicy:
    """A policy for GPUs without MIG, with the run's timing."""
    return shared_policy(name, cluster, batch_window=args.batch_window,
                         capacity_lag=args.capacity_lag)


RESERVING = "dynamic:reservations-"
"""``dynamic:reservations-N``: the dynamic policy with N reservations per plan, so that one run
compares reservation settings side by side (README, "Reservations: a choice per workload")."""


def _reservations_in(name: str) -> int:
    count = name.removeprefix(RESERVING)
    if not (count.isascii() and count.isdigit()):
        raise InvalidInputError("--policies", f"{name!r}: N in {RESERVING}N is a whole number "
                                f"of 0 or more, e.g. {RESERVING}0")
    return int(count)


def _policy(name: str, cluster: ClusterSpec, args: argparse.Namespace) -> SimPolicy | None:
    if name == "dynamic" or name.startswith(RESERVING):
        held = reservation_flags.settings(args)
        if name != "dynamic":
            held["reservations"] = _reservations_in(name)
        dynamic = DynamicPolicy(cluster, reconfig_latency=args.reconfig_latency,
                                capacity_lag=args.capacity_lag, **held)
        dynamic.name = name
        return dynamic
    if name == "greedy":
        return GreedyPolicy(cluster, batch_window=args.batch_window,
                            reconfig_latency=args.reconfig_latency,
                            capacity_lag=args.capacity_lag)
    if name in (UNCURATED, CURATED):
        return DraPolicy(cluster, curated=name == CURATED,
                         reconfig_latency=args.reconfig_latency)
    if name == "fluid:gpu":
        return FluidGpuPolicy(cluster)
    if name == "fluid:cluster":
        return FluidClusterPolicy(cluster)
    if name == "static:best":
        return None
    if name.startswith("static:"):
        return StaticPolicy.uniform(cluster, name.split(":", 1)[1])
    raise InvalidInputError("--policies", f"unknown policy {name!r}",
                            ("dynamic", f"{RESERVING}N", "greedy", "static:<layout>",
                             "static:best",
                             UNCURATED, CURATED, "fluid:gpu", "fluid:cluster"))


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
    if args.workload:
        return _history(args, cluster.card)
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
    if args.trace == "synthetic" or args.arrivals == "replay" or args.workload:
        raise InvalidInputError("--trace/--arrivals/--workload", "a mixed cluster is "
                                "simulated on an openb trace with Poisson arrivals")
    rows, label = _rows(args)
    jobs, window, to_mig = mixed_jobs(rows, cluster, load=args.load, seed=args.seed,
                                      max_duration=args.max_duration)
    names = _names(args, MIXED_DEFAULT_POLICIES)
    policies: list[tuple[str, SimPolicy | None]] = [(n, mixed_policy(
        n, cluster, to_mig, lambda m: _policy(m, cluster.mig, args),
        lambda o: _shared(o, cluster.shared, args))) for n in names]
    source = (f"{label}, Poisson arrivals in trace order, seed {args.seed}; "
              f"{len(to_mig)} of the pods to the MIG pool")
    return jobs, window, source, policies


def _sizing(args: argparse.Namespace, shared: SharedCluster | None) -> int:
    """``--size-for``; ``shared``: the cluster when it is of GPUs without MIG."""
    if shared is None and "," in args.cluster:
        raise InvalidInputError("--size-for", "sizes one kind of card at a time, not a mixed "
                                "cluster")
    makers: list[tuple[str, Callable[[int], tuple[SimPolicy, int]]]] = []
    if shared is not None:
        goal = parse_goal(args.size_for, size_classes(shared.card))
        jobs, horizon, source = _shared_workload(args, shared)
        model_name = shared.card.name
        limit, per_node = shared.nodes * 4, shared.per_node
        for name in _names(args, SHARED_DEFAULT_POLICIES):
            def make(nodes: int, name: str = name) -> tuple[SimPolicy, int]:
                cluster = SharedCluster(shared.card, nodes, shared.per_node)
                return _shared(name, cluster, args), cluster.capacity
            makers.append((name, make))
    else:
        mig = load_cluster(args.cluster)
        goal = parse_goal(args.size_for, size_classes(mig.main_model))
        per_node = len(mig.nodes[0].gpus)
        jobs, horizon, source = _workload(args, mig)
        model_name = mig.main_model.name
        limit = len(mig.nodes) * 4
        for name in _names(args, _default_policies(mig)):
            if name == "static:best":
                raise InvalidInputError("--size-for", "static:best is a mix found for one "
                                        "cluster; size each static:<layout> instead")
            makers.append((name, mig_sizer(name, mig, args)))
    answers = []
    with Progress(TextColumn("{task.description:<22}"), BarColumn(), TimeElapsedColumn(),
                  disable=args.no_progress, console=None, transient=False) as bar:
        for name, maker in makers:
            task = bar.add_task(name, total=limit)

            def tick(nodes: int, task: Any = task) -> None:
                bar.update(task, completed=nodes)

            answers.append(size_for(name, maker, jobs, horizon, goal, limit=limit,
                                    gpus_per_node=per_node, progress=tick))
    lines = headline(answers, goal, limit * per_node)
    details = [f"cluster: nodes of {per_node} {model_name} GPUs, every size from 1 to {limit} "
               "nodes", f"workload: {source}, made once for {args.cluster} and replayed on "
               "every size", f"goal: {goal}",
               "answer: the fewest GPUs from which the goal holds at every larger size; each "
               "policy's run below is at that size (at the largest tried when never met)"]
    report = write_report(args.report, [a.result for a in answers],
                          title="Tessera: how many GPUs does this workload need?",
                          details=details, headline=lines,
                          lead_html=(class_table_html(answers, goal),
                                     curve_html(answers, goal)))
    if args.json:
        print(json.dumps({"goal": str(goal), "targets": [
            {"class": t.scope, "metric": t.metric, "seconds": t.seconds} for t in goal.targets],
            "report": str(report), "answers": [_answer_json(a, goal) for a in answers]},
            indent=2))
    else:
        print("\n".join(lines))
        print(class_table_text(answers, goal))
        print(f"report: {report}")
    return 0


def mig_sizer(name: str, mig: ClusterSpec, args: argparse.Namespace
              ) -> Callable[[int], tuple[SimPolicy, int]]:
    """Policy ``name`` on N nodes like ``mig``'s first (same GPUs per node, same card), and
    that cluster's capacity: what ``--size-for`` replays the workload on, size by size."""
    per_node = len(mig.nodes[0].gpus)

    def make(nodes: int) -> tuple[SimPolicy, int]:
        cluster = shorthand(nodes, per_node, mig.main_model.name)
        policy = _policy(name, cluster, args)
        assert policy is not None
        return policy, cluster.capacity
    return make


def _answer_json(a: SizeAnswer, goal: Goal) -> dict[str, Any]:
    """One policy's answer: its size, what binds it, the sizes that also meet the goal, its
    run at the answer (the table's figures) and the whole curve."""
    return {"policy": a.policy, "gpus": a.gpus, "also_met_gpus": list(a.also_met),
            "not_met_gpus": list(a.not_met), "binding_gpus": a.binding_gpus,
            "binding": [{"class": m.class_name, "metric": m.target.metric,
                         "value_s": round(m.value, 1), "target_s": m.target.seconds}
                        for m in a.binding],
            **a.result.summary(),
            "curve": [{"gpus": gpus, "met": goal.met(r), "served_share": round(r.served_share, 4),
                       "p95_wait_s": round(r.p95_wait, 1), "waits_by_class": r.by_class()}
                      for gpus, r in a.curve]}


def _sources(args: argparse.Namespace) -> None:
    """Settle the workload options: ``--workload`` replaces the trace and its arrival model,
    so the options that only shape a trace are refused beside it rather than ignored."""
    if args.workload:
        given = [name for name, value in (("--trace", args.trace), ("--load", args.load))
                 if value is not None]
        if args.arrivals == "poisson":
            given.append("--arrivals poisson")
        if given:
            raise InvalidInputError("--workload", f"replays the pods' own clock, so "
                                    f"{', '.join(given)} does not apply; drop it (use "
                                    "--rate-scale for more load)")
    elif args.trace is None:
        args.trace = BUNDLED
    if args.load is None:
        args.load = DEFAULT_LOAD


def run(args: argparse.Namespace) -> int:
    _sources(args)
    reservation_flags.settings(args)  # checked before any workload is built
    shared = _shared_cluster(args.cluster)
    if reservation_flags.given(args) and shared is not None:
        raise InvalidInputError("--reservations/--reserve-after-waits", "apply to the "
                                "dynamic policy of MIG GPUs (the controller's own loop); "
                                "GPUs without MIG are simulated with the planner's defaults: "
                                "drop the flags for this cluster")
    if args.size_for:
        return _sizing(args, shared)
    mixed = _mixed_cluster(args.cluster) if shared is None else None
    cluster: ClusterSpec | SharedCluster | MixedCluster
    policies: list[tuple[str, SimPolicy | None]]
    if mixed is not None:
        cluster = mixed
        jobs, horizon, source, policies = _mixed_run(args, mixed)
    elif shared is not None:
        cluster = shared
        jobs, horizon, source = _shared_workload(args, shared)
        names = _names(args, SHARED_DEFAULT_POLICIES)
        policies = [(n, _shared(n, shared, args)) for n in names]
    else:
        mig = load_cluster(args.cluster)
        cluster = mig
        jobs, horizon, source = _workload(args, mig)
        names = _names(args, _default_policies(mig))
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
               "dynamic: the controller's own decision loop (batches of "
               f"{DEFAULT_BATCH_IDLE_S:g} s idle, {DEFAULT_BATCH_MAX_S:g} s at most, "
               f"{_held(args)}); greedy: "
               f"batch window {args.batch_window} s; reconfiguration "
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


def _held(args: argparse.Namespace) -> str:
    """The dynamic policy's reservation settings, as the run's details say them."""
    held = reservation_flags.settings(args)
    return (f"{held['reservations']} reservation(s) per plan ({RESERVING}N: N), after "
            f"{held['reserve_after_waits']:g}x the median wait")


def history_row(pod: Mapping[str, Any]) -> HistoryPod:
    """A raw Pod (as the API lists it) as a ``--workload`` row; InvalidInputError saying why a
    pod cannot be one.

    Started: the earliest container start (init containers, restarts' last state included):
    the GPU is the pod's from then. Finished: the latest finish, once every app container has
    terminated (a container waiting to restart still holds its GPU)."""
    request = request_from_resources(demand.gpu_requests(pod))
    created = demand.created_at(pod)
    if created is None:
        raise InvalidInputError("metadata.creationTimestamp", "is not set")
    status = pod.get("status") or {}
    app = list(status.get("containerStatuses") or [])
    starts: list[float] = []
    for container in [*(status.get("initContainerStatuses") or []), *app]:
        for state in (container.get("state") or {}, container.get("lastState") or {}):
            for phase in ("running", "terminated"):
                text = (state.get(phase) or {}).get("startedAt")
                if text:
                    starts.append(parse_time(text, f"{phase}.startedAt")[0])
    started = min((t for t in starts if t > 0), default=None)  # 0: a container never run
    ends = [(c.get("state") or {}).get("terminated") or {} for c in app]
    finished = None
    if app and all(ends):
        finished = max((parse_time(e["finishedAt"], "terminated.finishedAt")[0]
                        for e in ends if e.get("finishedAt")), default=None)
    if started is None and (finished is not None or demand.is_terminal(pod)):
        raise InvalidInputError("status", "ended without starting")
    return HistoryPod(demand.pod_key(pod), created, started, finished, request)


def history_rows(pods: Iterable[Mapping[str, Any]]) -> tuple[list[HistoryPod], Counter[str]]:
    """The GPU pods among ``pods`` as rows in creation order, and why the others were
    skipped (pods asking no ``nvidia.com/`` resource are not counted)."""
    rows: list[HistoryPod] = []
    skipped: Counter[str] = Counter()
    for pod in pods:
        if not demand.gpu_requests(pod):
            continue
        try:
            rows.append(history_row(pod))
        except InvalidInputError as exc:
            skipped[exc.problem] += 1
    rows.sort(key=lambda r: (r.created, r.name))
    return rows, skipped


def run_export(args: argparse.Namespace) -> int:
    """List pods only: not the full listing of ``tessera plan --kubeconfig``, which needs
    Tessera's CRDs, since the export is most useful on a cluster that does not run Tessera
    yet."""
    pods = live_cache(args.kubeconfig, args.context, kinds=("pod",)).pods.values()
    rows, skipped = history_rows(pods)
    text = write_history(rows)
    if args.output == "-":
        sys.stdout.write(text)
        where = "stdout"
    else:
        try:
            Path(args.output).write_text(text, encoding="utf-8")
        except OSError as exc:
            raise InvalidInputError("--output", f"cannot write {args.output}: "
                                    f"{exc.strerror}") from None
        where = args.output
    running = sum(1 for r in rows if r.started is not None and r.finished is None)
    waiting = sum(1 for r in rows if r.started is None)
    summary = (f"tessera: exported {len(rows)} GPU pods ({running} running, {waiting} "
               f"waiting) to {where}")
    if skipped:
        summary += "; skipped " + ", ".join(f"{n} ({why})" for why, n in sorted(skipped.items()))
    print(summary, file=sys.stderr)
    return 0
