"""A GPU model's placements as bit masks, so the planner's many layout checks cost O(1).

A layout is an int over the model's candidate (profile, start) pairs. The rules are those of
:func:`tessera.core.layout.check_layout` (no shared memory slice, per-profile and total
counts, compute slices, engines), applied on ints: engines and per-profile counts are packed
into one int each, field by field, so a sum is one addition and a budget check one
subtraction (SWAR). Final plans still go through :func:`layout.check_layout`; a test
compares both on every layout of every model.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from tessera.core import catalogue
from tessera.core.catalogue import GpuModel
from tessera.core.layout import Slice

__all__ = ["Aggregate", "Geometry", "bits", "geometry_of"]

_FIELD = 8
"""Bits per packed field; every count and engine total stays below 128."""


def _pack(values: tuple[int, ...]) -> int:
    return sum(v << (_FIELD * i) for i, v in enumerate(values))


def _guards(fields: int) -> int:
    return sum(1 << (_FIELD * i + _FIELD - 1) for i in range(fields))


@dataclass(frozen=True)
class Aggregate:
    """What a set of slices uses up; enough to tell in O(1) whether one more slice fits."""

    valid: bool
    memory: int
    compute: int
    count: int
    packed: int
    """Per-profile counts and engine totals, one 8-bit field each (see :func:`_pack`)."""


class Geometry:
    """A model's placements as bit masks: a layout is an int over the candidate (profile, start)s.

    Checking a layout with :func:`layout.check_layout` costs ~100 us; these checks apply the same
    rules (overlap, per-profile and total counts, compute slices, engines) on ints and are
    memoised, which is what makes thousands of distinct GPU states affordable. The final plan
    still goes through :func:`layout.check_layout`, and a test compares both on every layout.
    """

    def __init__(self, model: GpuModel) -> None:
        self.model = model
        profiles = list(model.profiles)
        self.slices = tuple(Slice(p.name, pl.start) for p in profiles for pl in p.placements)
        self.index = {s: i for i, s in enumerate(self.slices)}
        self.profile_of = tuple(next(j for j, p in enumerate(profiles) if p.name == s.profile)
                                for s in self.slices)
        self.memory = tuple(
            ((1 << model.profile(s.profile).memory_slices) - 1) << s.start for s in self.slices
        )
        self.size = tuple(model.profile(s.profile).memory_slices for s in self.slices)
        self.compute = tuple(model.profile(s.profile).compute_slices for s in self.slices)
        fields = len(profiles) + 5
        # One packed int per candidate: a 1 in its profile's field, then its engines.
        self.packed = tuple(
            _pack(tuple(int(j == self.profile_of[i]) for j in range(len(profiles)))
                  + _engines(model.profile(s.profile).engines))
            for i, s in enumerate(self.slices)
        )
        self.limit = _pack(tuple(p.max_count for p in profiles) + _engines(model.engine_budget))
        self._guard = _guards(fields)
        self._limit_guarded = self.limit | self._guard
        self.by_profile = {
            p.name: tuple(i for i, s in enumerate(self.slices) if s.profile == p.name)
            for p in profiles
        }
        self.profile_mask = {
            name: sum(1 << i for i in ids) for name, ids in self.by_profile.items()
        }
        self.overlap = tuple(
            sum(1 << j for j in range(len(self.slices)) if self.memory[i] & self.memory[j])
            for i in range(len(self.slices))
        )
        self.flex = tuple(
            sum(self.size[i] for i in range(len(self.slices)) if not self.memory[i] & used)
            for used in range(1 << model.memory_slices)
        )
        self._aggregates: dict[int, Aggregate] = {}

    def within(self, packed: int) -> bool:
        """Every field of ``packed`` at most the model's limit (counts, engines)."""
        return (self._limit_guarded - packed) & self._guard == self._guard

    def aggregate(self, mask: int) -> Aggregate:
        found = self._aggregates.get(mask)
        if found is not None:
            return found
        memory = compute = count = packed = 0
        valid = True
        rest = mask
        while rest:
            low = rest & -rest
            i = low.bit_length() - 1
            rest ^= low
            if memory & self.memory[i]:
                valid = False
            memory |= self.memory[i]
            compute += self.compute[i]
            count += 1
            packed += self.packed[i]
        model = self.model
        valid = (valid and compute <= model.compute_slices
                 and count <= model.max_gpu_instances and self.within(packed))
        found = Aggregate(valid, memory, compute, count, packed)
        self._aggregates[mask] = found
        return found

    def fits(self, base: Aggregate, i: int) -> bool:
        """Whether candidate ``i`` can join the valid layout summarised by ``base``."""
        model = self.model
        return (
            not base.memory & self.memory[i]
            and base.compute + self.compute[i] <= model.compute_slices
            and base.count < model.max_gpu_instances
            and self.within(base.packed + self.packed[i])
        )

    def valid(self, mask: int) -> bool:
        return self.aggregate(mask).valid

    def to_slices(self, mask: int) -> frozenset[Slice]:
        return frozenset(self.slices[i] for i in bits(mask))

    def to_mask(self, slices: frozenset[Slice]) -> int:
        return sum(1 << self.index[s] for s in slices)


def _engines(engines: catalogue.Engines) -> tuple[int, ...]:
    return (engines.copy, engines.decoders, engines.encoders, engines.jpeg, engines.ofa)


@cache
def geometry_of(model_name: str) -> Geometry:
    return Geometry(catalogue.model(model_name))


@cache
def hostable(model_name: str, held: int, profile: str) -> bool:
    """Whether ``profile`` fits on a GPU of ``model_name`` beside the ``held`` slices (a mask)
    once its free ones are destroyed: what can start there after a reshape."""
    geometry = geometry_of(model_name)
    if profile not in geometry.by_profile:
        return False
    base = geometry.aggregate(held)
    return any(geometry.fits(base, i) for i in geometry.by_profile[profile])


def bits(mask: int) -> list[int]:
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


