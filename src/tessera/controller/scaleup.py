"""Scale-up: turn the pods a plan could not place into capacity the cluster's autoscaler adds.

Autoscalers act only on pods the scheduler marked Unschedulable, skip pods that carry
scheduling gates, and read an instance type's or node group's capacity as ``nvidia.com/gpu``.
So for each PartitionPolicy with ``spec.scaleUp.enabled`` the controller packs its unplaced
pods into whole GPUs (:func:`tessera.core.scaleup.size`) and asks for them as **placeholder
pods**: ungated, asking ``nvidia.com/gpu``, carrying the policy's node labels and the waiting
pods' node selectors, affinities and tolerations, at a priority below every workload (any real
pod preempts them), labelled ``tessera.dev/placeholder`` so a restarted controller finds
them, and naming a scheduler that does not exist (:data:`PLACEHOLDER_SCHEDULER`): nothing
binds them, the controller marks them Unschedulable. Karpenter and Cluster Autoscaler both
provision for such pods. Where the API server serves ``autoscaling.x-k8s.io/v1``
ProvisioningRequests (Cluster Autoscaler, GKE), the same ask is a **ProvisioningRequest** of
class ``best-effort-atomic-scale-up.autoscaling.x-k8s.io`` whose PodTemplate is the
placeholder's spec: nothing then even looks like a pod to schedule.

The hand-over: a placeholder is deleted as soon as a node created after it exists that would
take it (the autoscaler's answer), before the node is Ready, so none ever holds a GPU (no
scheduler would bind it anyway); the node then counts as capacity on its way
(:class:`~tessera.core.scaleup.Arriving`) until its agent reports and the planner places the
waiting pods there. A placeholder older than the TTL, or bound to a node anyway, is deleted
too; asks the demand no longer needs are withdrawn. Everything here is derived from the cluster
(placeholders by label, nodes, reports) each tick: nothing is remembered that a new leader
would lack.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tessera.api.v1alpha1 import NodePartition, PartitionPolicy
from tessera.controller import demand
from tessera.controller.policies import policy_for
from tessera.controller.snapshot import node_allocatable, node_labels, node_taints
from tessera.core import catalogue, scaleup
from tessera.core.errors import TesseraError
from tessera.core.planner import Node, PendingPod
from tessera.core.planner.filters import rejection

__all__ = [
    "ASK_ANNOTATION",
    "GPU_COUNT_LABEL",
    "GPU_PRODUCT_LABEL",
    "Placeholder",
    "Round",
    "arriving",
    "cache_key",
    "hand_overs",
    "kind_for",
    "placeholder_body",
    "plan_round",
    "targets",
]

ASK_ANNOTATION = "tessera.dev/scale-up"
"""On a placeholder: what it asks and for whom (JSON: policy, model, gpus, pods)."""
SHAPE_LABEL = "tessera.dev/scale-up-shape"
"""On a placeholder: a digest of what it asks (GPUs, model, constraints)."""
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
"""GPU feature discovery's label, which node pools and node group templates often declare."""
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
POD = "Pod"
PROVISIONING_REQUEST = "ProvisioningRequest"
PLACEHOLDER_SCHEDULER = "tessera-placeholder"
"""The scheduler a placeholder pod names, which does not exist: no scheduler ever binds it,
so it can never hold a GPU; the controller marks it Unschedulable itself (what autoscalers
act on), as a scheduler that found no node would. Karpenter and Cluster Autoscaler take
pods of any scheduler name (Karpenter's IsProvisionable; Cluster Autoscaler unless
``--allowed-scheduler-names`` says otherwise), and judge them against existing nodes and
node templates by their own simulation."""
MARK_AFTER_S = 30.0
"""A placeholder pod still not marked Unschedulable this long after creation (the controller
stopped between its two writes) is deleted and asked again."""
PROVREQ_GROUP, PROVREQ_VERSION, PROVREQ_PLURAL = (
    "autoscaling.x-k8s.io", "v1", "provisioningrequests")
PROVREQ_CLASS = "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
"""Cluster Autoscaler's class that scales node groups up for the request (all or nothing per
try, retried with backoff) and sets Provisioned or Failed (its apis module, v1 types.go)."""
TRANSIENT_TAINTS = frozenset({
    "node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable",
    "node.cloudprovider.kubernetes.io/uninitialized", "karpenter.sh/unregistered",
})
"""Taints a new node carries only while it starts: they do not say who it is for."""


