"""Your own pod history as a workload: the CSV ``tessera simulate --workload`` replays and
``tessera simulate export`` writes.

Why a format of its own: the question "would dynamic MIG save me GPUs?" is best answered on
the pods a team really ran, not on Alibaba's trace; and a CSV is what a user can also write
from their own records (a scheduler's database, audit logs, a spreadsheet).

The format, one row per pod, with a header row (other columns are ignored)::

    name,created,started,finished,request
    default/notebook-7,2025-05-01T09:00:00Z,2025-05-01T09:00:04Z,2025-05-01T11:30:00Z,1g.10gb
    ml/train-42,2025-05-01T09:05:00Z,2025-05-01T09:07:30Z,,2x3g.40gb
    ml/eval-3,2025-05-01T09:06:00Z,,,gpu:2
    infer/llm-0,2025-05-01T09:10:00Z,2025-05-01T09:10:02Z,2025-05-01T10:00:00Z,shared:10gb

- ``name``: any text (the exporter writes ``namespace/name``). Rows with the same name and
  ``created`` are one pod seen by several exports: the most complete row is kept, so periodic
  exports can be concatenated (keep one header).
- ``created``, ``started``, ``finished``: RFC 3339 / ISO 8601 timestamps (without an offset:
  UTC) or seconds (any origin), one kind for the whole file. ``created`` is required.
- A pod's arrival is its ``created`` relative to the first row's; its duration is ``finished -
  started`` (at least one second).
- ``finished`` empty: still running when exported. Its duration is censored at the latest time
  the file records (at most the export time).
- ``started`` (and ``finished``) empty: it never started (it waited when exported). It is
  demand that arrived at ``created``; its duration is the median of the finished pods with the
  same request, else of all finished pods; with no finished pod at all it is skipped (and
  counted).
- ``request``, one kind per pod:

  - a MIG profile, with a count: ``1g.10gb``, ``2x3g.40gb``, ``1g.10gb+me``; several
    profiles separated by spaces (``1g.10gb 2x2g.20gb``); names as the catalogue knows them;
  - whole GPUs: ``gpu:2`` (``nvidia.com/gpu``);
  - a share of a GPU without MIG (MPS or time-slicing): ``shared:10gb`` (a memory-sized share,
    ``nvidia.com/gpu.shared-10gb``; ``2xshared:10gb`` for two), ``shared`` / ``3xshared``
    (equal shares, ``nvidia.com/gpu.shared``, read as a GPU shared
    :data:`~tessera.sim.shared.DEFAULT_SHARES` ways, the dynamic policy's default), or
    ``shared:250m`` (milli-GPUs, the openb traces' unit).

How a request becomes the simulator's: on MIG cards a MIG profile stays itself (the card must
offer it), ``gpu:K`` is K whole-card profiles, a share is the smallest profile that covers its
fraction of the card (``--mapping``, as for the traces). On cards without MIG a share is
milli-GPUs of that card (memory-sized: its fraction of the card's memory), ``gpu:K`` is K
whole GPUs, a MIG profile asks its memory on that card (or its compute fraction of its own
card, if larger). A share of a whole GPU or more becomes whole GPUs.

Everything here is pure: the only I/O is reading the file given (:func:`load_history`).
"""

from __future__ import annotations

import csv
import datetime
import io
import math
import re
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from tessera.core import catalogue
from tessera.core.catalogue import GpuModel, MigProfile, WholeGpu
from tessera.core.errors import InvalidInputError
from tessera.sim.shared import DEFAULT_SHARES
from tessera.sim.workload import DEFAULT_MAX_DURATION_S, MILLI, Job, Mapping_, map_request

__all__ = [
    "COLUMNS",
    "Gpus",
    "History",
    "HistoryPod",
    "Replayed",
    "Request",
    "Share",
    "Slices",
    "format_time",
    "history_jobs",
    "load_history",
    "mig_requests",
    "parse_history",
    "parse_request",
    "parse_time",
    "request_from_resources",
    "shared_requests",
    "write_history",
]

COLUMNS = ("name", "created", "started", "finished", "request")

