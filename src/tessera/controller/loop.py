"""The controller's decision loop: one :meth:`Controller.tick` at a time, over a cache of the
cluster, writing through a small :class:`Writer` interface (the API server in production, a
recorder in tests).

Per tick:

1. NodePartitions whose agent has reported the last plan leave the in-flight set; plans not
   reported in ``plan_timeout_s`` are given up with a Warning Event.
2. Policies: static and MPS layouts are written (and re-written when someone edits them);
   dynamic nodes get every MIG-capable card in MIG mode.
3. Pending GPU pods are batched: the window closes after ``batch_idle_s`` without a new pod,
   or ``batch_max_s`` after it opened. Then the planner runs on a consistent snapshot, changed
   specs are written with a new ``planId``, and every pod gets an Event saying where it goes or
   why it cannot fit.
4. Pods waiting for their slices are pinned to their node and released (scheduling gate lifted)
   once the node's allocatable shows room for them beside every pod already bound or released
   there: never more pods than free slices.

In-flight plans are derived from the NodePartitions themselves (``spec.planId`` not yet equal
to ``status.appliedPlanId``), so a new leader picks up where the old one stopped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeVar

from tessera.api.v1alpha1 import (
    Condition,
    DraSpec,
    NodePartition,
    NodePartitionSpec,
    PartitionPolicy,
    PartitionPolicyStatus,
    comparable,
)
from tessera.controller import demand, dra, scaleup
from tessera.controller.decide import decide, plan_id
from tessera.controller.policies import policy_for, policy_gpu_specs
from tessera.controller.snapshot import (
    SnapshotBuilder,
    node_allocatable,
    node_labels,
    node_view,
)
from tessera.controller.waits import RecentWaits
from tessera.core import catalogue, planner
from tessera.core.dra import MPS_DEVICE_CLASS
from tessera.core.errors import InvalidInputError

__all__ = ["ClusterCache", "Controller", "ControllerSettings", "Writer"]

log = logging.getLogger(__name__)

RawObject = Mapping[str, Any]

_SCHEDULER_FLUSH_S = 300.0
"""kube-scheduler's podMaxInUnschedulablePodsDuration: it retries every turned-down pod this
often by itself."""


class Writer(Protocol):
    def write_spec(self, node: str, spec: NodePartitionSpec,
                   current: NodePartition | None) -> bool:
        """False when the write lost a race (someone changed it first): plan again."""
        ...

    def release_pod(self, pod: str, node: str, hostname: str, gated: bool,
                    seen: RawObject | None = None) -> None:
        """Pin ``pod`` to ``hostname`` and ungate it if ``gated``; ``seen``: the pod as the
        cache shows it (a writer may build its patch from it, guarded by its version)."""
        ...

    def requeue_dra(self, device_class: str) -> None:
        """Touch ``device_class`` so kube-scheduler retries the pods DRA turned down."""
        ...

    def release_to_dra(self, pod: str, selector: Mapping[str, str]) -> bool:
        """Ungate a pod for DRA nodes, adding ``selector`` to its node selector; False if it
        is gone or no longer gated."""
        ...

    def pod_event(self, pod: str, reason: str, message: str, warning: bool) -> None: ...

    def partition_event(self, node: str, reason: str, message: str, warning: bool) -> None: ...

    def policy_status(self, name: str, status: PartitionPolicyStatus) -> None: ...

    def create_placeholder(self, body: Mapping[str, Any]) -> str | None:
        """Create a scale-up placeholder pod; its ``namespace/name``, or None if refused."""
        ...

    def delete_placeholder(self, kind: str, key: str, reason: str) -> None:
        """Delete a placeholder pod or ProvisioningRequest (``kind``) by ``namespace/name``."""
        ...


class Metrics(Protocol):
    def record_tick(self, pending: int, leader: bool, oldest_s: float = 0.0) -> None: ...

    def record_plan(self, seconds: float, placed: int, unplaced: int, created: int,
                    destroyed: int) -> None: ...

    def record_release(self, waited_s: float | None = None, pinned: bool = True) -> None:
        """A pod handed over with room made for it, after ``waited_s`` since its creation;
        ``pinned``: it carried the gate, so it was pinned and released (a pod the gate missed
        is the scheduler's already: its wait counts, but nothing was released)."""

    def record_scale_up(self, gpus: int) -> None: ...


class _NoMetrics:
    def record_tick(self, pending: int, leader: bool, oldest_s: float = 0.0) -> None:
        pass

    def record_plan(self, seconds: float, placed: int, unplaced: int, created: int,
                    destroyed: int) -> None:
        pass

    def record_release(self, waited_s: float | None = None, pinned: bool = True) -> None:
        pass

    def record_scale_up(self, gpus: int) -> None:
        pass


@dataclass
class PodFacts:
    """What the decision loop reads of a pod, derived once per version of it: a tick looks at
    every pod the cache holds, and parsing thousands of pods' containers on every tick was
    most of a tick's cost under load."""

    raw: RawObject
    requests: Mapping[str, int]
    waiting: bool
    terminal: bool
    created: float | None
    _pending: planner.PendingPod | None = None

    @classmethod
    def of(cls, raw: RawObject, placeholders: str | None = None) -> PodFacts:
        return cls(raw, demand.gpu_requests(raw), demand.is_waiting(raw, placeholders),
                   demand.is_terminal(raw), demand.created_at(raw))

    @property
    def pending(self) -> planner.PendingPod:
        if self._pending is None:
            self._pending = demand.pending_pod(self.raw)
        return self._pending


class ClusterCache:
    """What the watches have delivered; thread-safe; the loop reads a consistent copy."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._facts: dict[str, PodFacts] = {}
        self.pods: dict[str, RawObject] = {}
        self.nodes: dict[str, RawObject] = {}
        self.partitions: dict[str, NodePartition] = {}
        self.policies: dict[str, PartitionPolicy] = {}
        self.placeholders: dict[str, RawObject] = {}
        """Scale-up placeholder pods (also in :attr:`pods`), indexed so a tick need not
        look at every pod to find them."""
        self.dra: set[str] = set()
        """Nodes whose agent serves DRA (their NodePartition says so), kept as they come:
        a tick need not look at every NodePartition to find them."""
        self.placeholder_namespace = "tessera"
        """Where placeholders are (the controller's namespace; set by the controller)."""
        self._dirty: set[str] = set()
        """Nodes whose Node or NodePartition changed (came, went) since the loop last took
        them (:meth:`loop_view`): what its snapshot must build again."""
        self.changed = threading.Event()

    def put(self, kind: str, event_type: str, raw: RawObject) -> None:
        name = raw.get("metadata", {}).get("name", "")
        with self._lock:
            if kind == "pod":
                key = demand.pod_key(raw)
                if event_type == "DELETED":
                    self.pods.pop(key, None)
                    self._facts.pop(key, None)
                    self.placeholders.pop(key, None)
                else:
                    self.pods[key] = raw
                    if demand.is_placeholder(raw, self.placeholder_namespace):
                        self.placeholders[key] = raw
            elif kind == "provisioningrequest":
                key = scaleup.cache_key(scaleup.PROVISIONING_REQUEST, demand.pod_key(raw))
                if event_type == "DELETED":
                    self.placeholders.pop(key, None)
                elif raw.get("metadata", {}).get("namespace") == self.placeholder_namespace:
                    self.placeholders[key] = {**raw, "kind": scaleup.PROVISIONING_REQUEST}
            elif kind == "node":
                if event_type == "DELETED":
                    self.nodes.pop(name, None)
                else:
                    view = node_view(raw)
                    if self.nodes.get(name) == view:
                        return  # nothing the loop reads changed: no tick for it
                    self.nodes[name] = view
                self._dirty.add(name)
            elif kind == "nodepartition":
                self._dirty.add(name)
                if event_type == "DELETED":
                    self.partitions.pop(name, None)
                    self.dra.discard(name)
                else:
                    partition = self.partitions[name] = NodePartition.model_validate(raw)
                    if dra.serves_dra(partition):
                        self.dra.add(name)
                    else:
                        self.dra.discard(name)
            elif kind == "partitionpolicy":
                if event_type == "DELETED":
                    self.policies.pop(name, None)
                else:
                    self.policies[name] = PartitionPolicy.model_validate(raw)
        self.changed.set()

    def facts(self, key: str, raw: RawObject) -> PodFacts:
        """``raw``'s facts, derived at most once for each version of the pod."""
        found = self._facts.get(key)
        if found is None or found.raw is not raw:
            found = PodFacts.of(raw, self.placeholder_namespace)
            if self.pods.get(key) is raw:
                self._facts[key] = found
        return found

    def placeholder_view(self) -> dict[str, RawObject]:
        with self._lock:
            return dict(self.placeholders)

    def view(self) -> tuple[dict[str, RawObject], dict[str, RawObject],
                            dict[str, NodePartition], dict[str, PartitionPolicy]]:
        with self._lock:
            return dict(self.pods), dict(self.nodes), dict(self.partitions), dict(self.policies)

    def loop_view(self, dirty: set[str] | None = None
                  ) -> tuple[dict[str, RawObject], dict[str, RawObject],
                             dict[str, NodePartition], dict[str, PartitionPolicy],
                             dict[str, NodePartition]]:
        """:meth:`view`, and the NodePartitions of DRA nodes among its NodePartitions
        (those that :func:`dra.serves_dra`), read together; with ``dirty``, the nodes whose
        Node or NodePartition changed since the last such call are added to it, in the same
        moment (one caller takes them: the controller)."""
        with self._lock:
            if dirty is not None:
                dirty |= self._dirty
                self._dirty = set()
            partitions = dict(self.partitions)
            return (dict(self.pods), dict(self.nodes), partitions, dict(self.policies),
                    {name: partitions[name] for name in self.dra})


@dataclass(frozen=True)
class ControllerSettings:
    batch_idle_s: float = 0.5
    batch_max_s: float = 3.0
    plan_timeout_s: float = 120.0
    release_timeout_s: float = 300.0
    release_grace_s: float = 10.0
    """A released pod the cache still shows waiting (gated, or unschedulable and unbound)
    this long after its release goes back to planning: the release failed, or its node
    lost the room. Until then it is not planned again: the watch shows an ungating a little
    after the controller made it, and a pod planned twice meanwhile took a second slice and
    kept restarting the batch window (found by bench/scale_bench.py: a plan every 1.6 s
    instead of every 0.5 s through a burst)."""
    solver: planner.SolverName = "fast"
    stale_s: float = 30.0
    """A placed pod whose node reported its plan but whose allocatable still has no room for
    it this long after (the kubelet publishes within ~10 s) goes back to planning: the plan
    was made on a view the cluster did not bear out, and waiting for ``release_timeout_s``
    would strand it while a slice it could use sits free elsewhere."""
    resync_s: float = 30.0
    """Pods that did not fit are planned again only when the cluster changed (a pod came or
    went, a slice freed, a node, policy or plan report changed) or after this long: time alone
    can matter (a GPU's repartition interval running out)."""
    dra_requeue_s: float = 10.0
    """A DRA pod asking MPS shares that the scheduler turned down while a node has shares
    free is sent back to the scheduler after this long (see ``Controller._requeue_shares``)."""
    backlog_batch_s: float = 5.0
    """The batch window (idle and max) while pods the last plan could not place still wait.
    They wait for capacity anyway, and one plan over the departures and arrivals of a few
    seconds packs better than a plan per departure: on the simulation grid, driving this
    controller, 5 s instead of 0.5/3 s served up to 5.5 points more compute under overload
    (bench/README.md). A pod arriving to a cluster with room still waits only batch_idle_s."""
    per_shape: int = planner.DEFAULT_PER_SHAPE
    """Pods of one request shape a plan considers at most (:func:`planner.bounded_batch`)."""
    reservations: int = planner.DEFAULT_RESERVATIONS
    """Waiting pods that may hold GPUs back from later ones in one plan (the objective's
    bounded backfill)."""
    reserve_after_waits: float = 2.0
    """A waiting pod may reserve GPUs only once it has waited this many times the median wait
    of the pods lately released (:mod:`tessera.controller.waits`; 0: at once). Most pods that
    find no room start seconds later anyway; reserving at once held GPUs idle for them. On
    the simulation grid, 2 served more compute than reserving at once (bench/README.md)."""
    dra_node_selector: tuple[tuple[str, str], ...] = ()
    """Labels of the DRA nodes (the chart's ``dra.nodeSelector``): added to a pod handed to
    DRA, so it lands only where the scheduler allocates slices itself."""
    namespace: str = "tessera"
    """Where the controller runs, and creates its scale-up placeholder pods."""
    scale_up_priority_class: str = ""
    """The PriorityClass of placeholder pods (the chart's, below every workload)."""
    scale_up_ttl_s: float = 900.0
    """A placeholder no node answered this long is deleted (and asked again if still needed):
    none stays behind."""
    scale_up_image: str = "registry.k8s.io/pause:3.10"
    """The placeholders' image: they never start (deleted before their node is Ready)."""
    provisioning_requests: bool = False
    """The API server serves autoscaling.x-k8s.io/v1 ProvisioningRequests (found at start):
    scale-up policies with method auto ask through them instead of placeholder pods."""
    scale_up_resync_s: float = 5.0
    """Scale-up is reconsidered on any change of its inputs, or at least this often (node
    arrival and placeholder expiry are timed)."""


@dataclass
class _Waiting:
    node: str
    requests: tuple[tuple[str, int], ...]
    since: float
    settled: float | None = None
    """When the node's plan was reported while this pod still did not fit its allocatable."""
    released_at: float | None = None
    """When it was released (pinned and ungated)."""


@dataclass
class _State:
    batch_opened: float | None = None
    batch_changed: float = 0.0
    batch_keys: frozenset[str] = frozenset()
    waiting: dict[str, _Waiting] = field(default_factory=dict)
    released: dict[str, _Waiting] = field(default_factory=dict)
    inflight_since: dict[str, tuple[str, float]] = field(default_factory=dict)
    written: dict[str, tuple[str, float]] = field(default_factory=dict)
    """Specs this controller wrote, by node, until the cache shows them."""
    enforced: dict[str, tuple[PartitionPolicy, NodePartition]] = field(default_factory=dict)
    """Per node, the policy and NodePartition objects its policy last asked nothing of: the
    cache replaces an object on every change, so the same objects need no second look."""
    specs: dict[str, NodePartitionSpec] = field(default_factory=dict)
    """The last spec this controller wrote per node: what an in-flight node is becoming."""
    given_up: set[str] = field(default_factory=set)
    settled: dict[str, NodePartition] = field(default_factory=dict)
    """Per node, the NodePartition object last found with its plan applied and none of this
    controller's writes pending: the same object is not in flight, without a second look
    (the walk over every NodePartition was a large part of a tick at 2,000 nodes)."""
    last_change: dict[tuple[str, int], float] = field(default_factory=dict)
    told: dict[str, str] = field(default_factory=dict)
    counter: int = 0
    last_inputs: object = None
    """What the last plan was made from (snapshot without its clock, pending pods)."""
    last_plan_at: float = float("-inf")
    backlog: bool = False
    """The last plan left pods waiting (unplaced, or not in its batch): the next batch window
    is ``backlog_batch_s``."""
    more: bool = False
    """The last plan left pods of some shape for the next one (its batch was bounded) while
    capacity may remain: the next tick plans again even if nothing else changed."""
    dra_released: set[str] = field(default_factory=set)
    """Pods handed to DRA whose ungating the cache has not shown yet."""
    dra_told: set[str] = field(default_factory=set)
    """Pods told once that no DRA node offers their profile."""
    view_version: int = 0
    """Counted up on every tick the cache delivered a Node or NodePartition change."""
    enforce_dirty: set[str] = field(default_factory=set)
    """Nodes whose Node or NodePartition changed since enforcement last walked."""
    enforce_flight: frozenset[str] = frozenset()
    """The plans in flight when enforcement last walked."""
    enforce_counter: int | None = None
    """:attr:`counter` when enforcement last walked (a write since: walk again); None: it
    has not walked since the policies changed, every node is to look at."""
    enforce_again: set[str] = field(default_factory=set)
    """Nodes enforcement must look at on every walk: written to, or with a problem."""
    enforce_retry: bool = False
    """Walk again even if nothing changed (a policy status was written)."""
    status_said: dict[str, tuple[object, ...]] = field(default_factory=dict)
    """Per policy, the policy object, matched nodes and verdict its status was last found
    right for (compared by identity: the same need no new status)."""
    inflight_dirty: set[str] = field(default_factory=set)
    """Nodes whose NodePartition changed since the in-flight walk."""
    inflight_walked: bool = False
    unsettled: set[str] = field(default_factory=set)
    """Nodes the in-flight walk found not settled: looked at on every walk."""
    enforce_seen: dict[str, tuple[RawObject, NodePartition | None, bool]] = field(
        default_factory=dict)
    """Per node, the Node and NodePartition objects and in-flight flag enforcement last found
    it needing nothing with: the same again needs no second look (with the policies the
    same, :attr:`enforce_chosen`). A node written to or with a problem is not kept here, so
    it is looked at again every time."""
    enforce_chosen: tuple[PartitionPolicy, ...] = ()
    node_match: dict[str, str | None] = field(default_factory=dict)
    """Per node, the name of the policy that selects it (None: none)."""
    matched: dict[str, list[str]] | None = None
    """Per policy, the nodes it selects, sorted: built again only when :attr:`node_match`
    changed."""
    views: SnapshotBuilder = field(default_factory=SnapshotBuilder)
    """Each node's planner view between plans (rebuilt only where its inputs changed)."""
    node_dirty: set[str] = field(default_factory=set)
    """Nodes whose Node, NodePartition, written spec or change times changed since the last
    snapshot: the cache's (taken with each view) and this controller's writes."""
    node_policy: dict[str, tuple[RawObject, tuple[PartitionPolicy, ...],
                                 PartitionPolicy | None]] = field(default_factory=dict)
    """Per node, the node object and policies its policy was matched from, and the match."""
    dra_inputs: object = None
    """What the last curation was computed from (the DRA partitions by identity, exemptions)."""
    dra_stuck: dict[str, float] = field(default_factory=dict)
    """DRA pods asking MPS shares the scheduler turned down: when first seen so."""
    dra_requeued_at: float | None = None
    """When the shares' DeviceClass was last touched."""
    dra_requeue_wait: float | None = None
    """How long after the last touch the next may come (doubles while pods stay down)."""
    unplaced: dict[str, float] = field(default_factory=dict)
    """Pods the last plan that considered them could not place (the scale-up demand), with
    when (wall clock) they were first found so."""
    planned_nodes: frozenset[str] = frozenset()
    """Nodes with reported GPUs in the last plan's view: a node not among them is capacity
    the planner has not tried yet, so scale-up counts it as still arriving."""
    scale_inputs: object = None
    scale_at: float = float("-inf")
    scale_created: dict[str, tuple[RawObject, float]] = field(default_factory=dict)
    """Placeholders this controller created that the cache does not show yet (with when):
    counted as existing, so a tick before the watch delivers them does not ask twice."""
    waits: RecentWaits = field(default_factory=RecentWaits)
    """How long the pods lately released waited (creation to release), starting from those
    the cluster showed bound when this controller began to lead (:meth:`Controller._seed`)."""
    seeded: bool = False
    reserve_after: float = 0.0
    """How long a pod had to have waited to reserve GPUs in the last plan (seconds)."""
    reserve_due: float = float("inf")
    """When (wall clock) the first pod of the last plan that was too new to reserve will have
    waited long enough: time alone then changes the plan, so it is made again."""


@dataclass
class _DraSorting:
    kept: dict[str, RawObject] = field(default_factory=dict)
    """Pods the planner handles (device-plugin nodes)."""
    hand_over: list[str] = field(default_factory=list)
    """Gated pods a DRA node would take: released to the scheduler."""
    exempt: set[str] = field(default_factory=set)
    """Profiles of DRA pods the scheduler could not place: not curated away."""
    unmatched: dict[str, list[str]] = field(default_factory=dict)
    """Pods asking MIG resources no DRA GPU offers."""
    shares_waiting: dict[str, int] = field(default_factory=dict)
    """DRA pods asking MPS shares that the scheduler found no device for: units asked."""
    shares_used: dict[str, int] = field(default_factory=dict)
    """MPS share units held by the pods bound to each DRA node."""


V = TypeVar("V")


def _without(names: Mapping[str, object], objects: Mapping[str, V]) -> dict[str, V]:
    """``objects`` but those named in ``names`` (the DRA nodes, out of the planner's view)."""
    return {k: v for k, v in objects.items() if k not in names}


def _demand_mix(pods: Iterable[planner.PendingPod]) -> dict[str, float]:
    """Units per resource the waiting pods ask: the demand placements keep capacity usable
    for (the whole backlog's mix, not one bounded batch's, which over-weights rare shapes)."""
    mix: dict[str, float] = {}
    for pod in pods:
        for resource, count in pod.requests:
            mix[resource] = mix.get(resource, 0.0) + count
    return mix


class Controller:
    def __init__(self, cache: ClusterCache, writer: Writer,
                 settings: ControllerSettings | None = None, *,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time,
                 metrics: Metrics | None = None) -> None:
        self.cache = cache
        self.writer = writer
        self.settings = settings or ControllerSettings()
        self._clock = clock
        self._wall = wall_clock
        self.metrics = metrics or _NoMetrics()
        self.state = _State()
        cache.placeholder_namespace = self.settings.namespace

    def reset(self) -> None:
        """Forget in-memory decisions (after losing leadership); the cluster holds the rest."""
        self.state = _State()

    # -- helpers ----------------------------------------------------------------------------

    def _seed(self, pods: Mapping[str, RawObject]) -> None:
        """Once per lead: the recent waits, from the GPU pods the cluster shows bound (creation
        to binding), so that a restarted controller, a new leader and a dry run hold pods to
        the same wait before they reserve GPUs as the controller that released them did."""
        state = self.state
        if state.seeded:
            return
        state.seeded = True
        bound: list[tuple[float, float]] = []
        for key, raw in pods.items():
            facts = self.cache.facts(key, raw)
            at = demand.scheduled_at(raw)
            if (at is not None and facts.created is not None and facts.requests
                    and not demand.is_placeholder(raw, self.settings.namespace)):
                bound.append((at, at - facts.created))
        if state.waits.seed(bound):
            log.info("recent waits: %d taken from the pods bound before this controller led; "
                     "a pod reserves GPUs after %.0f s", len(state.waits),
                     state.waits.reserve_after(self.settings.reserve_after_waits))

    def _inflight(self, partitions: Mapping[str, NodePartition], now: float) -> set[str]:
        state = self.state
        inflight: set[str] = set()
        settled = state.settled
        # Only nodes whose NodePartition changed, those not settled last time and those this
        # controller wrote to can be in flight: the others are as the last walk found them.
        if state.inflight_walked:
            names = sorted(state.inflight_dirty | state.unsettled | state.written.keys())
        else:
            names = sorted(partitions)
            state.inflight_walked = True
        state.inflight_dirty = set()
        for name in names:
            partition = partitions.get(name)
            if partition is None:  # gone (or now a DRA node's)
                settled.pop(name, None)
                state.unsettled.discard(name)
                continue
            state.unsettled.add(name)  # until found settled below
            if settled.get(name) is partition and name not in state.written:
                state.unsettled.discard(name)
                continue
            wanted = partition.spec.plan_id
            applied = partition.status.applied_plan_id if partition.status else None
            written = state.written.get(name)
            if written is not None and written[0] != wanted:
                if now - written[1] <= self.settings.plan_timeout_s:
                    inflight.add(name)  # our write has not reached the cache yet
                    continue
                del state.written[name]
            if not wanted or wanted == applied:
                state.written.pop(name, None)
                if name in state.inflight_since:
                    del state.inflight_since[name]
                settled[name] = partition
                state.unsettled.discard(name)
                continue
            key = f"{name}/{wanted}"
            if key in state.given_up:
                continue
            seen = state.inflight_since.get(name)
            if seen is None or seen[0] != wanted:
                state.inflight_since[name] = (wanted, now)
                seen = state.inflight_since[name]
            if now - seen[1] > self.settings.plan_timeout_s:
                state.given_up.add(key)
                self.writer.partition_event(
                    name, "PlanTimedOut", f"the agent has not reported plan {wanted} after "
                    f"{self.settings.plan_timeout_s:.0f} s; planning over this node again", True)
                continue
            inflight.add(name)
        return inflight

    def _claimed(self, pods: Mapping[str, RawObject], bound: Mapping[str, Mapping[str, int]],
                 placed: bool = False) -> dict[str, dict[str, int]]:
        """GPU units held per node by pods bound there (or released to it); with ``placed``,
        also by pods a plan put there that wait for the slice to show: a new plan must not
        hand the same slice to another pod meanwhile (it did, when a node applied its plan
        before the kubelet advertised the slice)."""
        claimed = {node: dict(held) for node, held in bound.items()}
        if placed:
            for key, waiting in self.state.waiting.items():
                if key in pods and not pods[key].get("spec", {}).get("nodeName"):
                    slot = claimed.setdefault(waiting.node, {})
                    for resource, count in waiting.requests:
                        slot[resource] = slot.get(resource, 0) + count
        return claimed

    def _bound(self, pods: Mapping[str, RawObject]) -> dict[str, dict[str, int]]:
        """Units held per node by pods bound or released there: one pass over the pods per
        tick, shared by the plan and the releases (which add their own as they go)."""
        claimed: dict[str, dict[str, int]] = {}
        for key, pod in pods.items():
            facts = self.cache.facts(key, pod)
            if facts.terminal or not facts.requests:
                continue
            node = pod.get("spec", {}).get("nodeName")
            released = self.state.released.get(key)
            if not node and released is not None:
                node = released.node
            if not node:
                continue
            slot = claimed.setdefault(node, {})
            for resource, count in facts.requests.items():
                slot[resource] = slot.get(resource, 0) + count
        return claimed

    def _write(self, node: str, spec: NodePartitionSpec, partition: NodePartition | None,
               reason: str, now: float) -> None:
        if not self.writer.write_spec(node, spec, partition):
            return
        self.state.written[node] = (spec.plan_id or "", now)
        self.state.specs[node] = spec
        self.state.node_dirty.add(node)  # its written spec and change times are in its view
        for gpu in spec.gpus:
            if gpu.index is not None:
                self.state.last_change[(node, gpu.index)] = self._wall()
        self.writer.partition_event(node, reason, f"wrote plan {spec.plan_id}", False)

    # -- the tick ---------------------------------------------------------------------------

    def tick(self) -> None:
        now = self._clock()
        pods, nodes, partitions, policies, on_dra = self._loop_view()
        if on_dra:
            # DRA nodes have no layouts to plan: the scheduler allocates there (tessera.
            # controller.dra); the rest of the tick sees only device-plugin nodes and pods.
            pods = self._serve_dra(pods, dra.dra_nodes(nodes, on_dra), on_dra)
            nodes, partitions = _without(on_dra, nodes), _without(on_dra, partitions)
        self._seed(pods)
        inflight = self._inflight(partitions, now)
        # What changed since a step last looked: the nodes' version (counted up whenever the
        # cache delivered a Node or NodePartition change) and the policies (few) by identity;
        # scale-up skips an unchanged view.
        seen = (self.state.view_version, tuple(map(id, policies.values())))
        self._enforce_policies(nodes, partitions, list(policies.values()), inflight, now)
        inflight |= set(self.state.written)
        self._forget(pods, now)
        waiting = {k: p for k, p in pods.items()
                   if self.cache.facts(k, p).waiting and k not in self.state.released}
        self.metrics.record_tick(len(waiting), True, self._oldest_wait(waiting))
        self._forget_placed(waiting)
        fresh = frozenset(k for k in waiting if k not in self.state.waiting)
        bound = self._bound(pods)
        if fresh and self._batch_closed(fresh, now):
            self._plan(waiting, pods=pods, bound=bound, nodes=nodes, partitions=partitions,
                       policies=list(policies.values()), inflight=inflight, now=now)
        # A node this tick's plan just wrote is in flight too: its allocatable (read before
        # the write) may still show a free slice the plan destroys, and a pod released onto
        # it would be refused by the kubelet (found by the simulator driving this loop).
        self._release(pods, bound, nodes, partitions,
                      inflight=inflight | set(self.state.written), now=now)
        self._scale_up(waiting, nodes, partitions, list(policies.values()), now, seen=seen)

    def _loop_view(self) -> tuple[dict[str, RawObject], dict[str, RawObject],
                                  dict[str, NodePartition], dict[str, PartitionPolicy],
                                  dict[str, NodePartition]]:
        """The cache's view, and the nodes whose Node or NodePartition changed since the last
        one handed to each step that keeps its own account (the snapshot, enforcement, the
        in-flight walk): each then looks only at those."""
        state = self.state
        taken: set[str] = set()
        view = self.cache.loop_view(taken)
        if taken:
            state.view_version += 1
            state.node_dirty |= taken
            state.enforce_dirty |= taken
            state.inflight_dirty |= taken
        return view

    def _sort_dra(self, pods: Mapping[str, RawObject],
                  dra_nodes: Sequence[tuple[planner.Node, frozenset[str]]],
                  on_dra: Mapping[str, NodePartition]) -> _DraSorting:
        """Which pods are DRA's (to hand over, or handed over already) and which the planner
        keeps; pure, so :meth:`preview` shows what a tick would do."""
        selector = dict(self.settings.dra_node_selector)
        offered = dra.offered_resources(on_dra.values())
        found = _DraSorting()
        for key, pod in pods.items():
            facts = self.cache.facts(key, pod)
            node = pod.get("spec", {}).get("nodeName")
            if (facts.terminal or not facts.requests
                    or not dra.servable(facts.requests, offered) or (node and node not in on_dra)):
                if not node and not facts.terminal:
                    missing = dra.unservable_profiles(facts.requests, offered)
                    if missing:
                        found.unmatched[key] = missing
                found.kept[key] = pod
            elif demand.is_gated(pod):
                if dra.admitted(facts.pending, selector, dra_nodes):
                    found.hand_over.append(key)
                else:
                    found.kept[key] = pod  # aimed elsewhere (node selector, affinity): planned
            elif node or (dra.is_dra_pod(pod, selector) if selector
                          else dra.admitted(facts.pending, selector, dra_nodes)):
                shares = facts.requests.get(catalogue.MPS_SHARED_RESOURCE, 0)
                if node and shares:
                    found.shares_used[node] = found.shares_used.get(node, 0) + shares
                if facts.waiting:  # the scheduler found no device: curation must not hide one
                    found.exempt.update(catalogue.profile_name_from_resource(r)
                                        for r in facts.requests
                                        if r.startswith(catalogue.MIG_RESOURCE_PREFIX))
                    if shares:
                        found.shares_waiting[key] = shares
            else:
                found.kept[key] = pod
        return found

    def _serve_dra(self, pods: Mapping[str, RawObject],
                   dra_nodes: Sequence[tuple[planner.Node, frozenset[str]]],
                   on_dra: Mapping[str, NodePartition]) -> dict[str, RawObject]:
        """Hand gated pods DRA can serve to the scheduler; curate; return the other pods."""
        state = self.state
        selector = dict(self.settings.dra_node_selector)
        found = self._sort_dra(pods, dra_nodes, on_dra)
        for key, missing in sorted(found.unmatched.items()):
            if key not in state.dra_told:
                state.dra_told.add(key)
                self.writer.pod_event(
                    key, "NoDraMatch", f"no DRA node offers {', '.join(missing)}: their GPUs "
                    f"({', '.join(dra.models_of(on_dra.values()))}) have no such MIG profile; "
                    "only device-plugin nodes can take this pod", True)
        for key in found.hand_over:
            if key not in state.dra_released and self.writer.release_to_dra(key, selector):
                state.dra_released.add(key)
                created = self.cache.facts(key, pods[key]).created
                self.metrics.record_release(
                    None if created is None else max(0.0, self._wall() - created))
        state.dra_released &= {k for k, p in pods.items() if demand.is_gated(p)}
        state.dra_told &= set(pods)
        self._curate(on_dra, frozenset(found.exempt))
        self._requeue_shares(found, on_dra)
        return found.kept

    def _requeue_shares(self, found: _DraSorting, on_dra: Mapping[str, NodePartition]) -> None:
        """Have kube-scheduler look again at MPS-share pods it found no device for while a
        DRA node has shares free.

        The scheduler retries a pod DRA turned down only on a ResourceSlice, DeviceClass or
        claim change that could help it (or after five minutes). A burst of share pods can be
        turned down with a share free: while a bound pod's claim is both in the scheduler's
        cache and still counted in flight, its consumable capacity counts twice (seen in the
        e2e: two of five pods left waiting 90 s beside a free share). No later event comes, so
        after ``dra_requeue_s`` the controller touches the shares' DeviceClass (an annotation),
        which sends those pods back to the scheduling queue; only while the shares asked fit on
        some node, and less often each time while pods stay turned down (10, 20, 40 s ... up
        to the scheduler's own five minutes): a pod turned down for another reason (its own
        node selector, CPU) would otherwise have the class touched forever."""
        state = self.state
        now = self._clock()
        state.dra_stuck = {k: state.dra_stuck.get(k, now) for k in found.shares_waiting}
        if not state.dra_stuck:
            state.dra_requeue_wait = self.settings.dra_requeue_s
            return
        wait = state.dra_requeue_wait or self.settings.dra_requeue_s
        due = [k for k, since in state.dra_stuck.items()
               if now - since >= self.settings.dra_requeue_s]
        if not due or (state.dra_requeued_at is not None
                       and now - state.dra_requeued_at < wait):
            return
        free = dra.free_shares(on_dra, found.shares_used)
        if not any(found.shares_waiting[k] <= left for k in due for left in free.values()):
            return
        state.dra_requeued_at = now
        state.dra_requeue_wait = min(2 * wait, _SCHEDULER_FLUSH_S)
        log.info("%d pod(s) asking MPS shares wait on the scheduler while %s has shares "
                 "free; touching DeviceClass %s so it looks again", len(due),
                 ", ".join(f"{n} ({left})" for n, left in sorted(free.items())),
                 MPS_DEVICE_CLASS)
        self.writer.requeue_dra(MPS_DEVICE_CLASS)

    def _curate(self, on_dra: Mapping[str, NodePartition], exempt: frozenset[str]) -> None:
        """Write each DRA node's ``spec.dra`` where curation changed it."""
        inputs = (tuple((name, id(p)) for name, p in sorted(on_dra.items())), exempt)
        if inputs == self.state.dra_inputs:
            return
        self.state.dra_inputs = inputs
        for node, wanted in dra.curation(on_dra, exempt).items():
            partition = on_dra[node]
            if (partition.spec.dra or DraSpec()) == wanted:
                continue
            spec = partition.spec.model_copy(update={"dra": wanted})
            if not self.writer.write_spec(node, spec, partition):
                self.state.dra_inputs = None  # lost a race: curate again next tick

    def _scale_up(self, waiting: Mapping[str, RawObject], nodes: Mapping[str, RawObject],
                  partitions: Mapping[str, NodePartition], policies: list[PartitionPolicy],
                  now: float, *, seen: object) -> None:
        """Ask the autoscaler for the capacity the unplaced pods need; hand over, expire and
        withdraw placeholders (:mod:`tessera.controller.scaleup`)."""
        state = self.state
        state.unplaced = {k: t for k, t in state.unplaced.items() if k in waiting}
        raw = self.cache.placeholder_view()
        for name, (body, since) in list(state.scale_created.items()):
            if name in raw or now - since > self.settings.plan_timeout_s:
                del state.scale_created[name]
            else:
                raw[name] = body
        enabled = any(p.spec.scale_up is not None and p.spec.scale_up.enabled
                      for p in policies)
        if not enabled and not raw:
            return
        unplaced = {k: waiting[k] for k in state.unplaced if k not in state.waiting}
        inputs = (state.planned_nodes, frozenset((k, id(p)) for k, p in unplaced.items()),
                  frozenset((k, id(p)) for k, p in raw.items()), seen)
        if (inputs == state.scale_inputs
                and now - state.scale_at < self.settings.scale_up_resync_s):
            return
        state.scale_inputs, state.scale_at = inputs, now
        placeholders = [found for body in raw.values()
                        if (found := scaleup.Placeholder.of(body)) is not None]
        decided = scaleup.plan_round(
            [self.cache.facts(k, p).pending for k, p in sorted(unplaced.items())],
            placeholders, nodes=nodes, partitions=partitions, policies=policies,
            now=self._wall(), ttl_s=self.settings.scale_up_ttl_s, planned=state.planned_nodes,
            since=state.unplaced,
            provisioning_requests=self.settings.provisioning_requests)
        for placeholder, reason in decided.delete:
            state.scale_created.pop(scaleup.cache_key(placeholder.kind, placeholder.key), None)
            self.writer.delete_placeholder(placeholder.kind, placeholder.key, reason)
        by_name = {p.metadata.name: p for p in policies}
        for policy, kind, ask in decided.create:
            body = scaleup.placeholder_body(
                by_name[policy], ask, namespace=self.settings.namespace,
                priority_class=self.settings.scale_up_priority_class,
                image=self.settings.scale_up_image, kind=kind)
            key = self.writer.create_placeholder(body)
            if key is None:
                state.scale_inputs = None  # refused: try again next tick
                continue
            name = key.split("/", 1)[1]
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self._wall()))
            body = {**body, "metadata": {**body["metadata"], "name": name,
                                         "creationTimestamp": stamp}}
            state.scale_created[scaleup.cache_key(kind, key)] = (body, now)
        for pod, (reason, message) in sorted(decided.asked.items()):
            self._tell(pod, reason, message, reason in ("NoScaleUp", "ScaleUpFailed"))
        self.metrics.record_scale_up(decided.requested_gpus)

    def _oldest_wait(self, waiting: Mapping[str, RawObject]) -> float:
        """How long the oldest waiting GPU pod has existed: the age an alert fires on."""
        created = [c for k, p in waiting.items()
                   if (c := self.cache.facts(k, p).created) is not None]
        return max(0.0, self._wall() - min(created)) if created else 0.0

    def _batch_closed(self, fresh: frozenset[str], now: float) -> bool:
        state = self.state
        if state.more:
            # The last plan was cut short (its batch bounded) with capacity left: the pods it
            # left have had their window; waiting another per plan made 1,000 pods of one
            # shape wait 16 windows (bench/scale_bench.py).
            return True
        if state.batch_opened is None:
            state.batch_opened = now
            state.batch_changed = now
            state.batch_keys = fresh
        elif fresh != state.batch_keys:
            state.batch_changed = now
            state.batch_keys = fresh
        idle_s, max_s = self.batch_window()
        idle = now - state.batch_changed >= idle_s
        full = now - state.batch_opened >= max_s
        return idle or full

    def batch_window(self) -> tuple[float, float]:
        """(idle, max) seconds of the batch now: the settings', or ``backlog_batch_s`` for
        both while pods the last plan could not place still wait."""
        settings = self.settings
        if self.state.backlog:
            wait = max(settings.batch_idle_s, settings.backlog_batch_s)
            return wait, max(settings.batch_max_s, wait)
        return settings.batch_idle_s, settings.batch_max_s

    def _forget(self, pods: Mapping[str, RawObject], now: float) -> None:
        """Released pods that are bound, gone or done; and those still waiting
        ``release_grace_s`` after their release, which are planned again."""
        state = self.state
        grace = self.settings.release_grace_s
        for key, released in list(state.released.items()):
            pod = pods.get(key)
            if pod is None or pod.get("spec", {}).get("nodeName") or demand.is_terminal(pod):
                del state.released[key]
            elif (self.cache.facts(key, pod).waiting and released.released_at is not None
                  and now - released.released_at > grace):
                log.warning("pod %s still waits %.0f s after its release onto %s; planning "
                            "it again", key, now - released.released_at, released.node)
                del state.released[key]

    def _forget_placed(self, waiting: Mapping[str, RawObject]) -> None:
        state = self.state
        for key in list(state.waiting):
            if key not in waiting:
                del state.waiting[key]

    def _enforce_policies(self, nodes: Mapping[str, RawObject],
                          partitions: Mapping[str, NodePartition],
                          policies: list[PartitionPolicy], inflight: set[str],
                          now: float) -> None:
        # Only nodes whose Node or NodePartition changed (the cache says which), whose plan
        # went in or out of flight, and those that needed something last time are looked at:
        # the others ask what they asked (nothing). With the same policies, none of those and
        # no write since, there is nothing to do. At 2,000 nodes a walk over every node was
        # most of an idle tick's cost, five ticks a second.
        state = self.state
        chosen = tuple(policies)
        if len(chosen) != len(state.enforce_chosen) or any(
                a is not b for a, b in zip(chosen, state.enforce_chosen, strict=True)):
            state.enforce_chosen = chosen
            state.enforce_seen = {}
            state.matched = None
            state.enforce_counter = None
        flights = frozenset(inflight)
        if state.enforce_counter is None:
            names = set(nodes) | state.enforce_dirty
        else:
            moved = flights ^ state.enforce_flight
            if (not state.enforce_dirty and not moved and not state.enforce_retry
                    and state.counter == state.enforce_counter):
                return
            names = state.enforce_dirty | moved | state.enforce_again
        state.enforce_dirty = set()
        state.enforce_flight = flights
        state.enforce_counter = state.counter
        state.enforce_retry = False
        problems: dict[str, str] = {}
        seen_before = state.enforce_seen
        for name in sorted(names):
            node = nodes.get(name)
            if node is None:
                continue  # gone: forgotten below
            partition = partitions.get(name)
            flight = name in inflight
            last = seen_before.get(name)
            # One that needs nothing is skipped while its objects stay the same; the others
            # (written to, with a problem) are looked at on every walk.
            if (last is not None and last[0] is node and last[1] is partition
                    and last[2] == flight) or self._enforce_node(
                        name, node, partition, flight=flight, chosen=chosen,
                        problems=problems, now=now):
                seen_before[name] = (node, partition, flight)
                state.enforce_again.discard(name)
            else:
                seen_before.pop(name, None)
                state.enforce_again.add(name)
        if len(self.state.node_policy) > len(nodes):  # nodes went: forget them
            self.state.node_policy = {k: v for k, v in self.state.node_policy.items()
                                      if k in nodes}
            state.enforce_again &= nodes.keys()
        if len(state.node_match) > len(nodes):
            # Nodes went (after the walk: every node there is now has its entry, so a node
            # that went while another came is not missed): forget them.
            state.node_match = {k: v for k, v in state.node_match.items() if k in nodes}
            state.enforce_seen = {k: v for k, v in state.enforce_seen.items() if k in nodes}
            state.matched = None
        matched = state.matched
        if matched is None:
            matched = {p.metadata.name: [] for p in policies}
            for name, chose in sorted(state.node_match.items()):
                if chose is not None and chose in matched:
                    matched[chose].append(name)
            state.matched = matched
        _, scale_up_problems = scaleup.targets(policies, self.settings.provisioning_requests)
        reasons = {key: "ScaleUpInvalid" for key in scale_up_problems if key not in problems}
        for key, text in scale_up_problems.items():
            problems.setdefault(key, text)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self._wall()))
        for policy in policies:
            name = policy.metadata.name
            problem = problems.get(name)
            # The same policy object, matched list and verdict as last time need no second
            # status (at 2,000 nodes, building one to compare was most of a walk's cost).
            said = (policy, matched[name], problem, reasons.get(name))
            before = state.status_said.get(name)
            if before is not None and all(a is b for a, b in zip(before, said, strict=True)):
                continue
            state.status_said[name] = said
            status = PartitionPolicyStatus(matched_nodes=list(matched[name]), conditions=[
                Condition(type="Invalid", status="True" if problem else "False",
                          reason=(reasons.get(name, "LayoutDoesNotFit") if problem
                                  else "Valid"),
                          message=problem or "the policy applies to every matched node",
                          last_transition_time=stamp,
                          observed_generation=policy.metadata.generation)])
            if comparable(policy.status) != comparable(status):
                self.writer.policy_status(name, status)
                self.state.enforce_retry = True  # look again once the cache shows it
                del state.status_said[name]

    def _enforce_node(self, name: str, node: RawObject, partition: NodePartition | None, *,
                      flight: bool, chosen: tuple[PartitionPolicy, ...],
                      problems: dict[str, str], now: float) -> bool:
        """Ask of one node what its policy wants (a spec write), noting which policy selects
        it and any problem; True when it needs nothing."""
        state = self.state
        policy = self._policy_of(name, node, chosen)
        policy_name = policy.metadata.name if policy is not None else None
        if name not in state.node_match or state.node_match[name] != policy_name:
            state.node_match[name] = policy_name
            state.matched = None
        if policy is None or partition is None or flight:
            return True
        enforced = state.enforced.get(name)
        if enforced is not None and enforced[0] is policy and enforced[1] is partition:
            return True
        try:
            wanted = policy_gpu_specs(policy, partition)
        except InvalidInputError as exc:
            problems[policy.metadata.name] = f"node {name}: {exc}"
            return False
        if wanted is None:
            state.enforced[name] = (policy, partition)
            return True
        current = list(partition.spec.gpus)
        if policy.spec.mode == "dynamic":
            # Only cards not yet in MIG mode need a word before planning; the planner's own
            # writes name the MIG cards it changes.
            named = {g.index for g in current}
            whole = {o.index for o in partition.status.gpus if o.mode != "mig"} if (
                partition.status) else set()
            missing = [g for g in wanted if g.index not in named and g.index in whole]
            if not missing:
                state.enforced[name] = (policy, partition)
                return True
            gpus = sorted([*current, *missing], key=lambda g: g.index or 0)
        else:
            if [g.to_wire() for g in current] == [g.to_wire() for g in wanted]:
                state.enforced[name] = (policy, partition)
                return True
            gpus = wanted
        state.counter += 1
        spec = NodePartitionSpec(gpus=gpus)
        spec = spec.model_copy(update={"plan_id": plan_id(name, spec, state.counter)})
        self._write(name, spec, partition, f"Policy{policy.spec.mode.capitalize()}", now)
        return False

    def _policy_of(self, name: str, node: RawObject, policies: tuple[PartitionPolicy, ...]
                   ) -> PartitionPolicy | None:
        """The node's policy, matched again only when the node or the policies changed (the
        cache replaces an object on every change): most nodes are the same objects tick
        after tick."""
        memo = self.state.node_policy.get(name)
        if memo is not None and memo[0] is node and memo[1] == policies:
            return memo[2]
        policy = policy_for(node_labels(node), policies)
        self.state.node_policy[name] = (node, policies, policy)
        return policy

    def _plan(self, waiting: Mapping[str, RawObject], *, pods: Mapping[str, RawObject],
              bound: Mapping[str, Mapping[str, int]], nodes: Mapping[str, RawObject],
              partitions: Mapping[str, NodePartition], policies: list[PartitionPolicy],
              inflight: set[str], now: float) -> None:
        state = self.state
        candidates = {k: p for k, p in waiting.items() if k not in state.waiting}
        snapshot = self._snapshot(pods, bound, nodes, partitions, policies=policies,
                                  inflight=inflight)
        # The pods by identity (a changed pod is a new object in the cache), not by value:
        # hashing thousands of pods on every tick costs more than the comparison saves.
        inputs = (replace(snapshot, now=None),
                  frozenset((k, id(p)) for k, p in candidates.items()))
        if (inputs == state.last_inputs and now - state.last_plan_at < self.settings.resync_s
                and self._wall() < state.reserve_due):
            # Nothing changed since these pods last found no room: planning again would
            # only repeat that answer (and its cost) every tick.
            state.batch_opened = None
            state.batch_keys = frozenset()
            return
        state.last_inputs, state.last_plan_at = inputs, now
        state.planned_nodes = state.views.planned
        started = time.perf_counter()
        batch, result = self._plan_batch(
            snapshot, [self.cache.facts(k, p).pending for k, p in candidates.items()],
            state.views.index)
        pending = batch.pods
        seconds = time.perf_counter() - started
        state.more = batch.cut_short
        if batch.cut_short:
            # Pods of some shape were left for the next plan while capacity may remain: plan
            # again as soon as this plan's placements are counted, not after the resync.
            state.last_inputs = None
        state.counter += 1
        requests = {f"{p.namespace}/{p.name}": p.requests for p in pending}
        # The policies of the nodes the plan changes (their sharing settings): not all nodes.
        chosen = tuple(policies)
        by_node = {name: found for name in {t.node for t in result.gpus}
                   if (raw_node := nodes.get(name)) is not None
                   and (found := self._policy_of(name, raw_node, chosen)) is not None}
        decision = decide(result, partitions, requests, state.counter, by_node)
        for node, spec in decision.specs.items():
            self._write(node, spec, partitions.get(node), "Repartition", now)
        for placed in decision.pods:
            state.waiting[placed.pod] = _Waiting(placed.node, placed.requests, now)
            self._tell(placed.pod, "Placed", placed.message, False)
        # Scale-up demand: what this plan could not place, and the pods it left for lack of
        # capacity (not those a batch cut short left, which are planned at once), each with
        # when it was first found so.
        later = {left.pod for left in batch.later}
        still = {pod for pod, _ in decision.unplaced} | (set() if batch.cut_short else later)
        wall = self._wall()
        for key in set(requests) | later:
            if key in still:
                state.unplaced.setdefault(key, wall)
            else:
                state.unplaced.pop(key, None)
        for pod, reason in decision.unplaced:
            self._tell(pod, "NoGPUFit", reason, True)
        for left in batch.later:
            self._tell(left.pod, "Waiting", f"not planned yet: {left.reason}", False)
        # A batch cut short is no backlog: the pods it left may fit, and are planned at once.
        state.backlog = bool(decision.unplaced or batch.later) and not batch.cut_short
        state.batch_opened = None
        state.batch_keys = frozenset()
        self.metrics.record_plan(seconds, len(decision.pods), len(decision.unplaced),
                                 decision.created, decision.destroyed)
        log.info("planned %d pod(s) in %.3f s: %d placed, %d unplaced, %d spec(s) written; "
                 "a pod reserves GPUs once it has waited %.0f s", len(pending), seconds,
                 len(decision.pods), len(decision.unplaced), len(decision.specs),
                 state.reserve_after)

    def preview(self) -> planner.Plan:
        """What a plan made now would do, writing nothing (``tessera plan --kubeconfig``): the
        snapshot, the waiting pods and the planner exactly as :meth:`tick` would use them."""
        pods, nodes, partitions, policies, on_dra = self._loop_view()
        if on_dra:  # as a tick: DRA's pods and nodes are the scheduler's
            pods = self._sort_dra(pods, dra.dra_nodes(nodes, on_dra), on_dra).kept
            nodes, partitions = _without(on_dra, nodes), _without(on_dra, partitions)
        self._seed(pods)
        now = self._clock()
        inflight = self._inflight(partitions, now)
        facts = [self.cache.facts(k, p) for k, p in pods.items()
                 if k not in self.state.waiting and k not in self.state.released]
        snapshot = self._snapshot(pods, self._bound(pods), nodes, partitions,
                                  policies=list(policies.values()), inflight=inflight)
        batch, result = self._plan_batch(snapshot, [f.pending for f in facts if f.waiting],
                                         self.state.views.index)
        return replace(result, unplaced=(*result.unplaced, *batch.later))

    def _plan_batch(self, snapshot: planner.Snapshot, waiting: Sequence[planner.PendingPod],
                    index: planner.RoomIndex) -> tuple[planner.Batch, planner.Plan]:
        """The bounded batch of the waiting pods, and the planner's plan for it, with the
        whole backlog's mix as the demand placements keep capacity usable for; ``index``:
        the snapshot's room (kept by the snapshot's builder)."""
        settings = self.settings
        batch = planner.bounded_batch(snapshot, waiting, per_shape=settings.per_shape,
                                      reservations=settings.reservations, index=index)
        demand_mix = _demand_mix(waiting)
        reserve_after = self.state.waits.reserve_after(settings.reserve_after_waits)
        self.state.reserve_after = reserve_after
        self.state.reserve_due = float("inf")
        # On a large cluster, the best-fitting nodes first; every node when that leaves a pod
        # out (planner.narrow).
        narrowed = planner.narrow(snapshot, batch.pods, batch.room, index=index)
        if narrowed is not None:
            result = planner.plan(narrowed, list(batch.pods), solver=settings.solver,
                                  reservations=settings.reservations, recent_demand=demand_mix,
                                  reserve_after_s=reserve_after)
            if not result.unplaced:
                return batch, result
        result = planner.plan(snapshot, list(batch.pods), solver=settings.solver,
                              reservations=settings.reservations, recent_demand=demand_mix,
                              reserve_after_s=reserve_after)
        # A pod left out that was too new to reserve may reserve once it is old enough: time
        # alone changes this plan then (each such pod once; placed pods need no reservation).
        left = {u.pod for u in result.unplaced}
        now = snapshot.now
        self.state.reserve_due = min(
            (due for p in batch.pods
             if p.key in left and now is not None
             and (due := p.creation_time + reserve_after) > now),
            default=float("inf"))
        return batch, result

    def _snapshot(self, pods: Mapping[str, RawObject], bound: Mapping[str, Mapping[str, int]],
                  nodes: Mapping[str, RawObject], partitions: Mapping[str, NodePartition], *,
                  policies: list[PartitionPolicy], inflight: set[str]) -> planner.Snapshot:
        """The planner's view: placed pods that wait for their slice hold it too."""
        state = self.state
        snapshot = state.views.build(nodes, partitions, policies,
                                     self._claimed(pods, bound, placed=True),
                                     dirty=state.node_dirty, frozen=inflight,
                                     last_change=state.last_change, now=self._wall(),
                                     specs=state.specs)
        state.node_dirty = set()
        return snapshot

    def _tell(self, pod: str, reason: str, message: str, warning: bool) -> None:
        if self.state.told.get(pod) == f"{reason}:{message}":
            return
        self.state.told[pod] = f"{reason}:{message}"
        self.writer.pod_event(pod, reason, message, warning)

    def _room(self, node: str, raw: RawObject, partition: NodePartition | None,
              in_flight: bool, resource: str) -> int:
        """Units of ``resource`` the node can hand out now: its allocatable less the slices
        the plan in flight there drops, and for a MIG slice never more than the complete
        slices its agent reports that stay. The kubelet's allocatable lags both ways (a new
        slice shows at its next status sync, a destroyed one goes only then), so it alone
        could release a pod onto a slice that is gone; the agent's report alone could release
        one before the kubelet advertises its slice. Nor is the smaller of the two enough:
        a stale allocatable that still counts a slice being dropped and a report that already
        counts one not yet advertised agree on a slice the kubelet cannot give (found by the
        simulator driving this loop), so a dropped slice comes off the allocatable too."""
        allocatable = node_allocatable(raw, resource)
        if (partition is None or partition.status is None
                or not resource.startswith(catalogue.MIG_RESOURCE_PREFIX)
                or resource.endswith(catalogue.SHARED_SUFFIX)):
            return allocatable
        spec = (self.state.specs.get(node) or partition.spec) if in_flight else None
        targets = {g.index: {(s.profile, s.start) for s in g.slices}
                   for g in (spec.gpus if spec else []) if g.index is not None}
        kept = dropped = 0
        for gpu in partition.status.gpus:
            if not gpu.healthy:
                continue
            target = targets.get(gpu.index)
            for item in gpu.slices:
                if (item.uuid is None or item.mps is not None
                        or catalogue.mig_resource_name(item.profile) != resource):
                    continue
                if target is None or (item.profile, item.start) in target:
                    kept += 1
                else:
                    dropped += 1
        return max(0, min(allocatable - dropped, kept))

    def _release(self, pods: Mapping[str, RawObject], bound: Mapping[str, Mapping[str, int]],
                 nodes: Mapping[str, RawObject], partitions: Mapping[str, NodePartition], *,
                 inflight: set[str], now: float) -> None:
        """Pin and release placed pods whose node has room for them now. A node whose plan
        is in flight releases pods onto the slices it has and keeps (a pod placed on an
        existing slice need not wait for another GPU's reconfiguration); the slices the plan
        makes count once the kubelet advertises them."""
        state = self.state
        claimed = self._claimed(pods, bound)
        for key, waiting in sorted(state.waiting.items(), key=lambda kv: kv[1].since):
            pod = pods.get(key)
            node = nodes.get(waiting.node)
            if pod is None or node is None:
                continue
            if now - waiting.since > self.settings.release_timeout_s:
                del state.waiting[key]  # plan it again with the next batch
                continue
            in_flight = waiting.node in inflight
            held = claimed.setdefault(waiting.node, {})
            partition = partitions.get(waiting.node)
            if any(self._room(waiting.node, node, partition, in_flight, r) < held.get(r, 0) + n
                   for r, n in waiting.requests):
                if in_flight:
                    waiting.settled = None
                elif waiting.settled is None:
                    waiting.settled = now
                elif now - waiting.settled > self.settings.stale_s:
                    log.warning("pod %s: %s reported its plan %.0f s ago but still has no "
                                "room for it; planning it again", key, waiting.node,
                                now - waiting.settled)
                    del state.waiting[key]
                continue
            hostname = node_labels(node).get("kubernetes.io/hostname", waiting.node)
            gated = demand.is_gated(pod)
            self.writer.release_pod(key, waiting.node, hostname, gated, seen=pod)
            created = self.cache.facts(key, pod).created
            self.metrics.record_release(
                None if created is None else max(0.0, self._wall() - created), pinned=gated)
            if created is not None:
                state.waits.add(self._wall() - created)
            for resource, count in waiting.requests:
                held[resource] = held.get(resource, 0) + count
            waiting.released_at = now
            state.released[key] = waiting
            del state.waiting[key]

