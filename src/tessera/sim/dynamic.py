"""Tessera's dynamic policy in the simulator: the controller that ships, on a simulated clock.

``dynamic`` is not a model of the controller: it *is* :class:`tessera.controller.loop.Controller`
(batching, the bounded batch, the planner, :func:`~tessera.controller.decide.decide`, pinning and
releasing pods), fed through its own :class:`~tessera.controller.loop.ClusterCache` and
writing through its :class:`~tessera.controller.loop.Writer` interface, so a change to the
controller shows here exactly as it does on the e2e cluster. Only what surrounds it is simulated,
each part standing in for the real component's observable behaviour:

- **the API server**: pods, nodes, NodePartitions and one dynamic PartitionPolicy as the
  watches would deliver them (raw objects into the cache);
- **the agents**: a written spec is applied GPU by GPU, ``reconfig_latency`` per GPU-instance
  create or destroy (NVML takes a second or two each), operations on one GPU one after the
  other; the node reports the plan (``status.appliedPlanId``) once its last GPU is done;
- **the kubelets**: a new slice is advertised (node ``allocatable``) ``capacity_lag`` after it
  exists, as the kubelet publishes device-plugin capacity at its next status sync; a pod the
  controller releases is bound at once and given free advertised slices of its profiles on its
  node, first found (the device plugin's choice, which need not be the one the plan drew);
- **time**: the controller ticks at every arrival and departure and again when something it
  waits for is due (a batch closing, a plan reported, capacity advertised).

A pod starts when it is bound: its slices are advertised by then, since the controller releases
a pod only when the node's allocatable has room for it.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from tessera.api.v1alpha1 import NodePartition, NodePartitionSpec, PartitionPolicyStatus
from tessera.controller.demand import GATE
from tessera.controller.loop import ClusterCache, Controller, ControllerSettings
from tessera.core import catalogue
from tessera.core.planner import DEFAULT_PER_SHAPE, DEFAULT_RESERVATIONS
from tessera.core.planner.geometry import hostable
from tessera.sim.cluster import ClusterSpec
from tessera.sim.policies import (
    DEFAULT_CAPACITY_LAG_S,
    DEFAULT_RECONFIG_LATENCY_S,
    Queues,
    Schedule,
    Shape,
    _MigPolicy,
)
from tessera.sim.workload import Job

__all__ = ["DEFAULT_BATCH_IDLE_S", "DEFAULT_BATCH_MAX_S", "DynamicPolicy"]

DEFAULT_BATCH_IDLE_S = ControllerSettings.batch_idle_s
DEFAULT_BATCH_MAX_S = ControllerSettings.batch_max_s
"""The controller's own defaults (the chart's ``batchIdleSeconds``/``batchMaxSeconds``)."""

_EPOCH = 1_800_000_000.0
"""Simulated second 0 on the wall clock the controller reads (creation times, ages)."""
_SOON = 1e-3
"""A tick right after this one (a plan left pods for the next): the next tick opens the batch."""
_NAMESPACE = "sim"
_LABEL = "tessera.dev/simulated"


def _timestamp(seconds: float) -> str:
    moment = datetime.datetime.fromtimestamp(_EPOCH + seconds, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _pod(job: Job, node: str | None = None) -> dict[str, Any]:
    """``job`` as the API server holds its pod: gated and Pending until the controller
    releases it, then bound to ``node`` and Running."""
    spec: dict[str, Any] = {"containers": [{"name": "main", "resources": {"limits": {
        catalogue.mig_resource_name(p): str(c) for p, c in job.requests}}}]}
    if node is None:
        spec["schedulingGates"] = [{"name": GATE}]
    else:
        spec["nodeName"] = node
    return {"metadata": {"namespace": _NAMESPACE, "name": job.name,
                         "creationTimestamp": _timestamp(job.arrival)},
            "spec": spec, "status": {"phase": "Pending" if node is None else "Running"}}


class DynamicPolicy(_MigPolicy):
    """The controller, over the simulated cluster (see the module docstring)."""

    name = "dynamic"
    batch_window = 0.0
    """The controller batches by itself; the event loop offers it every change at once."""

    def __init__(self, cluster: ClusterSpec, *, batch_idle: float = DEFAULT_BATCH_IDLE_S,
                 batch_max: float = DEFAULT_BATCH_MAX_S,
                 reconfig_latency: float = DEFAULT_RECONFIG_LATENCY_S,
                 capacity_lag: float = DEFAULT_CAPACITY_LAG_S, solver: str = "fast",
                 reservations: int = DEFAULT_RESERVATIONS,
                 per_shape: int = DEFAULT_PER_SHAPE,
                 reserve_after_waits: float = ControllerSettings.reserve_after_waits) -> None:
        super().__init__(cluster)
        self.latency = reconfig_latency
        self.lag = capacity_lag
        self.now = 0.0
        self.node_names = [n.name for n in cluster.nodes]
        self._node_index = {name: i for i, name in enumerate(self.node_names)}
        self._jobs: dict[str, Job] = {}
        self._reports: dict[int, tuple[float, str]] = {}
        """Node -> (when its agent reports, the plan id it reports)."""
        self._advertise: dict[int, float] = {}
        """Node -> the next time a slice of it becomes allocatable."""
        self._specs: dict[int, NodePartitionSpec] = {}
        self._applied: dict[int, str | None] = {}
        self._starts: list[tuple[Job, float]] = []
        self.events = 0
        self.cache = ClusterCache()
        self.controller = Controller(
            self.cache, self, ControllerSettings(
                batch_idle_s=batch_idle, batch_max_s=batch_max,
                solver="exact" if solver == "exact" else "fast",
                reservations=reservations, per_shape=per_shape,
                reserve_after_waits=reserve_after_waits),
            clock=lambda: self.now, wall_clock=lambda: _EPOCH + self.now)
        self.cache.put("partitionpolicy", "ADDED", {
            "metadata": {"name": "simulated-dynamic", "generation": 1},
            "spec": {"nodeSelector": {"matchLabels": {_LABEL: "true"}}, "mode": "dynamic"}})
        for n in range(len(self.node_gpus)):
            self._applied[n] = None
            self._specs[n] = NodePartitionSpec()
            self._put_node(n)
            self._put_partition(n)

    # -- the simulated API server ------------------------------------------------------------

    def _put_node(self, n: int) -> None:
        allocatable: dict[str, int] = {}
        for gpu in self.node_gpus[n]:
            for item in gpu.slices.values():
                if item.ready_at <= self.now:
                    resource = catalogue.mig_resource_name(item.profile)
                    allocatable[resource] = allocatable.get(resource, 0) + 1
        name = self.node_names[n]
        self.cache.put("node", "MODIFIED", {
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
                                                  _LABEL: "true"}},
            "spec": {},
            "status": {"allocatable": {r: str(c) for r, c in sorted(allocatable.items())}}})
        later = [s.ready_at for g in self.node_gpus[n] for s in g.slices.values()
                 if s.ready_at > self.now]
        if later:
            self._advertise[n] = min(later)
        else:
            self._advertise.pop(n, None)

    def _put_partition(self, n: int) -> None:
        gpus = []
        for i, gpu in enumerate(self.node_gpus[n]):
            model = gpu.model
            gpus.append({
                "index": i, "uuid": f"GPU-sim-{gpu.gid}", "name": model.product_names[0],
                "model": model.name, "mode": "mig",
                "migMode": {"current": True, "pending": True},
                "slices": [{"profile": s.profile, "start": s.start, "gpuInstanceId": s.start,
                            "uuid": f"MIG-sim-{gpu.gid}-{s.start}",
                            "allocated": s.holder is not None}
                           for s in sorted(gpu.slices.values(), key=lambda s: s.start)]})
        raw: dict[str, Any] = {"metadata": {"name": self.node_names[n], "generation": 1},
                               "spec": self._specs[n].to_wire(),
                               "status": {"appliedPlanId": self._applied[n], "gpus": gpus}}
        self.cache.put("nodepartition", "MODIFIED", raw)

    def arrive(self, job: Job) -> None:
        self._jobs[f"{_NAMESPACE}/{job.name}"] = job
        self.cache.put("pod", "ADDED", _pod(job))

    def release(self, job: Job) -> None:
        nodes = {gpu.node for gpu, _ in self.held.get(job.name, ())}
        super().release(job)
        self.cache.put("pod", "DELETED", {"metadata": {"namespace": _NAMESPACE,
                                                       "name": job.name}})
        for n in sorted(nodes):
            self._put_partition(n)

    # -- the controller's writes (the Writer protocol) -----------------------------------------

    def write_spec(self, node: str, spec: NodePartitionSpec,
                   current: NodePartition | None) -> bool:
        """The agent's part: free slices the target drops go now, new ones are made one
        operation after the other per GPU; the plan is reported when the last GPU is done."""
        n = self._node_index[node]
        self._specs[n] = spec
        done = self.now
        for wanted in spec.gpus:
            if wanted.index is None or wanted.mode not in (None, "mig"):
                raise NotImplementedError(f"the MIG simulation got a {wanted.mode} GPU spec")
            gpu = self.node_gpus[n][wanted.index]
            target = {(s.profile, s.start) for s in wanted.slices}
            drop = [s for s in gpu.slices.values() if (s.profile, s.start) not in target]
            make = sorted(target - {(s.profile, s.start) for s in gpu.slices.values()},
                          key=lambda t: t[1])
            if not drop and not make:
                continue
            for item in drop:
                self._destroy(gpu, item.start)
            finished = self._reconfigure(gpu, self.now, len(drop) + len(make), self.latency)
            for profile, start in make:
                self._create(gpu, profile, start, finished + self.lag)
            self.repartitions += 1
            done = max(done, finished)
        self._reports[n] = (done, spec.plan_id or "")
        self._put_partition(n)
        self._put_node(n)
        return True

    def release_pod(self, pod: str, node: str, hostname: str, gated: bool,
                    seen: Mapping[str, Any] | None = None) -> None:
        """The scheduler binds the pod to its pinned node; the kubelet gives it free slices
        it advertises, of each profile it asks."""
        job = self._jobs[pod]
        n = self._node_index[node]
        # The kubelet refuses a pod it has no free advertised device for: so does this.
        self._take_first(job, n, usable_at=self.now)
        self.cache.put("pod", "MODIFIED", _pod(job, node))
        self._put_partition(n)
        self._starts.append((job, self.now))

    def release_to_dra(self, pod: str, selector: Mapping[str, str]) -> bool:
        """Never called: this policy simulates device-plugin nodes only, whose partitions never
        report ``api: dra`` (DRA nodes are the ``dra`` policies of :mod:`tessera.sim.dra`)."""
        raise AssertionError(f"pod {pod} handed to DRA on a cluster without DRA nodes")

    def requeue_dra(self, device_class: str) -> None:
        """Never called, as :meth:`release_to_dra`."""
        raise AssertionError(f"DeviceClass {device_class} touched on a cluster without DRA")

    def pod_event(self, pod: str, reason: str, message: str, warning: bool) -> None:
        self.events += 1

    def partition_event(self, node: str, reason: str, message: str, warning: bool) -> None:
        self.events += 1

    def policy_status(self, name: str, status: PartitionPolicyStatus) -> None:
        pass

    def create_placeholder(self, body: Mapping[str, Any]) -> str | None:
        return None  # the simulated cluster has a fixed size: no autoscaler to ask

    def delete_placeholder(self, kind: str, key: str, reason: str) -> None:
        pass

    # -- the event loop's side ---------------------------------------------------------------

    def schedule(self, now: float, queues: Queues) -> Schedule:
        self.now = now
        for n, (when, plan) in list(self._reports.items()):
            if when <= now:
                del self._reports[n]
                self._applied[n] = plan
                self._put_partition(n)
        for n, when in list(self._advertise.items()):
            if when <= now:
                self._put_node(n)
        before = self.controller.state.counter
        self.controller.tick()
        self.planner_calls += self.controller.state.counter - before
        starts, self._starts = tuple(self._starts), []
        return Schedule(starts, wake_at=self._next_wake(now))

    def _next_wake(self, now: float) -> float | None:
        """The first instant the controller would act on without a new arrival or departure:
        a plan reported, capacity advertised, its batch closing."""
        due = [when for when, _ in self._reports.values()]
        due.extend(self._advertise.values())
        state = self.controller.state
        if state.more:
            due.append(now + _SOON)
        if state.batch_opened is not None:
            idle, most = self.controller.batch_window()
            due.append(min(state.batch_changed + idle, state.batch_opened + most))
        # Something already due (a plan done with no latency) is seen at the next tick, which
        # must then come right after this one.
        return max(min(due), now + _SOON) if due else None

    def unusable_free(self, shapes: Sequence[Shape]) -> int:
        if not shapes:
            return 0
        wanted = self._wanted(shapes)
        return sum(g.free_compute() for g in self.gpus
                   if not any(hostable(g.model.name, g.held_mask(), p) for p in wanted))

