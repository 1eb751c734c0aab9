"""The policies the simulator compares, all behind one interface so one event loop runs them.

- ``dynamic`` (:class:`tessera.sim.dynamic.DynamicPolicy`): Tessera's controller itself,
  driven over the simulated cluster; it shares this module's MIG state.
- :class:`StaticPolicy`: every GPU keeps a fixed layout; pods take free slices of their exact
  profile, first fit in node order (what kube-scheduler does with mig-parted layouts).
- :class:`GreedyPolicy`: first fit without placements, like nos: a pod first takes an
  existing free slice; otherwise the first GPU whose *profile counts* still admit the profile
  is repartitioned, and the new slice goes to the lowest start NVML's own creation order
  finds free around the slices kept. Counts that fit but placements that do not are a failed
  attempt (nos's weak spot: it reasons about counts, NVML about placements).
- :class:`FluidGpuPolicy` and :class:`FluidClusterPolicy`: physical limits, not real
  policies. Per GPU: each GPU offers its compute slices and a unit takes its compute slices on
  one GPU, with no placement rules (best fit); per cluster: all compute slices pooled.

A policy sees the pending pods grouped by request shape, oldest first within a shape, and
answers which pods start and when; the event loop owns time.
"""

from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cache

from tessera.core import catalogue
from tessera.core.catalogue import GpuModel
from tessera.core.errors import InvalidInputError
from tessera.core.layout import Slice, count_profiles, enumerate_layouts
from tessera.core.planner.geometry import Geometry, geometry_of
from tessera.core.planner.synthetic import standard_layouts
from tessera.sim.cluster import ClusterSpec
from tessera.sim.workload import Job

__all__ = [
    "DEFAULT_BATCH_WINDOW_S",
    "DEFAULT_CAPACITY_LAG_S",
    "DEFAULT_RECONFIG_LATENCY_S",
    "FluidClusterPolicy",
    "FluidGpuPolicy",
    "GreedyPolicy",
    "Layout",
    "Queues",
    "Schedule",
    "Shape",
    "SimPolicy",
    "StaticPolicy",
    "in_arrival_order",
]

DEFAULT_BATCH_WINDOW_S = 5.0
"""How long the controller collects pending pods before it plans."""
DEFAULT_RECONFIG_LATENCY_S = 2.0
"""Seconds per GPU-instance create or destroy (NVML takes a second or two per operation)."""
DEFAULT_CAPACITY_LAG_S = 10.0
"""The kubelet publishes new device-plugin capacity at its next node-status sync, up to 10 s
later at the default ``nodeStatusUpdateFrequency``; the worst case is the default here."""

Shape = tuple[tuple[str, int], ...]
Queues = Mapping[Shape, Mapping[str, Job]]
Layout = tuple[tuple[str, int, int, bool], ...]
"""A GPU's slices as ``(profile, start, memory slices, held)``, for the report's pictures."""


@dataclass(frozen=True)
class Schedule:
    """Pods that start (with the time their last slice is usable) and whether to plan again
    at once because a batch was cut short."""

    starts: tuple[tuple[Job, float], ...]
    more: bool = False
    wake_at: float | None = None
    """When the policy wants another round although nothing arrives or leaves (the
    controller's batch closing, a plan reported, capacity advertised)."""


def in_arrival_order(queues: Queues, try_place: Callable[[Job], bool]) -> list[Job]:
    """Offer pending pods oldest first across shapes; a shape is dropped at its first failure.

    Within one scheduling round capacity only shrinks, so once a pod of some shape fails every
    later pod of that shape would too: this keeps a round at O(placed + shapes) even when
    thousands of pods wait.
    """
    iters: dict[int, Iterator[Job]] = {}
    heap: list[tuple[float, int, int, Job]] = []
    for k, queue in enumerate(queues.values()):
        it = iter(queue.values())
        first = next(it, None)
        if first is not None:
            iters[k] = it
            heap.append((first.arrival, first.seq, k, first))
    heapq.heapify(heap)
    placed = []
    while heap:
        _, _, k, job = heapq.heappop(heap)
        if not try_place(job):
            continue
        placed.append(job)
        nxt = next(iters[k], None)
        if nxt is not None:
            heapq.heappush(heap, (nxt.arrival, nxt.seq, k, nxt))
    return placed


