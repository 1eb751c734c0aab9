"""The planner's view of the cluster, built from what the API server holds.

Only nodes a PartitionPolicy selects and whose agent has reported its cards take part. A slice
counts as in use when the agent reports it allocated or busy, and also when a pod already bound
to (or pinned by Tessera onto) the node will take it: the kubelet's allocation shows up in the
agent's report only later, and the planner must not hand the same slice out twice.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tessera.api.v1alpha1 import (
    NodePartition,
    NodePartitionSpec,
    ObservedGpu,
    ObservedSlice,
    PartitionPolicy,
)
from tessera.controller.policies import policy_for
from tessera.core import catalogue
from tessera.core.planner import (
    Gpu,
    GpuSlice,
    Node,
    Policy,
    RoomIndex,
    RoomTracker,
    Snapshot,
    Taint,
)
from tessera.core.planner.model import Sharing

__all__ = ["SnapshotBuilder", "build_snapshot", "node_allocatable", "node_labels", "node_taints",
           "node_view"]

RawNode = Mapping[str, Any]


def node_view(node: RawNode) -> dict[str, Any]:
    """What the controller reads of a Node (name, labels, creation, taints, cordon,
    allocatable), and nothing else. The cache keeps this, not the object: kube-controller-
    manager's annotations, heartbeats, conditions and image lists change a Node far more often
    than any of these (16 updates a second at 2,000 nodes, bench/scale_bench.py), and an
    update that leaves the view as it was is no reason to look at the cluster again."""
    meta = node.get("metadata") or {}
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    return {"metadata": {"name": meta.get("name", ""), "labels": meta.get("labels") or {},
                         "creationTimestamp": meta.get("creationTimestamp")},
            "spec": {"taints": spec.get("taints") or [],
                     "unschedulable": bool(spec.get("unschedulable"))},
            "status": {"allocatable": status.get("allocatable") or {}}}


def node_labels(node: RawNode) -> dict[str, str]:
    return dict(node.get("metadata", {}).get("labels") or {})


def node_allocatable(node: RawNode, resource: str) -> int:
    """The node's allocatable count of an (integer, extended) resource; 0 if absent."""
    value = (node.get("status", {}).get("allocatable") or {}).get(resource, "0")
    try:
        return int(str(value))
    except ValueError:
        return 0


def node_taints(node: RawNode) -> tuple[Taint, ...]:
    taints = [Taint(key=t["key"], value=t.get("value", "") or "",
                    effect=t.get("effect", "NoSchedule"))
              for t in node.get("spec", {}).get("taints") or []]
    if node.get("spec", {}).get("unschedulable"):
        taints.append(Taint(key="node.kubernetes.io/unschedulable", effect="NoSchedule"))
    return tuple(taints)


def _card_name(gpu: ObservedGpu) -> str:
    """The catalogue name of a card (MIG-capable or not), else what NVML calls it."""
    if gpu.model:
        return gpu.model
    pci = int(gpu.pci_device_id, 16) if gpu.pci_device_id else None
    found = catalogue.find_card(gpu.name, pci)
    return found.name if found is not None else gpu.name


def _gpu(gpu: ObservedGpu, reserve: Counter[str], last_change: float | None) -> Gpu | None:
    if gpu.model is None and gpu.mode == "mig":
        return None
    model = _card_name(gpu)
    if gpu.mode == "mig":
        slices = []
        for item in sorted(gpu.slices, key=lambda s: s.start):
            if item.mps is not None:  # its shares, not the slice, are offered
                shared = catalogue.shared_mig_resource_name(item.profile)
                held = min(item.mps.shares, max(0, reserve[shared]))
                reserve[shared] -= held
                slices.append(GpuSlice(profile=item.profile, start=item.start, in_use=True,
                                       shares=item.mps.shares, shares_in_use=held))
                continue
            busy = item.allocated or item.processes > 0 or item.uuid is None
            resource = catalogue.mig_resource_name(item.profile)
            if not busy and reserve[resource] > 0:
                reserve[resource] -= 1  # a bound pod whose allocation is not reported yet
                busy = True
            slices.append(GpuSlice(profile=item.profile, start=item.start, in_use=busy))
        return Gpu(index=gpu.index, model=model, mode="mig", slices=tuple(slices),
                   last_change=last_change)
    shares = 0
    sharing: Sharing = "mps"
    if gpu.mode == "mps" and gpu.mps is not None:
        shares = gpu.mps.shares
    elif gpu.mode == "timeslice" and gpu.timeslice is not None:
        if gpu.timeslice.resource != catalogue.MPS_SHARED_RESOURCE:
            return None  # replicas named nvidia.com/gpu: not units the planner counts
        shares, sharing = gpu.timeslice.replicas, "timeslice"
    if shares:
        resource = gpu.mps.resource if gpu.mode == "mps" and gpu.mps is not None else (
            catalogue.MPS_SHARED_RESOURCE)
        held = min(shares, max(0, reserve[resource]))
        reserve[resource] -= held
        return Gpu(index=gpu.index, model=model, mode="mps", shares=shares,
                   shares_in_use=held, sharing=sharing, share_resource=resource,
                   last_change=last_change)
    held_whole = reserve[catalogue.WHOLE_GPU_RESOURCE] > 0
    if held_whole:
        reserve[catalogue.WHOLE_GPU_RESOURCE] -= 1
    return Gpu(index=gpu.index, model=model, mode="none", in_use=held_whole,
               last_change=last_change)


