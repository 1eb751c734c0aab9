"""The reference solver: an integer program over whole-GPU layout choices, solved by HiGHS.

Variables: for every repartitionable GPU, one binary per candidate target layout (pick one);
for every pod and eligible node, a binary "the pod lands here"; for every pod, GPU and resource,
an integer count of units taken there. A pod's units add up to its demand on exactly the node
it lands on, and a GPU gives out no more units of a profile than its chosen layout has free.

Candidate layouts are every valid layout that keeps all in-use slices and creates only profiles
some eligible pod asks for, reduced to one per capacity vector (the cheapest) and then to the
Pareto front of (capacity, cost): that is exact, since the program sees a layout only through
those numbers, and it is what keeps 20 GPUs to a few thousand variables.

The objective is the planner's (see :mod:`tessera.core.planner`), solved lexicographically:
first the pods placed in planning order (priority, then arrival): placing a pod outweighs
placing every pod after it, solved in stages of :data:`_STAGE` pods so the weights stay exact
in floating point; then, with that fixed, the fewest slices destroyed, GPUs touched, whole
GPUs split and slices created (in that order of weight).

Reservations (:mod:`~tessera.core.planner.reserve`) are found as the fast solver finds them:
solve; the first pod left out (after the last one that reserved) that has waited long enough
(:attr:`~tessera.core.planner.problem.PodInfo.may_reserve`) reserves its GPUs, closing
them to every pod after it; solve again; until the bound is reached or no pod is left out.
A reservation only restricts later pods, so the plan before each reserving pod never changes.
It is meant for small clusters (tests, benchmarks, ``tessera plan --solver exact``): above
``max_gpus`` it refuses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from tessera.core import layout
from tessera.core.errors import InvalidInputError
from tessera.core.layout import Slice
from tessera.core.planner.problem import GpuInfo, Problem, profile_for
from tessera.core.planner.reserve import DEFAULT_RESERVATIONS, reserve
from tessera.core.planner.result import GpuOutcome, Outcome, PlannerBug, Unit

__all__ = ["DEFAULT_MAX_GPUS", "solve_exact"]

DEFAULT_MAX_GPUS = 24
_STAGE = 16
"""Pods per lexicographic stage: weights up to 2**16 keep HiGHS' sums exact."""


@dataclass(frozen=True)
class _Candidate:
    slices: frozenset[Slice]
    capacity: tuple[int, ...]
    """Free units per resource in the GPU's resource list, in order."""
    cost: tuple[int, int, int, int]
    """(destroyed, touched, whole GPU split, created)."""


def _layouts(info: GpuInfo, profiles: Sequence[str]) -> list[frozenset[Slice]]:
    """Valid layouts keeping ``info.in_use``, from existing free slices and new ``profiles``."""
    if info.frozen_reason is not None:
        return [info.current]
    options = sorted(info.current - info.in_use)
    options += sorted(
        {Slice(p, pl.start) for p in profiles if info.can_create(p)
         for pl in info.mig.profile(p).placements} - info.current
    )
    found: list[frozenset[Slice]] = []

    def extend(index: int, chosen: list[Slice]) -> None:
        found.append(frozenset(chosen))
        for nxt in range(index, len(options)):
            if layout.conflict_with(info.mig, chosen, options[nxt]) is None:
                chosen.append(options[nxt])
                extend(nxt + 1, chosen)
                chosen.pop()

    extend(0, sorted(info.in_use))
    return found


def _candidates(info: GpuInfo, resources: Sequence[str]) -> list[_Candidate]:
    profiles = [profile_for(info.mig, r) for r in resources]
    by_capacity: dict[tuple[int, ...], _Candidate] = {}
    for slices in _layouts(info, [p for p in profiles if p is not None]):
        free = slices - info.in_use
        capacity = tuple(sum(1 for s in free if s.profile == p) for p in profiles)
        created = len(slices - info.current)
        destroyed = len(info.current - slices)
        touched = int(created + destroyed > 0)
        cost = (destroyed, touched, int(touched and not info.current and created > 0), created)
        known = by_capacity.get(capacity)
        if known is None or (cost, sorted(slices)) < (known.cost, sorted(known.slices)):
            by_capacity[capacity] = _Candidate(slices, capacity, cost)
    ordered = sorted(by_capacity.values(), key=lambda c: (c.cost, c.capacity))
    front: list[_Candidate] = []
    for candidate in ordered:  # cheapest first: a later one is kept only if it offers more
        if not any(
            all(k >= c for k, c in zip(kept.capacity, candidate.capacity, strict=True))
            for kept in front
        ):
            front.append(candidate)
    return front


