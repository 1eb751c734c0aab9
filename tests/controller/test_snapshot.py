"""The planner's view of the cluster, built from the cache's objects, and kept between plans."""

from __future__ import annotations

from tessera.api.v1alpha1 import NodePartition, NodePartitionSpec, PartitionPolicy
from tessera.controller.snapshot import SnapshotMemo, build_snapshot

from .test_loop import DYNAMIC, node, partition

SLICE = {"profile": "1g.10gb", "start": 0, "gpuInstanceId": 7,
         "uuid": "MIG-00000007-0000-5000-0000-000000000000"}


def _cluster(count: int) -> tuple[list[dict[str, object]], dict[str, NodePartition]]:
    nodes = [node(f"node-{i}") for i in range(count)]
    parts = {f"node-{i}": NodePartition.model_validate(partition(f"node-{i}", [SLICE]))
             for i in range(count)}
    return nodes, parts


def test_a_kept_view_is_reused_only_while_everything_it_was_built_from_is_the_same() -> None:
    policies = [PartitionPolicy.model_validate(DYNAMIC)]
    nodes, parts = _cluster(3)
    memo = SnapshotMemo()
    first = build_snapshot(nodes, parts, policies, {}, memo=memo)
    again = build_snapshot(nodes, parts, policies, {}, memo=memo)
    assert all(a is b for a, b in zip(first.nodes, again.nodes, strict=True))
    # One node's partition changes, another's claims, a third goes in flight: each rebuilt.
    parts["node-0"] = NodePartition.model_validate(partition("node-0", []))
    claims = {"node-1": {"nvidia.com/mig-1g.10gb": 1}}
    spec = NodePartitionSpec.model_validate({"planId": "p", "gpus": []})
    changed = build_snapshot(nodes, parts, policies, claims, memo=memo, frozen=["node-2"],
                             specs={"node-2": spec})
    fresh = build_snapshot(nodes, parts, policies, claims, frozen=["node-2"],
                           specs={"node-2": spec})
    assert changed == fresh, "the same view as one built without the memo"
    assert all(a is not b for a, b in zip(first.nodes, changed.nodes, strict=True))
    assert changed.nodes[0].gpus[0].slices == ()
    assert changed.nodes[1].gpus[0].slices[0].in_use
    assert changed.nodes[2].policy.mode == "static"


def test_a_node_that_went_is_forgotten() -> None:
    policies = [PartitionPolicy.model_validate(DYNAMIC)]
    nodes, parts = _cluster(2)
    memo = SnapshotMemo()
    build_snapshot(nodes, parts, policies, {}, memo=memo)
    smaller = build_snapshot(nodes[:1], parts, policies, {}, memo=memo)
    assert [n.name for n in smaller.nodes] == ["node-0"]
    assert memo.get("node-1", (), ()) == (False, None)
