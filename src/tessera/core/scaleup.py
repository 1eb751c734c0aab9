"""How much new GPU capacity the pods a plan could not place need, in whole GPUs: the form a
cluster autoscaler reads.

Autoscalers (Karpenter, Cluster Autoscaler, GKE's node auto-provisioning) decide from an
instance type's or node group's declared capacity, which names ``nvidia.com/gpu``, never a MIG
slice. So the waiting demand is packed into whole GPUs of the models a scale-up policy names,
the way the planner would fill a new node's empty cards, and asked for as whole GPUs:

- a pod whose slices fit on one GPU shares that GPU with other such pods (first fit in the
  order the pods wait: priority, then age), so eight ``1g.10gb`` pods ask one A100, not eight;
- a pod that needs several GPUs (``nvidia.com/gpu: 2``, three ``7g.80gb``) gets an ask of its
  own for all of them, since they must be on one node;
- pods a new node of the pool could never hold (a profile no named model has, a node selector
  the pool's labels contradict) ask nothing, and :attr:`Sizing.impossible` says why.

Nodes that have registered but whose agent has not reported yet (:class:`Arriving`) are
counted first: the pods they will hold ask nothing more, so a node that is still booting never
makes the autoscaler add a second one. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache, lru_cache

from tessera.core import catalogue, layout
from tessera.core.errors import TesseraError
from tessera.core.planner import MatchExpression, Node, PendingPod, Taint, Toleration
from tessera.core.planner.filters import rejection

__all__ = [
    "Arriving",
    "Ask",
    "Constraints",
    "Sizing",
    "Target",
    "contradiction",
    "size",
]


@dataclass(frozen=True)
class Target:
    """What a scale-up policy may add: GPUs of ``models`` (catalogue names, preferred first)
    on nodes carrying ``labels`` (the policy's node selector, which new nodes must match to be
    governed by it)."""

    models: tuple[str, ...]
    labels: tuple[tuple[str, str], ...] = ()
    shares_per_gpu: int = 1
    """How many ``nvidia.com/gpu.shared`` units a whole GPU gives (the policy's MPS shares or
    time-slicing replicas)."""
    max_gpus: int = 64
    """The most GPUs asked for at once (asks beyond it wait for the next round)."""


@dataclass(frozen=True)
class Constraints:
    """Where a pod may run, as its placeholder must say it: node selector, required node
    affinity and tolerations. Pods with equal constraints share placeholders."""

    node_selector: tuple[tuple[str, str], ...] = ()
    affinity_terms: tuple[tuple[MatchExpression, ...], ...] = ()
    tolerations: tuple[Toleration, ...] = ()

    @classmethod
    def of(cls, pod: PendingPod) -> Constraints:
        return cls(pod.node_selector, pod.affinity_terms, pod.tolerations)


@dataclass(frozen=True)
class Ask:
    """Whole GPUs of ``model`` on one node, for ``pods``: one placeholder pod (or one
    ProvisioningRequest pod set) asking ``nvidia.com/gpu: gpus``."""

    gpus: int
    model: str
    constraints: Constraints
    pods: tuple[str, ...]

    @property
    def shape(self) -> tuple[int, str, Constraints]:
        """What makes two asks interchangeable: an existing placeholder of the same shape
        stands for a new ask whatever pods it was first made for."""
        return (self.gpus, self.model, self.constraints)


@dataclass(frozen=True)
class Arriving:
    """A node of the pool that exists but has not reported its GPUs yet: capacity on its way.
    ``model`` None: the target's first model is assumed."""

    name: str
    gpus: int
    model: str | None = None
    labels: tuple[tuple[str, str], ...] = ()
    taints: tuple[Taint, ...] = ()


@dataclass(frozen=True)
class Sizing:
    asks: tuple[Ask, ...] = ()
    covered: Mapping[str, str] = field(default_factory=dict)
    """Pods an arriving node will hold, with that node's name."""
    impossible: Mapping[str, str] = field(default_factory=dict)
    """Pods no new node of the pool could hold, with the reason."""
    capped: tuple[str, ...] = ()
    """Pods left for a later round: asking for them would pass ``max_gpus``."""

    @property
    def gpus(self) -> int:
        return sum(a.gpus for a in self.asks)


