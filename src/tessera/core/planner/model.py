"""The planner's values: what it is given (a cluster snapshot, pending pods) and what it returns.

Everything is a frozen dataclass so a plan can be compared, cached and logged without fear of
aliasing; mappings are stored as sorted tuples of pairs where equality or hashing matters.
Resource accounting uses three kinds of GPU capacity, all named as NVIDIA's device plugin names
them so pod specs need no change:

- ``nvidia.com/mig-<profile>``: one MIG slice of that profile (the planner may create it);
- ``nvidia.com/gpu``: one whole GPU, i.e. a GPU in mode ``none`` that nothing holds;
- ``nvidia.com/gpu.shared``: one share of a GPU in mode ``mps`` (an MPS share, or a
  time-slicing replica: :attr:`Gpu.sharing` says which); a dynamic policy that allows sharing
  lets the planner turn an idle whole GPU into shares and back (:mod:`.sharing`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

from tessera.core.catalogue import MPS_SHARED_RESOURCE, WHOLE_GPU_RESOURCE
from tessera.core.errors import InvalidInputError
from tessera.core.layout import Slice
from tessera.core.planner.geometry import geometry_of

__all__ = [
    "MPS_SHARE_RESOURCE",
    "WHOLE_GPU_RESOURCE",
    "AssignedSlice",
    "Gpu",
    "GpuMode",
    "GpuSlice",
    "GpuTarget",
    "MatchExpression",
    "Node",
    "PendingPod",
    "Plan",
    "PodPlacement",
    "Policy",
    "Sharing",
    "Snapshot",
    "Taint",
    "Toleration",
    "Unplaced",
]

MPS_SHARE_RESOURCE = MPS_SHARED_RESOURCE
"""One MPS share; a GPU in mode ``mps`` offers ``shares`` of them (NVIDIA's ``.shared`` style)."""

GpuMode = Literal["mig", "none", "mps"]
PolicyMode = Literal["dynamic", "static"]
Sharing = Literal["mps", "timeslice"]


@dataclass(frozen=True)
class GpuSlice:
    """A MIG slice that exists on a GPU now; ``in_use`` slices are never destroyed or given out."""

    profile: str
    start: int
    in_use: bool = False
    shares: int = 0
    """MPS shares of a slice running its own daemon (then it is in use as a slice, and its
    shares are ``nvidia.com/mig-<profile>.shared``); 0 for a plain slice."""
    shares_in_use: int = 0

    @property
    def slice(self) -> Slice:
        return Slice(self.profile, self.start)


@dataclass(frozen=True)
class Gpu:
    """One GPU of a node, as the agent reports it.

    ``mode`` ``mig``: ``slices`` is its current layout. ``none``: a whole GPU, held when
    ``in_use``. ``mps``: ``shares`` MPS shares of which ``shares_in_use`` are held. The planner
    never switches a GPU's mode (that resets Ampere cards), so a MIG GPU is never handed out
    whole and a whole GPU is never split.
    """

    index: int
    model: str
    """The catalogue name (``tessera catalogue``), already resolved from any alias."""
    mode: GpuMode = "mig"
    slices: tuple[GpuSlice, ...] = ()
    in_use: bool = False
    shares: int = 0
    shares_in_use: int = 0
    sharing: Sharing = "mps"
    """How a GPU in mode ``mps`` shares itself: MPS (limits per share) or time-slicing."""
    share_resource: str = MPS_SHARE_RESOURCE
    """What its shares are advertised as: ``nvidia.com/gpu.shared`` or a memory-sized
    ``nvidia.com/gpu.shared-<N>gb``."""
    last_change: float | None = None
    """When its layout last changed (seconds, same clock as :attr:`Snapshot.now`)."""

    @cached_property
    def mig_room(self) -> tuple[int, int, int] | None:
        """(mask of its slices in use, compute slices in use, compute slices free) of a MIG
        GPU, as its model's geometry counts them; None for another GPU or a model without
        one. Worked out once per object: the controller hands the planner the same objects
        for GPUs that did not change (``controller.snapshot.SnapshotBuilder``), and the
        cluster's room is counted from every GPU's (:mod:`~tessera.core.planner.room`)."""
        if self.mode != "mig":
            return None
        try:
            geometry = geometry_of(self.model)
        except InvalidInputError:
            return None
        held = sum(1 << geometry.index[s.slice] for s in self.slices
                   if s.in_use and s.slice in geometry.index)
        used = geometry.aggregate(held).compute
        return held, used, geometry.model.compute_slices - used


@dataclass(frozen=True)
class Policy:
    """The PartitionPolicy that applies to a node, reduced to what the planner obeys.

    ``static``: never repartition, pods only take existing free slices. ``dynamic``: free
    capacity may be reshaped, creating only ``allowed_profiles`` (None: all), and a GPU changed
    less than ``min_repartition_interval_s`` ago is treated as static for this plan.
    """

    name: str = "default"
    mode: PolicyMode = "dynamic"
    allowed_profiles: frozenset[str] | None = None
    min_repartition_interval_s: float = 0.0
    share: Sharing | None = None
    """Dynamic only: whole GPUs (no MIG) may be turned into ``share_count`` shares of this kind
    when pods wait for ``nvidia.com/gpu.shared``, and back when every share is free."""
    share_count: int = 0
    share_sizes_gib: tuple[int, ...] = ()
    """Memory-sized shares the policy offers besides the plain ones: a GPU is turned into
    ``nvidia.com/gpu.shared-<N>gb`` shares of N GiB (as many as its memory holds) when pods
    wait for that resource."""


@dataclass(frozen=True)
class Taint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"


@dataclass(frozen=True)
class Node:
    """A GPU node: labels and taints for filtering, free CPU/memory, GPUs and its policy."""

    name: str
    labels: tuple[tuple[str, str], ...] = ()
    taints: tuple[Taint, ...] = ()
    free_cpu_milli: int | None = None
    """Allocatable minus what running pods request; None when not reported (no limit)."""
    free_memory_mib: int | None = None
    gpus: tuple[Gpu, ...] = ()
    policy: Policy = field(default_factory=Policy)

    @property
    def label_map(self) -> Mapping[str, str]:
        return dict(self.labels)

    @cached_property
    def mig_room(self) -> tuple[int, int, tuple[tuple[str, int, int], ...]]:
        """(compute slices free, compute slices in use, (model, mask in use, free) of each
        MIG GPU with room) over its MIG GPUs (:attr:`Gpu.mig_room`). Worked out once per
        object, as the GPUs': an unchanged node is the same object plan after plan, and the
        cluster's room is kept from every node's (:class:`~tessera.core.planner.RoomTracker`)."""
        free = used = 0
        open_gpus: list[tuple[str, int, int]] = []
        for gpu in self.gpus:
            found = gpu.mig_room
            if found is None:
                continue
            held, in_use, spare = found
            free += spare
            used += in_use
            if spare > 0:
                open_gpus.append((gpu.model, held, spare))
        return free, used, tuple(open_gpus)


@dataclass(frozen=True)
class Snapshot:
    """The cluster as the planner sees it; ``now`` is compared with :attr:`Gpu.last_change`."""

    nodes: tuple[Node, ...]
    now: float | None = None


@dataclass(frozen=True)
class Toleration:
    """A pod toleration (``operator`` ``Equal`` or ``Exists``; empty key + Exists tolerates all)."""

    key: str = ""
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str = ""
    effect: str = ""
    """Empty matches every effect."""


@dataclass(frozen=True)
class MatchExpression:
    """One ``matchExpressions`` entry of required node affinity."""

    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    values: tuple[str, ...] = ()


@dataclass(frozen=True)
class PendingPod:
    """A pod waiting for GPU capacity; all its containers' requests together are one unit.

    ``requests`` holds only GPU resources (summed over containers, sorted by name);
    ``affinity_terms`` are the required ``nodeSelectorTerms``: a node must satisfy every
    expression of at least one term (none: no constraint).
    """

    namespace: str
    name: str
    requests: tuple[tuple[str, int], ...]
    priority: int = 0
    creation_time: float = 0.0
    cpu_milli: int = 0
    memory_mib: int = 0
    node_selector: tuple[tuple[str, str], ...] = ()
    affinity_terms: tuple[tuple[MatchExpression, ...], ...] = ()
    tolerations: tuple[Toleration, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def request_map(self) -> Mapping[str, int]:
        return dict(self.requests)


@dataclass(frozen=True, order=True)
class AssignedSlice:
    """What a pod is expected to get on one GPU: a MIG slice, a whole GPU or MPS shares."""

    gpu: int
    resource: str
    profile: str | None = None
    start: int | None = None
    count: int = 1
    """More than one only for MPS shares of the same GPU."""


@dataclass(frozen=True)
class PodPlacement:
    pod: str
    node: str
    slices: tuple[AssignedSlice, ...]


@dataclass(frozen=True)
class Unplaced:
    pod: str
    reason: str


@dataclass(frozen=True)
class GpuTarget:
    """The full target layout of a GPU the plan changes, and the steps that get there."""

    node: str
    index: int
    model: str
    slices: tuple[Slice, ...]
    destroy: tuple[Slice, ...]
    create: tuple[Slice, ...]
    mode: GpuMode = "mig"
    """``none`` or ``mps`` for a whole GPU the plan shares or takes back (no slices then)."""
    shares: int = 0
    sharing: Sharing = "mps"
    share_resource: str = MPS_SHARE_RESOURCE


@dataclass(frozen=True)
class Plan:
    """Target layouts of changed GPUs, where each placed pod lands, and why the others do not."""

    gpus: tuple[GpuTarget, ...]
    placements: tuple[PodPlacement, ...]
    unplaced: tuple[Unplaced, ...]
    solver: str

    @property
    def placed_pods(self) -> frozenset[str]:
        return frozenset(p.pod for p in self.placements)
