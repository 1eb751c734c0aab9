"""The best static mix in hindsight: how many nodes get each of NVIDIA's standard layouts.

The strongest static baseline an admin could ever pick, knowing the whole workload. mig-parted
configures a node at a time (one ``nvidia.com/mig.config`` label per node), so a mix is a
count of nodes per standard layout, and every mix is scored: C(N+5, 5) mixes for N nodes
(435,897 for 32 nodes).

Scoring each mix by a full simulation would take days, but static layouts decompose: a pod
takes only a free slice of its exact profile, so pods of different profiles never compete,
and a mix's served compute is the sum over profiles of what a pool of that many slices
serves to that profile's pods alone (:func:`pool_served`, a first-come first-served k-server
queue, exact for one-slice pods). Pools are simulated once per distinct size. Multi-slice
pods (whole-GPU jobs spanning several GPUs of a node) break the independence slightly
(they need their slices on one node), so the best few mixes by this score are re-run
through the real event loop and the best of those by served compute is kept.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from tessera.core.layout import Slice
from tessera.core.planner.synthetic import standard_layouts
from tessera.sim.cluster import ClusterSpec
from tessera.sim.engine import RunResult, simulate
from tessera.sim.policies import StaticPolicy
from tessera.sim.workload import Job

__all__ = ["STANDARD_LAYOUTS", "BestMix", "best_static_mix", "compositions", "pool_served"]

STANDARD_LAYOUTS = ("all-1g", "all-2g", "all-3g", "all-4g", "all-7g", "all-balanced")
"""NVIDIA's standard A100/H100 mig-parted configs (``all-1g.10gb`` ... ``all-balanced``)."""


@dataclass(frozen=True)
class BestMix:
    nodes: tuple[tuple[str, int], ...]
    """(layout, nodes) for every layout used."""
    score: float
    """Served compute by the decomposition (compute slices x seconds)."""
    result: RunResult
    """The event loop's run of this mix."""
    mixes_scored: int

    def describe(self) -> str:
        return " + ".join(f"{n}x{name}" for name, n in self.nodes)


def pool_served(jobs: Sequence[Job], servers: int, horizon: float) -> float:
    """Compute served within ``horizon`` by ``servers`` identical slices, first come first
    served; a job of ``m`` slices starts when ``m`` are free (and blocks those behind it)."""
    if servers <= 0:
        return 0.0
    free = [0.0] * servers
    served = 0.0
    for job in jobs:
        units = job.units
        if units > servers:
            continue
        taken = [heapq.heappop(free) for _ in range(units)]
        start = max(job.arrival, taken[-1])
        end = start + job.duration
        if start < horizon:
            served += job.compute * (min(end, horizon) - start)
        for _ in range(units):
            heapq.heappush(free, end)
    return served


def compositions(total: int, parts: int) -> Iterator[tuple[int, ...]]:
    """Every way to write ``total`` as ``parts`` ordered non-negative counts."""
    if parts == 1:
        yield (total,)
        return
    for first in range(total + 1):
        for rest in compositions(total - first, parts - 1):
            yield (first, *rest)


def best_static_mix(cluster: ClusterSpec, jobs: Sequence[Job], horizon: float, *,
                    layouts: Sequence[str] = STANDARD_LAYOUTS, rerun: int = 3) -> BestMix:
    """Score every per-node mix of ``layouts`` and return the best after re-running the top
    ``rerun`` through the event loop. Nodes must be alike (same model and GPU count)."""
    model = cluster.main_model
    per_node = len(cluster.nodes[0].gpus)
    if any(len(n.gpus) != per_node or any(g.model != model for g in n.gpus)
           for n in cluster.nodes):
        raise ValueError("best_static_mix needs identical nodes")
    known = standard_layouts(model.name)
    names = [name for name in layouts if name in known]
    slices_per_node = [Counter({p: c * per_node for p, c in
                                Counter(s.profile for s in known[name]).items()})
                       for name in names]
    by_profile: dict[str, list[Job]] = {}
    for job in jobs:
        if job.arrival <= horizon and len(job.requests) == 1:
            by_profile.setdefault(job.requests[0][0], []).append(job)
    memo: dict[tuple[str, int], float] = {}

    def served(profile: str, servers: int) -> float:
        key = (profile, servers)
        if key not in memo:
            memo[key] = pool_served(by_profile.get(profile, ()), servers, horizon)
        return memo[key]

    profiles = sorted(by_profile)
    scored: list[tuple[float, tuple[int, ...]]] = []
    count = 0
    for mix in compositions(len(cluster.nodes), len(names)):
        count += 1
        score = sum(served(p, sum(n * slices_per_node[i][p] for i, n in enumerate(mix)))
                    for p in profiles)
        scored.append((score, mix))
    scored.sort(key=lambda item: (-item[0], item[1]))
    best: tuple[float, float, tuple[int, ...], RunResult] | None = None
    for score, mix in scored[:max(1, rerun)]:
        per_gpu: list[Sequence[Slice]] = []
        for i, n in enumerate(mix):
            per_gpu.extend([known[names[i]]] * (n * per_node))
        label = "static:best(" + "+".join(f"{n}x{names[i]}" for i, n in enumerate(mix) if n) + ")"
        result = simulate(StaticPolicy(cluster, label, per_gpu), jobs,
                          capacity=cluster.capacity, horizon=horizon, track_gpus=0)
        if best is None or result.served > best[1]:
            best = (score, result.served, mix, result)
    assert best is not None
    score, _, mix, result = best
    return BestMix(tuple((names[i], n) for i, n in enumerate(mix) if n), score, result, count)
