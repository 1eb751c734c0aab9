"""The MIG profile catalogue: typed, validated views over the one table in ``_mig_table``.

Why a separate view: the table is kept terse so a reviewer can compare it line by line with
``nvidia-smi mig -lgip``; this module turns it into frozen values with the derived facts that
callers need (resource names, placements, GPU-instance ids) so that nothing is spelled twice.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache, cached_property
from typing import Literal, Protocol, TypeVar

from tessera.core import _mig_table
from tessera.core.errors import UnknownModelError, UnknownProfileError

__all__ = [
    "COMPUTE_INSTANCE_PROFILE_CONSTANTS",
    "GPU_INSTANCE_PROFILE_CONSTANTS",
    "MIG_RESOURCE_PREFIX",
    "MPS_MAX_CLIENTS",
    "MPS_SHARED_RESOURCE",
    "NO_ENGINES",
    "RESOURCE_DOMAIN",
    "WHOLE_GPU_RESOURCE",
    "Card",
    "Engines",
    "GpuModel",
    "MigProfile",
    "Placement",
    "WholeGpu",
    "card",
    "compute_instance_profile_for_slices",
    "compute_instance_slices",
    "describe",
    "expected_profile_name",
    "find_card",
    "find_model",
    "is_gpu_share",
    "mig_resource_name",
    "model",
    "model_from_product_label",
    "models",
    "profile_name_from_resource",
    "share_size_gib",
    "shared_mig_resource_name",
    "shared_resource",
    "shares_of",
    "variant_of",
    "whole_gpus",
]

RESOURCE_DOMAIN = "nvidia.com"
"""Resource names follow NVIDIA's device plugin so existing pod specs work unchanged."""
WHOLE_GPU_RESOURCE = f"{RESOURCE_DOMAIN}/gpu"
MPS_SHARED_RESOURCE = f"{RESOURCE_DOMAIN}/gpu.shared"
"""An MPS share of a GPU: the name NVIDIA's plugin gives shared GPUs (``renameByDefault``)."""
MIG_RESOURCE_PREFIX = f"{RESOURCE_DOMAIN}/mig-"
MPS_MAX_CLIENTS = 48
"""Client contexts one MPS server serves per device on Volta and later: 48 through CUDA 13.0
(NVIDIA's MPS documentation, "Client-Server Connection Limits"; 13.1 raised it to 60), so 48
holds on every driver a node may run. Pre-Volta MPS had 16 clients and no per-client limits."""

GPU_INSTANCE_PROFILE_CONSTANTS: Mapping[str, int] = {
    "1_SLICE": 0,
    "2_SLICE": 1,
    "3_SLICE": 2,
    "4_SLICE": 3,
    "7_SLICE": 4,
    "8_SLICE": 5,
    "6_SLICE": 6,
    "1_SLICE_REV1": 7,
    "2_SLICE_REV1": 8,
    "1_SLICE_REV2": 9,
    "1_SLICE_GFX": 10,
    "2_SLICE_GFX": 11,
    "4_SLICE_GFX": 12,
    "1_SLICE_NO_ME": 13,
    "2_SLICE_NO_ME": 14,
    "1_SLICE_ALL_ME": 15,
    "2_SLICE_ALL_ME": 16,
    "3_SLICE_GFX": 17,
}
"""``NVML_GPU_INSTANCE_PROFILE_<key>`` values (nvml.h, API 13); ``COUNT`` is 18."""

COMPUTE_INSTANCE_PROFILE_CONSTANTS: Mapping[str, int] = {
    "1_SLICE": 0,
    "2_SLICE": 1,
    "3_SLICE": 2,
    "4_SLICE": 3,
    "7_SLICE": 4,
    "8_SLICE": 5,
    "6_SLICE": 6,
    "1_SLICE_REV1": 7,
    "7_SLICE_NVL": 8,
}
"""``NVML_COMPUTE_INSTANCE_PROFILE_<key>`` values; a compute instance's ``info.id`` is one."""

_CI_SLICES: Mapping[int, int] = {0: 1, 1: 2, 2: 3, 3: 4, 4: 7, 5: 8, 6: 6, 7: 1, 8: 7}


_VARIANTS: Mapping[str, str] = {
    "_REV1": "+me",
    "_ALL_ME": "+me.all",
    "_NO_ME": "-me",
    "_GFX": "+gfx",
}
"""Name suffix of each NVML profile family, as NVIDIA's go-nvlib spells it (``REV2`` has none:
it is the 1-compute-slice profile with two memory slices, named by its memory alone)."""


