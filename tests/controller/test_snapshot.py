"""The planner's view of the cluster, built from the cache's objects, and kept between plans."""

from __future__ import annotations

import random
from typing import Any

from tessera.api.v1alpha1 import NodePartition, NodePartitionSpec, PartitionPolicy
from tessera.controller.snapshot import SnapshotBuilder, build_snapshot
from tessera.core.planner import RoomIndex

from .test_loop import DYNAMIC, node, partition

SLICE = {"profile": "1g.10gb", "start": 0, "gpuInstanceId": 7,
         "uuid": "MIG-00000007-0000-5000-0000-000000000000"}
MIG_1G = "nvidia.com/mig-1g.10gb"


def _cluster(count: int) -> tuple[dict[str, dict[str, Any]], dict[str, NodePartition]]:
    nodes = {f"node-{i}": node(f"node-{i}") for i in range(count)}
    parts = {f"node-{i}": NodePartition.model_validate(partition(f"node-{i}", [SLICE]))
             for i in range(count)}
    return nodes, parts


def test_a_kept_view_is_rebuilt_only_where_its_inputs_changed() -> None:
    policies = [PartitionPolicy.model_validate(DYNAMIC)]
    nodes, parts = _cluster(4)
    views = SnapshotBuilder()
    first = views.build(nodes, parts, policies, {}, dirty=())
    assert first == build_snapshot(nodes.values(), parts, policies, {}), "the first: all built"
    again = views.build(nodes, parts, policies, {}, dirty=())
    assert all(a is b for a, b in zip(first.nodes, again.nodes, strict=True))
    # One node's partition changes (the cache says so), another's claims, a third goes in
    # flight: each rebuilt, the fourth kept.
    parts["node-0"] = NodePartition.model_validate(partition("node-0", []))
    claims = {"node-1": {MIG_1G: 1}}
    spec = NodePartitionSpec.model_validate({"planId": "p", "gpus": []})
    changed = views.build(nodes, parts, policies, claims, dirty={"node-0"},
                          frozen=["node-2"], specs={"node-2": spec})
    assert changed == build_snapshot(nodes.values(), parts, policies, claims,
                                     frozen=["node-2"], specs={"node-2": spec})
    assert [a is b for a, b in zip(first.nodes, changed.nodes, strict=True)] == [
        False, False, False, True]
    assert changed.nodes[0].gpus[0].slices == ()
    assert changed.nodes[1].gpus[0].slices[0].in_use
    assert changed.nodes[2].policy.mode == "static"


def test_nodes_that_come_and_go_join_and_leave_the_view_in_name_order() -> None:
    policies = [PartitionPolicy.model_validate(DYNAMIC)]
    nodes, parts = _cluster(2)
    views = SnapshotBuilder()
    views.build(nodes, parts, policies, {}, dirty=())
    del nodes["node-1"]
    nodes["node-00"] = node("node-00")
    parts["node-00"] = NodePartition.model_validate(partition("node-00", []))
    after = views.build(nodes, parts, policies, {}, dirty={"node-1", "node-00"})
    assert [n.name for n in after.nodes] == ["node-0", "node-00"]


def test_new_policies_rebuild_every_view() -> None:
    nodes, parts = _cluster(2)
    views = SnapshotBuilder()
    assert views.build(nodes, parts, [], {}, dirty=()).nodes == (), "no policy: no node"
    policies = [PartitionPolicy.model_validate(DYNAMIC)]
    assert len(views.build(nodes, parts, policies, {}, dirty=()).nodes) == 2


def test_over_random_changes_it_builds_what_a_full_build_does() -> None:
    """The builder against :func:`build_snapshot` from the same inputs, over changes of every
    kind a tick sees, each told as the controller tells it (the cache's and its own writes
    in ``dirty``; claims and plans in flight left for the builder to compare)."""
    rng = random.Random(20)
    policies = [PartitionPolicy.model_validate(DYNAMIC)]
    nodes, parts = _cluster(12)
    views = SnapshotBuilder()
    claims: dict[str, dict[str, int]] = {}
    frozen: set[str] = set()
    specs: dict[str, NodePartitionSpec] = {}
    last_change: dict[tuple[str, int], float] = {}
    for step in range(300):
        dirty: set[str] = set()
        for _ in range(rng.randint(0, 3)):
            name = f"node-{rng.randrange(14)}"
            what = rng.choice(["partition", "node", "gone", "claim", "unclaim", "flight",
                               "land", "write"])
            if what == "partition":
                parts[name] = NodePartition.model_validate(
                    partition(name, rng.choice([[], [SLICE]])))
                nodes.setdefault(name, node(name))
                dirty.add(name)
            elif what == "node":
                nodes[name] = node(name, {MIG_1G: str(rng.randint(0, 2))})
                dirty.add(name)
            elif what == "gone":
                nodes.pop(name, None)
                parts.pop(name, None)
                dirty.add(name)
            elif what == "claim":
                claims = {**claims, name: {MIG_1G: rng.randint(1, 3)}}
            elif what == "unclaim":
                claims = {k: v for k, v in claims.items() if k != name}
            elif what == "flight":
                frozen.add(name)
            elif what == "land":
                frozen.discard(name)
            else:  # the controller writes a spec: new change times, told in dirty
                specs[name] = NodePartitionSpec.model_validate(
                    {"planId": f"p{step}", "gpus": []})
                last_change[(name, 0)] = float(step)
                dirty.add(name)
        built = views.build(nodes, parts, policies, claims, dirty=dirty, frozen=frozen,
                            last_change=last_change, specs=specs, now=float(step))
        full = build_snapshot(nodes.values(), parts, policies, claims, frozen=frozen,
                              last_change=last_change, specs=specs, now=float(step))
        assert built == full, f"step {step}"
        assert views.index == RoomIndex.of(full.nodes), f"step {step}: the room kept"
        assert views.planned == {n.name for n in full.nodes if n.gpus}, f"step {step}"
