"""The event loop every policy runs through: pods arrive, wait, start on slices, depart.

Time advances from event to event (departures first at a given instant, then slice-ready
starts, arrivals, scheduling rounds, then measurement samples). An arrival or a departure
asks for a scheduling round after the policy's batching window; a round offers the policy
every pending pod, grouped by request shape. Nothing here depends on wall time or on hash
order, so a run is a pure function of the policy, the jobs and the window.

Measures, over ``[0, horizon]``: compute served (running compute slices x time, integrated
exactly), pods placed and placed in the first round after arrival, waits (arrival to the time
the pod's last slice is usable), fragmentation (free compute that no pending pod could use,
averaged over evenly spaced samples), and the policy's repartitions and slices
created/destroyed. A few GPUs' layouts are sampled for the report's pictures.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tessera.core.catalogue import MPS_SHARED_RESOURCE, WHOLE_GPU_RESOURCE, GpuModel, WholeGpu
from tessera.sim.policies import Layout, Shape, SimPolicy
from tessera.sim.workload import Job

__all__ = ["MULTI_GPU", "RunResult", "percentile", "simulate", "size_class", "size_classes"]

_DEPART, _START, _ARRIVE, _TICK, _SAMPLE = range(5)


MULTI_GPU = "multi-GPU"
"""The size class of a pod that asks for more than one unit (several GPUs or slices)."""
SHARE = "share"
WHOLE = "whole"


def size_class(job: Job) -> str:
    """``"<n>g"`` for a one-unit pod of n compute slices, :data:`MULTI_GPU` for the rest: the
    classes a starvation check compares, since large pods are the ones a scheduler starves.
    On GPUs without MIG: ``share`` (less than a GPU), ``whole`` (one GPU) or multi-GPU."""
    resource = job.requests[0][0] if job.requests else ""
    if resource == MPS_SHARED_RESOURCE:
        return SHARE
    if resource == WHOLE_GPU_RESOURCE:
        return MULTI_GPU if job.units > 1 else WHOLE
    return MULTI_GPU if job.units > 1 else f"{job.compute}g"


def size_classes(card: GpuModel | WholeGpu) -> tuple[str, ...]:
    """Every class :func:`size_class` can give a pod on ``card``, smallest first: one per
    compute size of its MIG profiles, or share and whole on a GPU without MIG; multi-GPU
    last."""
    if isinstance(card, WholeGpu):
        return (SHARE, WHOLE, MULTI_GPU)
    sizes = sorted({p.compute_slices for p in card.profiles})
    return (*(f"{n}g" for n in sizes), MULTI_GPU)


def _class_order(name: str) -> tuple[int, int]:
    if name in (SHARE, WHOLE):
        return (0, 0 if name == SHARE else 1)
    return (1, 0) if name == MULTI_GPU else (0, int(name.rstrip("g") or 0))


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100); 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass
class RunResult:
    """One policy's run. Times are simulated seconds except ``wall_s``."""

    policy: str
    jobs: int
    capacity: int
    horizon: float
    placed: int = 0
    placed_on_arrival: int = 0
    waits: list[float] = field(default_factory=list)
    """Arrival to start for placed pods; arrival to the horizon for pods never placed (a
    censored wait: a pod that never ran waited at least that long, and leaving it out would
    make a policy that places nothing look like one that never keeps anyone waiting)."""
    class_waits: dict[str, list[float]] = field(default_factory=dict)
    """:attr:`waits` split by :func:`size_class`, same rules (unplaced pods censored)."""
    served: float = 0.0
    """Compute slices x seconds of running pods within the horizon."""
    fragmentation: float = 0.0
    """Mean share of the cluster's compute that is free yet useless to every pending pod."""
    repartitions: int = 0
    created: int = 0
    destroyed: int = 0
    failed_creates: int = 0
    planner_calls: int = 0
    utilisation: list[tuple[float, float]] = field(default_factory=list)
    """(time, share of compute running) at each sample."""
    layouts: dict[int, list[tuple[float, Layout]]] = field(default_factory=dict)
    wall_s: float = 0.0

    @property
    def served_share(self) -> float:
        return self.served / (self.capacity * self.horizon) if self.horizon else 0.0

    @property
    def mean_wait(self) -> float:
        return sum(self.waits) / len(self.waits) if self.waits else 0.0

    @property
    def p95_wait(self) -> float:
        return percentile(self.waits, 95)

    def by_class(self) -> dict[str, dict[str, float | int]]:
        """Waits per size class (smallest first, multi-GPU last): pods, mean, p95, max."""
        return {
            name: {"pods": len(waits), "mean_wait_s": round(sum(waits) / len(waits), 1),
                   "p95_wait_s": round(percentile(waits, 95), 1),
                   "max_wait_s": round(max(waits), 1)}
            for name, waits in sorted(self.class_waits.items(), key=lambda kv: _class_order(kv[0]))
            if waits
        }

    def summary(self) -> dict[str, Any]:
        """The figures of the report's table, JSON-ready (``waits_by_class`` nested)."""
        return {
            "policy": self.policy, "jobs": self.jobs, "placed": self.placed,
            "placed_on_arrival": self.placed_on_arrival,
            "served_share": round(self.served_share, 4),
            "mean_wait_s": round(self.mean_wait, 1), "p95_wait_s": round(self.p95_wait, 1),
            "placed_share": round(self.placed / self.jobs, 4) if self.jobs else 0.0,
            "fragmentation": round(self.fragmentation, 4), "repartitions": self.repartitions,
            "created": self.created, "destroyed": self.destroyed,
            "failed_creates": self.failed_creates, "planner_calls": self.planner_calls,
            "wall_s": round(self.wall_s, 2), "waits_by_class": self.by_class(),
        }