def variant_of(constant_name: str) -> str:
    """The profile-name suffix an ``NVML_GPU_INSTANCE_PROFILE_*`` constant carries: ``+me``
    (media extensions: a 1g with the card's OFA/JPEG), ``+me.all`` (every media engine),
    ``-me`` (no media engine) or ``+gfx`` (graphics capable, RTX PRO); "" for a plain one."""
    for ending, suffix in _VARIANTS.items():
        if constant_name.endswith(ending):
            return suffix
    return ""


def compute_instance_slices(ci_profile: int) -> int:
    """Compute slices of an ``NVML_COMPUTE_INSTANCE_PROFILE_*`` value (KeyError if unknown)."""
    return _CI_SLICES[ci_profile]


def compute_instance_profile_for_slices(slices: int) -> int:
    """The compute-instance profile spanning ``slices`` compute slices (a GI's default CI)."""
    for constant, size in _CI_SLICES.items():
        if size == slices:
            return constant
    raise KeyError(slices)


@dataclass(frozen=True)
class Placement:
    """Where a GPU instance sits, in memory slices, as ``nvmlGpuInstancePlacement_t`` says."""

    start: int
    size: int

    @property
    def end(self) -> int:
        """One past the last memory slice used."""
        return self.start + self.size

    def overlaps(self, other: Placement) -> bool:
        return self.start < other.end and other.start < self.end

    def __str__(self) -> str:
        return f"{self.start}:{self.size}"


@dataclass(frozen=True)
class Engines:
    """Hardware engines a GPU instance owns; media engines (JPEG, OFA) are scarce per card."""

    copy: int
    decoders: int
    encoders: int
    jpeg: int
    ofa: int

    def __add__(self, other: Engines) -> Engines:
        return Engines(
            self.copy + other.copy,
            self.decoders + other.decoders,
            self.encoders + other.encoders,
            self.jpeg + other.jpeg,
            self.ofa + other.ofa,
        )

    def fits_within(self, limit: Engines) -> bool:
        return (
            self.copy <= limit.copy
            and self.decoders <= limit.decoders
            and self.encoders <= limit.encoders
            and self.jpeg <= limit.jpeg
            and self.ofa <= limit.ofa
        )


NO_ENGINES = Engines(0, 0, 0, 0, 0)


@dataclass(frozen=True)
class MigProfile:
    """One GPU-instance profile of one GPU model (a row of ``nvidia-smi mig -lgip``)."""

    name: str
    """NVIDIA's name, e.g. ``1g.10gb`` or ``1g.10gb+me``."""
    nvml_constant_name: str
    """``NVML_GPU_INSTANCE_PROFILE_*`` name, given to ``nvmlDeviceGetGpuInstanceProfileInfo``."""
    nvml_constant: int
    profile_id: int
    """The device-specific id NVML returns in ``info.id``; create/placement calls take this one."""
    compute_slices: int
    memory_slices: int
    memory_mib: int
    max_count: int
    sm_count: int
    engines: Engines
    placements: tuple[Placement, ...]
    unverified: frozenset[str] = field(default_factory=frozenset)
    """Fields whose value was estimated, not read off a real card (model-wide ones included)."""
    aliases: tuple[str, ...] = ()
    """Other names the same profile had under an earlier driver that reported another total
    memory (names follow from memory, see :func:`expected_profile_name`); configs written
    then, such as NVIDIA's default mig-parted file, still use them."""

    @property
    def verified(self) -> bool:
        return not self.unverified

    @property
    def variant(self) -> str:
        """``+me``, ``+me.all``, ``-me``, ``+gfx`` or "" (see :func:`variant_of`)."""
        return variant_of(self.nvml_constant_name)

    @property
    def plain(self) -> bool:
        """A profile without a media or graphics variant: what a pod asking only for compute
        and memory is given, and what the planner and simulator offer by default."""
        return not self.variant

    @property
    def resource_name(self) -> str:
        """The extended resource a pod requests, named as NVIDIA's "mixed" strategy names it."""
        return mig_resource_name(self.name)

    @property
    def starts(self) -> tuple[int, ...]:
        return tuple(p.start for p in self.placements)

    def placement_at(self, start: int) -> Placement | None:
        for placement in self.placements:
            if placement.start == start:
                return placement
        return None