Requests = tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class Slices:
    """MIG slices: ``(profile, count)`` sorted by profile, names as written (a catalogued
    card's current name or an alias)."""

    slices: Requests

    def __str__(self) -> str:
        return " ".join(p if n == 1 else f"{n}x{p}" for p, n in self.slices)


@dataclass(frozen=True)
class Gpus:
    """Whole GPUs (``nvidia.com/gpu``)."""

    count: int

    def __str__(self) -> str:
        return f"gpu:{self.count}"


@dataclass(frozen=True)
class Share:
    """``count`` shares of a GPU without MIG: memory-sized (``gib`` each), equal shares of the
    card (neither given), or ``milli`` milli-GPUs (count 1)."""

    count: int = 1
    gib: int | None = None
    milli: int | None = None

    def __str__(self) -> str:
        prefix = f"{self.count}x" if self.count != 1 else ""
        if self.milli is not None:
            return f"shared:{self.milli}m"
        if self.gib is not None:
            return f"{prefix}shared:{self.gib}gb"
        return f"{prefix}shared"


Request = Slices | Gpus | Share


@dataclass(frozen=True)
class HistoryPod:
    """One row: a pod's three times (seconds; None when it has not got there) and request.
    ``line`` is where the row sits in its file, for error messages; it is not compared."""

    name: str
    created: float
    started: float | None
    finished: float | None
    request: Request
    line: int = field(default=0, compare=False)


@dataclass(frozen=True)
class History:
    """The pods of a file in creation order, and the latest time it records (its censoring
    point: the export happened then or later)."""

    pods: tuple[HistoryPod, ...]
    source: str
    end: float


_FORMS = ("1g.10gb", "2x3g.40gb", "gpu:2", "shared:10gb", "2xshared:10gb", "shared",
          "shared:250m")
_COUNT = re.compile(r"^(\d+)x(.+)$")
_SHARE = re.compile(r"^shared(?::(\d+)(gb|m))?$")


def _where(source: str, line: int, column: str, pod: str = "") -> str:
    named = f" (pod {pod})" if pod else ""
    return f"--workload {source} line {line}{named}, column {column}"


def _profile_names() -> frozenset[str]:
    """Every MIG profile name and alias of any catalogued card. A name is kept as written and
    resolved per card when simulated: one card's old name may be another's current one."""
    return frozenset(name for model in catalogue.models() for profile in model.profiles
                     for name in (profile.name, *profile.aliases))


def parse_request(text: str, field_name: str = "request") -> Request:
    """A ``request`` cell (see the module docstring for its forms)."""
    items = text.split()
    if not items:
        raise InvalidInputError(field_name, "is empty; write what the pod asked for", _FORMS)
    known = _profile_names()
    slices: dict[str, int] = {}
    for item in items:
        count, rest = 1, item
        match = _COUNT.match(item)
        if match is not None:
            count, rest = int(match.group(1)), match.group(2)
            if count < 1:
                raise InvalidInputError(field_name, f"{item!r}: a count must be at least 1")
        share = _SHARE.match(rest)
        if rest.startswith("gpu"):
            if len(items) > 1 or match is not None or not re.fullmatch(r"gpu:[1-9]\d*", rest):
                raise InvalidInputError(field_name, f"{text!r}: whole GPUs are written gpu:K "
                                        "(e.g. gpu:2), alone in the cell")
            return Gpus(int(rest.split(":", 1)[1]))
        if share is not None:
            if len(items) > 1:
                raise InvalidInputError(field_name, f"{text!r}: a pod asks one kind of "
                                        "resource; a share is alone in the cell")
            size, unit = share.group(1), share.group(2)
            if size is not None and int(size) < 1:
                raise InvalidInputError(field_name, f"{item!r}: a share's size must be "
                                        "at least 1")
            if unit == "m":
                if match is not None:
                    raise InvalidInputError(field_name, f"{item!r}: write the milli-GPUs in "
                                            f"total (shared:{count * int(size)}m)")
                return Share(milli=int(size))
            return Share(count, gib=int(size) if size is not None else None)
        if rest not in known:
            raise InvalidInputError(field_name, f"{item!r} is neither a MIG profile of a "
                                    "catalogued card (see `tessera catalogue`) nor gpu:K or a "
                                    "share", _FORMS)
        slices[rest] = slices.get(rest, 0) + count
    return Slices(tuple(sorted(slices.items())))