class _Bin:
    """One whole GPU being filled: MIG slices by profile, or shares, or one whole-GPU pod."""

    def __init__(self, model: catalogue.GpuModel) -> None:
        self.model = model
        self.profiles: Counter[str] = Counter()
        self.shares = 0
        self.whole = False
        self.pods: list[str] = []

    def take(self, need: _Need, shares_per_gpu: int) -> bool:
        if self.whole:
            return False
        if need.whole:
            if self.profiles or self.shares:
                return False
            self.whole = True
            return True
        if need.shares:
            if self.profiles or self.shares + need.shares > shares_per_gpu:
                return False
            self.shares += need.shares
            return True
        if self.shares:
            return False
        merged = self.profiles + need.profiles
        if not _fits(self.model.name, _key(merged)):
            return False
        self.profiles = merged
        return True


@dataclass(frozen=True)
class _Need:
    """One GPU's worth of a pod's request."""

    profiles: Counter[str] = field(default_factory=Counter)
    shares: int = 0
    whole: bool = False


def _key(counts: Counter[str]) -> tuple[tuple[str, int], ...]:
    return tuple(sorted((+counts).items()))


@cache
def _valid_counts(model_name: str) -> frozenset[tuple[tuple[str, int], ...]]:
    """Every profile count one card of the model can hold at once (every valid layout's; a
    layout's subsets are layouts too, so this is exactly the set of counts that fit)."""
    model = catalogue.model(model_name)
    return frozenset(_key(layout.count_profiles(found))
                     for found in layout.enumerate_layouts(model))


@lru_cache(maxsize=65536)
def _fits(model_name: str, counts: tuple[tuple[str, int], ...]) -> bool:
    return counts in _valid_counts(model_name)


def _needs(model: catalogue.GpuModel, requests: Iterable[tuple[str, int]],
           shares_per_gpu: int) -> list[_Need] | str:
    """The GPUs one pod alone fills on ``model``, or why the model cannot hold it."""
    needs: list[_Need] = []
    slices: list[str] = []
    shares = 0
    for resource, count in requests:
        if resource == catalogue.WHOLE_GPU_RESOURCE:
            needs.extend(_Need(whole=True) for _ in range(count))
        elif catalogue.is_gpu_share(resource):
            shares += count
        elif resource.startswith(catalogue.MIG_RESOURCE_PREFIX):
            if resource.endswith(catalogue.SHARED_SUFFIX):
                return f"{resource} (shares of a MIG slice) is not asked of an autoscaler"
            name = catalogue.profile_name_from_resource(resource)
            try:
                profile = model.profile(name)
            except TesseraError:
                return f"{model.name} has no {name} profile"
            slices.extend([profile.name] * count)
        else:
            return f"{resource} is not a resource a new {model.name} node offers"
    while shares > 0:
        take = min(shares, max(1, shares_per_gpu))
        needs.append(_Need(shares=take))
        shares -= take
    order = {p.name: i for i, p in enumerate(model.profiles)}
    open_: list[Counter[str]] = []
    for name in sorted(slices, key=lambda n: order[n]):  # largest profiles first
        for counts in open_:
            if _fits(model.name, _key(counts + Counter({name: 1}))):
                counts[name] += 1
                break
        else:
            if not _fits(model.name, _key(Counter({name: 1}))):
                return f"{name} does not fit on one {model.name}"
            open_.append(Counter({name: 1}))
    needs.extend(_Need(profiles=counts) for counts in open_)
    return needs


def contradiction(pod: PendingPod, labels: Mapping[str, str]) -> str | None:
    """Why a new node with ``labels`` (the pool's) could never take ``pod``, or None. Only the
    labels the pool fixes are judged: the pod may ask for others the new node will carry."""
    for key, value in pod.node_selector:
        if key in labels and labels[key] != value:
            return f"its nodeSelector {key}={value} contradicts the pool's {key}={labels[key]}"
    if pod.affinity_terms:
        probe = Node(name="new", labels=tuple(labels.items()))
        judged = [t for t in pod.affinity_terms if all(e.key in labels for e in t)]
        if judged and len(judged) == len(pod.affinity_terms) and rejection(
                PendingPod(namespace="", name="", requests=(), affinity_terms=tuple(judged)),
                probe) is not None:
            return "its required node affinity excludes the pool's labels"
    return None