Architecture = Literal["ampere", "hopper", "blackwell"]
_ARCHITECTURES: tuple[Architecture, ...] = ("ampere", "hopper", "blackwell")


@dataclass(frozen=True)
class GpuModel:
    """A MIG-capable GPU model: its geometry and every profile it offers."""

    name: str
    product_names: tuple[str, ...]
    """What ``nvmlDeviceGetName`` returns for cards of this model."""
    pci_device_ids: tuple[int, ...]
    """``nvmlPciInfo_t.pciDeviceId`` values (device id << 16 | vendor 0x10DE)."""
    architecture: Architecture
    compute_capability: tuple[int, int]
    """CUDA's (major, minor), as ``nvmlDeviceGetCudaComputeCapability`` gives it."""
    total_memory_mib: int
    memory_slices: int
    compute_slices: int
    max_gpu_instances: int
    min_driver: str | None
    source: str
    unverified: frozenset[str]
    """Caveats that hold for the whole model (e.g. ``placements`` never observed on a card)."""
    profiles: tuple[MigProfile, ...]

    @property
    def mig_enable_resets_gpu(self) -> bool:
        """Ampere resets the GPU to switch MIG mode (and keeps it over reboots); Hopper does not."""
        return self.architecture == "ampere"

    @cached_property
    def full_profile(self) -> MigProfile:
        """The plain profile that spans the whole card; its engines are the card's engine budget
        (a ``+gfx`` twin of the same size owns the same engines and is not preferred)."""
        return max(self.profiles, key=lambda p: (p.memory_slices, p.compute_slices, p.plain))

    @cached_property
    def engine_budget(self) -> Engines:
        return self.full_profile.engines

    @property
    def resource_names(self) -> tuple[str, ...]:
        return tuple(p.resource_name for p in self.profiles)

    @property
    def verified(self) -> bool:
        return not self.unverified and all(p.verified for p in self.profiles)

    def profile(self, name: str, field_name: str = "profile") -> MigProfile:
        """The named profile; also accepts its resource name (``nvidia.com/mig-1g.10gb.me``)."""
        wanted = name
        if name.startswith(MIG_RESOURCE_PREFIX):
            for profile in self.profiles:
                if profile.resource_name == name:
                    return profile
            wanted = profile_name_from_resource(name)
        for profile in self.profiles:
            if profile.name == wanted:
                return profile
        for profile in self.profiles:
            if wanted in profile.aliases:
                return profile
        raise UnknownProfileError(
            field_name,
            f"{self.name} has no MIG profile {name!r}",
            [p.name for p in self.profiles],
        )

    def profile_by_id(self, profile_id: int) -> MigProfile | None:
        for profile in self.profiles:
            if profile.profile_id == profile_id:
                return profile
        return None

    def profile_by_constant(self, constant: int) -> MigProfile | None:
        for profile in self.profiles:
            if profile.nvml_constant == constant:
                return profile
        return None

    def gpu_instance_id(self, placement: Placement) -> int:
        """The GI id NVML gives an instance at ``placement`` (binary-tree slot numbering).

        Observed on A100, A30, H100, H100 NVL and GH200: on an 8-slice card 0:8 is GI 0, 0:4 and
        4:4 are 1 and 2, the 2-slice slots 3..6 and the 1-slice slots 7..13; the A30 is the same
        tree over 4 slices. Callers must not assume GI ids are dense.
        """
        return self.memory_slices // placement.size - 1 + placement.start // placement.size


def _profile_from_row(row: _mig_table._P, model_unverified: Iterable[str]) -> MigProfile:
    size = row.memory_slices
    return MigProfile(
        name=row.name,
        nvml_constant_name=f"NVML_GPU_INSTANCE_PROFILE_{row.constant}",
        nvml_constant=GPU_INSTANCE_PROFILE_CONSTANTS[row.constant],
        profile_id=row.profile_id,
        compute_slices=row.compute_slices,
        memory_slices=size,
        memory_mib=row.memory_mib,
        max_count=row.max_count,
        sm_count=row.sm_count,
        engines=Engines(*row.engines),
        placements=tuple(Placement(start, size) for start in row.starts),
        unverified=frozenset(row.unverified) | frozenset(model_unverified),
        aliases=row.aliases,
    )


