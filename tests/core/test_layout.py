"""The layout model: which sets of placed slices a card holds, and how to go from one to another."""

from __future__ import annotations

import itertools

import pytest

from tessera.core import catalogue
from tessera.core.errors import InvalidLayoutError, UnknownProfileError
from tessera.core.layout import (
    Slice,
    check_layout,
    conflict_with,
    count_profiles,
    diff_layouts,
    enumerate_layouts,
    free_memory_slices,
    is_valid,
    layout_for_counts,
    parse_slice,
    reachability,
)

A30 = catalogue.model("A30-24GB")
A100 = catalogue.model("A100-SXM4-40GB")
H100 = catalogue.model("H100-80GB")


def S(text: str) -> Slice:
    return parse_slice(text)


class TestValidation:
    def test_a_full_mixed_layout_is_valid(self) -> None:
        check_layout(A100, [S("4g.20gb@0"), S("2g.10gb@4"), S("1g.5gb@6")])

    def test_4g_plus_3g_is_allowed_since_r510(self) -> None:
        check_layout(A100, [S("4g.20gb@0"), S("3g.20gb@4")])

    def test_a_start_the_profile_does_not_offer_is_refused_naming_the_field(self) -> None:
        with pytest.raises(InvalidLayoutError) as error:
            check_layout(A100, [S("1g.5gb@0"), S("2g.10gb@6")], field="spec.slices")
        assert error.value.field == "spec.slices[1].start"
        assert "valid starts: 0, 2, 4" in str(error.value)

    def test_overlapping_memory_slices_are_refused(self) -> None:
        with pytest.raises(InvalidLayoutError) as error:
            check_layout(A100, [S("3g.20gb@4"), S("1g.5gb@5")])
        assert error.value.field == "slices[1]"
        assert "overlaps 3g.20gb@4" in str(error.value)

    def test_counts_are_limited_per_profile(self) -> None:
        with pytest.raises(InvalidLayoutError, match=r"at most 1 x 1g\.5gb\+me"):
            check_layout(A100, [S("1g.5gb+me@0"), S("1g.5gb+me@1")])

    def test_only_one_media_extension_profile_fits_on_a_card(self) -> None:
        """The card has one OFA: 1g.6gb+me and 2g.12gb+me both want it."""
        with pytest.raises(InvalidLayoutError, match="engines"):
            check_layout(A30, [S("1g.6gb+me@0"), S("2g.12gb+me@2")])
        check_layout(A30, [S("1g.6gb+me@0"), S("2g.12gb@2")])

    def test_an_unknown_profile_names_the_valid_ones(self) -> None:
        with pytest.raises(UnknownProfileError) as error:
            check_layout(A30, [S("1g.5gb@0")])
        assert error.value.field == "slices[0].profile"
        assert "1g.6gb" in error.value.choices

    def test_parse_refuses_text_without_a_start(self) -> None:
        with pytest.raises(InvalidLayoutError, match="PROFILE@START"):
            parse_slice("1g.5gb", field="spec.gpus[0].slices[0]")

    def test_free_memory_slices(self) -> None:
        assert free_memory_slices(A100, [S("3g.20gb@4"), S("1g.5gb@0")]) == {1, 2, 3}

    def test_conflict_kinds_separate_bad_placements_from_a_full_card(self) -> None:
        placement = conflict_with(A100, [], S("1g.5gb@7"))
        assert placement is not None
        assert placement.kind == "placement"
        full = conflict_with(A100, [S("7g.40gb@0")], S("1g.5gb@0"))
        assert full is not None
        assert full.kind == "resources"


class TestEnumeration:
    def test_a30_layout_count_matches_the_hand_count(self) -> None:
        """A30: two halves (slices 0-1, 2-3) or one 4g.

        Without +me profiles a half is empty, 1g@a, 1g@b, both 1g, or 2g: 5 ways, so 25 layouts,
        plus 4g alone: 26. With the card's single media-extension set in use, either one 2g is
        the +me one (a 2g appears in 10 of the 25 half-pairs, once each) or one 1g is: 1g
        instances over the 25 half-pairs total 4*5 + 5*4 = 40. 26 + 10 + 40 = 76.
        """
        assert sum(1 for _ in enumerate_layouts(A30)) == 76

    def test_a100_40gb_layout_count_matches_the_hand_count(self) -> None:
        """A100-40GB: halves 0-3 and 4-7, or one 7g.

        A pair of memory slices where 1g.5gb may sit on both (0-1, 2-3, 4-5) holds nothing,
        1g@a, 1g@b, both, 1g.10gb or 2g.10gb: 6 ways with 4 1g.5gb instances among them. The pair
        6-7 takes nothing, 1g.5gb@6 or 1g.10gb@6: 3 ways, 1 instance. Left half: 4g, 3g, or 6*6
        pairs = 38 ways, 1g.5gb instances 4*6 + 6*4 = 48. Right half: 3g@4 or 6*3 = 19 ways,
        instances 4*3 + 6*1 = 18. Without +me: 38*19 + 1 (7g) = 723. The one 1g.5gb+me can be any
        1g.5gb instance: 48*19 + 38*18 = 1596 more. 723 + 1596 = 2319.
        """
        assert sum(1 for _ in enumerate_layouts(A100)) == 2319

    def test_every_enumerated_layout_is_valid_and_distinct(self) -> None:
        layouts = list(enumerate_layouts(A30))
        assert len(set(layouts)) == len(layouts)
        assert all(is_valid(A30, sorted(layout)) for layout in layouts)
        assert frozenset() in layouts


