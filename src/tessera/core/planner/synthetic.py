"""Seeded generators of clusters and pending pods, for property tests and benchmarks.

Pure functions of a :class:`random.Random`, so a failing case is reproduced from its seed. The
clusters look like a busy GPU fleet: some GPUs whole, some split into random valid layouts with
some slices in use, a few nodes static or tainted; the pods mostly ask for one small slice, a
few for several slices, mixed profiles or a whole card.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from tessera.core import catalogue, layout
from tessera.core.errors import InvalidLayoutError
from tessera.core.layout import Slice
from tessera.core.planner.model import (
    Gpu,
    GpuSlice,
    MatchExpression,
    Node,
    PendingPod,
    Policy,
    Snapshot,
    Taint,
    Toleration,
)

__all__ = ["STANDARD_SHAPES", "random_layout", "standard_layouts", "synthetic_cluster",
           "synthetic_pods"]

STANDARD_SHAPES: dict[str, tuple[tuple[int, int, int], ...]] = {
    "all-1g": tuple((1, 1, start) for start in range(7)),
    "all-2g": ((2, 2, 0), (2, 2, 2), (2, 2, 4)),
    "all-3g": ((3, 4, 0), (3, 4, 4)),
    "all-4g": ((4, 4, 0),),
    "all-7g": ((7, 8, 0),),
    "all-balanced": ((2, 2, 0), (1, 1, 2), (1, 1, 3), (3, 4, 4)),
    "4g+3g": ((4, 4, 0), (3, 4, 4)),
}
"""NVIDIA's mig-parted default configs for 8-slice cards, as (compute, memory, start) triples.

