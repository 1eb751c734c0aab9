"""Which nodes a plan looks at first on a large cluster (:func:`tessera.core.planner.narrow`)."""

from __future__ import annotations

from tessera.core.planner import (
    Gpu,
    GpuSlice,
    Node,
    PendingPod,
    Snapshot,
    bounded_batch,
    narrow,
    plan,
)

MIG_1G = "nvidia.com/mig-1g.10gb"


def _node(name: str, busy: int, labels: tuple[tuple[str, str], ...] = ()) -> Node:
    """A node of two A100-80GB, ``busy`` 1g slices of its first GPU in use."""
    slices = tuple(GpuSlice("1g.10gb", s, in_use=True) for s in range(busy))
    return Node(name, labels=labels, gpus=(Gpu(index=0, model="A100-80GB", slices=slices),
                                           Gpu(index=1, model="A100-80GB")))


def _pods(count: int, selector: tuple[tuple[str, str], ...] = ()) -> list[PendingPod]:
    return [PendingPod("ml", f"p{i}", ((MIG_1G, 1),), creation_time=float(i),
                       node_selector=selector) for i in range(count)]


def _narrowed(snapshot: Snapshot, pods: list[PendingPod], *, minimum: int,
              headroom: float = 4.0) -> Snapshot | None:
    return narrow(snapshot, pods, bounded_batch(snapshot, pods).room, minimum=minimum,
                  headroom=headroom)


def test_a_small_cluster_is_planned_whole() -> None:
    snapshot = Snapshot(tuple(_node(f"n{i:02d}", 0) for i in range(8)))
    assert _narrowed(snapshot, _pods(3), minimum=8) is None


def test_nodes_in_use_come_first_least_room_first_then_idle_ones_up_to_the_headroom() -> None:
    nodes = [_node(f"idle{i:02d}", 0) for i in range(6)]
    nodes += [_node("half", 3), _node("nearly-full", 6), _node("one-used", 1)]
    snapshot = Snapshot(tuple(sorted(nodes, key=lambda n: n.name)))
    # 2 pods x 1 compute slice, headroom 4: 8 slices; the three nodes in use hold 11+8+13.
    chosen = _narrowed(snapshot, _pods(2), minimum=2, headroom=4.0)
    assert chosen is not None
    assert {n.name for n in chosen.nodes} == {"nearly-full"} | {"half"}
    more = _narrowed(snapshot, _pods(10), minimum=2, headroom=4.0)  # 40 slices
    assert more is not None
    assert {n.name for n in more.nodes} == {"nearly-full", "half", "one-used", "idle00"}


def test_a_batch_with_requests_not_counted_in_compute_is_planned_whole() -> None:
    snapshot = Snapshot(tuple(_node(f"n{i:02d}", 0) for i in range(8)))
    whole = [PendingPod("ml", "w", (("nvidia.com/gpu", 1),))]
    assert _narrowed(snapshot, whole, minimum=2) is None


def test_the_narrowed_plan_places_pods_on_the_chosen_nodes() -> None:
    nodes = tuple(_node(f"n{i:02d}", 2 if i == 5 else 0) for i in range(10))
    snapshot = Snapshot(nodes)
    pods = _pods(2)
    chosen = _narrowed(snapshot, pods, minimum=1, headroom=1.0)
    assert chosen is not None
    assert [n.name for n in chosen.nodes] == ["n05"]
    result = plan(chosen, pods)
    assert not result.unplaced
    assert {p.node for p in result.placements} == {"n05"}