_PLANNED = "planned"
"""The UUID a slice the in-flight plan makes carries in the planner's view (a slice without
one is an incomplete GPU instance, in use)."""


def _planned(gpu: ObservedGpu, spec: NodePartitionSpec) -> ObservedGpu:
    """A MIG GPU as the in-flight spec will leave it: the spec's slices, each still in use
    where the agent reports it allocated or busy (the agent never destroys those). A slice not
    made yet counts as free: the pods the plan put there hold it through their claims, and
    another pod placed on it is released only once it exists and is advertised."""
    if gpu.mode != "mig":
        return gpu
    wanted = next((g for g in spec.gpus if g.index == gpu.index), None)
    if wanted is None or wanted.mode not in (None, "mig"):
        return gpu
    now = {(s.profile, s.start): s for s in gpu.slices}
    slices = []
    for target in wanted.slices:
        found = now.get((target.profile, target.start))
        slices.append(found if found is not None else ObservedSlice(
            profile=target.profile, start=target.start, gpu_instance_id=-1, uuid=_PLANNED))
    kept = {(s.profile, s.start) for s in wanted.slices}
    slices.extend(s for s in gpu.slices  # in use: the agent keeps them whatever the spec says
                  if (s.profile, s.start) not in kept and (s.allocated or s.processes))
    return gpu.model_copy(update={"slices": slices})


def _share_settings(policy: PartitionPolicy) -> tuple[Sharing | None, int]:
    """The kind and number of shares a dynamic policy lets the planner make of a whole GPU."""
    modes = set(policy.spec.allowed_modes)
    if policy.spec.mode != "dynamic":
        return None, 0
    if "mps" in modes and policy.spec.mps is not None:
        return "mps", policy.spec.mps.shares
    if "timeslice" in modes and policy.spec.timeslice is not None:
        return "timeslice", policy.spec.timeslice.replicas
    return None, 0


_MISSING = object()


class SnapshotBuilder:
    """The planner's view kept between plans and rebuilt only for the nodes whose inputs
    changed, as the caller says: a plan's snapshot then costs what changed, not what the
    cluster holds (at 2,000 nodes, looking at every node's inputs was the largest part of a
    plan's cost that grew with the cluster; bench/plan_cost_bench.py).

    A node's view is built from its Node and NodePartition, the policies, the units bound to
    it, whether a plan is in flight there (and the spec written for it) and its GPUs' change
    times. The caller names the nodes whose Node, NodePartition, written spec or change times
    changed (``dirty``: the cache's record of what its watches delivered, and the
    controller's own writes); this compares the rest itself (the in-flight set, the claims,
    the policies by identity). What it builds after any changes is what a fresh one
    (:func:`build_snapshot`) builds from the same inputs (tests/controller/test_snapshot.py
    checks so over random changes)."""

    def __init__(self) -> None:
        self._views: dict[str, Node | None] = {}
        self._nodes: tuple[Node, ...] = ()
        self._policies: tuple[PartitionPolicy, ...] | None = None
        self._frozen: frozenset[str] = frozenset()
        self._claimed: Mapping[str, Mapping[str, int]] = {}
        self._room = RoomTracker()
        self._list: list[Node] = []
        self._position: dict[str, int] = {}
        self._with_gpus: set[str] = set()
        self._planned: frozenset[str] | None = frozenset()

    @property
    def planned(self) -> frozenset[str]:
        """The nodes of the last snapshot that have GPUs to plan over."""
        if self._planned is None:
            self._planned = frozenset(self._with_gpus)
        return self._planned

    @property
    def index(self) -> RoomIndex:
        """The MIG room of the last snapshot built (for the batch bound and narrowing)."""
        return self._room.freeze()

    def build(self, nodes: Mapping[str, RawNode], partitions: Mapping[str, NodePartition],
              policies: Sequence[PartitionPolicy], claimed: Mapping[str, Mapping[str, int]],
              *, dirty: Iterable[str], frozen: Iterable[str] = (),
              last_change: Mapping[tuple[str, int], float] | None = None,
              now: float | None = None,
              specs: Mapping[str, NodePartitionSpec] | None = None) -> Snapshot:
        """:func:`build_snapshot` of the same inputs; ``nodes`` by name; ``dirty``: the nodes
        whose Node, NodePartition, written spec or change times changed since the last call
        (every node, the first time, whatever it says)."""
        chosen = tuple(policies)
        in_flight = frozenset(frozen)
        known = self._policies
        if known is None or len(known) != len(chosen) or any(
                a is not b for a, b in zip(known, chosen, strict=True)):
            todo = set(nodes) | set(self._views)
            self._policies = chosen
        else:
            todo = set(dirty) | (in_flight ^ self._frozen)
            before = self._claimed
            todo.update(name for name, held in claimed.items() if before.get(name) != held)
            todo.update(name for name in before if name not in claimed)
        self._frozen = in_flight
        self._claimed = claimed
        if not todo:
            return Snapshot(nodes=self._nodes, now=now)
        specs = specs or {}
        last_change = last_change or {}
        reordered = False
        replaced: list[tuple[str, Node]] = []
        for name in todo:
            raw = nodes.get(name)
            old = self._views.get(name)
            if raw is None:
                reordered |= self._views.pop(name, _MISSING) is not _MISSING
                view = None
            else:
                reordered |= name not in self._views
                partition = partitions.get(name)
                flight = name in in_flight
                spec = ((specs.get(name) or (partition.spec if partition else None))
                        if flight else None)
                view = self._views[name] = _view(raw, partition, chosen, claimed,
                                                 in_flight=flight, spec=spec,
                                                 last_change=last_change)
            if view is old:
                continue
            self._room.update(name, old, view)
            # A view that comes or goes moves the others; one replaced keeps its place.
            reordered |= (old is None) != (view is None)
            if view is not None:
                replaced.append((name, view))
            if bool(old is not None and old.gpus) != bool(view is not None and view.gpus):
                self._planned = None
                if view is not None and view.gpus:
                    self._with_gpus.add(name)
                else:
                    self._with_gpus.discard(name)
        if reordered:
            self._list = [view for view in map(self._views.__getitem__, sorted(self._views))
                          if view is not None]
            self._position = {view.name: i for i, view in enumerate(self._list)}
        else:
            for name, view in replaced:
                self._list[self._position[name]] = view
        self._nodes = tuple(self._list)
        return Snapshot(nodes=self._nodes, now=now)


