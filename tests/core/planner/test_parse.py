"""Bad CLUSTER.json / PENDING.json is refused naming the JSON path, with the valid choices."""

from __future__ import annotations

from typing import Any

import pytest

from tessera.core.errors import InvalidInputError
from tessera.core.planner import parse_cluster, parse_pending
from tests.core.planner.cases import gpu


def refused(data: Any, parse: Any = parse_cluster) -> InvalidInputError:
    with pytest.raises(InvalidInputError) as error:
        parse(data)
    return error.value


def cluster(*gpus: dict[str, Any]) -> dict[str, Any]:
    return {"nodes": [{"name": "a", "gpus": [gpu(0)]}, {"name": "b"},
                      {"name": "c", "gpus": list(gpus)}]}


class TestCluster:
    def test_the_documented_example_parses_and_extra_fields_are_ignored(self) -> None:
        snapshot = parse_cluster({"kind": "whatever", "nodes": [{
            "name": "node-a", "labels": {}, "uid": "x",
            "gpus": [{"index": 0, "model": "A100-SXM4-40GB", "mode": "mig", "uuid": "GPU-1",
                      "slices": [{"profile": "3g.20gb", "start": 4, "in_use": True}]}]}]})
        (slice_,) = snapshot.nodes[0].gpus[0].slices
        assert (slice_.profile, slice_.start, slice_.in_use) == ("3g.20gb", 4, True)

    def test_an_unknown_profile_names_its_path_and_the_models_profiles(self) -> None:
        error = refused(cluster(gpu(0, "A100-SXM4-40GB", "1g.5gb@0", "2g.20gb@2")))
        assert error.field == "nodes[2].gpus[0].slices[1].profile"
        assert "2g.10gb" in error.choices

    def test_an_unknown_model_names_its_path_and_the_catalogue(self) -> None:
        error = refused(cluster({"index": 0, "model": "V100"}))
        assert error.field == "nodes[2].gpus[0].model"
        assert "H100-80GB" in error.choices

    def test_a_layout_the_card_cannot_hold_is_refused(self) -> None:
        error = refused(cluster(gpu(0, "A100-SXM4-40GB", "4g.20gb@0", "3g.20gb@2")))
        assert error.field == "nodes[2].gpus[0].slices[1].start"

    def test_overlapping_slices_are_refused(self) -> None:
        error = refused(cluster(gpu(0, "A100-SXM4-40GB", "3g.20gb@4", "1g.5gb@5")))
        assert error.field == "nodes[2].gpus[0].slices[1]"

    @pytest.mark.parametrize(("data", "field"), [
        ({}, "nodes"),
        ({"nodes": [{"gpus": []}]}, "nodes[0].name"),
        ({"nodes": [{"name": "a"}, {"name": "a"}]}, "nodes[1].name"),
        ({"nodes": [{"name": "a", "gpus": [{"index": -1, "model": "A30"}]}]},
         "nodes[0].gpus[0].index"),
        ({"nodes": [{"name": "a", "gpus": [{"index": 0, "model": "A30-24GB", "mode": "x"}]}]},
         "nodes[0].gpus[0].mode"),
        ({"nodes": [{"name": "a", "policy": {"mode": "sometimes"}}]}, "nodes[0].policy.mode"),
        ({"nodes": [{"name": "a", "policy": {"allowed_profiles": ["9g.99gb"]}}]},
         "nodes[0].policy.allowed_profiles[0]"),
        ({"nodes": [{"name": "a", "allocatable": {"cpu": "lots"}}]}, "nodes[0].allocatable.cpu"),
        ({"nodes": [{"name": "a", "gpus": [{"index": 0, "model": "A30-24GB",
                                            "slices": [{"profile": "1g.6gb", "start": "x"}]}]}]},
         "nodes[0].gpus[0].slices[0].start"),
    ])
    def test_malformed_fields_are_refused_by_path(self, data: Any, field: str) -> None:
        assert refused(data).field == field


class TestPending:
    def test_container_requests_add_up_and_non_gpu_resources_are_kept_apart(self) -> None:
        (pod,) = parse_pending({"pods": [{"name": "p", "containers": [
            {"requests": {"nvidia.com/mig-1g.5gb": 1, "cpu": "500m"}},
            {"requests": {"nvidia.com/mig-1g.5gb": 2, "memory": "1Gi", "example.com/x": 3}},
        ]}]})
        assert pod.requests == (("nvidia.com/mig-1g.5gb", 3),)
        assert (pod.cpu_milli, pod.memory_mib) == (500, 1024)

    def test_an_unknown_mig_resource_is_refused_with_the_known_ones(self) -> None:
        error = refused({"pods": [{"name": "p", "requests": {"nvidia.com/mig-9g.99gb": 1}}]},
                        parse_pending)
        assert error.field == 'pods[0].requests["nvidia.com/mig-9g.99gb"]'
        assert "nvidia.com/mig-1g.10gb" in error.choices

    @pytest.mark.parametrize(("pod", "field"), [
        ({"requests": {}}, "pods[0].name"),
        ({"name": "p", "requests": {"nvidia.com/gpu": -1}}, 'pods[0].requests["nvidia.com/gpu"]'),
        ({"name": "p", "tolerations": [{"operator": "Maybe"}]}, "pods[0].tolerations[0].operator"),
        ({"name": "p", "creation_time": "yesterday"}, "pods[0].creation_time"),
        ({"name": "p", "affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "k", "operator": "Near"}]}]}}}},
         "pods[0].affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
         ".nodeSelectorTerms[0].matchExpressions[0].operator"),
    ])
    def test_malformed_pods_are_refused_by_path(self, pod: Any, field: str) -> None:
        assert refused({"pods": [pod]}, parse_pending).field == field

    def test_a_pod_listed_twice_is_refused(self) -> None:
        error = refused({"pods": [{"name": "p"}, {"name": "p"}]}, parse_pending)
        assert error.field == "pods[1].name"
