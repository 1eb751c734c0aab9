"""Clusters of GPUs without MIG (L4, T4, A10G ...), shared whole: the policies compared.

Jobs ask ``nvidia.com/gpu.shared`` sized in milli-GPUs (the trace's share of one GPU) or
``nvidia.com/gpu`` (whole GPUs); see :func:`tessera.sim.workload.shared_request`. A GPU shared
``N`` ways gives a job ``ceil(milli * N / 1000)`` of its shares, all on one GPU, so a job never
gets less than it asked; the load unit is the milli-GPU.

- :class:`WholePolicy` (``whole``): no sharing, every pod takes whole GPUs (what a cluster
  without a sharing device plugin does).
- :class:`StaticSharePolicy` (``static:timeslice-N``, ``static:mps-N``): every GPU shared N
  ways from the start, as NVIDIA's plugin configures it; a pod asking a whole GPU never fits
  (its replicas are ``nvidia.com/gpu.shared``). Time-slicing and MPS have the same capacity
  here; what differs (isolation, memory limits) is not simulated.
- :class:`DynamicSharePolicy` (``dynamic``): Tessera's own planner, with a dynamic policy that
  shares a whole GPU N ways by MPS when pods wait for shares and takes it back whole when pods
  wait for whole GPUs (:mod:`tessera.core.planner.sharing`); a switched GPU serves after the
  MPS daemon starts and the kubelet publishes the capacity.
- :class:`SharedFluidPolicy` (``fluid:gpu``): the per-GPU limit, 1000 milli per GPU, no shares.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tessera.core import catalogue
from tessera.core.catalogue import WholeGpu
from tessera.core.errors import InvalidInputError
from tessera.core.planner import Gpu, Node, PendingPod, Policy, Snapshot, plan
from tessera.sim.policies import (
    DEFAULT_BATCH_WINDOW_S,
    DEFAULT_CAPACITY_LAG_S,
    Layout,
    Queues,
    Schedule,
    Shape,
    SimPolicy,
    in_arrival_order,
)
from tessera.sim.workload import MILLI, Job

__all__ = [
    "DEFAULT_SHARES",
    "DynamicSharePolicy",
    "SharedCluster",
    "SharedFluidPolicy",
    "StaticSharePolicy",
    "WholePolicy",
    "shared_policy",
]

SHARED = catalogue.MPS_SHARED_RESOURCE
WHOLE = catalogue.WHOLE_GPU_RESOURCE
DEFAULT_SHARES = 4
"""Shares per GPU of the dynamic policy when the run does not say (``dynamic-N`` does)."""
MPS_START_S = 1.0
"""Starting an MPS control daemon on a GPU (the agent's step) before its shares exist."""


@dataclass(frozen=True)
class SharedCluster:
    """``nodes`` nodes of ``per_node`` cards of one model without MIG."""

    card: WholeGpu
    nodes: int
    per_node: int

    @property
    def gpu_count(self) -> int:
        return self.nodes * self.per_node

    @property
    def capacity(self) -> int:
        """Milli-GPUs in total: the denominator of load and utilisation."""
        return self.gpu_count * MILLI

    def describe(self) -> str:
        return (f"{self.nodes} nodes, {self.gpu_count} GPUs ({self.gpu_count} x "
                f"{self.card.name}, no MIG: shared whole)")


def _wants(job: Job) -> tuple[str, int]:
    (resource, count), = job.requests
    return resource, count


def _shares(milli: int, ways: int) -> int:
    return max(1, math.ceil(milli * ways / MILLI))


class _Cards(SimPolicy):
    """Cards that are whole or shared ``ways`` ways; jobs hold shares of one GPU or whole GPUs
    of one node."""

    def __init__(self, cluster: SharedCluster, ways: int, shared: bool) -> None:
        super().__init__()
        self.cluster = cluster
        self.ways = ways
        count = cluster.gpu_count
        self.shared = [shared] * count
        self.free = [ways if shared else 0] * count
        self.whole_free = [not shared] * count
        self.ready_at = [0.0] * count
        self.held: dict[str, tuple[bool, list[tuple[int, int]]]] = {}

    def _node_of(self, gpu: int) -> int:
        return gpu // self.cluster.per_node

    def take_shares(self, job: Job, items: Sequence[tuple[int, int]]) -> None:
        """``items``: (GPU, shares) pairs (the planner may spread a pod over a node's GPUs)."""
        for gpu, shares in items:
            self.free[gpu] -= shares
        self.held[job.name] = (True, list(items))

    def take_whole(self, job: Job, gpus: Sequence[int]) -> None:
        for gpu in gpus:
            self.whole_free[gpu] = False
        self.held[job.name] = (False, [(g, 1) for g in gpus])

    def release(self, job: Job) -> None:
        shared, items = self.held.pop(job.name, (True, []))
        for gpu, count in items:
            if shared:
                self.free[gpu] += count
            else:
                self.whole_free[gpu] = True

    def best_shared(self, shares: int) -> int | None:
        """The shared GPU with the fewest free shares that still hold ``shares``."""
        fitting = [g for g in range(len(self.free)) if self.shared[g] and self.free[g] >= shares]
        return min(fitting, key=lambda g: (self.free[g], g)) if fitting else None

    def whole_on_one_node(self, count: int) -> list[int] | None:
        per = self.cluster.per_node
        for node in range(self.cluster.nodes):
            free = [g for g in range(node * per, node * per + per) if self.whole_free[g]]
            if len(free) >= count:
                return free[:count]
        return None

    def layout(self, gpu: int) -> Layout | None:
        """For the report's strips: a whole GPU is one band; a shared one a band per share
        (the held ones first), drawn on the report's 8 rows."""
        if gpu >= len(self.shared):
            return None
        if not self.shared[gpu]:
            return (("whole", 0, 8, not self.whole_free[gpu]),)
        shown = min(self.ways, 8)
        size = 8 // shown
        held = round((self.ways - self.free[gpu]) * shown / self.ways)
        return tuple(("share", i * size, size, i < held) for i in range(shown))

    def unusable_free(self, shapes: Sequence[Shape]) -> int:
        """Free milli no waiting pod can use: shares of a GPU fewer than the smallest waiting
        share request needs (whole free GPUs can always serve)."""
        needs = [_shares(count, self.ways) for shape in shapes for resource, count in shape
                 if resource == SHARED]
        if not needs:
            return 0
        least = min(needs)
        per_share = MILLI // self.ways
        return sum(f * per_share for g, f in enumerate(self.free)
                   if self.shared[g] and 0 < f < least)


class WholePolicy(_Cards):
    """No sharing: a pod asking a share takes a whole GPU."""

    def __init__(self, cluster: SharedCluster) -> None:
        super().__init__(cluster, 1, shared=False)
        self.name = "whole"

    def schedule(self, now: float, queues: Queues) -> Schedule:
        starts: list[tuple[Job, float]] = []

        def attempt(job: Job) -> bool:
            resource, count = _wants(job)
            gpus = self.whole_on_one_node(1 if resource == SHARED else count)
            if gpus is None:
                return False
            self.take_whole(job, gpus)
            starts.append((job, now))
            return True

        in_arrival_order(queues, attempt)
        return Schedule(tuple(starts))


class StaticSharePolicy(_Cards):
    """Every GPU shared ``ways`` ways from the start; whole-GPU pods never fit."""

    def __init__(self, cluster: SharedCluster, name: str, ways: int) -> None:
        super().__init__(cluster, ways, shared=True)
        self.name = name

    def schedule(self, now: float, queues: Queues) -> Schedule:
        starts: list[tuple[Job, float]] = []

        def attempt(job: Job) -> bool:
            resource, count = _wants(job)
            if resource != SHARED:
                return False
            shares = _shares(count, self.ways)
            gpu = self.best_shared(shares)
            if gpu is None:
                return False
            self.take_shares(job, [(gpu, shares)])
            starts.append((job, now))
            return True

        in_arrival_order(queues, attempt)
        return Schedule(tuple(starts))


class DynamicSharePolicy(_Cards):
    """Tessera's planner with a dynamic policy sharing whole GPUs ``ways`` ways by MPS."""

    def __init__(self, cluster: SharedCluster, *, ways: int = DEFAULT_SHARES,
                 batch_window: float = DEFAULT_BATCH_WINDOW_S,
                 capacity_lag: float = DEFAULT_CAPACITY_LAG_S) -> None:
        super().__init__(cluster, ways, shared=False)
        self.name = f"dynamic-{ways}" if ways != DEFAULT_SHARES else "dynamic"
        self.batch_window = batch_window
        self.capacity_lag = capacity_lag
        self.policy = Policy(name="sim", mode="dynamic", share="mps", share_count=ways)

    def _snapshot(self) -> Snapshot:
        per = self.cluster.per_node
        nodes = []
        for n in range(self.cluster.nodes):
            gpus = []
            for i in range(per):
                g = n * per + i
                if self.shared[g]:
                    gpus.append(Gpu(index=i, model=self.cluster.card.name, mode="mps",
                                    shares=self.ways, shares_in_use=self.ways - self.free[g]))
                else:
                    gpus.append(Gpu(index=i, model=self.cluster.card.name, mode="none",
                                    in_use=not self.whole_free[g]))
            nodes.append(Node(name=f"node-{n:03d}", gpus=tuple(gpus), policy=self.policy))
        return Snapshot(nodes=tuple(nodes))

    def schedule(self, now: float, queues: Queues) -> Schedule:
        jobs = {job.name: job for queue in queues.values() for job in queue.values()}
        if not jobs:
            return Schedule(())
        pods = []
        for job in jobs.values():
            resource, count = _wants(job)
            units = _shares(count, self.ways) if resource == SHARED else count
            pods.append(PendingPod("sim", job.name, ((resource, units),),
                                   creation_time=job.arrival))
        self.planner_calls += 1
        result = plan(self._snapshot(), pods)
        per = self.cluster.per_node
        for target in result.gpus:
            g = int(target.node.rsplit("-", 1)[1]) * per + target.index
            self.repartitions += 1
            self.shared[g] = target.mode == "mps"
            self.free[g] = self.ways if self.shared[g] else 0
            self.whole_free[g] = not self.shared[g]
            self.ready_at[g] = now + (MPS_START_S if self.shared[g] else 0.0) + (
                self.capacity_lag)
            if self.shared[g]:
                self.created += 1
            else:
                self.destroyed += 1
        starts: list[tuple[Job, float]] = []
        for placement in result.placements:
            job = jobs[placement.pod.split("/", 1)[1]]
            node = int(placement.node.rsplit("-", 1)[1])
            gpus = [node * per + s.gpu for s in placement.slices]
            ready = max([now, *(self.ready_at[g] for g in gpus)])
            resource, _ = _wants(job)
            if resource == SHARED:
                self.take_shares(job, [(node * per + s.gpu, s.count) for s in placement.slices])
            else:
                self.take_whole(job, gpus)
            starts.append((job, ready))
        return Schedule(tuple(starts))


class SharedFluidPolicy(SimPolicy):
    """The per-GPU limit: 1000 milli per GPU, a job's milli on one GPU (best fit)."""

    name = "fluid:gpu"

    def __init__(self, cluster: SharedCluster) -> None:
        super().__init__()
        self.free = [MILLI] * cluster.gpu_count
        self.held: dict[str, list[tuple[int, int]]] = {}

    def schedule(self, now: float, queues: Queues) -> Schedule:
        starts: list[tuple[Job, float]] = []

        def attempt(job: Job) -> bool:
            resource, count = _wants(job)
            if resource == SHARED:
                fitting = [g for g, f in enumerate(self.free) if f >= count]
                if not fitting:
                    return False
                gpu = min(fitting, key=lambda g: (self.free[g], g))
                self.free[gpu] -= count
                self.held[job.name] = [(gpu, count)]
            else:
                whole = [g for g, f in enumerate(self.free) if f == MILLI][:count]
                if len(whole) < count:
                    return False
                for g in whole:
                    self.free[g] = 0
                self.held[job.name] = [(g, MILLI) for g in whole]
            starts.append((job, now))
            return True

        in_arrival_order(queues, attempt)
        return Schedule(tuple(starts))

    def release(self, job: Job) -> None:
        for gpu, milli in self.held.pop(job.name, ()):
            self.free[gpu] += milli

    def unusable_free(self, shapes: Sequence[Shape]) -> int:
        needs = [count for shape in shapes for resource, count in shape if resource == SHARED]
        if not needs:
            return 0
        least = min(needs)
        return sum(f for f in self.free if 0 < f < least)


def shared_policy(name: str, cluster: SharedCluster, *, batch_window: float,
                  capacity_lag: float) -> SimPolicy:
    """A policy by its ``--policies`` name, for a cluster of GPUs without MIG."""
    if name == "whole":
        return WholePolicy(cluster)
    if name == "fluid:gpu":
        return SharedFluidPolicy(cluster)
    if name == "dynamic" or name.startswith("dynamic-"):
        ways = DEFAULT_SHARES if name == "dynamic" else _ways(name, name.split("-", 1)[1])
        return DynamicSharePolicy(cluster, ways=ways, batch_window=batch_window,
                                  capacity_lag=capacity_lag)
    for kind in ("timeslice", "mps"):
        prefix = f"static:{kind}-"
        if name.startswith(prefix):
            return StaticSharePolicy(cluster, name, _ways(name, name[len(prefix):]))
    raise InvalidInputError("--policies", f"unknown policy {name!r} for GPUs without MIG",
                            ("dynamic", "dynamic-N", "static:timeslice-N", "static:mps-N",
                             "whole", "fluid:gpu"))


def _ways(name: str, text: str) -> int:
    if not text.isdigit() or not 2 <= int(text) <= catalogue.MPS_MAX_CLIENTS:
        raise InvalidInputError("--policies", f"{name!r}: N must be 2..{catalogue.MPS_MAX_CLIENTS}")
    return int(text)