class _Model:
    """A small builder over HiGHS' raw interface (the wrapper class prints a banner)."""

    def __init__(self) -> None:
        self.lower: list[float] = []
        self.upper: list[float] = []
        self.rows: list[tuple[float, float, list[int], list[float]]] = []

    def var(self, upper: float) -> int:
        self.lower.append(0.0)
        self.upper.append(upper)
        return len(self.lower) - 1

    def row(self, lower: float, upper: float, terms: Sequence[tuple[int, float]]) -> None:
        self.rows.append((lower, upper, [t[0] for t in terms], [t[1] for t in terms]))

    def solve(self, stages: Sequence[tuple[dict[int, float], bool]], time_limit: float
              ) -> list[float]:
        import highspy  # noqa: PLC0415 - heavy (numpy); only the exact solver needs it

        raw: Any = highspy
        solver: Any = raw._Highs()
        solver.setOptionValue("output_flag", False)
        solver.setOptionValue("mip_rel_gap", 0.0)
        solver.setOptionValue("threads", 1)
        solver.setOptionValue("random_seed", 0)
        solver.setOptionValue("time_limit", time_limit)
        lp = highspy.HighsLp()
        lp.num_col_ = len(self.lower)
        lp.num_row_ = len(self.rows)
        lp.col_cost_ = [0.0] * len(self.lower)
        lp.col_lower_ = self.lower
        lp.col_upper_ = self.upper
        lp.row_lower_ = [r[0] for r in self.rows]
        lp.row_upper_ = [r[1] for r in self.rows]
        lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
        starts = [0]
        for r in self.rows:
            starts.append(starts[-1] + len(r[2]))
        lp.a_matrix_.start_ = starts
        lp.a_matrix_.index_ = [i for r in self.rows for i in r[2]]
        lp.a_matrix_.value_ = [v for r in self.rows for v in r[3]]
        lp.integrality_ = [highspy.HighsVarType.kInteger] * len(self.lower)
        solver.passModel(lp)
        values: list[float] = []
        for objective, maximise in stages:
            columns = list(range(len(self.lower)))
            solver.changeColsCost(len(columns), columns, [objective.get(c, 0.0) for c in columns])
            solver.changeObjectiveSense(
                highspy.ObjSense.kMaximize if maximise else highspy.ObjSense.kMinimize
            )
            solver.run()
            status = solver.getModelStatus()
            if status != highspy.HighsModelStatus.kOptimal:
                raise PlannerBug(f"HiGHS ended with {status} (time limit {time_limit}s?)")
            values = list(solver.getSolution().col_value)
            best = sum(w * values[c] for c, w in objective.items())
            terms = sorted(objective.items())
            idx = [c for c, _ in terms]
            coefficients = [w for _, w in terms]
            if maximise:
                solver.addRow(best - 0.5, highspy.kHighsInf, len(idx), idx, coefficients)
            else:
                solver.addRow(-highspy.kHighsInf, best + 0.5, len(idx), idx, coefficients)
        return values


def solve_exact(
    problem: Problem, max_gpus: int = DEFAULT_MAX_GPUS, time_limit_s: float = 120.0,
    reservations: int = DEFAULT_RESERVATIONS,
) -> Outcome:
    """An optimal plan for the problem (see the module docstring for the objective)."""
    if len(problem.gpus) > max_gpus:
        raise InvalidInputError(
            "solver",
            f"the exact solver handles at most {max_gpus} GPUs; this cluster has "
            f"{len(problem.gpus)}",
            ["fast"],
        )
    reserved: dict[int, int] = {}
    owners: list[int] = []
    while True:
        outcome = replace(_solve(problem, reserved, time_limit_s), reserved=dict(reserved))
        if len(owners) >= reservations:
            return outcome
        after = owners[-1] if owners else -1
        blocked = next((p for p, pod in enumerate(problem.pods)
                        if p > after and pod.demand and pod.eligible and pod.may_reserve
                        and p not in outcome.assignments), None)
        if blocked is None:
            return outcome
        owners.append(blocked)
        for g in reserve(problem, blocked, reserved.keys()):
            reserved[g] = blocked