def request_from_resources(resources: Mapping[str, int]) -> Request:
    """A pod's ``nvidia.com/*`` requests (summed over its containers) in the CSV's terms,
    resolving each resource name through the catalogue; InvalidInputError for what the
    simulator does not model (MPS shares inside a MIG slice, unknown names, mixed kinds)."""
    items = {name: count for name, count in resources.items() if count > 0}
    if not items:
        raise InvalidInputError("resources", "asks no nvidia.com/ resource")
    slices: dict[str, int] = {}
    others: list[Request] = []
    for name, count in sorted(items.items()):
        if name == catalogue.WHOLE_GPU_RESOURCE:
            others.append(Gpus(count))
        elif name == catalogue.MPS_SHARED_RESOURCE:
            others.append(Share(count))
        elif (gib := catalogue.share_size_gib(name)) is not None:
            others.append(Share(count, gib=gib))
        elif name.startswith(catalogue.MIG_RESOURCE_PREFIX) and name.endswith(
                catalogue.SHARED_SUFFIX):
            raise InvalidInputError("resources", f"{name}: MPS shares inside a MIG slice are "
                                    "not simulated")
        elif name.startswith(catalogue.MIG_RESOURCE_PREFIX):
            profile = catalogue.profile_name_from_resource(name)
            if profile not in _profile_names():
                raise InvalidInputError("resources", f"{name}: no catalogued card has this "
                                        "MIG profile")
            slices[profile] = slices.get(profile, 0) + count
        else:
            raise InvalidInputError("resources", f"{name}: not a GPU resource Tessera knows")
    if (slices and others) or len(others) > 1:
        raise InvalidInputError("resources", f"{', '.join(sorted(items))}: several kinds of "
                                "GPU resource in one pod are not simulated")
    return others[0] if others else Slices(tuple(sorted(slices.items())))


TimeKind = Literal["timestamp", "seconds"]


def parse_time(text: str, field_name: str = "time") -> tuple[float, TimeKind]:
    """Seconds, or an RFC 3339 / ISO 8601 timestamp (UTC without an offset) as epoch seconds."""
    value = text.strip()
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        if not math.isfinite(seconds):
            raise InvalidInputError(field_name, f"{value!r} is not a time")
        return seconds, "seconds"
    try:
        when = datetime.datetime.fromisoformat(value)
    except ValueError:
        raise InvalidInputError(field_name, f"{value!r} is neither an RFC 3339 timestamp "
                                "(2025-05-01T09:00:00Z) nor seconds (3600)") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return when.timestamp(), "timestamp"


def format_time(seconds: float) -> str:
    """Epoch seconds as RFC 3339 in UTC (``2025-05-01T09:00:00Z``), as the exporter writes."""
    when = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    return when.isoformat().replace("+00:00", "Z")


def _completeness(pod: HistoryPod) -> tuple[int, float]:
    return (pod.started is not None) + (pod.finished is not None), pod.finished or 0.0


