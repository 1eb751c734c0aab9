"""How many GPUs a workload needs under each policy: ``tessera simulate --size-for``.

The workload is made once, for the cluster given (its arrivals offer ``--load`` of that
cluster), then replayed on clusters of the same nodes in every number from one to the limit.
Every size is run: more nodes do not always mean shorter waits for a planner that starts large
pods (on the bundled sample, ``dynamic:reservations-0`` keeps a p95 of 18 s on 24 GPUs, 641 s on
32 and 12 s on 40: at 32 GPUs it starts the multi-GPU pods sooner, and the 7g pods queue behind
the cards they drain), so a bisection that assumes the opposite can skip the answer or return
one that a larger cluster breaks. Each run of the bundled workload takes about a second.

The answer is the smallest size from which the goal holds at every larger size tried; a
smaller size that meets it without that guarantee is named beside it ("also met at 24 GPUs, not
at 32").

A goal is one or more targets, each on a class of pod (:func:`tessera.sim.engine.size_class`:
``1g`` ... ``7g``, ``multi-GPU``, and ``share``/``whole`` on GPUs without MIG) or a group of
them: ``small`` (every one-GPU class), or ``all`` (every pod pooled, the single figure that
lets small pods hide a starving class). A target on a group holds each class in it to the
bound, so no class hides behind another. A target given without a class is on ``small``; a
class with no target is still measured, and reported when it waits more than ten times as long
as the targeted classes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from tessera.core.errors import InvalidInputError
from tessera.sim.engine import MULTI_GPU, RunResult, percentile, simulate
from tessera.sim.policies import SimPolicy
from tessera.sim.workload import Job

__all__ = ["ALL", "SMALL", "Goal", "Miss", "SizeAnswer", "Target", "answer", "duration",
           "headline", "judge", "parse_goal", "size_for", "sweep"]

_TRACKED = 4
"""GPUs whose layouts each run draws for the report."""

SMALL = "small"
"""Every class of pod that asks one GPU or less."""
ALL = "all"
"""Every pod pooled into one figure."""
_GROUP_HELP = {SMALL: "every class of one GPU or less", ALL: "all pods pooled"}
METRICS = ("p95-wait", "mean-wait")
UNSEEN = 10.0
"""An untargeted class waiting more than this many times the targeted classes' worst p95 is
named in the headline."""

_ITEM = re.compile(r"^(?:(?P<scope>[A-Za-z0-9-]+):)?(?P<metric>[a-z0-9-]+)="
                   r"(?P<value>\d+(?:\.\d+)?)(?P<unit>s|m|h)?$")
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


def duration(seconds: float) -> str:
    """A wait as a reader takes it in: seconds, minutes or hours."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}".removesuffix(".0") + " min"
    return f"{seconds / 3600:.1f}".removesuffix(".0") + " h"


@dataclass(frozen=True)
class Target:
    """One bound: ``scope`` is a class (``"7g"``, ``"multi-GPU"``), :data:`SMALL` or
    :data:`ALL`; ``metric`` is ``p95-wait`` or ``mean-wait``."""

    scope: str
    metric: str
    seconds: float

    def value(self, waits: Sequence[float]) -> float:
        if self.metric == "p95-wait":
            return percentile(waits, 95)
        return sum(waits) / len(waits) if waits else 0.0

    def __str__(self) -> str:
        who = {SMALL: "small pods'", ALL: "all pods' pooled"}.get(self.scope,
                                                                    f"{self.scope} pods'")
        return f"{who} {self.metric.replace('-', ' ')} <= {duration(self.seconds)}"


@dataclass(frozen=True)
class Miss:
    """A class (or ``all``) over its bound in one run."""

    target: Target
    class_name: str
    value: float

    @property
    def who(self) -> str:
        return "all pods" if self.class_name == ALL else self.class_name

    def __str__(self) -> str:
        return f"{self.who} {self.target.metric.split('-')[0]} {duration(self.value)}"


