"""Workloads for the simulator: jobs with an arrival, a duration and MIG requests.

A job is what a pod is to the planner plus the two times the planner never sees. Three sources:

- the Alibaba openb traces (``gpu_milli``/``num_gpu`` per pod, no GPU memory column), mapped
  to the smallest MIG profile that covers the request (:func:`map_request`);
- those traces' own timestamps (:func:`replay`, with a time compression factor and an
  arrival-rate scale), or Poisson arrivals in trace order at a rate set for a target offered
  load (:func:`poisson`), because the real timestamps leave most of the span nearly empty;
- a seeded synthetic generator (:func:`synthetic`).

Everything is a pure function of its inputs and a seed, so a run is reproduced exactly.
"""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tessera.core import catalogue
from tessera.core.catalogue import GpuModel
from tessera.core.errors import InvalidInputError

__all__ = [
    "DEFAULT_MAX_DURATION_S",
    "MAPPINGS",
    "MILLI",
    "Job",
    "Mapper",
    "Mapping_",
    "TraceRow",
    "load_trace",
    "map_request",
    "mig_mapper",
    "offered_load",
    "poisson",
    "replay",
    "resolve_model",
    "shared_request",
    "synthetic",
]

MILLI = 1000
"""Milli-GPUs in one GPU: the unit of load on GPUs without MIG, as the traces give shares."""

Mapping_ = Literal["both", "compute", "memory"]
MAPPINGS: tuple[Mapping_, ...] = ("both", "compute", "memory")

DEFAULT_MAX_DURATION_S = 86_400.0
"""Durations are capped at a day by default. The traces' ``Running`` pods are censored at the
trace's end: 51 of gpushare100's 7,064 GPU pods last longer than a day and would carry 80% of
all demand, so one of them would hold a GPU for the whole window of a load-targeted run."""


@dataclass(frozen=True)
class Job:
    """One pod of the workload. ``requests`` are MIG profiles (``(profile, count)``, sorted);
    all units land on one node. ``compute`` is its compute slices in total, the unit of load."""

    seq: int
    name: str
    arrival: float
    duration: float
    requests: tuple[tuple[str, int], ...]
    compute: int

    @property
    def units(self) -> int:
        return sum(c for _, c in self.requests)


@dataclass(frozen=True)
class TraceRow:
    """A GPU pod of an openb trace: its request and its life in the trace (seconds)."""

    name: str
    num_gpu: int
    gpu_milli: int
    creation: float
    duration: float


def load_trace(path: Path) -> list[TraceRow]:
    """The GPU pods of an openb ``pod_list`` CSV, in creation order (CPU-only pods dropped).

    A pod's duration is ``deletion_time - scheduled_time`` (or ``- creation_time`` when it was
    never scheduled), at least one second.
    """
    try:
        text = path.read_text()
    except OSError as exc:
        raise InvalidInputError("--trace", f"cannot read {path}: {exc.strerror}") from None
    rows = []
    reader = csv.DictReader(text.splitlines())
    missing = {"name", "num_gpu", "gpu_milli", "creation_time", "deletion_time"} - set(
        reader.fieldnames or ())
    if missing:
        raise InvalidInputError("--trace", f"{path} lacks columns {', '.join(sorted(missing))}")
    for line, raw in enumerate(reader, start=2):
        try:
            num_gpu = int(raw["num_gpu"])
            milli = int(raw["gpu_milli"])
            created = float(raw["creation_time"])
            started = float(raw.get("scheduled_time") or created)
            deleted = float(raw["deletion_time"] or started)
        except ValueError as exc:
            raise InvalidInputError(f"--trace {path}:{line}", str(exc)) from None
        if num_gpu <= 0:
            continue
        rows.append(TraceRow(raw["name"], num_gpu, milli, created, max(1.0, deleted - started)))
    rows.sort(key=lambda r: (r.creation, r.name))
    return rows


def map_request(num_gpu: int, gpu_milli: int, model: GpuModel,
                mapping: Mapping_ = "both") -> tuple[str, int]:
    """The smallest profile of ``model`` that covers a trace request, and how many of it.

    The trace gives only a share of one GPU (``gpu_milli``) for ``num_gpu == 1``, else whole
    GPUs. ``compute``: at least ``ceil(milli * compute_slices / 1000)`` compute slices;
    ``memory``: at least that share of the memory slices; ``both`` (default): both at once.
    Smallest means fewest compute slices, then fewest memory slices. ``num_gpu > 1`` asks for
    that many full-GPU profiles (``7g.80gb`` on an A100-80GB).
    """
    if mapping not in MAPPINGS:
        raise InvalidInputError("--mapping", f"unknown mapping {mapping!r}", MAPPINGS)
    if num_gpu > 1 or gpu_milli >= 1000:
        return model.full_profile.name, max(1, num_gpu)
    milli = max(1, gpu_milli)
    need_c = math.ceil(milli * model.compute_slices / 1000) if mapping != "memory" else 1
    need_m = math.ceil(milli * model.memory_slices / 1000) if mapping != "compute" else 1
    fitting = [p for p in model.profiles if p.plain
               and p.compute_slices >= need_c and p.memory_slices >= need_m]
    best = min(fitting, key=lambda p: (p.compute_slices, p.memory_slices, p.name))
    return best.name, 1


def _compute_of(model: GpuModel, requests: Iterable[tuple[str, int]]) -> int:
    return sum(model.profile(p).compute_slices * n for p, n in requests)


Mapper = Callable[[TraceRow], tuple[tuple[tuple[str, int], ...], int]]
"""A trace row's requests and its compute (the unit of load)."""