def parse_history(text: str, source: str = "pods.csv") -> History:
    """The pods of a history CSV's text (``source`` names it in errors), in creation order."""
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in COLUMNS if c not in (reader.fieldnames or ())]
    if missing:
        raise InvalidInputError(f"--workload {source}", f"the header lacks "
                                f"{', '.join(missing)}; the first line must be "
                                f"{','.join(COLUMNS)}")
    kind: TimeKind | None = None
    latest = -math.inf
    seen: dict[tuple[str, float], HistoryPod] = {}
    for line, raw in enumerate(reader, start=2):
        name = (raw.get("name") or "").strip()
        if not name:
            raise InvalidInputError(_where(source, line, "name"), "is empty; name the pod")
        times: dict[str, float | None] = {}
        for column in ("created", "started", "finished"):
            cell = (raw.get(column) or "").strip()
            if not cell:
                if column == "created":
                    raise InvalidInputError(_where(source, line, column, name),
                                            "is empty; give when the pod was created")
                times[column] = None
                continue
            where = _where(source, line, column, name)
            value, this = parse_time(cell, where)
            if kind is not None and this != kind:
                raise InvalidInputError(where, f"{cell!r} is {this} in a file of {kind}s; "
                                        "write every time the same way")
            kind = this
            times[column] = value
            latest = max(latest, value)
        created, started, finished = times["created"], times["started"], times["finished"]
        assert created is not None
        if finished is not None and started is None:
            raise InvalidInputError(_where(source, line, "started", name),
                                    "is empty but finished is not; give when it started, or "
                                    "leave both empty for a pod that never started")
        if finished is not None and started is not None and finished < started:
            raise InvalidInputError(_where(source, line, "finished", name),
                                    "is before started; swap them or fix the clock")
        request = parse_request(raw.get("request") or "",
                                _where(source, line, "request", name))
        pod = HistoryPod(name, created, started, finished, request, line)
        before = seen.get((name, created))
        if before is None or _completeness(pod) > _completeness(before):
            seen[(name, created)] = pod
    if not seen:
        raise InvalidInputError(f"--workload {source}", "has no pods (only a header)")
    pods = tuple(sorted(seen.values(), key=lambda p: (p.created, p.line)))
    return History(pods, source, latest)


