"""Which nodes one plan looks at, in a large cluster: enough of the best-fitting ones.

A plan's cost is of the order of the GPUs it looks at (their states, offers and heaps are set
up for every plan), so on 2,000 nodes a plan for a handful of pods cost 0.3 s however few nodes
it changed (bench/plan_cost_bench.py). kube-scheduler meets the same problem by scoring only a
share of the nodes of a large cluster (``percentageOfNodesToScore``); this does the same for
the planner, keeping its preferences: the nodes already in use with room come first, least room
first (the planner prefers already-split GPUs and full nodes, and so does first-fit packing),
then idle nodes, until the nodes chosen have ``headroom`` times the compute the batch asks and
at least ``minimum`` nodes.

The narrowed plan is only a shortcut: the caller plans over every node when it leaves any pod
unplaced (reservations, the reasons a pod is told, and pods no chosen node can host need the
whole cluster), so narrowing never keeps a pod from a node that could take it. A cluster of
``minimum`` nodes or fewer, and a batch with any request that is not a MIG profile (whole GPUs,
shares: their capacity is not counted in compute slices), are planned whole.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from tessera.core.planner.batch import mig_compute
from tessera.core.planner.model import PendingPod, Snapshot
from tessera.core.planner.room import RoomIndex

__all__ = ["DEFAULT_HEADROOM", "DEFAULT_MINIMUM", "narrow"]

DEFAULT_MINIMUM = 64
"""Nodes a narrowed plan looks at, at least (kube-scheduler scores at least 100 nodes, or
5%; nodes here hold several GPUs each: 64 nodes of 8 are 512 GPUs, twice the simulation
grid's largest cluster, which is therefore always planned whole)."""
DEFAULT_HEADROOM = 4.0
"""The chosen nodes' free compute, as a multiple of what the batch asks."""


def narrow(snapshot: Snapshot, pods: Sequence[PendingPod], room: Mapping[str, tuple[int, int]],
           *, minimum: int = DEFAULT_MINIMUM, headroom: float = DEFAULT_HEADROOM,
           index: RoomIndex | None = None) -> Snapshot | None:
    """The snapshot with only the nodes a plan for ``pods`` looks at first, or None to plan
    over every node. ``room``: per node, (free, used) compute slices of its MIG GPUs (as
    :func:`~tessera.core.planner.batch.bounded_batch` counts them). ``index``: the same
    room, kept by the caller for a snapshot whose nodes are in name order (its ranking is
    then read, not sorted, and only the nodes chosen are looked at)."""
    if len(snapshot.nodes) <= minimum or not pods:
        return None
    asked = 0
    for pod in pods:
        compute = mig_compute(pod.requests)
        if compute is None:
            return None
        asked += compute
    ranked: Iterable[tuple[bool, int, str]] = index.ranked if index is not None else sorted(
        (room[n.name][1] == 0, room[n.name][0], n.name) for n in snapshot.nodes
        if room.get(n.name, (0, 0))[0] > 0)
    chosen: list[str] = []
    free = 0
    for _idle, spare, name in ranked:
        if len(chosen) >= minimum and free >= headroom * asked:
            break
        chosen.append(name)
        free += spare
    if len(chosen) == len(snapshot.nodes):
        return None
    if index is not None:
        return replace(snapshot, nodes=tuple(index.by_name[n] for n in sorted(chosen)))
    picked = set(chosen)
    return replace(snapshot, nodes=tuple(n for n in snapshot.nodes if n.name in picked))