def simulate(policy: SimPolicy, jobs: Sequence[Job], *, capacity: int, horizon: float,
             samples: int = 200, track_gpus: int = 4,
             progress: Callable[[float], None] | None = None) -> RunResult:
    """Run ``jobs`` (arrivals after ``horizon`` are ignored) through ``policy``.

    ``capacity`` is the cluster's compute slices; ``progress`` is called now and then with
    the share of the horizon simulated so far.
    """
    began = time.perf_counter()
    result = RunResult(policy.name, 0, capacity, horizon)
    heap: list[tuple[float, int, int, Job | None]] = []
    for job in jobs:
        if job.arrival <= horizon:
            heap.append((job.arrival, _ARRIVE, job.seq, job))
            result.jobs += 1
    samples = max(1, samples)
    heap.extend((horizon * k / samples, _SAMPLE, k, None) for k in range(samples + 1))
    heapq.heapify(heap)
    queues: dict[Shape, dict[str, Job]] = {}
    fresh: list[Job] = []
    first_round: dict[str, int] = {}
    tick_at: float | None = None
    rounds = 0
    running = 0.0
    last = 0.0
    area = 0.0
    frag = 0.0
    tick_seq = 0
    processed = 0
    wakes: set[float] = set()

    def request_tick(now: float) -> None:
        nonlocal tick_at, tick_seq
        if tick_at is None:
            tick_at = now + policy.batch_window
            tick_seq += 1
            heapq.heappush(heap, (tick_at, _TICK, tick_seq, None))

    while heap:
        now, kind, _, item = heapq.heappop(heap)
        if now > horizon:
            break
        area += running * (now - last)
        last = now
        processed += 1
        if progress is not None and processed % 2000 == 0:
            progress(now / horizon if horizon else 1.0)
        if kind == _DEPART:
            assert item is not None
            policy.release(item)
            running -= policy.weight(item)
            request_tick(now)
        elif kind == _START:
            assert item is not None
            running += policy.weight(item)
        elif kind == _ARRIVE:
            assert item is not None
            policy.arrive(item)
            queues.setdefault(item.requests, {})[item.name] = item
            fresh.append(item)
            request_tick(now)
        elif kind == _TICK:
            tick_at = None
            rounds += 1
            for new in fresh:
                first_round[new.name] = rounds
            fresh.clear()
            outcome = policy.schedule(now, queues)
            for placed, ready in outcome.starts:
                del queues[placed.requests][placed.name]
                result.placed += 1
                result.placed_on_arrival += first_round[placed.name] == rounds
                result.waits.append(ready - placed.arrival)
                result.class_waits.setdefault(size_class(placed), []).append(
                    ready - placed.arrival)
                heapq.heappush(heap, (ready, _START, placed.seq, placed))
                heapq.heappush(heap, (ready + placed.duration, _DEPART, placed.seq, placed))
            if outcome.more:
                request_tick(now)
            if outcome.wake_at is not None and outcome.wake_at not in wakes:
                wakes.add(outcome.wake_at)
                tick_seq += 1
                heapq.heappush(heap, (outcome.wake_at, _TICK, tick_seq, None))
        else:
            pending = [shape for shape, queue in queues.items() if queue]
            unusable = policy.unusable_free(pending)
            frag += unusable / capacity
            result.utilisation.append((now, running / capacity))
            for gpu in range(track_gpus):
                shown = policy.layout(gpu)
                if shown is not None:
                    result.layouts.setdefault(gpu, []).append((now, shown))
    area += running * max(0.0, horizon - last)
    for queue in queues.values():
        for job in queue.values():
            result.waits.append(horizon - job.arrival)
            result.class_waits.setdefault(size_class(job), []).append(horizon - job.arrival)
    result.served = area
    result.fragmentation = frag / (samples + 1)
    result.repartitions = policy.repartitions
    result.created = policy.created
    result.destroyed = policy.destroyed
    result.failed_creates = policy.failed_creates
    result.planner_calls = policy.planner_calls
    result.wall_s = time.perf_counter() - began
    if progress is not None:
        progress(1.0)
    return result