class SimPolicy(ABC):
    """What the event loop needs from a policy."""

    name: str
    batch_window: float = 0.0
    """Delay between a change (arrival, departure) and the scheduling round it triggers."""

    def __init__(self) -> None:
        self.repartitions = 0
        self.created = 0
        self.destroyed = 0
        self.failed_creates = 0
        self.planner_calls = 0

    @abstractmethod
    def schedule(self, now: float, queues: Queues) -> Schedule: ...

    @abstractmethod
    def release(self, job: Job) -> None: ...

    def arrive(self, job: Job) -> None:  # noqa: B027 - a hook, empty by default
        """``job`` arrived (before the round that first offers it); most policies only look
        at the queues a round offers."""

    @abstractmethod
    def unusable_free(self, shapes: Sequence[Shape]) -> int:
        """Free compute slices that no pod of ``shapes`` could use now (fragmentation)."""

    def layout(self, gpu: int) -> Layout | None:
        """GPU ``gpu``'s slices now, or None for a policy without layouts."""
        return None

    def weight(self, job: Job) -> float:
        """A running job's share of the capacity, in the run's unit (its compute, except where
        a mixed cluster converts units)."""
        return job.compute


# --- MIG state shared by the dynamic, static and greedy policies -----------------------------


class _Slice:
    __slots__ = ("holder", "profile", "ready_at", "start")

    def __init__(self, profile: str, start: int, ready_at: float = 0.0) -> None:
        self.profile = profile
        self.start = start
        self.holder: str | None = None
        self.ready_at = ready_at


class _Gpu:
    __slots__ = ("busy_until", "geometry", "gid", "model", "node", "slices", "version")

    def __init__(self, gid: int, node: int, model: GpuModel, slices: Sequence[Slice]) -> None:
        self.gid = gid
        self.node = node
        self.model = model
        self.geometry: Geometry = geometry_of(model.name)
        self.slices: dict[int, _Slice] = {s.start: _Slice(s.profile, s.start) for s in slices}
        self.busy_until = 0.0
        self.version = 0
        """Bumped on every change, so per-GPU decisions can be memoised between rounds."""

    def held_mask(self) -> int:
        g = self.geometry
        return sum(1 << g.index[Slice(s.profile, s.start)]
                   for s in self.slices.values() if s.holder is not None)

    def free_compute(self) -> int:
        held = sum(self.model.profile(s.profile).compute_slices
                   for s in self.slices.values() if s.holder is not None)
        return self.model.compute_slices - held