class TestDiff:
    def test_destroys_come_before_creates_and_kept_slices_are_untouched(self) -> None:
        current = [S("3g.20gb@4"), S("1g.5gb@0"), S("1g.5gb@1")]
        target = [S("3g.20gb@4"), S("2g.10gb@0"), S("1g.10gb@2")]
        diff = diff_layouts(A100, current, target)
        assert diff.keep == (S("3g.20gb@4"),)
        assert set(diff.destroy) == {S("1g.5gb@0"), S("1g.5gb@1")}
        assert set(diff.create) == {S("2g.10gb@0"), S("1g.10gb@2")}

    def test_no_change_is_an_empty_diff(self) -> None:
        layout = [S("7g.40gb@0")]
        assert diff_layouts(A100, layout, layout).empty

    def test_an_invalid_target_is_refused_before_any_step(self) -> None:
        with pytest.raises(InvalidLayoutError) as error:
            diff_layouts(A100, [], [S("4g.20gb@0"), S("4g.20gb@4")])
        assert error.value.field.startswith("target")


class TestReachability:
    def test_a_target_that_keeps_in_use_slices_is_reachable(self) -> None:
        current = [S("1g.10gb@0"), S("1g.10gb@2")]
        target = [S("1g.10gb@0"), S("3g.40gb@4")]
        result = reachability(H100, current, target, in_use=[S("1g.10gb@0")])
        assert result.reachable

    def test_a_target_that_drops_an_in_use_slice_names_it(self) -> None:
        current = [S("1g.10gb@0"), S("1g.10gb@2")]
        result = reachability(H100, current, [S("7g.80gb@0")], in_use=[S("1g.10gb@2")])
        assert not result.reachable
        assert result.blocking == (S("1g.10gb@2"),)

    def test_in_use_slices_must_exist(self) -> None:
        with pytest.raises(InvalidLayoutError, match="not in the current layout"):
            reachability(H100, [], [], in_use=[S("1g.10gb@0")])


class TestCounts:
    def test_mig_parted_counts_get_placements(self) -> None:
        assert layout_for_counts(A100, {"1g.5gb": 7}) == {S(f"1g.5gb@{i}") for i in range(7)}
        mixed = layout_for_counts(A100, {"3g.20gb": 1, "2g.10gb": 1, "1g.5gb": 2})
        assert is_valid(A100, sorted(mixed))
        assert sorted(s.profile for s in mixed) == ["1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"]
        assert layout_for_counts(A100, {"3g.20gb": 1, "2g.10gb": 1, "1g.5gb": 2}) == mixed

    def test_a_card_already_cut_to_the_counts_keeps_its_placements(self) -> None:
        """mig-parted asserts counts only: a card cut to an entry by it (or by hand) is left
        exactly as it is, whatever the placements: every layout an A30 can hold, and a spread
        of an A100-40GB's 2,319."""
        for model, every in ((A30, 1), (A100, 290)):
            for current in itertools.islice(enumerate_layouts(model), 0, None, every):
                assert layout_for_counts(model, count_profiles(current), keep=current) == current

    def test_otherwise_the_layout_that_keeps_most_current_slices_wins(self) -> None:
        """Checked against brute force: every set of placements an A30 has, kept if valid."""
        placements = [Slice(p.name, start) for p in A30.profiles for start in p.starts]
        layouts = [frozenset(chosen) for size in range(len(placements) + 1)
                   for chosen in itertools.combinations(placements, size)
                   if is_valid(A30, chosen)]
        by_counts: dict[tuple[tuple[str, int], ...], list[frozenset[Slice]]] = {}
        for found in layouts:
            by_counts.setdefault(tuple(sorted(count_profiles(found).items())), []).append(found)
        for current in layouts:
            for counts, same in by_counts.items():
                chosen = layout_for_counts(A30, dict(counts), keep=current)
                assert chosen in same
                assert len(chosen & current) == max(len(other & current) for other in same)
        assert len(layouts) > 20

    def test_counts_that_do_not_fit_are_refused_naming_them(self) -> None:
        with pytest.raises(InvalidLayoutError, match=r"holds 0\.\.1 x 4g\.20gb, not 2"):
            layout_for_counts(A100, {"4g.20gb": 2}, field="static[0].migDevices")
        with pytest.raises(InvalidLayoutError, match="does not fit"):
            layout_for_counts(A100, {"3g.20gb": 2, "1g.5gb": 1})
