"""Whole GPUs turned into shares and back, as the waiting pods ask (dynamic sharing).

A GPU without MIG serves either one pod whole (``nvidia.com/gpu``) or several through shares
(``nvidia.com/gpu.shared``: MPS shares or time-slicing replicas). Under a dynamic policy that
allows sharing (:attr:`Policy.share`), this pass decides, before the solvers run, which idle
whole GPUs become ``share_count`` shares and which shared GPUs with every share free become
whole again, so that both solvers (fast and exact) plan on the same reshaped cluster.

The rule, in the planner's order (priority, then arrival), one node per pod as the solvers place
it: a pod asking for shares takes free shares on a node it may run on, or, failing that, turns
idle whole GPUs there into shares; a pod asking for whole GPUs takes idle whole ones, or,
failing that, takes back shared GPUs whose shares are all free; of the nodes that can hold the
pod, the one needing the fewest switches wins. A pod no node can hold switches nothing.
Switching never touches a GPU in use (a pod holds it or one of its shares) and obeys the
policy's minimum interval between changes, as a MIG repartition does. Nothing here places a pod:
the solvers do, on the result.
"""

from __future__ import annotations

import math
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

    def _convertible(self, n: int, to: str) -> list[int]:
        """GPUs of node ``n`` that may switch: idle whole ones (``to`` shares) or shared ones
        with every share free (``to`` whole)."""
        node = self.nodes[n]
        found = []
        for i, gpu in enumerate(self.gpus[n]):
            if (n, i) in self.switched or not _switchable(gpu, node, self.now):
                continue
            idle = self.whole_free[n][i] if to == "shares" else (
                gpu.mode == "mps" and self.shares_free[n][i] == gpu.shares)
            if idle:
                found.append(i)
        return found

    def take_shares(self, fits: list[int], units: int) -> None:
        """``units`` shares on one node: free ones (the fullest shared GPUs first), then idle
        whole GPUs turned into shares; the node needing the fewest switches wins. A pod no
        node can hold takes nothing (the solvers will say why)."""
        best: tuple[int, int] | None = None
        for n in fits:
            free = sum(self.shares_free[n])
            count = self.nodes[n].policy.share_count
            need = 0 if free >= units else math.ceil((units - free) / count) if count else -1
            if need < 0 or need > len(self._convertible(n, "shares")):
                continue
            if best is None or need < best[0]:
                best = (need, n)
        if best is None:
            return
        need, n = best
        policy = self.nodes[n].policy
        for i in self._convertible(n, "shares")[:need]:
            assert policy.share is not None
            self.switched[(n, i)] = replace(
                self.gpus[n][i], mode="mps", shares=policy.share_count, shares_in_use=0,
                sharing=policy.share, in_use=False)
            self.whole_free[n][i] = False
            self.shares_free[n][i] = policy.share_count
        left = units
        while left:
            row = [i for i, free in enumerate(self.shares_free[n]) if free > 0]
            i = min(row, key=lambda i: (self.shares_free[n][i], i))
            taken = min(left, self.shares_free[n][i])
            self.shares_free[n][i] -= taken
            left -= taken

    def take_whole(self, fits: list[int], units: int) -> None:
        """``units`` whole GPUs on one node: idle ones, then shared ones with every share free
        taken back; the node needing the fewest switches wins."""
        best: tuple[int, int] | None = None
        for n in fits:
            free = sum(self.whole_free[n])
            need = max(0, units - free)
            if need > len(self._convertible(n, "whole")):
                continue
            if best is None or need < best[0]:
                best = (need, n)
        if best is None:
            return
        need, n = best
        for i in self._convertible(n, "whole")[:need]:
            self.switched[(n, i)] = replace(self.gpus[n][i], mode="none", shares=0,
                                            shares_in_use=0, in_use=False)
            self.shares_free[n][i] = 0
            self.whole_free[n][i] = True
        left = units
        for i, free in enumerate(self.whole_free[n]):
            if free and left:
                self.whole_free[n][i] = False
                left -= 1


def reshape(snapshot: Snapshot, pods: Sequence[PendingPod]) -> Reshaped:
    """Switch whole GPUs to shares and back for ``pods`` (see the module's rule)."""
    state = _Pass(snapshot)
    ordered = sorted(pods, key=lambda p: (-p.priority, p.creation_time, p.namespace, p.name))
    for pod in ordered:
        wants = pod.request_map
        fits = [n for n, node in enumerate(state.nodes) if rejection(pod, node) is None]
        if wants.get(MPS_SHARE_RESOURCE, 0):
            state.take_shares(fits, wants[MPS_SHARE_RESOURCE])
        if wants.get(WHOLE_GPU_RESOURCE, 0):
            state.take_whole(fits, wants[WHOLE_GPU_RESOURCE])
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