def mig_mapper(model: GpuModel, mapping: Mapping_ = "both") -> Mapper:
    """Requests as MIG profiles of ``model`` (:func:`map_request`); compute in slices."""
    def mapped(row: TraceRow) -> tuple[tuple[tuple[str, int], ...], int]:
        requests = (map_request(row.num_gpu, row.gpu_milli, model, mapping),)
        return requests, _compute_of(model, requests)
    return mapped


def shared_request(row: TraceRow) -> tuple[tuple[tuple[str, int], ...], int]:
    """Requests on a cluster of GPUs without MIG, in milli-GPUs: a pod asking less than one
    GPU asks ``nvidia.com/gpu.shared`` sized in milli (each policy turns that into its shares
    or replicas), one asking whole GPUs asks ``nvidia.com/gpu``; compute is milli-GPUs."""
    if row.num_gpu > 1 or row.gpu_milli >= MILLI:
        count = max(1, row.num_gpu)
        return ((catalogue.WHOLE_GPU_RESOURCE, count),), MILLI * count
    milli = max(1, row.gpu_milli)
    return ((catalogue.MPS_SHARED_RESOURCE, milli),), milli


def _jobs(rows: Sequence[TraceRow], mapper: Mapper,
          arrivals: Sequence[float], durations: Sequence[float]) -> tuple[Job, ...]:
    out = []
    for i, (row, at, lasting) in enumerate(zip(rows, arrivals, durations, strict=True)):
        requests, compute = mapper(row)
        out.append(Job(i, row.name, at, lasting, requests, compute))
    return tuple(out)


def replay(rows: Sequence[TraceRow], model: GpuModel | None, *, mapping: Mapping_ = "both",
           compress: float = 1.0, rate_scale: float = 1.0,
           max_duration: float = DEFAULT_MAX_DURATION_S,
           mapper: Mapper | None = None) -> tuple[Job, ...]:
    """The trace's own timestamps, from the first creation on.

    ``compress`` divides every time (gaps and durations: the same load, sooner); ``rate_scale``
    divides only the gaps between arrivals (``rate_scale`` times the offered load).
    """
    if compress <= 0 or rate_scale <= 0:
        raise InvalidInputError("--compress/--rate-scale", "must be positive")
    if not rows:
        return ()
    start = rows[0].creation
    arrivals = [(r.creation - start) / compress / rate_scale for r in rows]
    durations = [min(r.duration, max_duration) / compress for r in rows]
    return _jobs(rows, _mapper(model, mapping, mapper), arrivals, durations)


def _mapper(model: GpuModel | None, mapping: Mapping_, mapper: Mapper | None) -> Mapper:
    if mapper is not None:
        return mapper
    if model is None:
        raise ValueError("a MIG model or a mapper is needed")
    return mig_mapper(model, mapping)


def poisson(rows: Sequence[TraceRow], model: GpuModel | None, *, capacity: int, load: float,
            seed: int, mapping: Mapping_ = "both",
            max_duration: float = DEFAULT_MAX_DURATION_S,
            mapper: Mapper | None = None) -> tuple[tuple[Job, ...], float]:
    """Poisson arrivals in trace order at the rate that offers ``load``; returns the window too.

    Offered load = demand (compute slices x duration, summed) / (``capacity`` compute slices x
    window), so the window is demand / (load x capacity). The gaps are exponential and scaled so
    that ``len(rows) + 1`` of them span the window exactly (a Poisson process conditioned on its
    count), which makes the offered load exactly ``load`` for every seed.
    """
    if load <= 0 or capacity <= 0:
        raise InvalidInputError("--load", "load and capacity must be positive")
    durations = [min(r.duration, max_duration) for r in rows]
    mapped = _mapper(model, mapping, mapper)
    demand = sum(mapped(r)[1] * d for r, d in zip(rows, durations, strict=True))
    window = demand / (load * capacity)
    rng = random.Random(seed)
    gaps = [rng.expovariate(1.0) for _ in range(len(rows) + 1)]
    scale = window / sum(gaps)
    arrivals, t = [], 0.0
    for gap in gaps[:-1]:
        t += gap * scale
        arrivals.append(t)
    return _jobs(rows, mapped, arrivals, durations), window


def offered_load(jobs: Sequence[Job], capacity: int, window: float) -> float:
    """Demand in compute slices x time over capacity x window."""
    return sum(j.compute * j.duration for j in jobs) / (capacity * window) if window else 0.0


def synthetic(rng: random.Random, count: int, model: GpuModel, *,
              mix: Mapping[str, float] | None = None, rate: float = 1.0,
              mean_duration: float = 600.0) -> tuple[Job, ...]:
    """``count`` one-slice jobs: Poisson arrivals at ``rate`` per second, exponential durations.

    ``mix`` weighs profiles (default: 1g, 2g, 3g, 4g and 7g in the proportions 4:3:2:1:1).
    """
    names = [p.name for p in model.profiles if p.plain]
    if mix is None:
        by_compute = {model.profile(n).compute_slices: n for n in reversed(names)}
        weights = {1: 4.0, 2: 3.0, 3: 2.0, 4: 1.0, model.compute_slices: 1.0}
        mix = {by_compute[c]: w for c, w in weights.items() if c in by_compute}
    for name in mix:
        model.profile(name, field_name="mix")
    profiles = sorted(mix)
    weights_ = [mix[p] for p in profiles]
    out, t = [], 0.0
    for i in range(count):
        t += rng.expovariate(rate)
        profile = rng.choices(profiles, weights_)[0]
        requests = ((profile, 1),)
        out.append(Job(i, f"job-{i:05d}", t, max(1.0, rng.expovariate(1 / mean_duration)),
                       requests, _compute_of(model, requests)))
    return tuple(out)


def resolve_model(name: str, field: str = "model") -> GpuModel:
    """A catalogue model as :func:`tessera.core.catalogue.model` resolves every name."""
    return catalogue.model(name, field)
