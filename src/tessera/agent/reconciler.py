"""One reconcile of a NodePartition: observe -> plan -> apply, until settled, then report.

Each round re-observes the card, so a round never acts on what an earlier one assumed; a round
that makes no progress (everything left is blocked, pending or failing) ends the reconcile, and
the agent tries again on the next change or tick. Nothing here talks to Kubernetes: the caller
hands in the NodePartition and writes the returned status.
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from tessera.agent.advertising import MpsAdvert
from tessera.agent.apply import MpsControl, Outcome, apply_steps, run_step
from tessera.agent.node import NodeRuntime
from tessera.agent.observation import NodeObservation
from tessera.agent.reconcile import MpsTarget, NodePlan, Step, TimesliceTarget, plan_node
from tessera.agent.status import build_status
from tessera.api.v1alpha1 import MpsStatus, NodePartition, NodePartitionStatus

__all__ = ["ReconcileResult", "Reconciler", "utc_now"]

log = logging.getLogger(__name__)


def utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class ReconcileResult:
    status: NodePartitionStatus
    done: list[Step] = field(default_factory=list)
    outcomes: list[Outcome] = field(default_factory=list)
    plan: NodePlan = field(default_factory=NodePlan)
    seconds: float = 0.0


def _running(status: dict[str, MpsStatus]) -> dict[str, MpsTarget]:
    return {uuid: MpsTarget(s.shares, s.thread_percentage, s.memory_mi_b, s.resource)
            for uuid, s in status.items()}


def _timesliced(runtime: NodeRuntime) -> dict[str, TimesliceTarget]:
    return {uuid: TimesliceTarget(a.replicas, a.resource) for uuid, a in runtime.timeslices.items()}


class MpsService(MpsControl, Protocol):
    """The MPS daemons' side the reconciler needs (:class:`tessera.agent.mps.MpsManager`)."""

    def check(self) -> list[str]: ...

    def status(self) -> dict[str, MpsStatus]: ...

    def adverts(self) -> dict[str, MpsAdvert]: ...


class Reconciler:
    def __init__(self, runtime: NodeRuntime, mps: MpsService | None = None, *,
                 max_rounds: int = 6, clock: Callable[[], str] = utc_now) -> None:
        self.runtime = runtime
        self.mps = mps
        self.max_rounds = max_rounds
        self._clock = clock

    def _mps_status(self) -> dict[str, MpsStatus]:
        return self.mps.status() if self.mps is not None else {}

    def _observe(self) -> NodeObservation:
        """Observe, with MPS daemons checked (restarted if dead) and their shares published."""
        if self.mps is None:
            return self.runtime.refresh()
        self.mps.check()
        return self.runtime.refresh(mps=self.mps.adverts())

    def _run(self, step: Step) -> Outcome:
        return run_step(self.runtime.backend, self.runtime, self.mps, step)

    def reconcile(self, partition: NodePartition) -> ReconcileResult:
        started = time.monotonic()
        spec = partition.spec
        done: list[Step] = []
        all_outcomes: list[Outcome] = []
        last_round: list[Outcome] = []
        retries = 2  # rounds that only met NVML errors, retried after observing again
        for _ in range(self.max_rounds):
            observation = self._observe()
            plan = plan_node(spec, observation, _running(self._mps_status()),
                             _timesliced(self.runtime))
            if not plan.steps:
                break
            last_round = apply_steps(plan.steps, self._run)
            all_outcomes += last_round
            done += [o.step for o in last_round if o.ok]
            if any(o.ok for o in last_round):
                continue
            if retries and all(o.status == "failed" for o in last_round):
                retries -= 1  # IN_USE / INSUFFICIENT_RESOURCES: the card may have moved on
                continue
            break  # no progress: blocked or pending; the next change or tick tries again
        observation = self._observe()
        mps_status = self._mps_status()
        plan = plan_node(spec, observation, _running(mps_status), _timesliced(self.runtime))
        status = build_status(
            generation=partition.metadata.generation,
            plan_id=spec.plan_id,
            observation=observation,
            plan=plan,
            outcomes=[o for o in last_round if not o.ok],
            previous=partition.status,
            now=self._clock(),
            mps=mps_status,
            timeslices=_timesliced(self.runtime),
        )
        return ReconcileResult(status=status, done=done, outcomes=all_outcomes, plan=plan,
                               seconds=time.monotonic() - started)