def _model_from_row(row: _mig_table._Model) -> GpuModel:
    if row.architecture not in _ARCHITECTURES:
        raise ValueError(f"{row.name}: unknown architecture {row.architecture!r}")
    architecture = next(a for a in _ARCHITECTURES if a == row.architecture)
    return GpuModel(
        name=row.name,
        product_names=row.product_names,
        pci_device_ids=row.pci_device_ids,
        architecture=architecture,
        compute_capability=row.compute_capability,
        total_memory_mib=row.total_memory_mib,
        memory_slices=row.memory_slices,
        compute_slices=row.compute_slices,
        max_gpu_instances=row.max_gpu_instances,
        min_driver=row.min_driver,
        source=row.source,
        unverified=frozenset(row.unverified),
        profiles=tuple(_profile_from_row(p, row.unverified) for p in row.profiles),
    )


@cache
def models() -> tuple[GpuModel, ...]:
    """Every supported model, in table order."""
    return tuple(_model_from_row(row) for row in _mig_table.MODELS)


def model(name: str, field_name: str = "model") -> GpuModel:
    """The one resolver every command uses: a catalogue name (case-insensitive), a product
    name as NVML reports it with or without ``NVIDIA `` (``A100-SXM4-80GB``), a PCI device id
    (``0x20B2``, or with NVIDIA's vendor id, ``0x20B210DE``), or a unique prefix (``h200``).
    Anything else is refused naming the field and every valid name."""
    found = find_model(name)
    if found is None:
        raise _unknown(name, field_name, [m.name for m in models()])
    return found


def _unknown(name: str, field_name: str, names: list[str]) -> UnknownModelError:
    """Why ``name`` resolves to no card: unknown, or a prefix of several (named)."""
    lowered = name.strip().lower()
    several = [n for n in names if lowered and n.lower().startswith(lowered)]
    problem = (f"GPU model {name!r} is ambiguous: it starts {', '.join(several)}"
               if len(several) > 1 else f"unknown GPU model {name!r}")
    return UnknownModelError(
        field_name, f"{problem} (a catalogue name, an NVML product name, a PCI device id "
        "or a unique prefix)", names)


def _pci_id(text: str) -> int | None:
    digits = text.removeprefix("0x")
    if not 4 <= len(digits) <= 8 or any(c not in "0123456789abcdef" for c in digits):
        return None
    return int(digits, 16)