def build_snapshot(
    nodes: Iterable[RawNode],
    partitions: Mapping[str, NodePartition],
    policies: Sequence[PartitionPolicy],
    claimed: Mapping[str, Mapping[str, int]],
    *,
    frozen: Iterable[str] = (),
    last_change: Mapping[tuple[str, int], float] | None = None,
    now: float | None = None,
    specs: Mapping[str, NodePartitionSpec] | None = None,
) -> Snapshot:
    """The planner's view built once, with nothing kept (a fresh :class:`SnapshotBuilder`).
    ``claimed[node][resource]``: units held by pods bound or pinned to the node.

    ``frozen`` nodes (a plan is in flight there) take part as *static*, each GPU the plan
    names shown as the plan's target layout (``specs``: what the controller wrote last, which
    the cache may not show yet): nothing is reshaped over a node until its agent
    has reported the last plan, but pods may still be placed on the slices it has or is making
    (released once it reports), and a waiting pod may reserve its GPUs. Leaving them out, as
    this did, hid a node from every plan while any one of its GPUs reconfigured: the
    simulator, driving this controller, showed multi-GPU pods starving behind it.
    """
    by_name = {raw.get("metadata", {}).get("name", ""): raw for raw in nodes}
    return SnapshotBuilder().build(by_name, partitions, policies, claimed, dirty=(),
                                   frozen=frozen, last_change=last_change, now=now,
                                   specs=specs)


def _view(raw: RawNode, partition: NodePartition | None, policies: Sequence[PartitionPolicy],
          claimed: Mapping[str, Mapping[str, int]], *, in_flight: bool,
          spec: NodePartitionSpec | None,
          last_change: Mapping[tuple[str, int], float]) -> Node | None:
    """One node as the planner sees it; None for a node no policy covers or not reported."""
    name = raw.get("metadata", {}).get("name", "")
    labels = node_labels(raw)
    policy = policy_for(labels, policies)
    if policy is None or partition is None or partition.status is None:
        return None
    # Bound pods whose slice the agent already reports allocated hold nothing more; only the
    # rest (allocated by the kubelet a moment ago, or about to be) take a free slice. Count
    # the reported ones over the whole node first: a pod's slice may be on any of its GPUs.
    reserve: Counter[str] = Counter(claimed.get(name, {}))
    for observed in partition.status.gpus:
        for item in observed.slices:
            if item.allocated and item.mps is None:
                reserve[catalogue.mig_resource_name(item.profile)] -= 1
    shown = [_planned(o, spec) if in_flight and spec is not None else o
             for o in partition.status.gpus if o.healthy]
    gpus = [g for g in (_gpu(o, reserve, last_change.get((name, o.index)))
                        for o in shown) if g is not None]
    allowed = frozenset(policy.spec.allowed_profiles) or None
    share, share_count = _share_settings(policy)
    return Node(
        name=name,
        labels=tuple(sorted(labels.items())),
        taints=node_taints(raw),
        gpus=tuple(gpus),
        policy=Policy(
            name=policy.metadata.name,
            mode="dynamic" if policy.spec.mode == "dynamic" and not in_flight else "static",
            allowed_profiles=allowed,
            min_repartition_interval_s=float(policy.spec.min_repartition_interval_seconds),
            share=share,
            share_count=share_count,
            share_sizes_gib=tuple(policy.spec.share_sizes_gib) if share == "mps" else (),
        ),
    )
