"""Recent waits: how long a pod must have waited before it may reserve GPUs."""

from __future__ import annotations

import pytest

from tessera.controller.waits import AT_LEAST, KEPT, RecentWaits


def waits(*seconds: float) -> RecentWaits:
    found = RecentWaits()
    for s in seconds:
        found.add(s)
    return found


def test_a_pod_reserves_after_factor_times_the_median_recent_wait() -> None:
    found = waits(*([2.0] * 15), *([600.0] * 10))  # most start in seconds, a few wait long
    assert found.reserve_after(2.0) == 4.0
    assert found.reserve_after(0.5) == 1.0


def test_with_too_few_waits_known_every_pod_reserves_at_once() -> None:
    # A new or restarted controller knows no typical wait yet: reserving as without the rule.
    assert waits(*([30.0] * (AT_LEAST - 1))).reserve_after(2.0) == 0.0
    assert waits(*([30.0] * AT_LEAST)).reserve_after(2.0) == 60.0


def test_a_factor_of_zero_turns_the_rule_off() -> None:
    assert waits(*([30.0] * KEPT)).reserve_after(0.0) == 0.0


def test_only_the_latest_waits_count() -> None:
    found = waits(*([1000.0] * KEPT), *([3.0] * (KEPT // 2 + 1)))
    assert len(found) == KEPT
    assert found.reserve_after(1.0) == 3.0, "the load changed: the old long waits age out"


def test_a_clock_step_back_counts_as_no_wait() -> None:
    found = waits(*([-5.0] * AT_LEAST))
    assert found.reserve_after(2.0) == 0.0


@pytest.mark.parametrize("factor", [1.0, 2.0, 3.0])
def test_the_wait_asked_grows_with_the_factor(factor: float) -> None:
    assert waits(*([10.0] * AT_LEAST)).reserve_after(factor) == pytest.approx(10.0 * factor)


def test_seeded_from_bound_pods_the_latest_kept_count_whatever_their_order() -> None:
    found = RecentWaits()
    # (bound at, waited): the KEPT latest bound waited 5 s; older ones waited long.
    old = [(float(t), 900.0) for t in range(KEPT)]
    new = [(float(KEPT + t), 5.0) for t in range(KEPT)]
    assert found.seed([*new[::2], *old, *new[1::2]]) == KEPT
    assert len(found) == KEPT
    assert found.reserve_after(1.0) == 5.0


def test_waits_measured_after_the_seed_are_the_newest() -> None:
    found = waits(*([7.0] * KEPT))
    found.seed((float(t), 900.0) for t in range(KEPT))
    assert found.reserve_after(1.0) == 7.0, "released by this controller: they stay"
    assert waits().seed([]) == 0
