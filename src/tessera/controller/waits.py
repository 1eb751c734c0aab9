"""How long pods have lately waited for GPUs: what tells a wait that is unusually long.

A pod that finds no room may *reserve* GPUs, closing them to later pods while they drain
towards it (:mod:`tessera.core.planner.reserve`). Most pods that find no room start a few
seconds later anyway, as something ends; one that reserves at once holds GPUs idle for a wait
it would not have had. So the controller lets a pod reserve only once it has waited
``factor`` times the median wait of the last :data:`KEPT` pods it released: the typical wait
is the cluster's own measure of "soon", under light load (seconds) as under a backlog (hours).

Measured on the simulation grid (bench/README.md, Planner objective, "A reservation only after
a wait"). The waits are kept in memory as pods are released; a controller that starts, or takes
over the lead, first takes them from the pods the cluster shows bound (:meth:`RecentWaits.seed`:
creation to the scheduler's binding, which follows the release by the scheduler's latency), so a
restart or a failover does not drop the rule, and a dry run (``tessera plan --kubeconfig``)
applies the same wait as the live controller. Until :data:`AT_LEAST` waits are known there is
no measure, and every pod may reserve at once, as without the rule.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable

__all__ = ["AT_LEAST", "KEPT", "RecentWaits"]

KEPT = 200
"""Releases the median is taken over: enough that one burst does not swing it, few enough that
it follows the load within minutes."""

AT_LEAST = 20
"""Releases before the median counts: a handful of first pods says little about the load."""


class RecentWaits:
    """The waits (creation to release, seconds) of the last :data:`KEPT` pods released."""

    def __init__(self) -> None:
        self._waits: deque[float] = deque(maxlen=KEPT)

    def seed(self, bound: Iterable[tuple[float, float]]) -> int:
        """Start from pods bound before this controller led: ``(bound at, waited)`` pairs in
        any order, of which the :data:`KEPT` latest count, as older than any wait already
        :meth:`add`-ed (those stay). Returns how many were taken."""
        latest = sorted(bound)[-KEPT:]
        self._waits = deque([*(max(0.0, waited) for _, waited in latest), *self._waits],
                            maxlen=KEPT)
        return len(latest)

    def add(self, waited_s: float) -> None:
        self._waits.append(max(0.0, waited_s))

    def __len__(self) -> int:
        return len(self._waits)

    def reserve_after(self, factor: float) -> float:
        """How long a pod must have waited to reserve: ``factor`` times the median recent
        wait; 0 (reserve at once) when ``factor`` is 0 or fewer than :data:`AT_LEAST` waits
        are known."""
        if factor <= 0 or len(self._waits) < AT_LEAST:
            return 0.0
        return factor * statistics.median(self._waits)