@dataclass(frozen=True)
class Placeholder:
    """A placeholder pod or ProvisioningRequest, read back from the cluster."""

    kind: str
    key: str
    policy: str
    shape: str
    gpus: int
    model: str
    pods: tuple[str, ...]
    created: float
    node: str | None
    scheduling: Mapping[str, Any]
    """The spec fields that say where it may run (nodeSelector, affinity, tolerations)."""
    failed: str | None = None
    """A ProvisioningRequest the autoscaler gave up on: its Failed condition's message."""
    marked: bool = True
    """A placeholder pod carries its PodScheduled=False/Unschedulable condition."""

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> Placeholder | None:
        meta = raw.get("metadata", {})
        labels = meta.get("labels") or {}
        if demand.PLACEHOLDER_LABEL not in labels:
            return None
        kind = PROVISIONING_REQUEST if raw.get("kind") == PROVISIONING_REQUEST else POD
        try:
            ask = json.loads((meta.get("annotations") or {}).get(ASK_ANNOTATION, "{}"))
            gpus, model, policy = int(ask["gpus"]), str(ask["model"]), str(ask["policy"])
            pods = tuple(str(p) for p in ask.get("pods") or ())
            scheduling = dict(ask.get("scheduling") or {})
        except (ValueError, KeyError, TypeError, AttributeError):
            gpus, model, policy, pods, scheduling = 0, "", "", (), {}  # not ours: withdrawn
        failed = None
        marked = True
        if kind == POD:
            scheduling = raw.get("spec") or {}
            marked = any(c.get("type") == "PodScheduled" and c.get("status") == "False"
                         for c in (raw.get("status") or {}).get("conditions") or [])
        else:
            for condition in (raw.get("status") or {}).get("conditions") or []:
                if condition.get("type") == "Failed" and condition.get("status") == "True":
                    failed = condition.get("message") or condition.get("reason") or "failed"
        return cls(kind=kind, key=demand.pod_key(raw), policy=policy,
                   shape=labels.get(SHAPE_LABEL, ""), gpus=gpus, model=model, pods=pods,
                   created=demand.created_at(raw) or 0.0,
                   node=(raw.get("spec") or {}).get("nodeName") or None if kind == POD else None,
                   scheduling=scheduling, failed=failed, marked=marked)

    def pending(self) -> PendingPod:
        """Where it may run, as the planner's filters read a pod."""
        return demand.pending_pod({"metadata": {"name": self.key}, "spec": self.scheduling})


def cache_key(kind: str, key: str) -> str:
    """How the controller's cache names a placeholder: a pod by ``namespace/name`` as every
    pod, a ProvisioningRequest with its kind in front (it may share a pod's name)."""
    return key if kind == POD else f"{kind}:{key}"


def _shape(policy: str, ask: scaleup.Ask, kind: str) -> str:
    text = json.dumps([policy, kind, ask.gpus, ask.model, repr(ask.constraints)])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def kind_for(policy: PartitionPolicy, provisioning_requests: bool) -> str | None:
    """How the policy asks: ``spec.scaleUp.method``, auto meaning a ProvisioningRequest where
    the API server serves them; None if it names one that is not served."""
    spec = policy.spec.scale_up
    method = spec.method if spec is not None else "auto"
    if method == "placeholders" or (method == "auto" and not provisioning_requests):
        return POD
    return PROVISIONING_REQUEST if provisioning_requests else None


def targets(policies: Iterable[PartitionPolicy], provisioning_requests: bool = False
            ) -> tuple[dict[str, scaleup.Target], dict[str, str]]:
    """Each scale-up policy's target, and the problems of those that cannot be one."""
    found: dict[str, scaleup.Target] = {}
    problems: dict[str, str] = {}
    for policy in policies:
        spec = policy.spec.scale_up
        if spec is None or not spec.enabled:
            continue
        if kind_for(policy, provisioning_requests) is None:
            problems[policy.metadata.name] = (
                "spec.scaleUp.method: provisioningRequest, but the API server does not serve "
                f"{PROVREQ_GROUP}/{PROVREQ_VERSION} ProvisioningRequests (install Cluster "
                "Autoscaler with --enable-provisioning-requests, or use placeholders)")
            continue
        try:
            names = tuple(catalogue.model(m, field_name=f"spec.scaleUp.models[{i}]").name
                          for i, m in enumerate(spec.models))
        except TesseraError as exc:
            problems[policy.metadata.name] = str(exc)
            continue
        if not names:
            problems[policy.metadata.name] = ("spec.scaleUp.models: name the GPU models the "
                                              "pool's new nodes carry")
            continue
        shares = (policy.spec.mps.shares if policy.spec.mps is not None
                  else policy.spec.timeslice.replicas if policy.spec.timeslice is not None
                  else 1)
        found[policy.metadata.name] = scaleup.Target(
            models=names, labels=tuple(sorted(policy.spec.node_selector.match_labels.items())),
            shares_per_gpu=max(1, shares), max_gpus=spec.max_gpus)
    return found, problems


