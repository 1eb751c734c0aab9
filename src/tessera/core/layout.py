"""The layout model: a GPU's MIG layout is a set of placed slices, checked against the catalogue.

Layouts always carry explicit placements. NVML's placement-free creation is greedy and
order-dependent (mig-parted has to try permutations until one works); with placements, any
subset of a valid layout is valid, so the steps from one layout to another can be ordered once
and always succeed: destroy what goes, then create what comes.

The rules a layout must satisfy, all derived from the catalogue:

- each slice's profile exists on the model and its start is one of the profile's placements;
- no two slices share a memory slice;
- per-profile counts stay within ``max_count`` and the total within ``max_gpu_instances``;
- compute slices and engines (notably the single set of media engines that ``+me`` profiles
  take) stay within the card's budget.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass

from tessera.core.catalogue import NO_ENGINES, GpuModel, MigProfile, Placement
from tessera.core.errors import InvalidLayoutError

__all__ = [
    "Conflict",
    "LayoutDiff",
    "Reachability",
    "Slice",
    "check_layout",
    "conflict_with",
    "count_profiles",
    "diff_layouts",
    "enumerate_layouts",
    "free_memory_slices",
    "is_valid",
    "layout_for_counts",
    "parse_slice",
    "reachability",
]


@dataclass(frozen=True, order=True)
class Slice:
    """A GPU instance as Tessera plans it: a profile at a start (in memory slices)."""

    profile: str
    start: int

    def __str__(self) -> str:
        return f"{self.profile}@{self.start}"

    def placement(self, model: GpuModel) -> Placement:
        return Placement(self.start, model.profile(self.profile).memory_slices)


def parse_slice(text: str, field: str = "slice") -> Slice:
    """Parse ``1g.10gb@2`` (the form Tessera prints) into a :class:`Slice`."""
    profile, sep, start = text.partition("@")
    if not sep or not profile or not start.isdigit():
        raise InvalidLayoutError(field, f"{text!r} is not PROFILE@START, e.g. 1g.10gb@2")
    return Slice(profile, int(start))


@dataclass(frozen=True)
class Conflict:
    """Why a slice cannot join a layout; ``kind`` lets adapters map it onto NVML's return codes."""

    kind: str
    """``placement`` (a start the profile does not offer) or ``resources`` (the card is full)."""
    message: str


def conflict_with(model: GpuModel, existing: Iterable[Slice], new: Slice) -> Conflict | None:
    """Whether ``new`` can be added to the valid layout ``existing``; None when it can."""
    profile = model.profile(new.profile)
    placement = profile.placement_at(new.start)
    if placement is None:
        return Conflict(
            "placement",
            f"{profile.name} cannot start at memory slice {new.start} on {model.name} "
            f"(valid starts: {', '.join(str(s) for s in profile.starts)})",
        )
    current = list(existing)
    for other in current:
        other_placement = other.placement(model)
        if placement.overlaps(other_placement):
            return Conflict(
                "resources",
                f"{new} ({placement}) overlaps {other} ({other_placement}) in memory slices",
            )
    same = sum(1 for other in current if other.profile == new.profile)
    if same + 1 > profile.max_count:
        return Conflict(
            "resources", f"{model.name} holds at most {profile.max_count} x {profile.name}"
        )
    if len(current) + 1 > model.max_gpu_instances:
        return Conflict(
            "resources", f"{model.name} holds at most {model.max_gpu_instances} GPU instances"
        )
    profiles = [model.profile(other.profile) for other in current] + [profile]
    compute = sum(p.compute_slices for p in profiles)
    if compute > model.compute_slices:
        return Conflict(
            "resources",
            f"{new} needs {profile.compute_slices} compute slices; only "
            f"{model.compute_slices - compute + profile.compute_slices} of "
            f"{model.compute_slices} are free",
        )
    engines = NO_ENGINES
    for p in profiles:
        engines = engines + p.engines
    if not engines.fits_within(model.engine_budget):
        return Conflict(
            "resources",
            f"{new} needs engines the card has already given out "
            f"(media engines: a card has {model.engine_budget.ofa} OFA and "
            f"{model.engine_budget.jpeg} JPEG)",
        )
    return None


def check_layout(model: GpuModel, slices: Iterable[Slice], field: str = "slices") -> None:
    """Raise :class:`InvalidLayoutError` naming the first slice that does not fit."""
    accepted: list[Slice] = []
    for index, item in enumerate(slices):
        model.profile(item.profile, field_name=f"{field}[{index}].profile")
        conflict = conflict_with(model, accepted, item)
        if conflict is not None:
            sub_field = f"{field}[{index}].start" if conflict.kind == "placement" else (
                f"{field}[{index}]"
            )
            raise InvalidLayoutError(sub_field, conflict.message)
        accepted.append(item)


def is_valid(model: GpuModel, slices: Iterable[Slice]) -> bool:
    try:
        check_layout(model, slices)
    except InvalidLayoutError:
        return False
    return True