def _order(pod: PendingPod) -> tuple[int, float, str]:
    return (-pod.priority, pod.creation_time, pod.key)


def size(pods: Sequence[PendingPod], target: Target,
         arriving: Sequence[Arriving] = ()) -> Sizing:
    """The whole GPUs ``pods`` need beyond what ``arriving`` nodes bring (module docstring)."""
    labels = dict(target.labels)
    models = [catalogue.model(name) for name in target.models]
    impossible: dict[str, str] = {}
    covered: dict[str, str] = {}
    bins: dict[tuple[Constraints, str], list[_Bin]] = {}
    # Arriving nodes' GPUs are bins already paid for; each belongs to the constraints of the
    # first pod that lands there (a node admits or refuses each pod on its own terms).
    arriving_bins: list[tuple[Arriving, list[_Bin]]] = []
    for node in arriving:
        model = catalogue.model(node.model) if node.model else models[0]
        arriving_bins.append((node, [_Bin(model) for _ in range(max(0, node.gpus))]))
    asks: list[Ask] = []
    capped: list[str] = []
    total = 0
    for pod in sorted(pods, key=_order):
        reason = contradiction(pod, labels)
        if reason is not None:
            impossible[pod.key] = reason
            continue
        if _cover(pod, arriving_bins, target.shares_per_gpu, covered):
            continue
        chosen: tuple[catalogue.GpuModel, list[_Need]] | None = None
        reasons: list[str] = []
        for model in models:
            needs = _needs(model, pod.requests, target.shares_per_gpu)
            if isinstance(needs, str):
                reasons.append(needs)
                continue
            chosen = (model, needs)
            break
        if chosen is None:
            impossible[pod.key] = "; ".join(reasons) or "it asks no GPU resource"
            continue
        model, needs = chosen
        constraints = Constraints.of(pod)
        if len(needs) > 1:
            if total + len(needs) > target.max_gpus:
                capped.append(pod.key)
                continue
            asks.append(Ask(len(needs), model.name, constraints, (pod.key,)))
            total += len(needs)
            continue
        open_ = bins.setdefault((constraints, model.name), [])
        if any(_place(b, needs[0], target.shares_per_gpu, pod.key) for b in open_):
            continue
        if total + 1 > target.max_gpus:
            capped.append(pod.key)
            continue
        fresh = _Bin(model)
        _place(fresh, needs[0], target.shares_per_gpu, pod.key)
        open_.append(fresh)
        total += 1
    for (constraints, model_name), filled in bins.items():
        asks.extend(Ask(1, model_name, constraints, tuple(b.pods)) for b in filled)
    return Sizing(asks=tuple(asks), covered=covered, impossible=impossible,
                  capped=tuple(capped))


def _place(gpu: _Bin, need: _Need, shares_per_gpu: int, pod: str) -> bool:
    if not gpu.take(need, shares_per_gpu):
        return False
    if pod not in gpu.pods:
        gpu.pods.append(pod)
    return True


def _cover(pod: PendingPod, arriving: Sequence[tuple[Arriving, list[_Bin]]],
           shares_per_gpu: int, covered: dict[str, str]) -> bool:
    """Fit ``pod`` on an arriving node that admits it (all its GPUs there), if one has room."""
    for node, gpus in arriving:
        probe = Node(name=node.name, labels=node.labels, taints=node.taints)
        if rejection(pod, probe) is not None or not gpus:
            continue
        needs = _needs(gpus[0].model, pod.requests, shares_per_gpu)
        if isinstance(needs, str):
            continue
        trial = [_copy(g) for g in gpus]
        if all(any(_place(g, need, shares_per_gpu, pod.key) for g in trial) for need in needs):
            gpus[:] = trial
            covered[pod.key] = node.name
            return True
    return False


def _copy(gpu: _Bin) -> _Bin:
    twin = _Bin(gpu.model)
    twin.profiles = Counter(gpu.profiles)
    twin.shares, twin.whole, twin.pods = gpu.shares, gpu.whole, list(gpu.pods)
    return twin