@dataclass(frozen=True)
class Goal:
    """The targets of one ``--size-for``, over the classes the card has."""

    targets: tuple[Target, ...]
    classes: tuple[str, ...]

    def members(self, target: Target) -> tuple[str, ...]:
        """The classes a target holds, each to its own bound (none for :data:`ALL`)."""
        if target.scope == ALL:
            return ()
        if target.scope == SMALL:
            return tuple(c for c in self.classes if c != MULTI_GPU)
        return (target.scope,)

    def targets_on(self, name: str) -> tuple[Target, ...]:
        """The targets that hold class ``name``, or the pooled figure when ``name`` is
        :data:`ALL`."""
        return tuple(t for t in self.targets
                     if (t.scope == ALL if name == ALL else name in self.members(t)))

    @property
    def targeted(self) -> tuple[str, ...]:
        covered = {c for t in self.targets for c in self.members(t)}
        return tuple(c for c in self.classes if c in covered)

    def misses(self, result: RunResult) -> tuple[Miss, ...]:
        """Every class over a bound in ``result``, worst (value over bound) first. A class with
        no pods in the workload meets every bound."""
        found: list[Miss] = []
        for target in self.targets:
            if target.scope == ALL:
                value = target.value(result.waits)
                if result.waits and value > target.seconds:
                    found.append(Miss(target, ALL, value))
                continue
            for name in self.members(target):
                waits = result.class_waits.get(name, [])
                value = target.value(waits)
                if waits and value > target.seconds:
                    found.append(Miss(target, name, value))
        return tuple(sorted(found, key=lambda m: -m.value / max(m.target.seconds, 1e-9)))

    def met(self, result: RunResult) -> bool:
        return not self.misses(result)

    def unseen(self, result: RunResult) -> tuple[tuple[str, float, float], ...]:
        """Classes with no target whose p95 wait is more than :data:`UNSEEN` times the worst
        p95 of the targeted classes: (class, its p95, the targeted p95). The pooled ``all``
        target covers no class by itself, so under it every class is checked."""
        targeted = self.targeted
        if targeted:
            watched = max((percentile(result.class_waits.get(c, []), 95) for c in targeted),
                          default=0.0)
        else:
            watched = percentile(result.waits, 95)
        found = []
        for name in self.classes:
            waits = result.class_waits.get(name, [])
            if name in targeted or not waits:
                continue
            p95 = percentile(waits, 95)
            if p95 > UNSEEN * max(watched, 1.0):
                found.append((name, p95, watched))
        return tuple(found)

    def __str__(self) -> str:
        return " and ".join(str(t) for t in self.targets)


def parse_goal(text: str, classes: Sequence[str]) -> Goal:
    """``p95-wait=2m``, ``small:p95-wait=2m,multi-gpu:p95-wait=6h``, ``7g:mean-wait=90s``,
    ``all:p95-wait=120s`` (seconds when no unit; a class without a scope means ``small``).
    ``classes`` are the card's; class names match without regard to case."""
    by_name = {c.lower(): c for c in classes}
    scopes = [*classes, SMALL, ALL]
    listing = ", ".join(f"{c}" for c in classes) + ", " + ", ".join(
        f"{g} ({why})" for g, why in _GROUP_HELP.items())
    targets: list[Target] = []
    for item in (part.strip() for part in text.split(",")):
        match = _ITEM.match(item)
        if match is None:
            raise InvalidInputError("--size-for", f"{item!r}: expected [CLASS:]METRIC=DURATION,"
                                    " e.g. small:p95-wait=2m,multi-gpu:p95-wait=6h; classes: "
                                    f"{listing}")
        metric = match.group("metric")
        if metric not in METRICS:
            raise InvalidInputError("--size-for", f"{item!r}: unknown metric {metric!r} "
                                    f"(metrics: {', '.join(METRICS)}); classes: {listing}")
        scope = (match.group("scope") or SMALL).lower()
        scope = by_name.get(scope, scope)
        if scope not in scopes:
            raise InvalidInputError("--size-for", f"{item!r}: no class {scope!r} on this card;"
                                    f" classes: {listing}")
        seconds = float(match.group("value")) * _UNITS[match.group("unit") or "s"]
        targets.append(Target(scope, metric, seconds))
    return Goal(tuple(targets), tuple(classes))


@dataclass(frozen=True)
class SizeAnswer:
    policy: str
    nodes: int | None
    """The fewest nodes from which the goal holds at every larger size; None when not even
    the limit meets it."""
    gpus: int | None
    result: RunResult
    """The run at that size (at the limit when not met)."""
    curve: tuple[tuple[int, RunResult], ...]
    """(GPUs, run) for every size tried, smallest first."""
    also_met: tuple[int, ...]
    """GPUs below the answer that meet the goal, though a larger size does not."""
    not_met: tuple[int, ...]
    """GPUs between the smallest of :attr:`also_met` and the answer that miss it."""
    binding: tuple[Miss, ...]
    """What misses at :attr:`binding_gpus`: the size just below the answer (at the limit when
    not met); empty when the smallest size meets it."""
    binding_gpus: int | None