class _MigPolicy(SimPolicy):
    """Slices per GPU, who holds them, and first fit over existing free slices."""

    def __init__(self, cluster: ClusterSpec,
                 layouts: Sequence[Sequence[Slice]] | None = None) -> None:
        super().__init__()
        self.gpus: list[_Gpu] = []
        self.node_gpus: list[list[_Gpu]] = []
        specs = cluster.gpus
        for n, node in enumerate(cluster.nodes):
            mine = []
            for spec in node.gpus:
                gid = len(self.gpus)
                chosen = spec.slices if layouts is None else layouts[gid]
                gpu = _Gpu(gid, n, spec.model, chosen)
                self.gpus.append(gpu)
                mine.append(gpu)
            self.node_gpus.append(mine)
        assert len(self.gpus) == len(specs)
        self.node_free: list[Counter[str]] = [Counter() for _ in self.node_gpus]
        self.node_version = [0] * len(self.node_gpus)
        self.free: Counter[str] = Counter()
        for gpu in self.gpus:
            for s in gpu.slices.values():
                self._count(gpu, s.profile, 1)
        self.held: dict[str, list[tuple[_Gpu, int]]] = {}

    def _count(self, gpu: _Gpu, profile: str, delta: int) -> None:
        gpu.version += 1
        self.node_version[gpu.node] += 1
        self.node_free[gpu.node][profile] += delta
        self.free[profile] += delta

    def preoccupy(self, gpu: int, start: int, holder: str = "background") -> None:
        """Mark an existing slice as held by something outside the workload (one-shot cases)."""
        item = self.gpus[gpu].slices[start]
        item.holder = holder
        self._count(self.gpus[gpu], item.profile, -1)

    def _take(self, job: Job, gpu: _Gpu, start: int) -> float:
        item = gpu.slices[start]
        assert item.holder is None, (job.name, gpu.gid, start)
        item.holder = job.name
        self._count(gpu, item.profile, -1)
        self.held.setdefault(job.name, []).append((gpu, start))
        return item.ready_at

    def release(self, job: Job) -> None:
        for gpu, start in self.held.pop(job.name, ()):
            item = gpu.slices[start]
            item.holder = None
            self._count(gpu, item.profile, 1)

    def _create(self, gpu: _Gpu, profile: str, start: int, ready_at: float) -> None:
        gpu.slices[start] = _Slice(profile, start, ready_at)
        self._count(gpu, profile, 1)
        self.created += 1

    def _destroy(self, gpu: _Gpu, start: int) -> None:
        item = gpu.slices.pop(start)
        assert item.holder is None, "a held slice is never destroyed"
        self._count(gpu, item.profile, -1)
        self.destroyed += 1

    def _existing_fit(self, job: Job, now: float) -> float | None:
        """Place ``job`` on existing free slices of one node (first fit); its start time."""
        if any(self.free[p] < n for p, n in job.requests):
            return None
        for n, counts in enumerate(self.node_free):
            if all(counts[p] >= k for p, k in job.requests):
                return max(now, self._take_first(job, n))
        return None

    def _take_first(self, job: Job, node: int, usable_at: float | None = None) -> float:
        """Give ``job`` the first free slices of its profiles on ``node`` (GPU order, then
        start), as a kubelet hands out devices; with ``usable_at``, only slices ready by then.
        Returns when its last slice is ready; the caller has checked the node has them."""
        ready = 0.0
        for profile, count in job.requests:
            left = count
            for gpu in self.node_gpus[node]:
                for start in sorted(gpu.slices):
                    item = gpu.slices[start]
                    if (left and item.holder is None and item.profile == profile
                            and (usable_at is None or item.ready_at <= usable_at)):
                        ready = max(ready, self._take(job, gpu, start))
                        left -= 1
            if left:
                raise AssertionError(f"{job.name}: node {node} has {left} free {profile} "
                                     "fewer than it asks")
        return ready

    def layout(self, gpu: int) -> Layout | None:
        if gpu >= len(self.gpus):
            return None
        model = self.gpus[gpu].model
        return tuple(sorted((s.profile, s.start, model.profile(s.profile).memory_slices,
                             s.holder is not None) for s in self.gpus[gpu].slices.values()))

    def _wanted(self, shapes: Sequence[Shape]) -> set[str]:
        return {p for shape in shapes for p, _ in shape}

    def _reconfigure(self, gpu: _Gpu, now: float, ops: int, latency: float) -> float:
        """Serialise NVML operations per GPU; the time the last one completes."""
        begin = max(now, gpu.busy_until)
        gpu.busy_until = begin + ops * latency
        return gpu.busy_until


class StaticPolicy(_MigPolicy):
    """Fixed layouts; ``name`` is ``static:<layout>`` or the mix's description."""

    def __init__(self, cluster: ClusterSpec, name: str,
                 layouts: Sequence[Sequence[Slice]]) -> None:
        super().__init__(cluster, layouts)
        self.name = name

    @classmethod
    def uniform(cls, cluster: ClusterSpec, layout_name: str) -> StaticPolicy:
        """Every GPU gets NVIDIA's standard layout ``layout_name`` (``all-1g`` ...)."""
        layouts = []
        for spec in cluster.gpus:
            known = standard_layouts(spec.model.name)
            if layout_name not in known:
                raise InvalidInputError("--policies", f"no standard layout {layout_name!r} for "
                                        f"{spec.model.name}", sorted(known))
            layouts.append(known[layout_name])
        return cls(cluster, f"static:{layout_name}", layouts)

    def schedule(self, now: float, queues: Queues) -> Schedule:
        starts: list[tuple[Job, float]] = []

        def attempt(job: Job) -> bool:
            ready = self._existing_fit(job, now)
            if ready is not None:
                starts.append((job, ready))
            return ready is not None

        in_arrival_order(queues, attempt)
        return Schedule(tuple(starts))

    def unusable_free(self, shapes: Sequence[Shape]) -> int:
        if not shapes:
            return 0
        wanted = self._wanted(shapes)
        usable = sum(gpu.model.profile(s.profile).compute_slices for gpu in self.gpus
                     for s in gpu.slices.values() if s.holder is None and s.profile in wanted)
        return sum(g.free_compute() for g in self.gpus) - usable


