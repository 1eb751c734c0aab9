"""Whole GPUs turned into shares and back, as the waiting pods ask (dynamic sharing).

A GPU without MIG serves either one pod whole (``nvidia.com/gpu``) or several through shares
(``nvidia.com/gpu.shared``: MPS shares or time-slicing replicas). Under a dynamic policy that
allows sharing (:attr:`Policy.share`), this pass decides, before the solvers run, which idle
whole GPUs become ``share_count`` shares and which shared GPUs with every share free become
whole again, so that both solvers (fast and exact) plan on the same reshaped cluster.

The rule, in the planner's order (priority, then arrival): a pod asking for shares takes free
shares on a node it may run on, or, failing that, turns one idle whole GPU there into shares;
a pod asking for whole GPUs takes idle whole ones, or, failing that, takes back shared GPUs
whose shares are all free. Switching never touches a GPU in use (a pod holds it or one of its
shares) and obeys the policy's minimum interval between changes, as a MIG repartition does.
Nothing here places a pod: the solvers do, on the result.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from tessera.core.planner.filters import rejection
from tessera.core.planner.model import (
    MPS_SHARE_RESOURCE,
    WHOLE_GPU_RESOURCE,
    Gpu,
    GpuTarget,
    Node,
    PendingPod,
    Snapshot,
)
from tessera.core.planner.problem import _frozen_reason

__all__ = ["Reshaped", "reshape"]


@dataclass(frozen=True)
class Reshaped:
    """The cluster as the solvers should see it, and the GPUs whose mode it switched."""

    snapshot: Snapshot
    switches: tuple[GpuTarget, ...]


def _switchable(gpu: Gpu, node: Node, now: float | None) -> bool:
    policy = node.policy
    if policy.mode != "dynamic" or policy.share is None or policy.share_count < 1:
        return False
    if gpu.mode == "mig" or gpu.model == "" or _frozen_reason(gpu, node, now) is not None:
        return False
    if gpu.mode == "none":
        return not gpu.in_use
    return gpu.shares_in_use == 0


class _Pass:
    """Free capacity as the pass goes: shares left per GPU, whether a whole GPU is free, and
    the GPUs switched so far."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.now = snapshot.now
        self.nodes = list(snapshot.nodes)
        self.gpus = [list(node.gpus) for node in self.nodes]
        self.shares_free = [[g.shares - g.shares_in_use if g.mode == "mps" else 0 for g in row]
                            for row in self.gpus]
        self.whole_free = [[g.mode == "none" and not g.in_use for g in row] for row in self.gpus]
        self.switched: dict[tuple[int, int], Gpu] = {}

    def take_share(self, fits: list[int]) -> None:
        for n in fits:  # free shares first, the fullest GPU first: shared GPUs fill up
            row = [i for i, free in enumerate(self.shares_free[n]) if free > 0]
            if row:
                best = min(row, key=lambda i: (self.shares_free[n][i], i))
                self.shares_free[n][best] -= 1
                return
        for n in fits:
            policy = self.nodes[n].policy
            for i, gpu in enumerate(self.gpus[n]):
                if (self.whole_free[n][i] and (n, i) not in self.switched
                        and _switchable(gpu, self.nodes[n], self.now)):
                    assert policy.share is not None
                    self.switched[(n, i)] = replace(
                        gpu, mode="mps", shares=policy.share_count, shares_in_use=0,
                        sharing=policy.share, in_use=False)
                    self.whole_free[n][i] = False
                    self.shares_free[n][i] = policy.share_count - 1
                    return

    def take_whole(self, fits: list[int]) -> None:
        for n in fits:
            for i, free in enumerate(self.whole_free[n]):
                if free:
                    self.whole_free[n][i] = False
                    return
        for n in fits:
            for i, gpu in enumerate(self.gpus[n]):
                if (gpu.mode == "mps" and (n, i) not in self.switched
                        and self.shares_free[n][i] == gpu.shares
                        and _switchable(gpu, self.nodes[n], self.now)):
                    self.switched[(n, i)] = replace(gpu, mode="none",
                                                    shares=0, shares_in_use=0, in_use=False)
                    self.shares_free[n][i] = 0
                    return


def reshape(snapshot: Snapshot, pods: Sequence[PendingPod]) -> Reshaped:
    """Switch whole GPUs to shares and back for ``pods`` (see the module's rule)."""
    state = _Pass(snapshot)
    ordered = sorted(pods, key=lambda p: (-p.priority, p.creation_time, p.namespace, p.name))
    for pod in ordered:
        wants = pod.request_map
        fits = [n for n, node in enumerate(state.nodes) if rejection(pod, node) is None]
        for _ in range(wants.get(MPS_SHARE_RESOURCE, 0)):
            state.take_share(fits)
        for _ in range(wants.get(WHOLE_GPU_RESOURCE, 0)):
            state.take_whole(fits)
    if not state.switched:
        return Reshaped(snapshot, ())
    targets = []
    for (n, i), gpu in sorted(state.switched.items()):
        state.gpus[n][i] = gpu
        targets.append(GpuTarget(node=state.nodes[n].name, index=gpu.index, model=gpu.model,
                                 slices=(), destroy=(), create=(), mode=gpu.mode,
                                 shares=gpu.shares, sharing=gpu.sharing))
    reshaped = tuple(replace(node, gpus=tuple(row))
                     for node, row in zip(state.nodes, state.gpus, strict=True))
    return Reshaped(replace(snapshot, nodes=reshaped), tuple(targets))