def answer(met: Sequence[bool]) -> int | None:
    """Index of the first size from which every size meets (``met[i]`` for size ``i + 1``
    nodes), None when the last does not."""
    if not met or not met[-1]:
        return None
    first = len(met) - 1
    while first > 0 and met[first - 1]:
        first -= 1
    return first


def sweep(make: Callable[[int], tuple[SimPolicy, int]], jobs: Sequence[Job], horizon: float,
          *, limit: int, gpus_per_node: int,
          progress: Callable[[int], None] | None = None) -> tuple[tuple[int, RunResult], ...]:
    """Run every size from 1 to ``limit`` nodes: (GPUs, run), smallest first. ``make(nodes)``
    gives a fresh policy on that many nodes and the cluster's capacity; ``progress(nodes)``
    is called after each size."""
    curve: list[tuple[int, RunResult]] = []
    for nodes in range(1, limit + 1):
        policy, capacity = make(nodes)
        curve.append((nodes * gpus_per_node, simulate(policy, jobs, capacity=capacity,
                                                      horizon=horizon, track_gpus=_TRACKED)))
        if progress is not None:
            progress(nodes)
    return tuple(curve)


def judge(policy_name: str, curve: Sequence[tuple[int, RunResult]], goal: Goal) -> SizeAnswer:
    """The answer :func:`sweep`'s curve gives for ``goal`` (one node more per step)."""
    met = [goal.met(r) for _, r in curve]
    first = answer(met)
    if first is None:
        gpus, result = curve[-1]
        return SizeAnswer(policy_name, None, None, result, tuple(curve), (), (),
                          goal.misses(result), gpus)
    also = tuple(g for (g, _), ok in zip(curve[:first], met[:first], strict=True) if ok)
    not_met = tuple(g for (g, _), ok in zip(curve[:first], met[:first], strict=True)
                    if not ok and also and g > also[0])
    below = curve[first - 1] if first else None
    return SizeAnswer(policy_name, first + 1, curve[first][0], curve[first][1], tuple(curve),
                      also, not_met, goal.misses(below[1]) if below else (),
                      below[0] if below else None)


def size_for(policy_name: str, make: Callable[[int], tuple[SimPolicy, int]],
             jobs: Sequence[Job], horizon: float, goal: Goal, *, limit: int,
             gpus_per_node: int,
             progress: Callable[[int], None] | None = None) -> SizeAnswer:
    """:func:`judge` of :func:`sweep`: every size run, then the answer."""
    return judge(policy_name, sweep(make, jobs, horizon, limit=limit,
                                    gpus_per_node=gpus_per_node, progress=progress), goal)


def _listed(values: Iterable[object]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    words = [str(v) for v in values]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def _binds(a: SizeAnswer) -> str:
    names = list(dict.fromkeys(m.who for m in a.binding))
    if not names:
        return "met from the smallest size tried"
    verb = "binds" if len(names) == 1 else "bind"
    return f"{_listed(names)} {verb}"


def headline(answers: Sequence[SizeAnswer], goal: Goal, limit_gpus: int) -> list[str]:
    """The answer first: "dynamic needs 40 GPUs (7g binds), ..."; then per policy what binds
    it (the classes that miss one size below), the sizes that also meet it without holding
    above, and any untargeted class waiting far longer than the targeted ones."""
    parts = [f"{a.policy} needs {a.gpus} GPUs ({_binds(a)})" if a.gpus is not None
             else f"{a.policy} needs more than {limit_gpus} GPUs ({_binds(a)})"
             for a in answers]
    lines = [f"To keep {goal}: " + ", ".join(parts) + "."]
    for a in answers:
        if a.gpus is None:
            why = ", ".join(str(m) for m in a.binding)
            lines.append(f"  {a.policy}: not met even at {limit_gpus} GPUs: {why}")
        elif a.binding:
            why = ", ".join(str(m) for m in a.binding)
            line = f"  {a.policy}: {a.gpus} GPUs; at {a.binding_gpus} GPUs: {why}"
            if a.also_met:
                line += (f"; also met at {_listed(a.also_met)} GPUs, not at "
                         f"{_listed(a.not_met)}")
            lines.append(line)
        for name, p95, watched in goal.unseen(a.result) if a.gpus is not None else ():
            lines.append(f"  ! {a.policy} meets it at {a.gpus} GPUs while "
                         f"{name} pods, with no target, wait p95 {duration(p95)}: more than "
                         f"{UNSEEN:.0f}x the p95 of the pods it targets ({duration(watched)})")
    return lines