@cache
def _allowed_counts(model_name: str) -> frozenset[tuple[tuple[str, int], ...]]:
    """The profile counts of every valid layout (nos's "allowed geometries"), found once."""
    model = catalogue.model(model_name)
    return frozenset(_key(count_profiles(found)) for found in enumerate_layouts(model))


def _counts_fit(model: GpuModel, counts: tuple[tuple[str, int], ...]) -> bool:
    """Whether some valid layout has exactly these profile counts."""
    return counts in _allowed_counts(model.name)


def _key(counts: Counter[str]) -> tuple[tuple[str, int], ...]:
    return tuple(sorted((p, n) for p, n in counts.items() if n))


class GreedyPolicy(_MigPolicy):
    """First fit without placements, nos-style (see the module docstring)."""

    name = "greedy"

    def __init__(self, cluster: ClusterSpec, *, batch_window: float = DEFAULT_BATCH_WINDOW_S,
                 reconfig_latency: float = DEFAULT_RECONFIG_LATENCY_S,
                 capacity_lag: float = DEFAULT_CAPACITY_LAG_S) -> None:
        super().__init__(cluster)
        self.batch_window = batch_window
        self.latency = reconfig_latency
        self.lag = capacity_lag
        self._plans: dict[tuple[int, str], tuple[int, tuple[list[int], int] | None]] = {}
        self._node_fails: dict[tuple[int, Shape], int] = {}
        """Node versions at which a shape was found not to fit: skipped until the node changes."""

    def _greedy_plan(self, gpu: _Gpu, profile: str) -> tuple[list[int], int] | None:
        """:meth:`_plan_once`, memoised until the GPU changes."""
        found = self._plans.get((gpu.gid, profile))
        if found is not None and found[0] == gpu.version:
            return found[1]
        step = self._plan_once(gpu, profile)
        self._plans[(gpu.gid, profile)] = (gpu.version, step)
        return step

    def _plan_once(self, gpu: _Gpu, profile: str) -> tuple[list[int], int] | None:
        """Free slices to destroy and the start of the new slice, or None when counts say no.

        Counts first (held slices plus the new one, then every free slice that still fits by
        counts, lowest start first); then NVML's creation without a placement takes the lowest
        start that does not overlap what stays. Counts that fit with no start left count as a
        failed creation.
        """
        model = gpu.model
        if profile not in gpu.geometry.by_profile:
            return None
        held = [s for s in gpu.slices.values() if s.holder is not None]
        counts = Counter(s.profile for s in held)
        counts[profile] += 1
        if not _counts_fit(model, _key(counts)):
            return None
        kept: list[_Slice] = []
        for item in sorted((s for s in gpu.slices.values() if s.holder is None),
                           key=lambda s: s.start):
            counts[item.profile] += 1
            if _counts_fit(model, _key(counts)):
                kept.append(item)
            else:
                counts[item.profile] -= 1
        g = gpu.geometry
        for stay in (kept, []):
            mask = sum(1 << g.index[Slice(s.profile, s.start)] for s in [*held, *stay])
            base = g.aggregate(mask)
            for i in g.by_profile[profile]:
                if g.fits(base, i):
                    destroy = [s.start for s in gpu.slices.values()
                               if s.holder is None and s not in stay]
                    return destroy, g.slices[i].start
        self.failed_creates += 1
        return None

    def schedule(self, now: float, queues: Queues) -> Schedule:
        starts: list[tuple[Job, float]] = []

        def attempt(job: Job) -> bool:
            ready = self._existing_fit(job, now)
            if ready is None:
                ready = self._repartition_fit(job, now)
            if ready is not None:
                starts.append((job, ready))
            return ready is not None

        in_arrival_order(queues, attempt)
        return Schedule(tuple(starts))

    def _repartition_fit(self, job: Job, now: float) -> float | None:
        units = [p for p, n in job.requests for _ in range(n)]
        for n, gpus in enumerate(self.node_gpus):
            if self._node_fails.get((n, job.requests)) == self.node_version[n]:
                continue
            chosen: list[tuple[_Gpu, list[int], int, str]] = []
            used: set[int] = set()
            for profile in units:
                for gpu in gpus:
                    if gpu.gid in used:
                        continue  # one repartition per GPU per pod keeps the rollback trivial
                    step = self._greedy_plan(gpu, profile)
                    if step is not None:
                        chosen.append((gpu, step[0], step[1], profile))
                        used.add(gpu.gid)
                        break
                else:
                    break
            if len(chosen) < len(units):
                self._node_fails[(n, job.requests)] = self.node_version[n]
                continue
            ready = now
            for gpu, destroy, start, profile in chosen:
                for old in destroy:
                    self._destroy(gpu, old)
                done = self._reconfigure(gpu, now, len(destroy) + 1, self.latency)
                self._create(gpu, profile, start, done + self.lag)
                self.repartitions += 1
                ready = max(ready, self._take(job, gpu, start))
            return ready
        return None

    def unusable_free(self, shapes: Sequence[Shape]) -> int:
        if not shapes:
            return 0
        wanted = self._wanted(shapes)
        total = 0
        for gpu in self.gpus:
            free = gpu.free_compute()
            if free and not any(
                    any(s.holder is None and s.profile == p for s in gpu.slices.values())
                    or _counts_fit(gpu.model, _key(Counter(
                        [*(s.profile for s in gpu.slices.values() if s.holder is not None), p])))
                    for p in wanted):
                total += free
        return total


