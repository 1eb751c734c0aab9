"""The controller's part on DRA nodes: hand pods to the scheduler at once, and curate offers.

A DRA node (its agent runs ``--api dra`` and reports ``status.api: dra``) makes a slice when
the kubelet prepares the claim the scheduler allocated, so there is nothing to plan ahead and
no capacity lag to wait out: a gated pod that DRA can serve is released at once, with the DRA
node selector added so it cannot take a slice made on a device-plugin node for another pod.
Such pods are the scheduler's from then on; the planner leaves them alone.

What remains is steering: kube-scheduler takes the first device that fits on the node it
scores best, and its default scores spread pods over the least-loaded nodes, so left alone it
splits a fresh GPU for every small pod. The controller taints (``spec.dra.curated``, applied
by each agent) the placements of idle GPUs while a split GPU anywhere still has room for that
profile (:func:`tessera.core.dra.curate`). A DRA pod the scheduler found no device for
(Unschedulable) exempts its profiles, so a pod that only an idle GPU can serve (a node
selector excluding the split ones) is never kept out by curation.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from functools import cache
from typing import Any

from tessera.api.v1alpha1 import DraCuration, DraSpec, NodePartition
from tessera.controller.snapshot import node_labels, node_taints
from tessera.core import catalogue, dra
from tessera.core.catalogue import GpuModel
from tessera.core.layout import Slice
from tessera.core.planner import Node, PendingPod
from tessera.core.planner.filters import rejection

__all__ = [
    "admitted",
    "curation",
    "dra_nodes",
    "free_shares",
    "is_dra_pod",
    "models_of",
    "offered_resources",
    "servable",
    "serves_dra",
    "unservable_profiles",
]

RawObject = Mapping[str, object]


def serves_dra(partition: NodePartition) -> bool:
    """Whether the node's agent serves DRA (it says so in its NodePartition's status)."""
    return partition.status is not None and partition.status.api == "dra"


@cache
def _model(name: str) -> GpuModel | None:
    return catalogue.find_model(name)


def offered_resources(partitions: Iterable[NodePartition]) -> frozenset[str]:
    """Resource names some healthy DRA GPU serves: the MIG profiles of its model, or
    ``nvidia.com/gpu.shared`` for a GPU its agent offers as MPS shares."""
    names: set[str] = set()
    for partition in partitions:
        for gpu in partition.status.gpus if partition.status else []:
            if not gpu.healthy:
                continue
            model = _model(gpu.model) if gpu.model and gpu.mode == "mig" else None
            if model is not None:
                names.update(p.resource_name for p in model.profiles)
            elif gpu.mode == "mps" and gpu.mps is not None:
                names.add(catalogue.MPS_SHARED_RESOURCE)
    return frozenset(names)


def servable(requests: Mapping[str, int], offered: frozenset[str]) -> bool:
    """Every GPU resource the pod asks is one some DRA GPU serves (DeviceClasses map MIG
    profiles and MPS shares; whole GPUs and MIG-slice shares stay with the device plugins)."""
    return bool(requests) and all(resource in offered for resource in requests)


def unservable_profiles(requests: Mapping[str, int], offered: frozenset[str]) -> list[str]:
    """The MIG resources the pod asks that no DRA GPU offers (empty for other requests:
    those never were DRA's to serve)."""
    return sorted(r for r in requests
                  if r.startswith(catalogue.MIG_RESOURCE_PREFIX)
                  and not r.endswith(catalogue.SHARED_SUFFIX) and r not in offered)


def free_shares(partitions: Mapping[str, NodePartition],
                used: Mapping[str, int]) -> dict[str, int]:
    """MPS shares each DRA node has left: its healthy shared GPUs' shares less ``used`` (the
    ``nvidia.com/gpu.shared`` units of the pods bound there); nodes with none left omitted."""
    free: dict[str, int] = {}
    for name, partition in partitions.items():
        shares = sum(gpu.mps.shares for gpu in (partition.status.gpus if partition.status
                                                   else [])
                     if gpu.healthy and gpu.mode == "mps" and gpu.mps is not None)
        left = shares - used.get(name, 0)
        if left > 0:
            free[name] = left
    return free


def models_of(partitions: Iterable[NodePartition]) -> list[str]:
    """The GPU models of the DRA nodes, for messages."""
    return sorted({gpu.model for p in partitions for gpu in (p.status.gpus if p.status else [])
                   if gpu.model})


def dra_nodes(raw_nodes: Mapping[str, Mapping[str, Any]],
              partitions: Mapping[str, NodePartition]) -> list[tuple[Node, frozenset[str]]]:
    """The DRA nodes as the scheduler filters them (labels, taints), each with the resources
    its GPUs serve."""
    found = []
    for name, partition in sorted(partitions.items()):
        raw = raw_nodes.get(name)
        if raw is None:
            continue
        found.append((Node(name=name, labels=tuple(sorted(node_labels(raw).items())),
                           taints=node_taints(raw)), offered_resources([partition])))
    return found


def admitted(pod: PendingPod, selector: Mapping[str, str],
             nodes: Iterable[tuple[Node, frozenset[str]]]) -> bool:
    """Some DRA node would take the pod once ``selector`` is added to its node selector: its
    labels, affinity and tolerations allow it, and its GPUs serve every resource asked. A pod
    aimed at device-plugin nodes (a node selector no DRA node has) stays with the planner."""
    wanted = {r for r, _n in pod.requests}
    pinned = replace(pod, node_selector=(*pod.node_selector, *sorted(selector.items())))
    return any(wanted <= offered and rejection(pinned, node) is None for node, offered in nodes)


def is_dra_pod(raw: Mapping[str, object], selector: Mapping[str, str]) -> bool:
    """The pod was handed to DRA: it carries the (non-empty) DRA node selector."""
    spec = raw.get("spec")
    node_selector = spec.get("nodeSelector") if isinstance(spec, Mapping) else None
    return bool(selector) and isinstance(node_selector, Mapping) and all(
        node_selector.get(k) == v for k, v in selector.items())


@cache
def _use(model: GpuModel, used: frozenset[Slice], healthy: bool, node_load: int
         ) -> dra.GpuUse:
    return dra.GpuUse(model, used, healthy, node_load)


def curation(partitions: Mapping[str, NodePartition], exempt: frozenset[str]
             ) -> dict[str, DraSpec]:
    """The ``spec.dra`` each DRA node should carry: curation over all DRA GPUs at once."""
    gpus: list[dra.GpuUse] = []
    where: list[tuple[str, str]] = []
    for name in sorted(partitions):
        status = partitions[name].status
        found = []
        for gpu in status.gpus if status else []:
            model = _model(gpu.model) if gpu.model and gpu.mode == "mig" else None
            if model is not None:
                found.append((gpu.uuid, model, gpu.healthy,
                              frozenset(Slice(s.profile, s.start) for s in gpu.slices)))
        load = sum(model.profile(item.profile).compute_slices
                   for _u, model, _h, used in found for item in used)
        for uuid, model, healthy, used in found:
            gpus.append(_use(model, used, healthy, load))
            where.append((name, uuid))
    tainted: dict[str, dict[str, list[str]]] = {name: {} for name in partitions}
    for position, profile in sorted(dra.curate(gpus)):
        if profile in exempt:
            continue
        node, uuid = where[position]
        tainted[node].setdefault(uuid, []).append(profile)
    return {node: DraSpec(curated=[DraCuration(gpu=uuid, profiles=profiles)
                                   for uuid, profiles in sorted(per_gpu.items())])
            for node, per_gpu in tainted.items()}
