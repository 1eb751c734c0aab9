"""Reservations: which GPUs a waiting pod holds back from the pods after it, and why."""

from __future__ import annotations

from typing import Any

import pytest

from tessera.core.planner.parse import parse_cluster, parse_pending
from tessera.core.planner.problem import Problem, prepare
from tessera.core.planner.reserve import blocking, reserve
from tests.core.planner.cases import gpu, pod


def problem(nodes: list[dict[str, Any]], pods: list[dict[str, Any]],
            **cluster: Any) -> Problem:
    return prepare(parse_cluster({"nodes": nodes, **cluster}), parse_pending({"pods": pods}))


def one_gpu(*slices: str, **cluster: Any) -> Problem:
    return problem([{"name": "a", "gpus": [gpu(0, "A100-80GB", *slices)]}],
                   [pod("p", mig_1g_10gb=1)], **cluster)


class TestBlocking:
    def test_a_card_with_nothing_in_use_blocks_nothing(self) -> None:
        info = one_gpu("1g.10gb@0", "3g.40gb@4").gpus[0]  # free slices can be reshaped
        assert blocking(info, "nvidia.com/mig-7g.80gb") == 0.0

    def test_in_use_slices_in_the_way_count_by_their_compute(self) -> None:
        info = one_gpu("1g.10gb@0*").gpus[0]
        assert blocking(info, "nvidia.com/mig-7g.80gb") == pytest.approx(1 / 7)
        assert blocking(info, "nvidia.com/mig-3g.40gb") == 0.0  # fits at start 4

    def test_the_best_placement_is_counted(self) -> None:
        info = one_gpu("2g.20gb@0*", "1g.10gb@4*").gpus[0]
        # 3g.40gb at 0 overlaps the 2g, at 4 the 1g: the 1g is the smaller obstacle.
        assert blocking(info, "nvidia.com/mig-3g.40gb") == pytest.approx(1 / 7)

    def test_a_static_card_waits_for_a_slice_of_the_profile(self) -> None:
        static = {"policy": {"mode": "static"}}
        assert blocking(one_gpu("3g.40gb@4", **static).gpus[0],
                        "nvidia.com/mig-3g.40gb") == 0.0
        assert blocking(one_gpu("3g.40gb@4*", **static).gpus[0],
                        "nvidia.com/mig-3g.40gb") == pytest.approx(3 / 7)
        assert blocking(one_gpu("3g.40gb@4*", **static).gpus[0],
                        "nvidia.com/mig-1g.10gb") is None

    def test_a_profile_the_model_lacks_is_never_hosted(self) -> None:
        assert blocking(one_gpu().gpus[0], "nvidia.com/mig-1g.5gb") is None

    def test_whole_gpus_block_while_in_use(self) -> None:
        nodes = [{"name": "a", "gpus": [
            {"index": 0, "model": "A100-80GB", "mode": "none", "in_use": True},
            {"index": 1, "model": "A100-80GB", "mode": "none"}]}]
        gpus = problem(nodes, [pod("p", gpu=1)]).gpus
        assert [blocking(g, "nvidia.com/gpu") for g in gpus] == [1.0, 0.0]
        assert blocking(gpus[0], "nvidia.com/mig-1g.10gb") is None


class TestReserve:
    def test_the_node_whose_cards_are_least_in_the_way_is_reserved(self) -> None:
        nodes = [{"name": "a", "gpus": [gpu(0, "A100-80GB", "3g.40gb@4*"),
                                        gpu(1, "A100-80GB", "4g.40gb@0*")]},
                 {"name": "b", "gpus": [gpu(0, "A100-80GB", "1g.10gb@0*"),
                                        gpu(1, "A100-80GB", "1g.10gb@3*")]}]
        found = problem(nodes, [pod("wide", mig_7g_80gb=2)])
        assert reserve(found, 0, ()) == (2, 3)  # node b's cards, global GPU ids

    def test_cards_reserved_by_an_earlier_pod_are_left_alone(self) -> None:
        nodes = [{"name": "a", "gpus": [gpu(0, "A100-80GB", "1g.10gb@0*"),
                                        gpu(1, "A100-80GB", "3g.40gb@4*")]}]
        found = problem(nodes, [pod("big", mig_7g_80gb=1)])
        assert reserve(found, 0, ()) == (0,)
        assert reserve(found, 0, (0,)) == (1,)
        assert reserve(found, 0, (0, 1)) == ()

    def test_small_units_share_one_card(self) -> None:
        nodes = [{"name": "a", "gpus": [gpu(0, "A100-80GB", "1g.10gb@0*"),
                                        gpu(1, "A100-80GB", "7g.80gb@0*")]}]
        found = problem(nodes, [pod("pair", mig_3g_40gb=2)])
        assert reserve(found, 0, ()) == (0,)  # 3g + 3g fit on card 0 once its 1g ends