class _Named(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def product_names(self) -> tuple[str, ...]: ...

    @property
    def pci_device_ids(self) -> tuple[int, ...]: ...


_C = TypeVar("_C", bound=_Named)


def _exact(cards: Sequence[_C], name: str, pci_device_id: int | None,
           spellings: Iterable[str]) -> _C | None:
    """By PCI device id (exact), catalogue name, product name in ``spellings``, or PCI id
    text, in that order."""
    if pci_device_id is not None:
        for candidate in cards:
            if pci_device_id in candidate.pci_device_ids:
                return candidate
    lowered = name.strip().lower()
    if not lowered:
        return None
    for candidate in cards:
        if candidate.name.lower() == lowered:
            return candidate
    for product in spellings:
        for candidate in cards:
            if any(p.lower() == product for p in candidate.product_names):
                return candidate
    number = _pci_id(lowered)
    if number is not None:
        for candidate in cards:
            if any(number in (full, full >> 16) for full in candidate.pci_device_ids):
                return candidate
    return None


def _prefix(cards: Sequence[_C], name: str) -> _C | None:
    """The one card whose catalogue name starts with ``name`` (none when several do)."""
    lowered = name.strip().lower()
    prefixed = [c for c in cards if lowered and c.name.lower().startswith(lowered)]
    return prefixed[0] if len(prefixed) == 1 else None


def find_model(name: str, pci_device_id: int | None = None) -> GpuModel | None:
    """Map a card to its model: by PCI device id first (exact), else as :func:`model` reads
    ``name``; None when nothing (or more than one model, for a prefix) matches."""
    lowered = name.strip().lower()
    return _exact(models(), name, pci_device_id, (lowered, f"nvidia {lowered}")) or _prefix(
        models(), name)  # "h200" is H200-141GB; "a100" is neither


def model_from_product_label(label: str) -> GpuModel | None:
    """The model a node's ``nvidia.com/gpu.product`` label names: GPU feature discovery writes
    the NVML product name with spaces as dashes (``NVIDIA-A100-SXM4-80GB``); a catalogue name
    or product name as such is taken too."""
    wanted = label.strip().lower()
    for candidate in models():
        spellings = (candidate.name, *candidate.product_names)
        if any(s.lower() == wanted or s.replace(" ", "-").lower() == wanted for s in spellings):
            return candidate
    return find_model(label)


def mig_resource_name(profile_name: str) -> str:
    """``1g.10gb+me`` -> ``nvidia.com/mig-1g.10gb.me``, as NVIDIA's device plugin names it."""
    return MIG_RESOURCE_PREFIX + profile_name.replace("+", ".")


def shared_resource(size_gib: int | None = None) -> str:
    """The resource of a GPU's shares: ``nvidia.com/gpu.shared`` (NVIDIA's name, equal shares
    of the card) or, memory-sized, ``nvidia.com/gpu.shared-<N>gb`` (shares of N GiB each)."""
    return MPS_SHARED_RESOURCE if size_gib is None else f"{MPS_SHARED_RESOURCE}-{size_gib}gb"


def share_size_gib(resource: str) -> int | None:
    """N of ``nvidia.com/gpu.shared-<N>gb``; None for any other resource."""
    prefix = MPS_SHARED_RESOURCE + "-"
    if resource.startswith(prefix) and resource.endswith("gb"):
        digits = resource[len(prefix):-2]
        if digits.isdigit() and int(digits) > 0:
            return int(digits)
    return None


def is_gpu_share(resource: str) -> bool:
    """A share of a whole GPU (MPS share or time-slicing replica), plain or memory-sized."""
    return resource == MPS_SHARED_RESOURCE or share_size_gib(resource) is not None


def shares_of(memory_mib: int, size_gib: int) -> int:
    """How many shares of ``size_gib`` a card of ``memory_mib`` holds (MPS's client limit
    bounds it)."""
    return min(MPS_MAX_CLIENTS, memory_mib // (size_gib * 1024))


SHARED_SUFFIX = ".shared"
"""What NVIDIA's plugin appends to a shared device's resource (``renameByDefault``)."""


def shared_mig_resource_name(profile: str) -> str:
    """MPS shares of a MIG device: ``nvidia.com/mig-<profile>.shared``, the name NVIDIA's
    plugin gives a shared MIG device (``renameByDefault``)."""
    return mig_resource_name(profile) + SHARED_SUFFIX


def profile_name_from_resource(resource: str) -> str:
    """Inverse of :func:`mig_resource_name` for the profiles in the catalogue."""
    if not resource.startswith(MIG_RESOURCE_PREFIX):
        raise UnknownProfileError(
            "resource",
            f"{resource!r} is not a MIG resource (expected {MIG_RESOURCE_PREFIX}<profile>)",
        )
    suffix = resource[len(MIG_RESOURCE_PREFIX) :]
    for candidate in models():
        for profile in candidate.profiles:
            if profile.resource_name == resource:
                return profile.name
    return suffix


def expected_profile_name(model_: GpuModel, profile: MigProfile,
                          total_gib: int | None = None) -> str:
    """The name NVIDIA's go-nvlib derives from memory fraction and total memory.

    ``GB = round(ceil(mem / total * 8) / 8 * ceil(total / 1 GiB))``, then the variant suffix
    (:func:`variant_of`). Used to cross-check the table: a row whose name disagrees with its
    memory has a typo in one of them. ``total_gib`` overrides the card's total, to derive the
    names an earlier driver gave (see :attr:`MigProfile.aliases`).
    """
    total = total_gib or math.ceil(model_.total_memory_mib / 1024)
    eighths = math.ceil(profile.memory_mib / model_.total_memory_mib * 8)
    gigabytes = math.floor(eighths / 8 * total + 0.5)  # Go's math.Round: half away from 0
    return f"{profile.compute_slices}g.{gigabytes}gb{profile.variant}"


def describe(models_: Iterable[GpuModel],
             whole: Iterable[WholeGpu] = ()) -> dict[str, object]:
    """The catalogue as plain data: the documented shape of ``tessera catalogue --json``.

    ``{"version": 1, "models": [{name, product_names, pci_device_ids (hex strings),
    architecture, total_memory_mib, memory_slices, compute_slices, max_gpu_instances,
    mig_enable_resets_gpu, verified, unverified, source, profiles: [{name, variant, aliases,
    resource_name,
    nvml_constant, nvml_constant_value, profile_id, compute_slices, memory_slices, memory_mib,
    max_count, sm_count, engines: {copy, decoders, encoders, jpeg, ofa}, placements: [{start,
    size, gpu_instance_id}], verified, unverified}]}], "whole_gpus": [{name, product_names,
    pci_device_ids, architecture, total_memory_mib, mps_supported, unverified, source}]}``
    """
    return {
        "version": 1,
        "models": [
            {
                "name": m.name,
                "product_names": list(m.product_names),
                "pci_device_ids": [f"0x{pci:08X}" for pci in m.pci_device_ids],
                "architecture": m.architecture,
                "total_memory_mib": m.total_memory_mib,
                "memory_slices": m.memory_slices,
                "compute_slices": m.compute_slices,
                "max_gpu_instances": m.max_gpu_instances,
                "mig_enable_resets_gpu": m.mig_enable_resets_gpu,
                "verified": m.verified,
                "unverified": sorted(m.unverified),
                "source": m.source,
                "profiles": [
                    {
                        "name": p.name,
                        "variant": p.variant,
                        "aliases": list(p.aliases),
                        "resource_name": p.resource_name,
                        "nvml_constant": p.nvml_constant_name,
                        "nvml_constant_value": p.nvml_constant,
                        "profile_id": p.profile_id,
                        "compute_slices": p.compute_slices,
                        "memory_slices": p.memory_slices,
                        "memory_mib": p.memory_mib,
                        "max_count": p.max_count,
                        "sm_count": p.sm_count,
                        "engines": {
                            "copy": p.engines.copy,
                            "decoders": p.engines.decoders,
                            "encoders": p.engines.encoders,
                            "jpeg": p.engines.jpeg,
                            "ofa": p.engines.ofa,
                        },
                        "placements": [
                            {
                                "start": pl.start,
                                "size": pl.size,
                                "gpu_instance_id": m.gpu_instance_id(pl),
                            }
                            for pl in p.placements
                        ],
                        "verified": p.verified,
                        "unverified": sorted(p.unverified),
                    }
                    for p in m.profiles
                ],
            }
            for m in models_
        ],
        "whole_gpus": [
            {
                "name": w.name,
                "product_names": list(w.product_names),
                "pci_device_ids": [f"0x{pci:08X}" for pci in w.pci_device_ids],
                "architecture": w.architecture,
                "total_memory_mib": w.total_memory_mib,
                "mps_supported": w.mps_supported,
                "unverified": sorted(w.unverified),
                "source": w.source,
            }
            for w in whole
        ],
    }


@dataclass(frozen=True)
class WholeGpu:
    """A card without MIG: Tessera shares it whole, by MPS or time-slicing.

    The MIG models share the same facts (memory, architecture) through :class:`GpuModel`;
    :func:`card` resolves either."""

    name: str
    product_names: tuple[str, ...]
    pci_device_ids: tuple[int, ...]
    architecture: str
    compute_capability: tuple[int, int]
    """CUDA's (major, minor), as ``nvmlDeviceGetCudaComputeCapability`` gives it."""
    total_memory_mib: int
    source: str
    unverified: frozenset[str]

    @property
    def mps_supported(self) -> bool:
        """MPS with per-client limits needs Volta or later; every card here has it."""
        return self.architecture != "pascal"


@cache
def whole_gpus() -> tuple[WholeGpu, ...]:
    """Every card without MIG that Tessera knows, in table order."""
    return tuple(
        WholeGpu(name=row.name, product_names=row.product_names,
                 pci_device_ids=row.pci_device_ids, architecture=row.architecture,
                 compute_capability=row.compute_capability,
                 total_memory_mib=row.total_memory_mib, source=row.source,
                 unverified=frozenset(row.unverified))
        for row in _mig_table.WHOLE_GPUS)


Card = GpuModel | WholeGpu


def find_card(name: str, pci_device_id: int | None = None) -> Card | None:
    """:func:`find_model`, then the same rules over the cards without MIG (whose product
    name driver 465 prefixed: "NVIDIA Tesla T4"); a prefix must be unique over both."""
    lowered = name.strip().lower()
    spellings = (lowered, f"nvidia {lowered}", lowered.removeprefix("nvidia "))
    every: list[Card] = [*models(), *whole_gpus()]
    return (_exact(models(), name, pci_device_id, spellings[:2])
            or _exact(whole_gpus(), name, pci_device_id, spellings) or _prefix(every, name))


def card(name: str, field_name: str = "model") -> Card:
    """Any card Tessera knows, MIG-capable or not, named as :func:`model` reads names."""
    found = find_card(name)
    if found is None:
        raise _unknown(name, field_name, [m.name for m in models()]
                       + [w.name for w in whole_gpus()])
    return found
