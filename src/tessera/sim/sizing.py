"""How many GPUs a workload needs under each policy: ``tessera simulate --size-for``.

The workload is made once, for the cluster given (its arrivals offer ``--load`` of that
cluster), then replayed on clusters of the same nodes in other numbers; for each policy a
bisection over the number of nodes finds the fewest that keep the target (``p95-wait=60s``: the
95th-percentile wait at most 60 s; ``mean-wait=...`` likewise). More nodes never make waits
longer in these policies' worlds in practice, which is what the bisection assumes; the answer
is checked by the run at the size it returns.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tessera.core.errors import InvalidInputError
from tessera.sim.engine import RunResult, simulate
from tessera.sim.policies import SimPolicy
from tessera.sim.workload import Job

__all__ = ["SizeAnswer", "Target", "headline", "parse_target", "size_for"]

_TRACKED = 4
"""GPUs whose layouts the answer's run draws for the report."""

_TARGET = re.compile(r"^(p95-wait|mean-wait)=(\d+(?:\.\d+)?)(s|m|h)?$")


@dataclass(frozen=True)
class Target:
    metric: str
    """``p95-wait`` or ``mean-wait``."""
    seconds: float

    def met(self, result: RunResult) -> bool:
        value = result.p95_wait if self.metric == "p95-wait" else result.mean_wait
        return value <= self.seconds

    def __str__(self) -> str:
        return f"{self.metric.replace('-', ' ')} <= {self.seconds:.0f} s"


def parse_target(text: str) -> Target:
    """``p95-wait=60s``, ``mean-wait=2m`` ... (seconds when no unit)."""
    match = _TARGET.match(text.strip())
    if match is None:
        raise InvalidInputError("--size-for", f"{text!r}: expected p95-wait=DURATION or "
                                "mean-wait=DURATION, e.g. p95-wait=60s")
    scale = {"s": 1.0, "m": 60.0, "h": 3600.0}[match.group(3) or "s"]
    return Target(match.group(1), float(match.group(2)) * scale)


@dataclass(frozen=True)
class SizeAnswer:
    policy: str
    nodes: int | None
    """The fewest nodes meeting the target; None when even ``limit`` nodes do not."""
    gpus: int | None
    result: RunResult
    """The run at that size (at the limit when not met)."""


def size_for(policy_name: str, make: Callable[[int], tuple[SimPolicy, int]],
             jobs: Sequence[Job], horizon: float, target: Target, *, limit: int,
             gpus_per_node: int) -> SizeAnswer:
    """``make(nodes)`` gives a fresh policy on that many nodes and the cluster's capacity."""
    runs: dict[int, RunResult] = {}

    def run(nodes: int, track_gpus: int = 0) -> RunResult:
        if nodes not in runs or track_gpus:
            policy, capacity = make(nodes)
            runs[nodes] = simulate(policy, jobs, capacity=capacity, horizon=horizon,
                                   track_gpus=track_gpus)
        return runs[nodes]

    if not target.met(run(limit)):
        return SizeAnswer(policy_name, None, None, run(limit, _TRACKED))
    low, high = 0, limit  # low fails (or is zero nodes), high meets
    while high - low > 1:
        middle = (low + high) // 2
        if target.met(run(middle)):
            high = middle
        else:
            low = middle
    # Once more at the answer, drawing a few GPUs' layouts for the report (the same run: the
    # simulation is deterministic, so the figures do not move).
    return SizeAnswer(policy_name, high, high * gpus_per_node, run(high, _TRACKED))


def headline(answers: Sequence[SizeAnswer], target: Target, limit_gpus: int) -> list[str]:
    """The answer first: "dynamic needs 12 GPUs, ..." to keep the target."""
    parts = [f"{a.policy} needs {a.gpus} GPUs" if a.gpus is not None
             else f"{a.policy} needs more than {limit_gpus}" for a in answers]
    lines = [f"To keep {target}: " + ", ".join(parts) + "."]
    for a in answers:
        at = f"{a.gpus} GPUs" if a.gpus is not None else f"{limit_gpus} GPUs (not met)"
        lines.append(f"  {a.policy:<22} at {at}: p95 wait {a.result.p95_wait:.0f} s, mean "
                     f"{a.result.mean_wait:.0f} s, {a.result.placed}/{a.result.jobs} placed, "
                     f"{a.result.served_share:.1%} of that cluster's compute served")
    return lines