def _gpus_of(node: Mapping[str, Any], labels: Mapping[str, str], default: int) -> int:
    """A new node's GPUs: its nvidia.com/gpu allocatable, else its GPU count label, else
    what the policy says its nodes have."""
    allocatable = node_allocatable(node, catalogue.WHOLE_GPU_RESOURCE)
    if allocatable > 0:
        return allocatable
    label = labels.get(GPU_COUNT_LABEL, "")
    return int(label) if label.isdigit() and int(label) > 0 else default


def _model_of(labels: Mapping[str, str]) -> str | None:
    product = labels.get(GPU_PRODUCT_LABEL)
    found = catalogue.model_from_product_label(product) if product else None
    return found.name if found else None


def arriving(nodes: Mapping[str, Mapping[str, Any]], partitions: Mapping[str, NodePartition],
             policies: Sequence[PartitionPolicy], policy: PartitionPolicy, *, now: float,
             planned: frozenset[str]) -> list[scaleup.Arriving]:
    """The policy's nodes that registered within its arrival timeout and that no plan has
    tried yet (their agent has not reported GPUs, or it did after the last plan): capacity on
    its way, counted before anything more is asked."""
    spec = policy.spec.scale_up
    assert spec is not None
    found: list[scaleup.Arriving] = []
    for name, node in sorted(nodes.items()):
        labels = node_labels(node)
        if policy_for(labels, policies) is not policy:
            continue
        partition = partitions.get(name)
        reported = (partition is not None and partition.status is not None
                    and bool(partition.status.gpus))
        if reported and name in planned:
            continue
        created = demand.created_at(node)
        if created is None or now - created > spec.arrival_timeout_seconds:
            continue
        probe = _probe(name, node)
        found.append(scaleup.Arriving(
            name=name, gpus=_gpus_of(node, labels, spec.gpus_per_node),
            model=_model_of(labels), labels=probe.labels, taints=probe.taints))
    return found


def _probe(name: str, node: Mapping[str, Any]) -> Node:
    """The node as the scheduler's filters will see it once it has started."""
    taints = tuple(t for t in node_taints(node) if t.key not in TRANSIENT_TAINTS)
    return Node(name=name, labels=tuple(node_labels(node).items()), taints=taints)


def hand_overs(placeholders: Sequence[Placeholder], nodes: Mapping[str, Mapping[str, Any]],
               gpus_per_node: Mapping[str, int]) -> dict[str, str]:
    """Placeholders the autoscaler has answered, by key, with the node: a node created since
    the placeholder that would take it, each node taking as many placeholders as its GPUs
    hold (``gpus_per_node`` per policy, for a node that does not show its GPUs yet), oldest
    placeholders first."""
    room: dict[str, int] = {}
    answered: dict[str, str] = {}
    for placeholder in sorted(placeholders, key=lambda p: (p.created, p.key)):
        pod = placeholder.pending()
        for name, node in sorted(nodes.items()):
            created = demand.created_at(node)
            if created is None or created < placeholder.created:
                continue
            if name not in room:
                room[name] = _gpus_of(node, node_labels(node),
                                      gpus_per_node.get(placeholder.policy, 1))
            if room[name] < placeholder.gpus or rejection(pod, _probe(name, node)) is not None:
                continue
            room[name] -= placeholder.gpus
            answered[placeholder.key] = name
            break
    return answered


