"""The planning problem both solvers share: GPUs with their fixed facts, pods in planning order.

Preparing it once keeps the solvers honest with each other: the same filters, the same
frozen GPUs, the same resource-to-profile mapping and the same pod order, so that any
difference between the fast and the exact plan comes from the search alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache

from tessera.core import catalogue
from tessera.core.catalogue import GpuModel, is_gpu_share
from tessera.core.layout import Slice
from tessera.core.planner.filters import rejection
from tessera.core.planner.model import (
    WHOLE_GPU_RESOURCE,
    Gpu,
    GpuSlice,
    Node,
    PendingPod,
    Snapshot,
)

__all__ = [
    "GpuInfo", "PodInfo", "Problem", "demand_shares", "prepare", "profile_for", "resource_size",
]


@cache
def _resource_map(model_name: str) -> Mapping[str, str]:
    model = catalogue.model(model_name)
    return {p.resource_name: p.name for p in model.profiles}


def profile_for(model: GpuModel, resource: str) -> str | None:
    """The profile of ``model`` that NVIDIA's plugin advertises as ``resource``, if any."""
    return _resource_map(model.name).get(resource)


@cache
def resource_size(resource: str) -> float:
    """A model-independent size used to order pods: fraction of a card's memory, smallest seen."""
    if resource in (WHOLE_GPU_RESOURCE,):
        return 1.0
    if is_gpu_share(resource):
        return 0.01
    sizes = [
        model.profile(name).memory_slices / model.memory_slices
        for model in catalogue.models()
        if (name := profile_for(model, resource)) is not None
    ]
    return min(sizes) if sizes else 1.0


@dataclass(frozen=True)
class GpuInfo:
    """A GPU's fixed facts for this plan; ``frozen_reason`` set means its layout must not change."""

    gid: int
    node: int
    gpu: Gpu
    model: GpuModel | None
    """The MIG model; None for a card without MIG (shared whole, by MPS or time-slicing)."""
    current: frozenset[Slice]
    in_use: frozenset[Slice]
    frozen_reason: str | None
    allowed: frozenset[str] | None
    free_profiles: frozenset[str]
    """Profiles of the slices that exist now and are not in use."""

    @property
    def model_name(self) -> str:
        return self.gpu.model

    @property
    def mig(self) -> GpuModel:
        """The MIG model, for code that only runs on MIG GPUs."""
        assert self.model is not None, f"{self.gpu.model} has no MIG"
        return self.model

    def offers(self, resource: str) -> bool:
        """Whether this GPU could ever supply one unit of ``resource`` (ignoring its state)."""
        mode = self.gpu.mode
        if mode != "mig":
            return resource == (WHOLE_GPU_RESOURCE if mode == "none"
                                else self.gpu.share_resource)
        profile = _resource_map(self.model_name).get(resource)
        if profile is None:
            return False
        return profile in self.free_profiles or self.can_create(profile)

    def can_create(self, profile: str) -> bool:
        return self.frozen_reason is None and (self.allowed is None or profile in self.allowed)


@dataclass(frozen=True)
class PodInfo:
    """A pending pod with its GPU demand and the nodes whose filters it passes."""

    pod: PendingPod
    demand: tuple[tuple[str, int], ...]
    eligible: tuple[int, ...]
    """Node positions (into :attr:`Problem.nodes`), in order, that pass nodeSelector, affinity
    and taints."""
    rejections: Mapping[str, int]
    """How many nodes each filter rejected, for the unplaced reason."""
    classes: tuple[int, ...]
    """The node classes (see :attr:`Problem.classes`) that make up :attr:`eligible`."""
    may_reserve: bool = True
    """Whether the pod, if it cannot be placed, may reserve GPUs (:mod:`~tessera.core.planner.
    reserve`): it has waited at least the plan's ``reserve_after_s``."""

    @property
    def units(self) -> int:
        return sum(count for _, count in self.demand)


@dataclass(frozen=True)
class Problem:
    nodes: tuple[Node, ...]
    gpus: tuple[GpuInfo, ...]
    node_gpus: tuple[tuple[int, ...], ...]
    """GPU ids (into :attr:`gpus`) of each node, in index order."""
    pods: tuple[PodInfo, ...]
    """In planning order: priority first (highest), then oldest, then namespace and name."""
    classes: tuple[tuple[int, ...], ...]
    """Nodes that every pod's filters treat alike (same relevant labels, same taints)."""
    demand: tuple[tuple[str, float], ...] = ()
    """(resource, share of recent requests), sorted: what placements keep capacity usable
    for (see :func:`demand_shares`)."""

    @property
    def priorities(self) -> tuple[int, ...]:
        return tuple(sorted({p.pod.priority for p in self.pods}, reverse=True))


def _frozen_reason(gpu: Gpu, node: Node, now: float | None) -> str | None:
    policy = node.policy
    if policy.mode == "static":
        return f"policy {policy.name} is static"
    interval = policy.min_repartition_interval_s
    if interval > 0 and gpu.last_change is not None:
        if now is None:
            return "the snapshot has no 'now' to check min_repartition_interval_s against"
        age = now - gpu.last_change
        if age < interval:
            return (f"repartitioned {age:.0f}s ago, policy {policy.name} waits "
                    f"{interval:.0f}s between changes")
    return None