def load_history(path: Path) -> History:
    """:func:`parse_history` of a file."""
    try:
        text = path.read_text(encoding="utf-8-sig")  # a spreadsheet's byte-order mark
    except OSError as exc:
        raise InvalidInputError("--workload", f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise InvalidInputError("--workload", f"{path} is not UTF-8 text (a CSV)") from None
    return parse_history(text, str(path))


def write_history(pods: Iterable[HistoryPod]) -> str:
    """The CSV text of ``pods`` (times in RFC 3339), which :func:`parse_history` reads back."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for pod in pods:
        writer.writerow([pod.name, format_time(pod.created),
                         "" if pod.started is None else format_time(pod.started),
                         "" if pod.finished is None else format_time(pod.finished),
                         str(pod.request)])
    return out.getvalue()


Convert = Callable[[Request], tuple[Requests, int]]
"""A request as the simulated cluster's jobs ask (resources and their counts) and its compute
(the unit of load)."""


def _share_milli(share: Share, memory_mib: int) -> int:
    if share.milli is not None:
        return max(1, share.milli)
    if share.gib is not None:
        return math.ceil(share.count * share.gib * 1024 * MILLI / memory_mib)
    return share.count * MILLI // DEFAULT_SHARES


def _offered(model: GpuModel, name: str) -> MigProfile | None:
    """``model``'s profile of that name (or alias), if it has one."""
    for profile in model.profiles:
        if name in (profile.name, *profile.aliases):
            return profile
    return None


def _profile_milli(name: str, memory_mib: int) -> int:
    """The share of a card of ``memory_mib`` that a MIG profile's pod needs: the profile's
    memory on that card, or its compute fraction of its own card (the first catalogued card
    offering it) if that is larger; memory is what the pod's own data needs wherever it runs."""
    for model in catalogue.models():
        profile = _offered(model, name)
        if profile is not None:
            return math.ceil(MILLI * max(profile.compute_slices / model.compute_slices,
                                         profile.memory_mib / memory_mib))
    raise InvalidInputError("request", f"no catalogued card has MIG profile {name!r}")


def mig_requests(model: GpuModel, mapping: Mapping_ = "both") -> Convert:
    """Requests on cards of ``model``: MIG profiles; compute in compute slices."""
    full = model.full_profile

    def convert(request: Request) -> tuple[Requests, int]:
        if isinstance(request, Slices):
            resolved: dict[str, int] = {}
            for name, count in request.slices:
                profile = _offered(model, name)
                if profile is None:
                    cards = [m.name for m in catalogue.models() if _offered(m, name)]
                    raise InvalidInputError("request", f"{name} is not a MIG profile of "
                                            f"{model.name}; simulate a card that has it "
                                            f"(--cluster 2x8x{cards[0] if cards else 'MODEL'})")
                resolved[profile.name] = resolved.get(profile.name, 0) + count
            requests = tuple(sorted(resolved.items()))
        elif isinstance(request, Gpus):
            requests = ((full.name, request.count),)
        else:
            milli = _share_milli(request, model.total_memory_mib)
            requests = ((full.name, math.ceil(milli / MILLI)),) if milli >= MILLI else (
                map_request(1, milli, model, mapping),)
        return requests, sum(model.profile(p).compute_slices * n for p, n in requests)

    return convert


def shared_requests(card: WholeGpu) -> Convert:
    """Requests on cards without MIG: ``nvidia.com/gpu.shared`` in milli-GPUs or
    ``nvidia.com/gpu`` whole (as :func:`tessera.sim.workload.shared_request` asks for trace
    rows); compute in milli-GPUs."""

    def convert(request: Request) -> tuple[Requests, int]:
        if isinstance(request, Gpus):
            milli = request.count * MILLI
        elif isinstance(request, Share):
            milli = _share_milli(request, card.total_memory_mib)
        else:
            milli = sum(_profile_milli(p, card.total_memory_mib) * n
                        for p, n in request.slices)
        if milli >= MILLI:
            count = math.ceil(milli / MILLI)
            return ((catalogue.WHOLE_GPU_RESOURCE, count),), count * MILLI
        return ((catalogue.MPS_SHARED_RESOURCE, milli),), milli

    return convert


@dataclass(frozen=True)
class Replayed:
    """The jobs of a history, its window (seconds) and what was estimated or skipped."""

    jobs: tuple[Job, ...]
    window: float
    estimated: int
    """Pods that never started, given the median duration of finished pods like them."""
    skipped: int
    """Pods that never started, in a history where no pod finished: no duration to give."""


def _median_durations(pods: Sequence[HistoryPod]) -> tuple[dict[str, float], float | None]:
    by_request: dict[str, list[float]] = {}
    every: list[float] = []
    for pod in pods:
        if pod.started is not None and pod.finished is not None:
            lasted = max(1.0, pod.finished - pod.started)
            by_request.setdefault(str(pod.request), []).append(lasted)
            every.append(lasted)
    medians = {k: statistics.median(v) for k, v in by_request.items()}
    return medians, statistics.median(every) if every else None


def history_jobs(history: History, convert: Convert, *, compress: float = 1.0,
                 rate_scale: float = 1.0,
                 max_duration: float = DEFAULT_MAX_DURATION_S) -> Replayed:
    """The history's own clock, as :func:`tessera.sim.workload.replay` treats a trace's:
    ``compress`` divides every time, ``rate_scale`` only the gaps between arrivals."""
    if compress <= 0 or rate_scale <= 0:
        raise InvalidInputError("--compress/--rate-scale", "must be positive")
    medians, overall = _median_durations(history.pods)
    start = history.pods[0].created
    jobs: list[Job] = []
    used: dict[str, int] = {}
    estimated = skipped = 0
    for pod in history.pods:
        if pod.started is None:
            lasted = medians.get(str(pod.request), overall)
            if lasted is None:
                skipped += 1
                continue
            estimated += 1
        else:
            lasted = max(1.0, (pod.finished if pod.finished is not None else history.end)
                         - pod.started)
        try:
            requests, compute = convert(pod.request)
        except InvalidInputError as exc:
            raise InvalidInputError(_where(history.source, pod.line, "request", pod.name),
                                    exc.problem, exc.choices or None) from None
        used[pod.name] = used.get(pod.name, 0) + 1
        name = pod.name if used[pod.name] == 1 else f"{pod.name}#{used[pod.name]}"
        jobs.append(Job(len(jobs), name, (pod.created - start) / compress / rate_scale,
                        min(lasted, max_duration) / compress, requests, compute))
    if not jobs:
        raise InvalidInputError(f"--workload {history.source}", "no pod ever started, so no "
                                "duration is known; export again once some have run")
    window = (history.end - start) / compress / rate_scale
    return Replayed(tuple(jobs), window if window > 0 else 1.0, estimated, skipped)