@dataclass
class Round:
    """What one scale-up round decided: placeholders to create and delete, what to tell."""

    create: list[tuple[str, str, scaleup.Ask]] = field(default_factory=list)
    """(policy, kind, ask) for asks with no placeholder yet."""
    delete: list[tuple[Placeholder, str]] = field(default_factory=list)
    """Placeholders to delete, with why."""
    asked: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Per pod: (Event reason, message)."""
    requested_gpus: int = 0
    """GPUs the placeholders that stay and the new ones ask for."""


def plan_round(unplaced: Sequence[PendingPod], placeholders: Sequence[Placeholder], *,
               nodes: Mapping[str, Mapping[str, Any]],
               partitions: Mapping[str, NodePartition], policies: Sequence[PartitionPolicy],
               now: float, ttl_s: float, planned: frozenset[str] = frozenset(),
               provisioning_requests: bool = False,
               since: Mapping[str, float] | None = None) -> Round:
    """One round: hand-overs and expiries first, then the asks the unplaced pods need beyond
    the nodes on their way, matched against the placeholders that stay (module docstring).
    ``since``: when each pod was first found unplaced; a pod is asked for only after its
    policy's ``delaySeconds`` (None: at once)."""
    found = Round()
    wanted, _ = targets(policies, provisioning_requests)
    by_name = {p.metadata.name: p for p in policies}
    kinds = {name: kind_for(by_name[name], provisioning_requests) or POD for name in wanted}
    staying: list[Placeholder] = []
    answered = hand_overs(
        [p for p in placeholders if not p.node and p.policy in wanted], nodes,
        {name: p.spec.scale_up.gpus_per_node for name, p in by_name.items()
         if p.spec.scale_up is not None})
    for placeholder in placeholders:
        if placeholder.node:
            found.delete.append((placeholder, f"bound to {placeholder.node}"))
        elif placeholder.policy not in wanted:
            found.delete.append((placeholder, "its policy no longer asks for scale-up"))
        elif now - placeholder.created > ttl_s:
            found.delete.append((placeholder, f"no node came within {ttl_s:.0f} s"))
        elif not placeholder.marked and now - placeholder.created > MARK_AFTER_S:
            found.delete.append((placeholder, "never marked Unschedulable: asked again"))
        elif placeholder.key in answered:
            found.delete.append((placeholder,
                                 f"node {answered[placeholder.key]} registered for it"))
        else:
            staying.append(placeholder)
    pools: dict[str, list[PendingPod]] = {}
    for pod in unplaced:
        chosen = _policy_for_pod(pod, policies, wanted)
        if chosen is None:
            continue
        spec = by_name[chosen].spec.scale_up
        first = (since or {}).get(pod.key, now) if since is not None else None
        if first is not None and spec is not None and now - first < spec.delay_seconds:
            continue  # a plan in flight may yet make room: not worth a node yet
        pools.setdefault(chosen, []).append(pod)
    for name, target in sorted(wanted.items()):
        sizing = scaleup.size(pools.get(name, []), target,
                              arriving(nodes, partitions, policies, by_name[name], now=now,
                                       planned=planned))
        free = [p for p in staying if p.policy == name]
        for ask in sizing.asks:
            shape = _shape(name, ask, kinds[name])
            match = next((p for p in free if p.shape == shape), None)
            if match is not None and match.failed:
                free.remove(match)
                for key in ask.pods:
                    found.asked[key] = ("ScaleUpFailed", (
                        f"the cluster autoscaler could not provision {ask.gpus} whole "
                        f"{ask.model} GPU(s) for this pod: {match.failed}; asked again once "
                        f"{match.key} is {ttl_s:.0f} s old"))
                continue
            if match is not None:
                free.remove(match)
                found.requested_gpus += match.gpus
            else:
                found.create.append((name, kinds[name], ask))
                found.requested_gpus += ask.gpus
            through = ("a ProvisioningRequest" if kinds[name] == PROVISIONING_REQUEST
                       else "a placeholder pod")
            for key in ask.pods:
                found.asked[key] = ("ScaleUpRequested", (
                    f"no node has room: asked the cluster autoscaler for {ask.gpus} whole "
                    f"{ask.model} GPU(s) (nvidia.com/gpu) for this pod"
                    f"{' and others like it' if len(ask.pods) > 1 else ''}, through "
                    f"{through} (policy {name})"))
        for placeholder in free:
            found.delete.append((placeholder, "the waiting pods no longer need it"))
        for key, node in sizing.covered.items():
            found.asked[key] = ("ScaleUpArriving", f"node {node} is joining the cluster for "
                                "it; placed once its agent reports its GPUs")
        for key, reason in sizing.impossible.items():
            found.asked[key] = ("NoScaleUp", f"no new node of policy {name} could hold this "
                                f"pod: {reason}")
        for key in sizing.capped:
            found.asked[key] = ("ScaleUpLimited", f"policy {name} asks at most "
                                f"{target.max_gpus} GPUs at once (spec.scaleUp.maxGpus); "
                                "this pod is asked for once those arrive")
    return found


