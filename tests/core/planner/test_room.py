"""The cluster's MIG room kept node by node (:mod:`tessera.core.planner.room`): the same
answers as counting every node, for the batch bound and for narrowing."""

from __future__ import annotations

import random

from tessera.core.planner import (
    Gpu,
    GpuSlice,
    Node,
    PendingPod,
    RoomIndex,
    RoomTracker,
    Snapshot,
    bounded_batch,
    narrow,
)

MIG_1G = "nvidia.com/mig-1g.10gb"
MIG_7G = "nvidia.com/mig-7g.80gb"


def _node(name: str, busy: int, whole: bool = False) -> Node:
    """Two A100-80GB: ``busy`` 1g slices of the first in use, the second idle (or a whole
    GPU, not in MIG mode, which has no MIG room)."""
    slices = tuple(GpuSlice("1g.10gb", s, in_use=True) for s in range(busy))
    second = Gpu(index=1, model="A100-80GB", mode="none" if whole else "mig")
    return Node(name, gpus=(Gpu(index=0, model="A100-80GB", slices=slices), second))


def _pods(count: int, resource: str = MIG_1G) -> list[PendingPod]:
    return [PendingPod("ml", f"p{i}", ((resource, 1),), creation_time=float(i))
            for i in range(count)]


def test_the_index_counts_free_and_used_compute_per_node_and_ranks_busy_nodes_first() -> None:
    index = RoomIndex.of([_node("a", 0), _node("b", 3), _node("c", 7, whole=True)])
    assert index.room == {"a": (14, 0), "b": (11, 3), "c": (0, 7)}
    assert index.free_compute == 25
    assert index.open_gpus == 4, "both of a and of b; c has none with room"
    assert [name for _idle, _free, name in index.ranked] == ["b", "a"]
    assert ("A100-80GB", 0) in index.layouts


def test_a_tracker_told_of_each_change_holds_what_counting_every_node_gives() -> None:
    rng = random.Random(7)
    tracker = RoomTracker()
    current: dict[str, Node] = {}
    for step in range(400):
        name = f"n{rng.randrange(30):02d}"
        old = current.get(name)
        if rng.random() < 0.2:
            current.pop(name, None)
            tracker.update(name, old, None)
        else:
            new = current[name] = _node(name, rng.randrange(8), whole=rng.random() < 0.2)
            tracker.update(name, old, new)
        held = tracker.freeze()
        assert held == RoomIndex.of(current.values()), f"step {step}"
    before = tracker.freeze()
    tracker.update("n99", None, _node("n99", 0))
    assert "n99" not in before.room, "an index handed out does not change later"


def test_with_the_index_the_batch_and_narrowing_are_the_same() -> None:
    rng = random.Random(3)
    for trial in range(30):
        nodes = tuple(_node(f"n{i:03d}", rng.randrange(8), whole=rng.random() < 0.1)
                      for i in range(rng.randrange(70, 120)))
        snapshot = Snapshot(nodes)
        index = RoomIndex.of(nodes)
        pods = _pods(rng.randrange(1, 40), rng.choice([MIG_1G, MIG_7G]))
        counted = bounded_batch(snapshot, pods, per_shape=8)
        kept = bounded_batch(snapshot, pods, per_shape=8, index=index)
        assert counted == kept, f"trial {trial}"
        assert narrow(snapshot, counted.pods, counted.room) == narrow(
            snapshot, kept.pods, kept.room, index=index), f"trial {trial}"
