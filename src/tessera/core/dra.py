"""A MIG GPU as Dynamic Resource Allocation sees it: one device per placement, shared counters.

Why counters: with partitionable devices (``DRAPartitionableDevices``) the scheduler itself
chooses a MIG placement. Each GPU publishes one device per valid (profile, start) and a counter
set; a device consumes counters, and the scheduler allocates a device only while every counter
it consumes has room. The counters below are the rules of :func:`tessera.core.layout.conflict_with`
written as capacities, one counter per rule:

- ``memory-slice-<i>`` (capacity 1): a placement holds its memory slices alone (no overlap);
- ``compute-slices``: compute slices of the card;
- ``gpu-instances``: the card's GPU-instance limit;
- ``copy-engines``, ``decoders``, ``encoders``, ``jpeg-engines``, ``ofa-engines``: the media and
  copy engines a ``+me`` profile takes (a card has one OFA, so one ``+me`` slice at a time);
- ``count-<profile>``: the profile's own instance limit (``1g.20gb``: at most 4 on an A100).

So a set of devices fits the counters exactly when its slices form a valid layout; a test
proves both directions by enumeration for every model. A slice that already exists on the card
and was not allocated through DRA (made before the node switched, or by hand) is taken out of
the capacities instead, so the scheduler never offers what overlaps it.

Names follow Kubernetes' rules (device, counter and counter-set names are DNS labels) and are
derived here once; the agent, the controller's curation and the simulator all use them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache, lru_cache

from tessera.core import catalogue
from tessera.core.catalogue import Engines, GpuModel, MigProfile
from tessera.core.layout import Slice

__all__ = [
    "DRIVER",
    "MAX_COUNTERS_PER_SET",
    "MAX_DEVICES_PER_SLICE",
    "MODE_MIG",
    "MODE_MPS",
    "MPS_DEVICE_CLASS",
    "REQUEUED_ANNOTATION",
    "SHARES",
    "TAINT_CURATED",
    "TAINT_UNHEALTHY",
    "DeviceOffer",
    "GpuUse",
    "all_profile_names",
    "capacities",
    "consumption",
    "counter_set_name",
    "curate",
    "device_class_name",
    "device_name",
    "devices",
    "first_fit",
    "fits",
    "mps_device_name",
    "profile_label",
]

DRIVER = "gpu.tessera.dev"
"""The DRA driver name: ResourceSlices' ``driver``, the kubelet plugin's name, and the domain of
the devices' attributes (``device.attributes["gpu.tessera.dev"].profile``)."""

TAINT_CURATED = f"{DRIVER}/curated"
"""NoSchedule taint on a device the controller does not want chosen now (see curation)."""
TAINT_UNHEALTHY = f"{DRIVER}/unhealthy"
"""NoSchedule taint on a device of a GPU that reported a fatal Xid."""

MAX_COUNTERS_PER_SET = 32
"""``ResourceSliceMaxCountersPerCounterSet`` in k8s.io/api resource/v1 (v0.37)."""
MAX_DEVICES_PER_SLICE = 64
"""``ResourceSliceMaxDevicesWithAdvancedFeatures``: the limit once devices consume counters."""

_ENGINE_COUNTERS: tuple[tuple[str, str], ...] = (
    ("copy", "copy-engines"),
    ("decoders", "decoders"),
    ("encoders", "encoders"),
    ("jpeg", "jpeg-engines"),
    ("ofa", "ofa-engines"),
)
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def profile_label(profile: str) -> str:
    """``1g.10gb+me.all`` -> ``1g10gb-plus-meall``: a profile name as a DNS-label fragment.

    ``+`` and ``-`` both mark variants (``+me``, ``-me``), so each keeps a word of its own and
    no two profiles of any model share a label (a test checks it over the catalogue).
    """
    text = profile.lower().replace("-", "-minus-").replace("+", "-plus-").replace(".", "")
    if not _LABEL.match(text):
        raise ValueError(f"profile {profile!r} gives no DNS label ({text!r})")
    return text


def device_name(gpu_index: int, item: Slice) -> str:
    """``gpu-0-1g10gb-at-6``: the device of GPU ``gpu_index``'s placement ``item``."""
    return f"gpu-{gpu_index}-{profile_label(item.profile)}-at-{item.start}"