mig-parted names profiles and counts only; the starts here are the ones that make each set
fit (e.g. all-balanced's 3g must sit at 4 for the two 1g slices to fit at 2 and 3).
"""


def standard_layouts(model_name: str) -> dict[str, tuple[Slice, ...]]:
    """NVIDIA's standard layouts in ``model_name``'s profile names: :data:`STANDARD_SHAPES`
    on 8-slice cards; on the others (A30, RTX PRO 6000) the same configs by mig-parted's
    counts (``all-<C>g`` fills the card with the plain <C>-compute-slice profile,
    ``all-balanced`` is two 1g, one 2g and one 3g where the card has one), as NVIDIA's
    default mig-parted file defines them for those cards."""
    model = catalogue.model(model_name)
    if model.memory_slices != 8:
        return _counted_layouts(model)
    by_shape = {
        (p.compute_slices, p.memory_slices): p.name
        for p in reversed(model.profiles) if p.plain
    }
    out = {}
    for name, shape in STANDARD_SHAPES.items():
        slices = tuple(Slice(by_shape[(c, m)], start) for c, m, start in shape
                       if (c, m) in by_shape)
        if len(slices) == len(shape) and layout.is_valid(model, slices):
            out[name] = slices
    return out


def _counted_layouts(model: catalogue.GpuModel) -> dict[str, tuple[Slice, ...]]:
    smallest: dict[int, catalogue.MigProfile] = {}
    for profile in model.profiles:
        if profile.plain and (profile.compute_slices not in smallest or profile.memory_slices
                              < smallest[profile.compute_slices].memory_slices):
            smallest[profile.compute_slices] = profile
    counts = {f"all-{c}g": {p.name: p.max_count} for c, p in sorted(smallest.items())}
    balanced = {smallest[c].name: n for c, n in ((1, 2), (2, 1), (3, 1)) if c in smallest}
    if len(balanced) > 1:
        counts["all-balanced"] = balanced
    out = {}
    for name, wanted in counts.items():
        try:
            out[name] = tuple(sorted(layout.layout_for_counts(model, wanted),
                                     key=lambda s: s.start))
        except InvalidLayoutError:
            continue
    return out


def random_layout(rng: random.Random, model_name: str, attempts: int) -> list[Slice]:
    """A valid layout built by trying ``attempts`` random (profile, start) additions."""
    model = catalogue.model(model_name)
    candidates = [Slice(p.name, pl.start) for p in model.profiles if p.plain
                  for pl in p.placements]
    chosen: list[Slice] = []
    for _ in range(attempts):
        item = rng.choice(candidates)
        if layout.conflict_with(model, chosen, item) is None:
            chosen.append(item)
    return sorted(chosen, key=lambda s: s.start)


def synthetic_cluster(
    rng: random.Random,
    nodes: int,
    *,
    gpus_per_node: int,
    models: Sequence[str] = ("A100-80GB", "H100-80GB"),
    split: float = 0.5,
    in_use: float = 0.5,
    static: float = 0.0,
    tainted: float = 0.0,
    standard: bool = False,
) -> Snapshot:
    """``split`` of the GPUs carry a layout, each slice in use with ``in_use``.

    ``standard``: the layout is one of NVIDIA's standard ones (what a fleet partitioned by
    mig-parted looks like) with its free slices kept or dropped at random; otherwise it is
    random (the worst case for the fast solver's memo: nearly every GPU is distinct).
    """
    out = []
    for n in range(nodes):
        model = models[n % len(models)]
        gpus = []
        for index in range(gpus_per_node):
            slices: tuple[GpuSlice, ...] = ()
            if rng.random() < split and standard:
                chosen = rng.choice(sorted(standard_layouts(model).items()))[1]
                marked = [GpuSlice(s.profile, s.start, rng.random() < in_use) for s in chosen]
                slices = tuple(s for s in marked if s.in_use or rng.random() < 0.5)
            elif rng.random() < split:
                slices = tuple(
                    GpuSlice(s.profile, s.start, rng.random() < in_use)
                    for s in random_layout(rng, model, rng.randint(1, 6))
                )
            gpus.append(Gpu(index=index, model=model, mode="mig", slices=slices))
        policy = Policy("fixed", "static") if rng.random() < static else Policy()
        taints = (Taint("dedicated", "batch", "NoSchedule"),) if rng.random() < tainted else ()
        out.append(
            Node(
                name=f"node-{n:04d}",
                labels=(("zone", "a" if n % 2 == 0 else "b"),),
                taints=taints,
                gpus=tuple(gpus),
                policy=policy,
            )
        )
    return Snapshot(nodes=tuple(out), now=0.0)


_SMALL = ("1g.10gb", "1g.20gb", "2g.20gb")
_LARGE = ("3g.40gb", "4g.40gb", "7g.80gb")


def synthetic_pods(
    rng: random.Random,
    count: int,
    *,
    multi: float = 0.1,
    priorities: Sequence[int] = (0,),
    filtered: float = 0.0,
    profiles: tuple[Sequence[str], Sequence[str]] = (_SMALL, _LARGE),
) -> tuple[PendingPod, ...]:
    """``count`` pods; ``multi`` of them want several units; ``filtered`` carry node filters.

    Profiles default to the names A100-80GB and H100-80GB share, small ones three times as
    often as large ones.
    """
    small, large = profiles
    pods = []
    for i in range(count):
        def pick() -> str:
            return rng.choice(small) if rng.random() < 0.75 else rng.choice(large)

        requests: dict[str, int] = {}
        units = rng.randint(2, 4) if rng.random() < multi else 1
        for _ in range(units):
            resource = catalogue.mig_resource_name(pick())
            requests[resource] = requests.get(resource, 0) + 1
        selector: tuple[tuple[str, str], ...] = ()
        affinity: tuple[tuple[MatchExpression, ...], ...] = ()
        tolerations: tuple[Toleration, ...] = ()
        if rng.random() < filtered:
            kind = rng.randint(0, 2)
            if kind == 0:
                selector = (("zone", rng.choice("ab")),)
            elif kind == 1:
                affinity = ((MatchExpression("zone", "NotIn", (rng.choice("ab"),)),),)
            else:
                tolerations = (Toleration("dedicated", "Equal", "batch", "NoSchedule"),)
        pods.append(
            PendingPod(
                namespace="default",
                name=f"pod-{i:05d}",
                requests=tuple(sorted(requests.items())),
                priority=rng.choice(list(priorities)),
                creation_time=float(i),
                node_selector=selector,
                affinity_terms=affinity,
                tolerations=tolerations,
            )
        )
    return tuple(pods)