def _policy_for_pod(pod: PendingPod, policies: Sequence[PartitionPolicy],
                    wanted: Mapping[str, scaleup.Target]) -> str | None:
    """The scale-up policy whose new nodes could take ``pod``: the highest priority one whose
    labels its constraints do not contradict."""
    for policy in sorted(policies, key=lambda p: (-p.spec.priority, p.metadata.name)):
        target = wanted.get(policy.metadata.name)
        if target is not None and scaleup.contradiction(pod, dict(target.labels)) is None:
            return policy.metadata.name
    return None


def placeholder_body(policy: PartitionPolicy, ask: scaleup.Ask, *, namespace: str,
                     priority_class: str, image: str, kind: str = POD) -> dict[str, Any]:
    """The placeholder for ``ask`` (module docstring): a pod, or for ``kind``
    ProvisioningRequest the request with its PodTemplate under ``podTemplate`` (the writer
    creates both)."""
    name = policy.metadata.name
    constraints = ask.constraints
    selector = {**dict(policy.spec.node_selector.match_labels),
                **dict(constraints.node_selector)}
    policy_terms = [{"key": r.key, "operator": r.operator, "values": list(r.values)}
                    for r in policy.spec.node_selector.match_expressions]
    terms = [[{"key": e.key, "operator": e.operator, "values": list(e.values)} for e in term]
             for term in constraints.affinity_terms] or [[]]
    spec: dict[str, Any] = {
        "containers": [{
            "name": "placeholder", "image": image,
            "resources": {"requests": {catalogue.WHOLE_GPU_RESOURCE: str(ask.gpus)},
                          "limits": {catalogue.WHOLE_GPU_RESOURCE: str(ask.gpus)}},
        }],
        "schedulerName": PLACEHOLDER_SCHEDULER,
        "terminationGracePeriodSeconds": 0,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "nodeSelector": selector,
        "tolerations": [
            {k: v for k, v in (("key", t.key), ("operator", t.operator), ("value", t.value),
                               ("effect", t.effect)) if v}
            for t in constraints.tolerations],
    }
    if policy_terms or constraints.affinity_terms:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [*term, *policy_terms]}
                                  for term in terms]}}}
    if priority_class:
        spec["priorityClassName"] = priority_class
    for toleration in spec["tolerations"]:
        if toleration.get("operator") == "Exists":
            toleration.pop("value", None)
    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    scheduling = {k: spec[k] for k in ("nodeSelector", "affinity", "tolerations") if k in spec}
    meta = {
        "namespace": namespace,
        "labels": {demand.PLACEHOLDER_LABEL: name if len(name) <= 63 else digest,
                   SHAPE_LABEL: _shape(name, ask, kind),
                   "app.kubernetes.io/managed-by": "tessera"},
        "annotations": {ASK_ANNOTATION: json.dumps({
            "policy": name, "model": ask.model, "gpus": ask.gpus,
            "pods": list(ask.pods[:50]),
            **({"scheduling": scheduling} if kind == PROVISIONING_REQUEST else {})},
            separators=(",", ":"))},
    }
    if kind == POD:
        return {"apiVersion": "v1", "kind": POD,
                "metadata": {"generateName": "tessera-scaleup-", **meta}, "spec": spec}
    return {
        "apiVersion": f"{PROVREQ_GROUP}/{PROVREQ_VERSION}", "kind": PROVISIONING_REQUEST,
        "metadata": meta,
        "spec": {"provisioningClassName": PROVREQ_CLASS,
                 "podSets": [{"podTemplateRef": {"name": ""}, "count": 1}]},
        "podTemplate": {"apiVersion": "v1", "kind": "PodTemplate",
                        "metadata": {"namespace": namespace, "labels": meta["labels"]},
                        "template": {"spec": spec}},
    }
