"""``dra`` and ``dra:curated``: kube-scheduler allocating MIG placements itself (DRA).

With Dynamic Resource Allocation each GPU publishes one device per valid (profile, start)
placement, and the devices share the GPU's counters (:mod:`tessera.core.dra`); there is no
controller in the pod's path. What these policies model, step by step:

- **the queue**: pods are served oldest first (kube-scheduler's queue sorts by priority, then
  creation; every pod here has the same priority), with no batching window: the scheduler
  takes a pod as soon as it is queued, so the event loop runs a round at every arrival and
  departure (window 0). A pod that fits nowhere waits; those behind it are still tried.
- **the node**: among the nodes where the whole request fits, the one with the least GPU
  compute in use, ties by node index. This is an assumption, read off kube-scheduler
  v1.37.2 (``pkg/scheduler``): the default plugins (``apis/config/v1/default_plugins.go``)
  score with ``NodeResourcesFit`` (weight 1, strategy ``LeastAllocated``), which favours the
  node with the smallest requested share of the scored resources, and
  ``NodeResourcesBalancedAllocation``; both score only ``cpu`` and ``memory`` by default
  (``defaultResourceSpec`` in ``apis/config/v1/defaults.go``), and the GPU enters them only
  if an operator lists the DRA-backed extended resource in ``scoringStrategy.resources``
  (``getDRAPreScoredParams``, ``noderesources/resource_allocation.go``). The
  ``DynamicResources`` plugin (weight 2 with DRA on) scores only which subrequest of a
  ``firstAvailable`` list a node could satisfy (``computeScore`` in
  ``dynamicresources/dynamicresources.go``); a claim of ``exactly`` one device class, as a
  MIG profile's claim is, scores 0 on every node, so devices do not steer the node choice.
  Assuming GPU pods' CPU and memory requests grow with their GPU share, "least GPU compute in
  use" stands for the default spreading; the real scheduler breaks ties at random
  (``framework/sorted_nodes.go``), this model by node index so a run is deterministic.
- **the devices**: on that node, each unit (one device of the request's profile) takes the
  first device in published order that fits: GPUs by index, then :func:`tessera.core.dra.devices`
  order, a device fitting when :func:`~tessera.core.dra.fits` says its
  :func:`~tessera.core.dra.consumption` fits the GPU's :func:`~tessera.core.dra.capacities`
  beside the counters the GPU's allocated slices use. A request of several units takes all
  its devices on one node (one ResourceClaim); units are placed one after the other, first
  fit. The real allocator backtracks (tries the next device for an earlier unit) when a later
  unit finds no room; this model does not, so it may refuse a rare multi-unit request that
  another choice of devices on the same node would hold.
- **the slice**: the kubelet's ``NodePrepareResources`` creates it, so the pod starts after
  one GPU-instance creation (``reconfig_latency``, serialised per GPU as for the other MIG
  policies; no capacity lag: no device-plugin capacity is advertised); when the pod ends,
  ``NodeUnprepareResources`` destroys it and its counters are free again (the destroy keeps
  the GPU busy for one more operation, which delays the next creation on it). A node starts
  with no slices (the driver makes them per claim): starting layouts of a cluster file are
  ignored.
- **curation** (``dra:curated``): before each pod's choice the controller's
  :func:`~tessera.core.dra.curate` runs over every GPU of the cluster (used: the slices
  allocated now, all healthy), and the (GPU, profile) devices it taints are not offered. A
  pod that fits nowhere with the taints but somewhere without them is served without them
  (the controller stops curating a profile a pod cannot otherwise get).

Counters: every slice made is ``created`` and every one destroyed ``destroyed``; each is a
reconfiguration of its GPU, counted in ``repartitions``.
"""

from __future__ import annotations

from collections.abc import Sequence