MODE_MIG = "mig"
MODE_MPS = "mps"
"""The ``mode`` attribute of every device: a MIG placement, or MPS shares of a whole GPU."""
SHARES = "shares"
"""The consumable capacity of an MPS device: each allocation takes shares of the GPU."""
MPS_DEVICE_CLASS = f"gpu-shared.{DRIVER}"
"""The DeviceClass of MPS shares; its ``extendedResourceName`` is ``nvidia.com/gpu.shared``."""
REQUEUED_ANNOTATION = f"{DRIVER}/requeued-at"
"""Set on :data:`MPS_DEVICE_CLASS` by the controller when it sends share pods back to the
scheduler (``tessera.controller.loop.Controller._requeue_shares``)."""


def mps_device_name(gpu_index: int) -> str:
    """``gpu-3-mps``: GPU 3 shared through MPS, one device allocated many times over."""
    return f"gpu-{gpu_index}-mps"


def counter_set_name(gpu_index: int) -> str:
    return f"gpu-{gpu_index}"


def device_class_name(profile: str) -> str:
    """The DeviceClass of one profile name (the same name on every model that has it), e.g.
    ``mig-1g10gb.gpu.tessera.dev``; its ``extendedResourceName`` is NVIDIA's resource name."""
    return f"mig-{profile_label(profile)}.{DRIVER}"


def _engine_values(engines: Engines) -> dict[str, int]:
    return {counter: getattr(engines, field) for field, counter in _ENGINE_COUNTERS}


def _count_counter(profile: MigProfile) -> str:
    return f"count-{profile_label(profile.name)}"


@cache
def _full_capacities(model: GpuModel) -> Mapping[str, int]:
    counters = {f"memory-slice-{i}": 1 for i in range(model.memory_slices)}
    counters["compute-slices"] = model.compute_slices
    counters["gpu-instances"] = model.max_gpu_instances
    counters.update(_engine_values(model.engine_budget))
    for profile in model.profiles:
        counters[_count_counter(profile)] = profile.max_count
    if len(counters) > MAX_COUNTERS_PER_SET:
        raise ValueError(f"{model.name} needs {len(counters)} counters; a counter set holds "
                         f"{MAX_COUNTERS_PER_SET}")
    return counters


@cache
def consumption(model: GpuModel, item: Slice) -> Mapping[str, int]:
    """The counters one placement takes (only those it takes: zero entries are left out)."""
    profile = model.profile(item.profile)
    placement = profile.placement_at(item.start)
    if placement is None:
        raise ValueError(f"{item} is not a placement of {model.name}")
    taken = {f"memory-slice-{i}": 1 for i in range(placement.start, placement.end)}
    taken["compute-slices"] = profile.compute_slices
    taken["gpu-instances"] = 1
    taken.update({k: v for k, v in _engine_values(profile.engines).items() if v})
    taken[_count_counter(profile)] = 1
    return taken


def capacities(model: GpuModel, held: Iterable[Slice] = ()) -> dict[str, int]:
    """The counter set of one GPU; ``held`` are slices on the card outside DRA's accounting
    (they must form a valid layout), taken out of the capacities."""
    left = dict(_full_capacities(model))
    for item in held:
        for counter, amount in consumption(model, item).items():
            left[counter] -= amount
            if left[counter] < 0:
                raise ValueError(f"held slices of {model.name} overcommit {counter}")
    return left


def fits(capacity: Mapping[str, int], used: Mapping[str, int], item_use: Mapping[str, int]
         ) -> bool:
    """Whether a device that takes ``item_use`` still fits beside ``used`` (the scheduler's
    rule: every consumed counter within its capacity)."""
    return all(used.get(c, 0) + n <= capacity.get(c, 0) for c, n in item_use.items())


@dataclass(frozen=True)
class DeviceOffer:
    """One device a GPU publishes: a placement, and why it may be tainted."""

    gpu_index: int
    slice: Slice
    profile: MigProfile

    @property
    def name(self) -> str:
        return device_name(self.gpu_index, self.slice)


