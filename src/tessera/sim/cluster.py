"""The simulated cluster: nodes of MIG GPUs, from a shorthand or a ``tessera plan`` file.

The simulator keeps only what the event loop needs (nodes, GPU models, starting layouts);
labels, taints and CPU are the planner's business and are not simulated.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from tessera.core.catalogue import GpuModel
from tessera.core.errors import InvalidInputError
from tessera.core.layout import Slice
from tessera.core.planner import parse_cluster
from tessera.sim.workload import resolve_model

__all__ = ["SHORTHAND", "ClusterSpec", "GpuSpec", "NodeSpec", "load_cluster", "shorthand"]

SHORTHAND = re.compile(r"^(\d+)x(\d+)x(.+)$")


@dataclass(frozen=True)
class GpuSpec:
    model: GpuModel
    slices: tuple[Slice, ...] = ()
    """The layout at time zero (all free); policies may replace it."""


@dataclass(frozen=True)
class NodeSpec:
    name: str
    gpus: tuple[GpuSpec, ...]


@dataclass(frozen=True)
class ClusterSpec:
    nodes: tuple[NodeSpec, ...]

    @property
    def gpus(self) -> tuple[GpuSpec, ...]:
        return tuple(g for n in self.nodes for g in n.gpus)

    @property
    def capacity(self) -> int:
        """Compute slices in total: the denominator of load and utilisation."""
        return sum(g.model.compute_slices for g in self.gpus)

    @property
    def main_model(self) -> GpuModel:
        """The most common model; trace requests are mapped to its profiles."""
        counts = Counter(g.model.name for g in self.gpus)
        name = min(counts, key=lambda n: (-counts[n], n))
        return next(g.model for g in self.gpus if g.model.name == name)

    def describe(self) -> str:
        counts = Counter(g.model.name for g in self.gpus)
        models = ", ".join(f"{n} x {m}" for m, n in sorted(counts.items()))
        return f"{len(self.nodes)} nodes, {len(self.gpus)} GPUs ({models})"


def shorthand(nodes: int, gpus_per_node: int, model: str) -> ClusterSpec:
    resolved = resolve_model(model, "--cluster")
    if resolved.compute_slices < 2:
        raise InvalidInputError("--cluster", f"{resolved.name} has no MIG profiles")
    return ClusterSpec(tuple(
        NodeSpec(f"node-{n:03d}", tuple(GpuSpec(resolved) for _ in range(gpus_per_node)))
        for n in range(nodes)))


def load_cluster(text: str) -> ClusterSpec:
    """``NODESxGPUSxMODEL`` (e.g. ``16x8xA100-SXM4-80GB``) or a CLUSTER.json path.

    From a file, each MIG GPU starts with its listed slices, all free (``in_use`` is ignored:
    the simulated workload is the only one); GPUs in mode ``none`` or ``mps`` are refused,
    because the simulator models MIG only.
    """
    match = SHORTHAND.match(text)
    if match and not Path(text).exists():
        count, per_node = int(match.group(1)), int(match.group(2))
        if count < 1 or per_node < 1:
            raise InvalidInputError("--cluster", "needs at least one node and one GPU")
        return shorthand(count, per_node, match.group(3))
    path = Path(text)
    try:
        raw = json.loads(path.read_text())
    except OSError as exc:
        raise InvalidInputError(
            "--cluster", f"{text!r} is neither NODESxGPUSxMODEL nor a readable file "
            f"({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise InvalidInputError("--cluster", f"{path} is not JSON: {exc.msg}") from None
    snapshot = parse_cluster(raw)
    nodes = []
    for i, node in enumerate(snapshot.nodes):
        gpus = []
        for j, gpu in enumerate(node.gpus):
            if gpu.mode != "mig":
                raise InvalidInputError(f"nodes[{i}].gpus[{j}].mode",
                                        "the simulator models MIG GPUs only", ("mig",))
            gpus.append(GpuSpec(resolve_model(gpu.model),
                                tuple(s.slice for s in sorted(gpu.slices, key=lambda s: s.start))))
        nodes.append(NodeSpec(node.name, tuple(gpus)))
    if not any(n.gpus for n in nodes):
        raise InvalidInputError("--cluster", f"{path} has no GPUs")
    return ClusterSpec(tuple(nodes))
