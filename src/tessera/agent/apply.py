"""Carry out planned steps on the card, re-checking at the last moment what planning assumed.

A destroy is the one dangerous step, so it is guarded: the slice is first withdrawn from the
device plugin (the kubelet can no longer hand it out), then the kubelet's allocations and NVML's
processes are read again, and only if both say nobody uses it is it destroyed; otherwise it is
advertised again and reported as blocked. Every step is idempotent (destroying what is gone,
creating what is there already after a crash, are both caught by the next observation), so the
agent may be killed between any two steps.

A step that fails stops the remaining steps of that GPU only: the next round re-observes the
card and plans again from what is really there.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from tessera.agent.advertising import TimesliceAdvert
from tessera.agent.observation import UNKNOWN_HOLDERS
from tessera.agent.reconcile import (
    CompleteSlice,
    CreateSlice,
    DestroySlice,
    SetMigMode,
    SetTimeslice,
    StartMps,
    Step,
    StopMps,
    StopTimeslice,
)
from tessera.core.errors import BackendError
from tessera.nvml.backend import GpuBackend

__all__ = ["Outcome", "SliceGuard", "StepRunner", "apply_steps"]

log = logging.getLogger(__name__)


class SliceGuard(Protocol):
    """The device plugin side of a destroy: stop offering a slice, and ask who holds it."""

    def withdraw(self, uuid: str) -> None: ...

    def restore(self, uuid: str) -> None: ...

    def holders(self, uuid: str) -> tuple[str, ...] | None:
        """Pods holding the device now; None if the kubelet cannot be asked."""
        ...

    def set_timeslice(self, uuid: str, advert: TimesliceAdvert | None) -> None:
        """Advertise a whole GPU as time-slicing replicas (None: whole again)."""
        ...


class MpsControl(Protocol):
    def start(self, step: StartMps) -> None: ...

    def stop(self, step: StopMps) -> None: ...


@dataclass(frozen=True)
class Outcome:
    step: Step
    status: str
    """``done``, ``blocked`` (someone uses it), ``pending`` (the driver deferred it), ``failed``."""
    message: str = ""
    code: int | None = None

    @property
    def ok(self) -> bool:
        return self.status == "done"


StepRunner = Callable[[Step], Outcome]


def _destroy(backend: GpuBackend, guard: SliceGuard, step: DestroySlice) -> Outcome:
    uuid = step.mig_uuid
    if uuid is None:  # no compute instance: no CUDA device, nobody can hold it
        backend.destroy_slice(step.gpu, step.gi_id)
        return Outcome(step, "done")
    guard.withdraw(uuid)
    holders = guard.holders(uuid)
    processes = backend.processes(uuid)
    if holders is None or holders or processes:
        guard.restore(uuid)
        who = (UNKNOWN_HOLDERS if holders is None else
               ", ".join(f"pod {p}" for p in holders) or f"{len(processes)} process(es)")
        return Outcome(step, "blocked", f"{step.slice} ({uuid}) is in use: {who}")
    try:
        backend.destroy_slice(step.gpu, step.gi_id)
    except BackendError:
        guard.restore(uuid)
        raise
    guard.restore(uuid)  # gone from the card, so it will not be advertised again anyway
    return Outcome(step, "done")


def run_step(backend: GpuBackend, guard: SliceGuard, mps: MpsControl | None,
             step: Step) -> Outcome:
    try:
        if isinstance(step, DestroySlice):
            return _destroy(backend, guard, step)
        if isinstance(step, CreateSlice):
            backend.create_slice(step.gpu, step.slice.profile, step.slice.start)
        elif isinstance(step, CompleteSlice):
            backend.create_compute_instance(step.gpu, step.gi_id)
        elif isinstance(step, SetMigMode):
            result = backend.set_mig_mode(step.gpu, step.enabled)
            if result.reset_required:
                return Outcome(step, "pending", f"GPU {step.gpu} needs a reset or reboot for "
                               "the MIG mode change (RESET_REQUIRED)", result.activation_status)
            if not result.applied:
                return Outcome(step, "pending", f"GPU {step.gpu}: MIG mode change is pending "
                               "until the GPU is idle (IN_USE)", result.activation_status)
        elif isinstance(step, SetTimeslice):
            guard.set_timeslice(step.uuid, TimesliceAdvert(step.replicas, step.resource))
        elif isinstance(step, StopTimeslice):
            guard.set_timeslice(step.uuid, None)
        elif isinstance(step, StartMps | StopMps):
            if mps is None:
                return Outcome(step, "failed", "MPS is not configured on this agent")
            if isinstance(step, StartMps):
                mps.start(step)
            else:
                mps.stop(step)
    except BackendError as exc:
        log.warning("step failed: %s: %s", step, exc)
        return Outcome(step, "failed", str(exc), exc.code)
    return Outcome(step, "done")


def apply_steps(steps: Iterable[Step], runner: StepRunner) -> list[Outcome]:
    """Run steps in order; after a GPU's first unsuccessful step, skip the rest of that GPU."""
    outcomes = []
    stopped: set[int] = set()
    for step in steps:
        if step.gpu in stopped:
            continue
        outcome = runner(step)
        log.info("%s: %s%s", step, outcome.status, f" ({outcome.message})" if outcome.message
                 else "")
        outcomes.append(outcome)
        if not outcome.ok:
            stopped.add(step.gpu)
    return outcomes