def devices(model: GpuModel, gpu_index: int) -> tuple[DeviceOffer, ...]:
    """Every placement of every profile, in the order the scheduler should try them.

    kube-scheduler's allocator takes the first device that fits, in published order. Listing
    each profile's placements from the highest start down keeps the low-start, large
    placements (``4g``/``7g`` start at 0) free longest, which is how the planner packs too.
    """
    offers: list[DeviceOffer] = []
    for profile in model.profiles:
        for placement in sorted(profile.placements, key=lambda p: -p.start):
            offers.append(DeviceOffer(gpu_index, Slice(profile.name, placement.start), profile))
    if len(offers) > MAX_DEVICES_PER_SLICE:
        raise ValueError(f"{model.name} has {len(offers)} placements; a ResourceSlice holds "
                         f"{MAX_DEVICES_PER_SLICE} devices that consume counters")
    return tuple(offers)


def all_profile_names() -> tuple[str, ...]:
    """Every profile name of every model: one DeviceClass each."""
    return tuple(sorted({p.name for m in catalogue.models() for p in m.profiles}))


@dataclass(frozen=True)
class GpuUse:
    """What curation needs to know of one GPU: its model and the slices on it now (allocated
    through DRA, or held outside it). ``healthy=False`` GPUs are never counted as room.
    ``node_load``: compute slices in use on its node (a GPU on an idle node is kept for pods
    that need a whole node, one on a lightly loaded node for pods that need most of one)."""

    model: GpuModel
    used: frozenset[Slice]
    healthy: bool = True
    node_load: int = 0

    @property
    def node_busy(self) -> bool:
        return self.node_load > 0

    @property
    def idle(self) -> bool:
        return not self.used

    def can_host(self, profile: str) -> bool:
        return self.healthy and first_fit(self.model, self.used, profile) is not None


@lru_cache(maxsize=1 << 16)
def first_fit(model: GpuModel, used: frozenset[Slice], profile: str) -> Slice | None:
    """The device kube-scheduler's allocator takes for ``profile`` on a GPU whose slices are
    ``used``: the first in published order whose counters fit; None when none does.

    Memoised: a fleet has few distinct (model, layout) pairs, and curation and the simulator
    ask each GPU about every profile on every change."""
    if not any(p.name == profile for p in model.profiles):
        return None
    capacity = capacities(model, sorted(used))
    return next((offer.slice for offer in devices(model, 0) if offer.slice.profile == profile
                 and fits(capacity, {}, consumption(model, offer.slice))), None)


def curate(gpus: Sequence[GpuUse]) -> frozenset[tuple[int, str]]:
    """The (GPU position, profile) pairs to taint ``NoSchedule`` so the scheduler's first fit
    packs:

    1. while some split GPU still has room for a profile, no idle GPU offers that profile;
    2. otherwise only the idle GPUs of the most loaded nodes that have one offer it, so a
       whole GPU is taken where a node is already busy and lightly loaded nodes drain, and
       idle nodes stay whole for the pods that need all of a node's GPUs.

    kube-scheduler takes the first device that fits on the node it scores best, and its
    default scores spread pods over the least-loaded nodes: left alone, it splits a fresh GPU
    (on a fresh node) for every small pod while split ones have room, and the whole GPUs and
    nodes that large pods need are gone. Tainting is advisory (the counters still rule what
    fits), so a stale curation can cost packing, never correctness; a pod that only a tainted
    device can serve (its node selector excludes the others, or it needs a whole node) is
    served once the caller stops curating that profile for it.
    """
    tainted: set[tuple[int, str]] = set()
    names = {p.name for gpu in gpus for p in gpu.model.profiles}
    for profile in sorted(names):
        offering = [i for i, gpu in enumerate(gpus)
                    if any(p.name == profile for p in gpu.model.profiles)]
        if any(not gpus[i].idle and gpus[i].can_host(profile) for i in offering):
            tainted.update((i, profile) for i in offering if gpus[i].idle)
            continue
        loads = [gpus[i].node_load for i in offering
                 if gpus[i].idle and gpus[i].node_busy and gpus[i].can_host(profile)]
        if loads:
            top = max(loads)
            tainted.update((i, profile) for i in offering
                           if gpus[i].idle and gpus[i].node_load < top)
    return frozenset(tainted)
