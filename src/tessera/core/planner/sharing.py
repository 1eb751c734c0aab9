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

from collections.abc import Sequence
from dataclasses import dataclass, replace

from tessera.core import catalogue
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


def _shares_for(gpu: Gpu, node: Node, resource: str) -> int:
    """How many shares of ``resource`` the policy makes of ``gpu`` (0: it makes none): the
    policy's count for plain shares, the card's memory over N GiB for ``gpu.shared-<N>gb``."""
    policy = node.policy
    if resource == MPS_SHARE_RESOURCE:
        return policy.share_count
    size = catalogue.share_size_gib(resource)
    if size is None or size not in policy.share_sizes_gib:
        return 0
    card = catalogue.find_card(gpu.model)
    return catalogue.shares_of(card.total_memory_mib, size) if card is not None else 0


class _Pass:
    """Free capacity as the pass goes: shares left per GPU (and their resource), whether a
    whole GPU is free, and the GPUs switched so far."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.now = snapshot.now
        self.nodes = list(snapshot.nodes)
        self.gpus = [list(node.gpus) for node in self.nodes]
        self.shares_free = [[g.shares - g.shares_in_use if g.mode == "mps" else 0 for g in row]
                            for row in self.gpus]
        self.resource = [[g.share_resource if g.mode == "mps" else "" for g in row]
                         for row in self.gpus]
        self.whole_free = [[g.mode == "none" and not g.in_use for g in row] for row in self.gpus]
        self.switched: dict[tuple[int, int], Gpu] = {}

    def _idle(self, n: int, i: int) -> bool:
        """Free to switch now: whole and free, or shared with every share free."""
        gpu = self.gpus[n][i]
        if (n, i) in self.switched or not _switchable(gpu, self.nodes[n], self.now):
            return False
        return self.whole_free[n][i] or (gpu.mode == "mps"
                                         and self.shares_free[n][i] == gpu.shares)

    def take_shares(self, fits: list[int], resource: str, units: int) -> bool:
        """``units`` shares of ``resource`` on one node: free ones (the fullest GPU first),
        then idle GPUs (whole, or shared another way with every share free) turned into
        shares of ``resource``; the node needing the fewest switches wins. A pod no node can
        hold takes nothing (the solvers will say why)."""
        best: tuple[int, int, list[tuple[int, int]]] | None = None
        for n in fits:
            free = sum(f for f, r in zip(self.shares_free[n], self.resource[n], strict=True)
                       if r == resource)
            switches: list[tuple[int, int]] = []
            for i in range(len(self.gpus[n])):
                if free >= units:
                    break
                if self.resource[n][i] != resource and self._idle(n, i):
                    count = _shares_for(self.gpus[n][i], self.nodes[n], resource)
                    if count:
                        switches.append((i, count))
                        free += count
            if free >= units and (best is None or len(switches) < best[0]):
                best = (len(switches), n, switches)
        if best is None:
            return False
        _, n, switches = best
        policy = self.nodes[n].policy
        for i, count in switches:
            assert policy.share is not None  # else no GPU of the node is switchable
            self.switched[(n, i)] = replace(
                self.gpus[n][i], mode="mps", shares=count, shares_in_use=0,
                sharing=policy.share, share_resource=resource, in_use=False)
            self.whole_free[n][i] = False
            self.shares_free[n][i] = count
            self.resource[n][i] = resource
        left = units
        while left:
            row = [i for i, free in enumerate(self.shares_free[n])
                   if free > 0 and self.resource[n][i] == resource]
            i = min(row, key=lambda i: (self.shares_free[n][i], i))
            taken = min(left, self.shares_free[n][i])
            self.shares_free[n][i] -= taken
            left -= taken
        return True

    def take_whole(self, fits: list[int], units: int) -> bool:
        """``units`` whole GPUs on one node: idle ones, then shared ones with every share free
        taken back; the node needing the fewest switches wins."""
        best: tuple[int, int, list[int]] | None = None
        for n in fits:
            back = [i for i in range(len(self.gpus[n]))
                    if not self.whole_free[n][i] and self._idle(n, i)]
            need = max(0, units - sum(self.whole_free[n]))
            if need > len(back):
                continue
            if best is None or need < best[0]:
                best = (need, n, back)
        if best is None:
            return False
        need, n, back = best
        for i in back[:need]:
            self.switched[(n, i)] = replace(self.gpus[n][i], mode="none", shares=0,
                                            shares_in_use=0, in_use=False)
            self.shares_free[n][i] = 0
            self.resource[n][i] = ""
            self.whole_free[n][i] = True
        left = units
        for i, free in enumerate(self.whole_free[n]):
            if free and left:
                self.whole_free[n][i] = False
                left -= 1
        return True


def reshape(snapshot: Snapshot, pods: Sequence[PendingPod]) -> Reshaped:
    """Switch whole GPUs to shares and back for ``pods`` (see the module's rule)."""
    if not any(node.policy.share is not None and node.policy.mode == "dynamic"
               for node in snapshot.nodes):
        return Reshaped(snapshot, ())  # no policy shares GPUs: nothing can switch
    state = _Pass(snapshot)
    ordered = sorted(pods, key=lambda p: (-p.priority, p.creation_time, p.namespace, p.name))
    # Capacity only shrinks during the pass: once ``units`` of a resource found no node, a
    # later pod asking as many finds none either (this keeps a pass over thousands of
    # waiting pods linear once the cluster is full).
    failed: dict[str, int] = {}
    for pod in ordered:
        wants = {r: n for r, n in pod.requests
                 if (r == WHOLE_GPU_RESOURCE or catalogue.is_gpu_share(r))
                 and n < failed.get(r, n + 1)}
        if not wants:
            continue
        fits = [n for n, node in enumerate(state.nodes) if rejection(pod, node) is None]
        for resource, units in sorted(wants.items()):
            taken = (state.take_whole(fits, units) if resource == WHOLE_GPU_RESOURCE
                     else state.take_shares(fits, resource, units))
            if not taken:
                failed[resource] = min(units, failed.get(resource, units))
    if not state.switched:
        return Reshaped(snapshot, ())
    targets = []
    for (n, i), gpu in sorted(state.switched.items()):
        state.gpus[n][i] = gpu
        targets.append(GpuTarget(node=state.nodes[n].name, index=gpu.index, model=gpu.model,
                                 slices=(), destroy=(), create=(), mode=gpu.mode,
                                 shares=gpu.shares, sharing=gpu.sharing,
                                 share_resource=gpu.share_resource))
    reshaped = tuple(replace(node, gpus=tuple(row))
                     for node, row in zip(state.nodes, state.gpus, strict=True))
    return Reshaped(replace(snapshot, nodes=reshaped), tuple(targets))