# --- fluid bounds -----------------------------------------------------------------------------


class FluidGpuPolicy(SimPolicy):
    """Per-GPU fluid limit: compute slices per GPU, no placements, no nodes; best fit."""

    name = "fluid:gpu"

    def __init__(self, cluster: ClusterSpec) -> None:
        super().__init__()
        self.size = [g.model.compute_slices for g in cluster.gpus]
        self.free = list(self.size)
        top = max(self.size)
        self.levels: list[set[int]] = [set() for _ in range(top + 1)]
        for i, f in enumerate(self.free):
            self.levels[f].add(i)
        self.held: dict[str, list[tuple[int, int]]] = {}
        self.model = cluster.main_model

    def _move(self, gpu: int, delta: int) -> None:
        self.levels[self.free[gpu]].discard(gpu)
        self.free[gpu] += delta
        self.levels[self.free[gpu]].add(gpu)

    def schedule(self, now: float, queues: Queues) -> Schedule:
        starts: list[tuple[Job, float]] = []

        def attempt(job: Job) -> bool:
            per_unit = job.compute // job.units
            taken: list[tuple[int, int]] = []
            for _ in range(job.units):
                gpu = next((min(self.levels[f]) for f in range(per_unit, len(self.levels))
                            if self.levels[f]), None)
                if gpu is None:
                    for g, c in taken:
                        self._move(g, c)
                    return False
                self._move(gpu, -per_unit)
                taken.append((gpu, per_unit))
            self.held[job.name] = taken
            starts.append((job, now))
            return True

        in_arrival_order(queues, attempt)
        return Schedule(tuple(starts))

    def release(self, job: Job) -> None:
        for g, c in self.held.pop(job.name, ()):
            self._move(g, c)

    def unusable_free(self, shapes: Sequence[Shape]) -> int:
        if not shapes:
            return 0
        smallest = min(self.model.profile(p).compute_slices for shape in shapes
                       for p, _ in shape)
        return sum(f for f in self.free if f < smallest)


class FluidClusterPolicy(SimPolicy):
    """Per-cluster fluid limit: every compute slice pooled."""

    name = "fluid:cluster"

    def __init__(self, cluster: ClusterSpec) -> None:
        super().__init__()
        self.free = cluster.capacity
        self.held: dict[str, int] = {}

    def schedule(self, now: float, queues: Queues) -> Schedule:
        starts: list[tuple[Job, float]] = []

        def attempt(job: Job) -> bool:
            if job.compute > self.free:
                return False
            self.free -= job.compute
            self.held[job.name] = job.compute
            starts.append((job, now))
            return True

        in_arrival_order(queues, attempt)
        return Schedule(tuple(starts))

    def release(self, job: Job) -> None:
        self.free += self.held.pop(job.name, 0)

    def unusable_free(self, shapes: Sequence[Shape]) -> int:
        return 0
