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
from tessera.core.planner import Gpu, GpuSlice, Node, Policy, Snapshot, Taint
from tessera.core.planner.model import Sharing

__all__ = ["SnapshotMemo", "build_snapshot", "node_allocatable", "node_labels", "node_taints",
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


class SnapshotMemo:
    """Each node's planner view with what it was built from, kept between snapshots: the
    cache replaces an object on every change, so a node whose Node, NodePartition, policies,
    plan in flight, claims and change times are the same objects and values as last time has
    the same view, and a plan over 2,000 nodes rebuilds only the few that changed."""

    def __init__(self) -> None:
        self._views: dict[str, tuple[tuple[object, ...], tuple[object, ...], Node | None]] = {}

    def get(self, name: str, same: tuple[object, ...], equal: tuple[object, ...]
            ) -> tuple[bool, Node | None]:
        """(found, view): ``same`` compared by identity, ``equal`` by value."""
        found = self._views.get(name)
        if (found is None or len(found[0]) != len(same)
                or any(a is not b for a, b in zip(found[0], same, strict=True))
                or found[1] != equal):
            return False, None
        return True, found[2]

    def put(self, name: str, same: tuple[object, ...], equal: tuple[object, ...],
            view: Node | None) -> None:
        self._views[name] = (same, equal, view)

    def keep(self, names: set[str]) -> None:
        """Forget nodes not in ``names`` (gone from the cluster)."""
        if len(self._views) > len(names):
            self._views = {k: v for k, v in self._views.items() if k in names}


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
    memo: SnapshotMemo | None = None,
) -> Snapshot:
    """``claimed[node][resource]``: units held by pods bound or pinned to the node.

    ``frozen`` nodes (a plan is in flight there) take part as *static*, each GPU the plan
    names shown as the plan's target layout (``specs``: what the controller wrote last, which
    the cache may not show yet): nothing is reshaped over a node until its agent
    has reported the last plan, but pods may still be placed on the slices it has or is making
    (released once it reports), and a waiting pod may reserve its GPUs. Leaving them out, as
    this did, hid a node from every plan while any one of its GPUs reconfigured: the
    simulator, driving this controller, showed multi-GPU pods starving behind it.
    """
    skip = set(frozen)
    specs = specs or {}
    last_change = last_change or {}
    planned: list[Node] = []
    chosen = tuple(policies)
    names: set[str] = set()
    # Change times by node, gathered once: only GPUs that changed have one, while looking
    # each node's GPUs up was eight lookups per node per plan.
    changed: dict[str, list[tuple[int, float]]] = {}
    for (node_name, index), at in last_change.items():
        changed.setdefault(node_name, []).append((index, at))
    for raw in sorted(nodes, key=lambda n: n.get("metadata", {}).get("name", "")):
        name = raw.get("metadata", {}).get("name", "")
        names.add(name)
        partition = partitions.get(name)
        in_flight = name in skip
        spec = (specs.get(name) or (partition.spec if partition else None)) if in_flight else None
        same = (raw, partition, spec, *chosen)
        times = changed.get(name)
        equal = (in_flight, tuple(sorted(claimed[name].items())) if name in claimed else (),
                 tuple(sorted(times)) if times else ())
        if memo is not None:
            found, view = memo.get(name, same, equal)
            if not found:
                view = _view(raw, partition, chosen, claimed, in_flight=in_flight, spec=spec,
                             last_change=last_change)
                memo.put(name, same, equal, view)
        else:
            view = _view(raw, partition, chosen, claimed, in_flight=in_flight, spec=spec,
                         last_change=last_change)
        if view is not None:
            planned.append(view)
    if memo is not None:
        memo.keep(names)
    return Snapshot(nodes=tuple(planned), now=now)


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