def _solve(problem: Problem, reserved: dict[int, int], time_limit_s: float) -> Outcome:
    """One solve with GPU ``g`` closed to every pod after ``reserved[g]``."""

    def open_to(position: int, g: int) -> bool:
        owner = reserved.get(g)
        return owner is None or position <= owner

    model = _Model()
    # Per GPU: the resources eligible pods might take from it, and the layout choice.
    wanted: list[set[str]] = [set() for _ in problem.gpus]
    for pod in problem.pods:
        for n in pod.eligible:
            for g in problem.node_gpus[n]:
                wanted[g].update(r for r, _ in pod.demand if problem.gpus[g].offers(r))
    resources = [sorted(w) for w in wanted]
    choices: list[list[tuple[int, _Candidate]]] = []
    count = len(problem.gpus)
    m0 = 8 * count + 1
    secondary: dict[int, float] = {}
    for info in problem.gpus:
        options: list[tuple[int, _Candidate]] = []
        if info.gpu.mode == "mig":
            for candidate in _candidates(info, resources[info.gid]):
                var = model.var(1)
                d, t, s, c = candidate.cost
                secondary[var] = float(((d * (count + 1) + t) * (count + 1) + s) * m0 + c)
                options.append((var, candidate))
            model.row(1, 1, [(v, 1.0) for v, _ in options])
        choices.append(options)
    # Per pod: where it lands and what it takes there.
    lands: dict[tuple[int, int], int] = {}
    takes: dict[tuple[int, int, str], int] = {}
    per_gpu: dict[tuple[int, str], list[int]] = {}
    for position, pod in enumerate(problem.pods):
        for n in pod.eligible:
            node = problem.nodes[n]
            if (node.free_cpu_milli is not None and pod.pod.cpu_milli > node.free_cpu_milli) or (
                node.free_memory_mib is not None and pod.pod.memory_mib > node.free_memory_mib
            ):
                continue
            gids = [g for g in problem.node_gpus[n] if open_to(position, g)]
            if not pod.demand or not all(
                any(problem.gpus[g].offers(r) for g in gids) for r, _ in pod.demand
            ):
                continue
            z = lands[(position, n)] = model.var(1)
            for resource, amount in pod.demand:
                terms: list[tuple[int, float]] = [(z, -float(amount))]
                for g in gids:
                    if problem.gpus[g].offers(resource):
                        a = takes[(position, g, resource)] = model.var(amount)
                        per_gpu.setdefault((g, resource), []).append(a)
                        terms.append((a, 1.0))
                model.row(0, 0, terms)
        model.row(0, 1, [(z, 1.0) for (p, _), z in lands.items() if p == position])
    for (g, resource), columns in sorted(per_gpu.items()):
        info = problem.gpus[g]
        terms = [(a, 1.0) for a in columns]
        if info.gpu.mode == "none":
            model.row(0, float(not info.gpu.in_use), terms)
        elif info.gpu.mode == "mps":
            model.row(0, float(info.gpu.shares - info.gpu.shares_in_use), terms)
        else:
            slot = resources[g].index(resource)
            terms += [(v, -float(c.capacity[slot])) for v, c in choices[g] if c.capacity[slot]]
            model.row(-float("inf"), 0, terms)
    for n, node in enumerate(problem.nodes):
        for limit, need in ((node.free_cpu_milli, "cpu"), (node.free_memory_mib, "memory")):
            if limit is None:
                continue
            terms = []
            for (p, m), z in lands.items():
                wants = problem.pods[p].pod
                amount = wants.cpu_milli if need == "cpu" else wants.memory_mib
                if m == n and amount:
                    terms.append((z, float(amount)))
            if terms:
                model.row(-float("inf"), float(limit), terms)
    # Lexicographic in planning order: a pod outweighs all the pods after it together.
    stages: list[tuple[dict[int, float], bool]] = []
    for first in range(0, len(problem.pods), _STAGE):
        stage = {z: float(2 ** (_STAGE - 1 - (p - first))) for (p, _), z in lands.items()
                 if first <= p < first + _STAGE}
        if stage:
            stages.append((stage, True))
    stages.append((secondary, False))
    values = model.solve(stages, time_limit_s) if model.lower else []
    return _outcome(problem, choices, lands, takes, values)


def _outcome(
    problem: Problem,
    choices: Sequence[Sequence[tuple[int, _Candidate]]],
    lands: dict[tuple[int, int], int],
    takes: dict[tuple[int, int, str], int],
    values: Sequence[float],
) -> Outcome:
    def on(var: int) -> int:
        return round(values[var])

    pools: list[dict[str, list[Slice]]] = []
    target: list[frozenset[Slice]] = []
    for info in problem.gpus:
        chosen = next((c.slices for v, c in choices[info.gid] if on(v)), info.current)
        target.append(chosen)
        pool: dict[str, list[Slice]] = {}
        # Existing free slices first, so a pod takes what is there before what gets made.
        for item in sorted(chosen - info.in_use, key=lambda s: (s not in info.current, s.start)):
            pool.setdefault(item.profile, []).append(item)
        pools.append(pool)
    locked = [set(info.in_use) for info in problem.gpus]
    whole = [info.gpu.mode == "none" and not info.gpu.in_use for info in problem.gpus]
    shares = [info.gpu.shares - info.gpu.shares_in_use for info in problem.gpus]
    assignments: dict[int, tuple[int, Sequence[Unit]]] = {}
    for (position, n), z in sorted(lands.items()):
        if not on(z):
            continue
        units: list[Unit] = []
        for resource, _ in problem.pods[position].demand:
            for g in problem.node_gpus[n]:
                var = takes.get((position, g, resource))
                for _ in range(on(var) if var is not None else 0):
                    info = problem.gpus[g]
                    if info.gpu.mode == "mig":
                        profile = profile_for(info.mig, resource)
                        assert profile is not None
                        item = pools[g][profile].pop(0)
                        locked[g].add(item)
                        units.append((g, resource, item))
                    elif info.gpu.mode == "none":
                        whole[g] = False
                        units.append((g, resource, None))
                    else:
                        shares[g] -= 1
                        units.append((g, resource, None))
        assignments[position] = (n, units)
    gpus = [
        GpuOutcome(target[g], frozenset(locked[g]), whole[g], shares[g])
        for g in range(len(problem.gpus))
    ]
    return Outcome(gpus=gpus, assignments=dict(sorted(assignments.items())))
