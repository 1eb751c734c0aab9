"""Mixed clusters: MIG cards and cards without MIG in one run (``4x8xA100-SXM4-80GB,4x8xL4``).

A pod spec asks for one kind of GPU resource, so a real mixed cluster runs two pools: pods
asking MIG slices land on the MIG cards, pods asking shares or whole cards on the others.
The simulator sends each trace pod to one pool, drawn (seeded) in proportion to the pools'
GPUs, maps it as that pool maps requests (MIG profiles; shares in milli-GPUs), and runs a pair
of policies side by side, one per pool (``dynamic``: Tessera's planner on both; ``A+B``: policy
A on the MIG pool, B on the other). Load and served compute are in milli-GPUs across both pools
(a MIG compute slice is ``1000 / 7`` of an A100's); the event loop is the one every run uses.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tessera.core.errors import InvalidInputError
from tessera.sim.cluster import ClusterSpec
from tessera.sim.policies import Layout, Queues, Schedule, Shape, SimPolicy
from tessera.sim.shared import SharedCluster
from tessera.sim.workload import (
    DEFAULT_MAX_DURATION_S,
    MILLI,
    Job,
    TraceRow,
    mig_mapper,
    shared_request,
)

__all__ = ["MixedCluster", "MixedPolicy", "mixed_jobs"]


@dataclass(frozen=True)
class MixedCluster:
    mig: ClusterSpec
    shared: SharedCluster

    @property
    def mig_gpus(self) -> int:
        return len(self.mig.gpus)

    @property
    def capacity(self) -> int:
        """Milli-GPUs over both pools."""
        return (self.mig_gpus + self.shared.gpu_count) * MILLI

    @property
    def milli_per_slice(self) -> float:
        return MILLI / self.mig.main_model.compute_slices

    def describe(self) -> str:
        return (f"{self.mig.describe()} + {self.shared.describe()}; each pod goes to one pool, "
                "in proportion to their GPUs")


def mixed_jobs(rows: Sequence[TraceRow], cluster: MixedCluster, *, load: float, seed: int,
               max_duration: float = DEFAULT_MAX_DURATION_S
               ) -> tuple[tuple[Job, ...], float, frozenset[str]]:
    """Poisson arrivals in trace order offering ``load`` of both pools; returns the jobs, the
    window and the names of the jobs that go to the MIG pool."""
    if load <= 0:
        raise InvalidInputError("--load", "load must be positive")
    draw = random.Random(seed * 7919 + 1)
    share_mig = cluster.mig_gpus / (cluster.mig_gpus + cluster.shared.gpu_count)
    to_mig = [draw.random() < share_mig for _ in rows]
    mapper = mig_mapper(cluster.mig.main_model)
    durations = [min(r.duration, max_duration) for r in rows]
    mapped = [mapper(r) if mig else shared_request(r) for r, mig in zip(rows, to_mig,
                                                                      strict=True)]
    demand = sum((compute * cluster.milli_per_slice if mig else compute) * d
                 for (_, compute), mig, d in zip(mapped, to_mig, durations, strict=True))
    window = demand / (load * cluster.capacity)
    rng = random.Random(seed)
    gaps = [rng.expovariate(1.0) for _ in range(len(rows) + 1)]
    scale = window / sum(gaps)
    jobs, t = [], 0.0
    for i, (row, (requests, compute), lasting) in enumerate(zip(rows, mapped, durations,
                                                                 strict=True)):
        t += gaps[i] * scale
        jobs.append(Job(i, row.name, t, lasting, requests, compute))
    names = frozenset(j.name for j, mig in zip(jobs, to_mig, strict=True) if mig)
    return tuple(jobs), window, names


class MixedPolicy(SimPolicy):
    """One policy per pool, run side by side; a job is the MIG pool's or the other's."""

    def __init__(self, name: str, mig: SimPolicy, shared: SimPolicy,
                 mig_jobs: frozenset[str], milli_per_slice: float) -> None:
        super().__init__()
        self.name = name
        self.mig = mig
        self.shared = shared
        self.mig_jobs = mig_jobs
        self.milli_per_slice = milli_per_slice
        self.batch_window = max(mig.batch_window, shared.batch_window)

    def _split(self, queues: Queues) -> tuple[Queues, Queues]:
        mig: dict[Shape, dict[str, Job]] = {}
        shared: dict[Shape, dict[str, Job]] = {}
        for shape, queue in queues.items():
            for name, job in queue.items():
                side = mig if name in self.mig_jobs else shared
                side.setdefault(shape, {})[name] = job
        return mig, shared

    def schedule(self, now: float, queues: Queues) -> Schedule:
        mig, shared = self._split(queues)
        first = self.mig.schedule(now, mig)
        second = self.shared.schedule(now, shared)
        self._count()
        wakes = [t for t in (first.wake_at, second.wake_at) if t is not None]
        return Schedule((*first.starts, *second.starts), first.more or second.more,
                        min(wakes) if wakes else None)

    def arrive(self, job: Job) -> None:
        (self.mig if job.name in self.mig_jobs else self.shared).arrive(job)

    def _count(self) -> None:
        for field in ("repartitions", "created", "destroyed", "failed_creates",
                      "planner_calls"):
            setattr(self, field, getattr(self.mig, field) + getattr(self.shared, field))

    def release(self, job: Job) -> None:
        (self.mig if job.name in self.mig_jobs else self.shared).release(job)

    def weight(self, job: Job) -> float:
        return job.compute * self.milli_per_slice if job.name in self.mig_jobs else job.compute

    def unusable_free(self, shapes: Sequence[Shape]) -> int:
        mig = [s for s in shapes if any(r.startswith("nvidia.com/mig-") for r, _ in s)]
        shared = [s for s in shapes if s not in mig]
        return round(self.mig.unusable_free(mig) * self.milli_per_slice
                     + self.shared.unusable_free(shared))

    def layout(self, gpu: int) -> Layout | None:
        return self.mig.layout(gpu)


def mixed_policy(name: str, cluster: MixedCluster, mig_jobs: frozenset[str],
                 make_mig: Callable[[str], SimPolicy | None],
                 make_shared: Callable[[str], SimPolicy]) -> MixedPolicy:
    """``dynamic``, ``fluid:gpu`` (the same on both pools) or ``MIG_POLICY+SHARED_POLICY``."""
    first, sep, second = name.partition("+")
    if not sep:
        if name not in ("dynamic", "fluid:gpu"):
            raise InvalidInputError(
                "--policies", f"{name!r}: on a mixed cluster give one policy per pool, "
                "MIG_POLICY+SHARED_POLICY (e.g. static:all-balanced+static:timeslice-4), or "
                "dynamic / fluid:gpu for both")
        second = name
    mig = make_mig(first)
    if mig is None:
        raise InvalidInputError("--policies", f"{first!r} (static:best) is not simulated on a "
                                "mixed cluster")
    return MixedPolicy(name, mig, make_shared(second), mig_jobs, cluster.milli_per_slice)