def free_memory_slices(model: GpuModel, slices: Iterable[Slice]) -> frozenset[int]:
    used: set[int] = set()
    for item in slices:
        placement = item.placement(model)
        used.update(range(placement.start, placement.end))
    return frozenset(range(model.memory_slices)) - used


def _candidates(model: GpuModel) -> list[tuple[MigProfile, Slice]]:
    return [
        (profile, Slice(profile.name, placement.start))
        for profile in model.profiles
        for placement in profile.placements
    ]


def enumerate_layouts(model: GpuModel) -> Iterator[frozenset[Slice]]:
    """Every valid layout of the model, the empty one included, each exactly once."""
    candidates = _candidates(model)

    def extend(index: int, chosen: list[Slice]) -> Iterator[frozenset[Slice]]:
        yield frozenset(chosen)
        for next_index in range(index, len(candidates)):
            _, item = candidates[next_index]
            if conflict_with(model, chosen, item) is None:
                chosen.append(item)
                yield from extend(next_index + 1, chosen)
                chosen.pop()

    yield from extend(0, [])


@dataclass(frozen=True)
class LayoutDiff:
    """The steps from one layout to another: destroy first, then create; kept slices untouched."""

    keep: tuple[Slice, ...]
    destroy: tuple[Slice, ...]
    create: tuple[Slice, ...]

    @property
    def empty(self) -> bool:
        return not self.destroy and not self.create


def diff_layouts(
    model: GpuModel, current: Collection[Slice], target: Collection[Slice]
) -> LayoutDiff:
    """Order the change from ``current`` to ``target`` so that every step succeeds.

    Destroying only ever frees capacity, and every intermediate state on the way up is a subset
    of the (valid) target, so it is valid too. Creation goes largest first only for a stable,
    readable order; correctness does not depend on it.
    """
    check_layout(model, target, field="target")
    target_set = set(target)
    current_set = set(current)
    size = {s: s.placement(model).size for s in target_set | current_set}
    return LayoutDiff(
        keep=tuple(sorted(current_set & target_set)),
        destroy=tuple(sorted(current_set - target_set, key=lambda s: (size[s], s))),
        create=tuple(sorted(target_set - current_set, key=lambda s: (-size[s], s.start, s))),
    )


@dataclass(frozen=True)
class Reachability:
    """Whether a target can be reached without touching in-use slices, and what blocks it."""

    blocking: tuple[Slice, ...]

    @property
    def reachable(self) -> bool:
        return not self.blocking


def reachability(
    model: GpuModel,
    current: Collection[Slice],
    target: Collection[Slice],
    in_use: Collection[Slice],
) -> Reachability:
    """A target is reachable iff it keeps every in-use slice exactly where it is."""
    check_layout(model, target, field="target")
    unknown = [s for s in in_use if s not in set(current)]
    if unknown:
        raise InvalidLayoutError(
            "in_use", f"{', '.join(map(str, unknown))} not in the current layout"
        )
    target_set = set(target)
    return Reachability(blocking=tuple(sorted(s for s in in_use if s not in target_set)))


def count_profiles(slices: Iterable[Slice]) -> Counter[str]:
    return Counter(s.profile for s in slices)


def layout_for_counts(model: GpuModel, counts: Mapping[str, int],
                      field: str = "migDevices", keep: Iterable[Slice] = ()) -> frozenset[Slice]:
    """Placements for a mig-parted style ``{profile: count}`` layout, found once, the same always.

    mig-parted has no placements and tries creation orders until one works; with the whole
    layout space enumerable, Tessera picks the valid layout with exactly these counts whose
    larger slices sit lowest (the first in catalogue order), so the same config always gives
    the same placements, and names the counts when none exists.

    ``keep``: the slices the card holds now. Of the layouts with these counts, one that keeps
    the most of them wins (then the order above), because a config asserts counts, not
    placements (``nvidia-mig-parted assert``): a card mig-parted already cut to the entry is
    left as it is, and a slice a pod holds is not moved when another placement would do.
    """
    kept = frozenset(keep)
    wanted: Counter[str] = Counter()
    for name, number in counts.items():
        profile = model.profile(name, field_name=f"{field}.{name}")  # an alias names it too
        wanted[profile.name] += number
        if number < 0 or wanted[profile.name] > profile.max_count:
            raise InvalidLayoutError(
                f"{field}.{name}", f"{model.name} holds 0..{profile.max_count} x {name}, "
                f"not {wanted[profile.name]}")
    wanted = +wanted
    best: frozenset[Slice] | None = None
    best_key: tuple[int, tuple[tuple[int, int], ...]] | None = None
    order = {p.name: i for i, p in enumerate(model.profiles)}
    for candidate in enumerate_layouts(model):
        if count_profiles(candidate) != Counter(wanted):
            continue
        key = (-len(candidate & kept),
               tuple(sorted((order[s.profile], s.start) for s in candidate)))
        if best_key is None or key < best_key:
            best, best_key = candidate, key
    if best is None:
        described = ", ".join(f"{n} x {p}" for p, n in sorted(wanted.items()))
        raise InvalidLayoutError(field, f"{described} does not fit on one {model.name}")
    return best