_Filtered = tuple[tuple[int, ...], dict[str, int], tuple[int, ...]]


def _eligibility(
    pods: Sequence[PendingPod], nodes: Sequence[Node]
) -> tuple[list[_Filtered], tuple[tuple[int, ...], ...]]:
    """Filter results per pod, computed once per distinct (pod filters, node class).

    Nodes often carry unique labels (hostname); only labels some pod refers to define a
    class, so 1,000 look-alike nodes are checked once per distinct pod filter.
    """
    keys = {k for p in pods for k, _ in p.node_selector}
    keys |= {e.key for p in pods for term in p.affinity_terms for e in term}
    classes: dict[object, list[int]] = {}
    for index, node in enumerate(nodes):
        labels = node.label_map
        signature = (tuple((k, labels.get(k)) for k in sorted(keys)), node.taints)
        classes.setdefault(signature, []).append(index)
    members_by_class = tuple(tuple(m) for m in classes.values())
    memo: dict[object, _Filtered] = {}
    out = []
    for pod in pods:
        pod_key = (pod.node_selector, pod.affinity_terms, pod.tolerations)
        if pod_key not in memo:
            eligible: list[int] = []
            rejected: dict[str, int] = {}
            chosen: list[int] = []
            for class_id, members in enumerate(members_by_class):
                reason = rejection(pod, nodes[members[0]])
                if reason is None:
                    eligible.extend(members)
                    chosen.append(class_id)
                else:
                    rejected[reason] = rejected.get(reason, 0) + len(members)
            memo[pod_key] = (tuple(sorted(eligible)), rejected, tuple(chosen))
        out.append(memo[pod_key])
    return out, members_by_class


@cache
def _model(name: str, mode: str) -> GpuModel | None:
    """The MIG model of a GPU; a GPU that is not in mode ``mig`` may be any card (its name is
    only a label then), a MIG GPU must be a catalogued MIG model."""
    if mode == "mig":
        return catalogue.model(name)
    found = catalogue.find_model(name)
    return found


def _layout_facts(
    slices: tuple[GpuSlice, ...], memo: dict[tuple[GpuSlice, ...], _Facts]
) -> _Facts:
    """(current, in use, free profiles) of a GPU; fleets repeat layouts, so memoised."""
    found = memo.get(slices)
    if found is None:
        current = frozenset(s.slice for s in slices)
        in_use = frozenset(s.slice for s in slices if s.in_use)
        found = memo[slices] = (current, in_use, frozenset(s.profile for s in current - in_use))
    return found


_Facts = tuple[frozenset[Slice], frozenset[Slice], frozenset[str]]


def demand_shares(pods: Sequence[PendingPod],
                  recent: Mapping[str, float] | None = None) -> tuple[tuple[str, float], ...]:
    """Each resource's share of recent requests: ``recent`` (units per resource, e.g. decayed
    counts of pods seen lately) when given, else the pending pods' own units."""
    counts: dict[str, float] = {}
    if recent:
        counts.update((r, float(n)) for r, n in recent.items() if n > 0)
    else:
        for pod in pods:
            for resource, count in pod.requests:
                counts[resource] = counts.get(resource, 0.0) + count
    total = sum(counts.values())
    return tuple(sorted((r, n / total) for r, n in counts.items())) if total else ()


def prepare(snapshot: Snapshot, pods: Sequence[PendingPod],
            recent: Mapping[str, float] | None = None, reserve_after_s: float = 0.0) -> Problem:
    """Resolve models, in-use and frozen GPUs, filters and the planning order, once.

    A pod may reserve GPUs once it has waited ``reserve_after_s`` by the snapshot's clock
    (created at least that long before ``snapshot.now``); without a clock every pod may.
    """
    gpus: list[GpuInfo] = []
    node_gpus: list[tuple[int, ...]] = []
    facts: dict[tuple[GpuSlice, ...], _Facts] = {}
    for n, node in enumerate(snapshot.nodes):
        ids = []
        for gpu in node.gpus:
            current, in_use, free_profiles = _layout_facts(gpu.slices, facts)
            gpus.append(
                GpuInfo(
                    gid=len(gpus),
                    node=n,
                    gpu=gpu,
                    model=_model(gpu.model, gpu.mode),
                    current=current,
                    in_use=in_use,
                    frozen_reason=_frozen_reason(gpu, node, snapshot.now),
                    allowed=node.policy.allowed_profiles,
                    free_profiles=free_profiles,
                )
            )
            ids.append(len(gpus) - 1)
        node_gpus.append(tuple(ids))
    ordered = sorted(
        pods,
        key=lambda p: (-p.priority, p.creation_time, p.namespace, p.name),
    )
    filters, classes = _eligibility(ordered, snapshot.nodes)
    now = snapshot.now
    infos = tuple(
        PodInfo(pod=pod, demand=pod.requests, eligible=eligible, rejections=rejected,
                classes=chosen,
                may_reserve=(reserve_after_s <= 0 or now is None
                             or now - pod.creation_time >= reserve_after_s))
        for pod, (eligible, rejected, chosen) in zip(ordered, filters, strict=True)
    )
    return Problem(
        nodes=snapshot.nodes, gpus=tuple(gpus), node_gpus=tuple(node_gpus), pods=infos,
        classes=classes, demand=demand_shares(pods, recent),
    )
