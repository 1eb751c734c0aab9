"""The MIG room of a whole cluster, kept up to date node by node.

Every plan asks the same of the cluster before it starts: how much MIG compute is free and
where (:func:`~tessera.core.planner.batch.bounded_batch`), and which nodes fit a batch best
(:func:`~tessera.core.planner.candidates.narrow`). Counting it from every node made each plan
on 2,000 nodes cost two walks over them however few nodes had changed
(bench/plan_cost_bench.py). A :class:`RoomTracker` is told each node whose view changed and
hands out a :class:`RoomIndex` that answers both without looking at the others; built from the
same nodes, :meth:`RoomIndex.of` gives the same index (the tests check the two agree).
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tessera.core.planner.model import Node

__all__ = ["RoomIndex", "RoomTracker"]

Ranked = tuple[bool, int, str]
"""(the node has nothing in use, its free compute, its name): narrowing's order, best first."""


@dataclass(frozen=True)
class RoomIndex:
    """MIG room over a snapshot's nodes (as :attr:`Node.mig_room` counts it)."""

    room: Mapping[str, tuple[int, int]]
    """Per node, (compute slices free, compute slices in use)."""
    free_compute: int
    open_gpus: int
    """MIG GPUs with free compute."""
    layouts: frozenset[tuple[str, int]]
    """(model, mask of slices in use) of the MIG GPUs with free compute."""
    ranked: tuple[Ranked, ...]
    """The nodes with free compute in narrowing's order."""
    by_name: Mapping[str, Node]

    @classmethod
    def of(cls, nodes: Iterable[Node]) -> RoomIndex:
        tracker = RoomTracker()
        for node in nodes:
            tracker.update(node.name, None, node)
        return tracker.freeze()


def _key(name: str, free: int, used: int) -> Ranked:
    return (used == 0, free, name)


class RoomTracker:
    """The :class:`RoomIndex` of a set of nodes, updated one node at a time."""

    def __init__(self) -> None:
        self._room: dict[str, tuple[int, int]] = {}
        self._free = 0
        self._open = 0
        self._layouts: Counter[tuple[str, int]] = Counter()
        self._ranked: list[Ranked] = []
        self._by_name: dict[str, Node] = {}
        self._frozen: RoomIndex | None = None

    def update(self, name: str, old: Node | None, new: Node | None) -> None:
        """``name``'s view went from ``old`` to ``new`` (None: none)."""
        if old is new:
            return
        self._frozen = None
        if old is not None:
            free, used, gpus = old.mig_room
            del self._room[name]
            del self._by_name[name]
            self._free -= free
            self._open -= len(gpus)
            self._layouts.subtract((model, held) for model, held, _ in gpus)
            if free > 0:
                key = _key(name, free, used)
                del self._ranked[bisect.bisect_left(self._ranked, key)]
        if new is not None:
            free, used, gpus = new.mig_room
            self._room[name] = (free, used)
            self._by_name[name] = new
            self._free += free
            self._open += len(gpus)
            self._layouts.update((model, held) for model, held, _ in gpus)
            if free > 0:
                bisect.insort(self._ranked, _key(name, free, used))

    def freeze(self) -> RoomIndex:
        """The index now (copies: later updates do not change an index handed out)."""
        if self._frozen is None:
            self._frozen = RoomIndex(
                room=dict(self._room), free_compute=self._free, open_gpus=self._open,
                layouts=frozenset(k for k, n in self._layouts.items() if n > 0),
                ranked=tuple(self._ranked), by_name=dict(self._by_name))
        return self._frozen
