"""DRA counters: a set of devices fits a GPU's counters exactly when it is a valid MIG layout."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

import pytest

from tessera.core import catalogue, dra
from tessera.core.catalogue import GpuModel
from tessera.core.layout import Slice, enumerate_layouts, is_valid

MODELS = catalogue.models()
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def _allowed_by_counters(model: GpuModel, held: Sequence[Slice] = ()
                         ) -> Iterator[frozenset[Slice]]:
    """Every set of devices the scheduler could allocate together (each set once)."""
    capacity = dra.capacities(model, held)
    offers = [o.slice for o in dra.devices(model, 0)]

    def extend(index: int, chosen: list[Slice], used: dict[str, int]
               ) -> Iterator[frozenset[Slice]]:
        yield frozenset(chosen)
        for next_index in range(index, len(offers)):
            item = offers[next_index]
            take = dra.consumption(model, item)
            if dra.fits(capacity, used, take):
                chosen.append(item)
                for counter, amount in take.items():
                    used[counter] = used.get(counter, 0) + amount
                yield from extend(next_index + 1, chosen, used)
                chosen.pop()
                for counter, amount in take.items():
                    used[counter] -= amount

    yield from extend(0, [], {})


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
def test_the_counters_allow_exactly_the_valid_layouts(model: GpuModel) -> None:
    allowed = set(_allowed_by_counters(model))
    valid = set(enumerate_layouts(model))
    assert allowed - valid == set(), "the counters let the scheduler pick an invalid layout"
    assert valid - allowed == set(), "the counters refuse a valid layout"
    assert len(valid) > len(model.profiles)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
def test_slices_outside_dra_take_their_share_of_the_counters(model: GpuModel) -> None:
    layouts = sorted(enumerate_layouts(model), key=lambda s: (len(s), sorted(s)))
    # a few held layouts of each size: one slice, two, the most
    samples = [layouts[1], next(s for s in layouts if len(s) == 2), layouts[-1]]
    for held in samples:
        allowed = set(_allowed_by_counters(model, sorted(held)))
        expected = {layout - held for layout in layouts if held <= layout}
        assert allowed == expected, f"held {sorted(held)}"


def test_a_held_layout_that_is_not_valid_is_refused() -> None:
    a100 = catalogue.model("A100-80GB")
    with pytest.raises(ValueError, match="overcommit memory-slice-0"):
        dra.capacities(a100, [Slice("7g.80gb", 0), Slice("1g.10gb", 0)])


def test_every_model_fits_the_api_limits_and_names_are_labels() -> None:
    for model in MODELS:
        assert len(dra.capacities(model)) <= dra.MAX_COUNTERS_PER_SET
        offers = dra.devices(model, 15)
        assert len(offers) <= dra.MAX_DEVICES_PER_SLICE
        names = [o.name for o in offers]
        assert len(set(names)) == len(names)
        for name in [*names, *dra.capacities(model), dra.counter_set_name(15)]:
            assert DNS_LABEL.fullmatch(name), name
        assert all(is_valid(model, [o.slice]) for o in offers)
        assert {o.slice for o in offers} == {Slice(p.name, pl.start) for p in model.profiles
                                             for pl in p.placements}


def test_profile_labels_never_collide() -> None:
    names = dra.all_profile_names()
    labels = {dra.profile_label(n) for n in names}
    assert len(labels) == len(names)
    assert dra.profile_label("1g.24gb+me") != dra.profile_label("1g.24gb-me")
    assert dra.device_class_name("1g.10gb") == "mig-1g10gb.gpu.tessera.dev"


def test_small_placements_are_listed_from_the_top_so_first_fit_keeps_large_ones() -> None:
    a100 = catalogue.model("A100-80GB")
    ones = [o.slice.start for o in dra.devices(a100, 0) if o.slice.profile == "1g.10gb"]
    assert ones == [6, 5, 4, 3, 2, 1, 0]
    # first fit of three 1g slices from the top leaves room for a 4g at 0
    capacity, used = dra.capacities(a100), dict[str, int]()
    for start in ones[:3]:
        for counter, n in dra.consumption(a100, Slice("1g.10gb", start)).items():
            used[counter] = used.get(counter, 0) + n
    assert dra.fits(capacity, used, dra.consumption(a100, Slice("4g.40gb", 0)))


def test_curation_keeps_idle_gpus_whole_while_a_split_one_has_room() -> None:
    a100 = catalogue.model("A100-80GB")
    split = dra.GpuUse(a100, frozenset({Slice("3g.40gb", 4)}))
    idle = dra.GpuUse(a100, frozenset())
    tainted = dra.curate([idle, split, idle])
    assert (0, "1g.10gb") in tainted
    assert (2, "3g.40gb") in tainted
    assert (0, "7g.80gb") not in tainted, "nothing split can host a 7g: the idle GPUs offer it"
    assert (0, "4g.40gb") in tainted, "a 4g still fits beside the 3g@4"
    assert not any(position == 1 for position, _ in tainted), "split GPUs are never tainted"


def test_curation_leaves_everything_offered_when_no_gpu_is_split_or_the_split_one_is_full() -> None:
    a100 = catalogue.model("A100-80GB")
    idle = dra.GpuUse(a100, frozenset())
    assert dra.curate([idle, idle]) == frozenset()
    full = dra.GpuUse(a100, frozenset({Slice("7g.80gb", 0)}))
    assert dra.curate([idle, full]) == frozenset()
    sick = dra.GpuUse(a100, frozenset({Slice("3g.40gb", 4)}), healthy=False)
    assert dra.curate([idle, sick]) == frozenset(), "an unhealthy GPU's room is no room"


def test_curation_offers_whole_gpus_on_the_most_loaded_node_that_has_one() -> None:
    a100 = catalogue.model("A100-80GB")
    full = dra.GpuUse(a100, frozenset({Slice("7g.80gb", 0)}), node_load=14)
    spare = dra.GpuUse(a100, frozenset(), node_load=14)
    light = dra.GpuUse(a100, frozenset(), node_load=7)
    fresh = dra.GpuUse(a100, frozenset(), node_load=0)
    tainted = dra.curate([full, spare, light, fresh])
    assert {(2, "7g.80gb"), (3, "7g.80gb"), (3, "1g.10gb")} <= tainted, \
        "lightly loaded nodes drain, idle nodes stay whole"
    assert not any(position == 1 for position, _ in tainted), "the busiest node's idle GPU"
    assert dra.curate([full, fresh, fresh]) == frozenset(), "no busy node has room: offer all"