from tessera.core import dra
from tessera.core.layout import Slice
from tessera.sim.cluster import ClusterSpec
from tessera.sim.policies import (
    DEFAULT_RECONFIG_LATENCY_S,
    Queues,
    Schedule,
    Shape,
    _Gpu,
    _MigPolicy,
    in_arrival_order,
)
from tessera.sim.workload import Job

__all__ = ["CURATED", "UNCURATED", "DraPolicy"]

UNCURATED = "dra"
CURATED = "dra:curated"

_Used = frozenset[Slice]
_Kind = tuple[str, _Used, int]
"""A GPU as curation sees it: its model's name, its allocated slices, its node's load
(compute slices in use)."""
_Taints = frozenset[tuple[_Kind, str]]
_NO_TAINTS: _Taints = frozenset()

class DraPolicy(_MigPolicy):
    """kube-scheduler with the DRA driver, curated or not (see the module docstring)."""

    batch_window = 0.0
    """kube-scheduler does not batch: a round at every arrival and departure."""

    def __init__(self, cluster: ClusterSpec, *, curated: bool = False,
                 reconfig_latency: float = DEFAULT_RECONFIG_LATENCY_S) -> None:
        super().__init__(cluster, [() for _ in cluster.gpus])
        self.name = CURATED if curated else UNCURATED
        self.curated = curated
        self.latency = reconfig_latency
        self.uses = [dra.GpuUse(gpu.model, frozenset()) for gpu in self.gpus]
        """What curation sees of each GPU: its allocated slices (all of its slices), and
        whether its node is busy."""
        self._kinds: list[_Kind] = [(gpu.model.name, frozenset(), 0) for gpu in self.gpus]
        self._alike: dict[_Kind, set[int]] = {}
        """The GPUs of each kind now (a GPU's taints depend only on its kind, see below)."""
        for gid, kind in enumerate(self._kinds):
            self._alike.setdefault(kind, set()).add(gid)
        self.node_compute = [0] * len(self.node_gpus)
        self._ends: dict[str, float] = {}
        self._changes = 0
        self._taints: tuple[int, _Taints] = (-1, _NO_TAINTS)
        self._fails: dict[tuple[int, Shape, bool], tuple[int, int]] = {}
        """(node, shape, tainted) -> (node version, taint version) at which it did not fit."""
        self._taint_version = 0

    # -- the allocator --------------------------------------------------------------------------

    def _current_taints(self) -> _Taints:
        """:func:`tessera.core.dra.curate` over the cluster now, recomputed only after a
        change.

        Curation decides each GPU from its own use and from which uses exist elsewhere, so
        GPUs of one kind (same model, same slices, same node load) are handed to it once
        and share its answer: the same taints, from a few dozen GPUs instead of every one. A
        taint is kept as (kind, profile): it applies to every GPU of that kind.
        """
        changes, taints = self._taints
        if changes != self._changes:
            kinds = list(self._alike)
            picked = dra.curate([self.uses[min(self._alike[kind])] for kind in kinds])
            fresh = frozenset((kinds[position], profile) for position, profile in picked)
            if fresh != taints:
                self._taint_version += 1
            self._taints = (self._changes, fresh)
            taints = fresh
        return taints

    def _fit_node(self, node: int, units: Sequence[str], taints: _Taints
                  ) -> list[tuple[_Gpu, Slice]] | None:
        """Each unit's device on ``node``, first fit in published order, or None.

        A GPU that had no device for a profile has none for a later unit of the same pod
        either (its own units only take room), so each profile's search resumes where its
        previous unit was placed.
        """
        gpus = self.node_gpus[node]
        mine: dict[int, _Used] = {}
        resume: dict[str, int] = {}
        chosen: list[tuple[_Gpu, Slice]] = []
        for profile in units:
            k = resume.get(profile, 0)
            while k < len(gpus):
                gpu = gpus[k]
                if not taints or (self._kinds[gpu.gid], profile) not in taints:
                    used = mine.get(gpu.gid, self.uses[gpu.gid].used)
                    found = dra.first_fit(gpu.model, used, profile)
                    if found is not None:
                        mine[gpu.gid] = used | {found}
                        chosen.append((gpu, found))
                        break
                k += 1
            else:
                return None
            resume[profile] = k
        return chosen

    def _choose(self, job: Job, taints: _Taints) -> list[tuple[_Gpu, Slice]] | None:
        """The devices of the least-allocated node that has room for every unit."""
        units = [p for p, n in job.requests for _ in range(n)]
        tainted = bool(taints)
        order = sorted(range(len(self.node_gpus)), key=lambda n: (self.node_compute[n], n))
        for node in order:
            key = (node, job.requests, tainted)
            seen = (self.node_version[node], self._taint_version if tainted else 0)
            if self._fails.get(key) == seen:
                continue
            chosen = self._fit_node(node, units, taints)
            if chosen is not None:
                return chosen
            self._fails[key] = seen
        return None

    def _allocate(self, job: Job, now: float, starts: list[tuple[Job, float]]) -> bool:
        """Place ``job`` (curated devices first when curating) and add it to ``starts`` with
        the time its last slice is made; False when it fits nowhere."""
        taints = self._current_taints() if self.curated else _NO_TAINTS
        chosen = self._choose(job, taints)
        if chosen is None and taints:
            chosen = self._choose(job, _NO_TAINTS)  # the controller stops curating for it
        if chosen is None:
            return False
        ready = now
        for gpu, item in chosen:
            made = self._reconfigure(gpu, now, 1, self.latency)
            self._create(gpu, item.profile, item.start, made)
            self._changed(gpu, item, +1)
            ready = max(ready, self._take(job, gpu, item.start))
        self._ends[job.name] = ready + job.duration
        starts.append((job, ready))
        return True

    def _changed(self, gpu: _Gpu, item: Slice, sign: int) -> None:
        use = self.uses[gpu.gid]
        used = use.used | {item} if sign > 0 else use.used - {item}
        self.node_compute[gpu.node] += sign * gpu.model.profile(item.profile).compute_slices
        self.uses[gpu.gid] = dra.GpuUse(gpu.model, used)
        for other in self.node_gpus[gpu.node]:  # the node's load is part of every GPU's kind
            self._rekind(other, self.node_compute[gpu.node])
        self.repartitions += 1
        self._changes += 1

    def _rekind(self, gpu: _Gpu, load: int) -> None:
        """File the GPU under its kind now (its slices, its node's load)."""
        used = self.uses[gpu.gid].used
        self.uses[gpu.gid] = dra.GpuUse(gpu.model, used, node_load=load)
        old, new = self._kinds[gpu.gid], (gpu.model.name, used, load)
        self._alike[old].discard(gpu.gid)
        if not self._alike[old]:
            del self._alike[old]
        self._alike.setdefault(new, set()).add(gpu.gid)
        self._kinds[gpu.gid] = new

    # -- the event loop's side ------------------------------------------------------------------

    def schedule(self, now: float, queues: Queues) -> Schedule:
        starts: list[tuple[Job, float]] = []
        in_arrival_order(queues, lambda job: self._allocate(job, now, starts))
        return Schedule(tuple(starts))

    def release(self, job: Job) -> None:
        """The pod ended: its claim is unprepared, each slice destroyed, counters freed."""
        held = list(self.held.get(job.name, ()))
        ended = self._ends.pop(job.name, 0.0)
        super().release(job)
        for gpu, start in held:
            item = Slice(gpu.slices[start].profile, start)
            self._reconfigure(gpu, ended, 1, self.latency)
            self._destroy(gpu, start)
            self._changed(gpu, item, -1)

    def unusable_free(self, shapes: Sequence[Shape]) -> int:
        if not shapes:
            return 0
        wanted = self._wanted(shapes)
        return sum(gpu.free_compute() for gpu in self.gpus
                   if not any(self.uses[gpu.gid].can_host(p) for p in wanted))
