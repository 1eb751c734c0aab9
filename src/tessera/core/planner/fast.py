"""The default solver: greedy in planning order, with every per-GPU decision memoised.

Why it is fast enough for 10,000 GPUs: a GPU's future depends only on its *state* (model, the
slices held, the free slices, whether the plan has touched it, its policy), and a big cluster
has few distinct states. So the best way to give a GPU one more unit of a resource is computed
once per (state, resource) and reused, and GPUs are indexed in one heap per (node class,
resource) ordered by that cost, so a one-unit pod (the common case) costs a few heap operations.
Pods that need several units are evaluated per distinct *node* state (the tuple of its GPUs'
states), again memoised; identical nodes are tried once.

Pods go in planning order (priority, then arrival). One that fits nowhere may reserve GPUs
(:mod:`~tessera.core.planner.reserve`); a GPU reserved by an earlier pod looks empty of offers
to every later pod (:meth:`_Search.node_sig`).

Costs are compared lexicographically: slices destroyed, GPUs newly touched, fragmentation
added (the FGD measure against recent demand, :meth:`_States.fragmentation`), whole (unsplit)
GPUs split, slices created, then flexibility lost (how much placeable memory the change takes
away: filling a fragment beats cutting into a large free run).

Those per-step costs pack the first pods tightly but can strand later, larger ones (a 7g, or
a 7g plus a small slice, finding no card left whole), so a bounded repair phase (:class:`_Repair`)
follows the greedy: each left-out pod gets a node, or a pair of nodes, repacked from the
snapshot with it included, and pods after it in the planning order may be left out for it
(placing an earlier pod outweighs every later one). The fast plan is within 1% of the exact
solver's on the seeded cases (tests/core/planner, bench/simulate/planner_quality.py).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from tessera.core import catalogue
from tessera.core.catalogue import is_gpu_share
from tessera.core.layout import Slice
from tessera.core.planner.geometry import Geometry, bits, geometry_of
from tessera.core.planner.model import MPS_SHARE_RESOURCE, WHOLE_GPU_RESOURCE
from tessera.core.planner.problem import GpuInfo, PodInfo, Problem, profile_for, resource_size
from tessera.core.planner.reserve import DEFAULT_RESERVATIONS, reserve
from tessera.core.planner.result import GpuOutcome, Outcome, Unit

__all__ = ["solve_fast"]

Cost = tuple[int, int, int, int, int, int]
_ZERO: Cost = (0, 0, 0, 0, 0, 0)
_FRAG_SCALE = 1000
"""Fragmentation (expected unusable compute slices) is compared in thousandths."""

# A GPU state. MIG: ("mig", model, locked, free, touched, was_empty, frozen, allowed);
# whole GPU: ("none", free); MPS: ("mps", shares_free, the shares' resource).
_Key = tuple[object, ...]


@dataclass(frozen=True)
class _Option:
    """The cheapest way for a GPU in some state to give one more unit of a resource."""

    cost: Cost
    take: Slice | None
    next: int
    """The GPU's state id afterwards."""


_UNKNOWN = _Option(_ZERO, None, -1)
"""An offer not worked out yet (None is a known answer: no offer)."""



_SHARED_LIMIT = 1 << 15
"""Entries the offers and fragmentation kept between plans may hold, then they start over (a
few MiB: a plan of 5,000 pods on 10,000 GPUs works out about 23,000 offers)."""
_SHARED_OFFERS: dict[tuple[_Key, str, tuple[tuple[str, float], ...]],
                    tuple[Cost, Slice | None, _Key] | None] = {}
"""A MIG GPU state's offer of a resource under a demand mix, kept between plans: a fleet's
GPUs are in a few states, the same plan after plan, and working their offers out again was the
largest part of a plan's cost (issue #13: unchanged nodes' offers reused between plans)."""
_SHARED_FRAG: dict[tuple[tuple[tuple[str, float], ...], str, int], int] = {}


def _bounded(memo: dict[Any, Any]) -> None:
    if len(memo) >= _SHARED_LIMIT:
        memo.clear()


class _States:
    """Interned GPU states with memoised offers; ids are small ints, cheap to hash and compare.
    A MIG state's offers and fragmentation are also kept between plans (``_SHARED_*``)."""

    def __init__(self, demand: Sequence[tuple[str, float]] = ()) -> None:
        self.demand = tuple(demand)
        """(resource, share of recent requests): what fragmentation is measured against."""
        self._frag: dict[tuple[str, int], int] = {}
        self.keys: list[_Key] = []
        self._ids: dict[_Key, int] = {}
        self._offers: dict[tuple[int, str], _Option | None] = {}
        self.known_offers = self._offers
        """The offers worked out so far, for loops that look them up many times."""
        self._capacity: dict[tuple[int, str], int] = {}
        self._entries: dict[tuple[int, tuple[str, ...]], tuple[tuple[str, Cost], ...]] = {}

    def entries(self, sid: int, offered: tuple[str, ...]) -> tuple[tuple[str, Cost], ...]:
        """(resource, cost) for each of ``offered`` a GPU in state ``sid`` can give a unit
        of: its heap entries, the same for every GPU in that state."""
        memo_key = (sid, offered)
        found = self._entries.get(memo_key)
        if found is None:
            found = self._entries[memo_key] = tuple(
                (resource, option.cost) for resource in offered
                if (option := self.offer(sid, resource)) is not None)
        return found

    def intern(self, key: _Key) -> int:
        found = self._ids.get(key)
        if found is None:
            found = self._ids[key] = len(self.keys)
            self.keys.append(key)
        return found

    def capacity(self, sid: int, resource: str) -> int:
        """Units of ``resource`` this GPU can still give, taking them greedily one by one."""
        memo_key = (sid, resource)
        found = self._capacity.get(memo_key)
        if found is None:
            option = self.offer(sid, resource)
            found = 0 if option is None else 1 + self.capacity(option.next, resource)
            self._capacity[memo_key] = found
        return found

    def offer(self, sid: int, resource: str) -> _Option | None:
        memo_key = (sid, resource)
        found = self._offers.get(memo_key, _UNKNOWN)
        if found is not _UNKNOWN:
            return found
        key = self.keys[sid]
        option: _Option | None = None
        if key[0] == "none":
            if resource == WHOLE_GPU_RESOURCE and key[1]:
                option = _Option(_ZERO, None, self.intern(("none", False)))
        elif key[0] == "mps":
            shares = key[1]
            assert isinstance(shares, int)
            if resource == key[2] and shares > 0:
                # Fewest free shares first: pack MPS GPUs, keep others whole for large requests.
                option = _Option((0, 0, 0, 0, 0, shares), None,
                                 self.intern(("mps", shares - 1, key[2])))
        else:
            shared_key = (key, resource, self.demand)
            if shared_key in _SHARED_OFFERS:
                kept = _SHARED_OFFERS[shared_key]
                option = None if kept is None else _Option(kept[0], kept[1], self.intern(kept[2]))
            else:
                option = self._mig_offer(key, resource)
                _bounded(_SHARED_OFFERS)
                _SHARED_OFFERS[shared_key] = None if option is None else (
                    option.cost, option.take, self.keys[option.next])
        self._offers[memo_key] = option
        return option

    def _mig_offer(self, key: _Key, resource: str) -> _Option | None:
        _, model_name, locked, free, touched, was_empty, frozen, allowed = key
        assert isinstance(model_name, str)
        assert isinstance(locked, int)
        assert isinstance(free, int)
        geometry = geometry_of(model_name)
        profile = profile_for(geometry.model, resource)
        if profile is None:
            return None
        existing = free & geometry.profile_mask[profile]
        now = self.fragmentation(geometry, locked)
        if existing:
            # The existing free slice whose use leaves the rest most usable (lowest start on
            # a tie: candidates are in start order).
            low = min(bits(existing),
                      key=lambda i: (self.fragmentation(geometry, locked | 1 << i), i))
            nxt = ("mig", model_name, locked | 1 << low, free & ~(1 << low), *key[4:])
            frag = self.fragmentation(geometry, locked | 1 << low) - now
            return _Option((0, 0, frag, 0, 0, 0), geometry.slices[low], self.intern(nxt))
        if frozen or (allowed is not None and profile not in allowed):  # type: ignore[operator]
            return None
        base = geometry.aggregate(locked)
        before = geometry.flex[geometry.aggregate(locked | free).memory]
        best: tuple[Cost, int, int, int] | None = None
        for i in geometry.by_profile[profile]:
            if not geometry.fits(base, i):
                continue
            bit = 1 << i
            overlapping = free & geometry.overlap[i]
            rest = free & ~overlapping
            extra = self._fewest_to_destroy(geometry, locked | bit, rest)
            kept = rest & ~extra
            after = geometry.aggregate(locked | kept | bit)
            cost: Cost = (
                bin(free & ~kept).count("1"),
                0 if touched else 1,
                self.fragmentation(geometry, locked | bit) - now,
                1 if was_empty and not touched else 0,
                1,
                before - geometry.flex[after.memory],
            )
            if best is None or (cost, i) < (best[0], best[1]):
                best = (cost, i, bit, kept)
        if best is None:
            return None
        cost, i, bit, kept = best
        nxt = ("mig", model_name, locked | bit, kept, True, was_empty, frozen, allowed)
        return _Option(cost, geometry.slices[i], self.intern(nxt))

    def fragmentation(self, geometry: Geometry, locked: int) -> int:
        """The GPU's free compute that recent demand could not use, in thousandths of a
        compute slice: free compute x the share of requests whose profile fits nowhere
        beside the held slices (the FGD measure, ATC'23; free slices can be reshaped, so
        only held ones count)."""
        memo_key = (geometry.model.name, locked)
        found = self._frag.get(memo_key)
        if found is None:
            found = _SHARED_FRAG.get((self.demand, *memo_key))
            if found is not None:
                self._frag[memo_key] = found
                return found
            base = geometry.aggregate(locked)
            spare = geometry.model.compute_slices - base.compute
            unusable = 0.0
            if spare:
                for resource, share in self.demand:
                    profile = profile_for(geometry.model, resource)
                    if profile is not None and not any(
                            geometry.fits(base, i) for i in geometry.by_profile[profile]):
                        unusable += share
            found = self._frag[memo_key] = round(spare * unusable * _FRAG_SCALE)
            _bounded(_SHARED_FRAG)
            _SHARED_FRAG[(self.demand, *memo_key)] = found
        return found

    @staticmethod
    def _fewest_to_destroy(geometry: Geometry, base: int, rest: int) -> int:
        """The smallest subset of the free ``rest`` whose removal makes ``base | rest`` valid."""
        if geometry.valid(base | rest):
            return 0
        ordered = bits(rest)
        for size in range(1, len(ordered) + 1):
            for extra in itertools.combinations(ordered, size):
                drop = sum(1 << i for i in extra)
                if geometry.valid(base | (rest & ~drop)):
                    return drop
        return rest  # pragma: no cover - base alone is valid, so dropping all of rest works


def _add(a: Cost, b: Cost) -> Cost:
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3], a[4] + b[4], a[5] + b[5])


@cache
def _unit_order(demand: tuple[tuple[str, int], ...]) -> tuple[str, ...]:
    """Largest units first, so small ones fill what the large ones leave on the same node."""
    ordered = sorted(demand, key=lambda d: (-resource_size(d[0]), d[0]))
    return tuple(r for r, c in ordered for _ in range(c))


@cache
def _size(demand: tuple[tuple[str, int], ...]) -> float:
    return sum(resource_size(r) * c for r, c in demand)


@cache
def _compute(resource: str) -> float:
    """Like :func:`resource_size` for compute: a 4g and a 3g may hold the same memory, but
    the 4g has fewer placements and must be packed first."""
    if resource == WHOLE_GPU_RESOURCE or is_gpu_share(resource):
        return resource_size(resource)
    sizes = [model.profile(name).compute_slices / model.compute_slices
             for model in catalogue.models()
             if (name := profile_for(model, resource)) is not None]
    return min(sizes) if sizes else 1.0


@cache
def _bulk(demand: tuple[tuple[str, int], ...]) -> tuple[float, float]:
    """How hard a pod is to pack, largest first: card memory, then compute."""
    return (-_size(demand), -sum(_compute(r) * c for r, c in demand))


@cache
def _largest(demand: tuple[tuple[str, int], ...]) -> float:
    return max(resource_size(r) for r, _ in demand)


def _state_key(info: GpuInfo) -> _Key:
    """A GPU's state as the snapshot has it (see :class:`_States`)."""
    gpu = info.gpu
    if gpu.mode == "none":
        return ("none", not gpu.in_use)
    if gpu.mode == "mps":
        return ("mps", gpu.shares - gpu.shares_in_use, gpu.share_resource)
    geometry = geometry_of(info.model_name)
    locked = geometry.to_mask(info.in_use)
    return ("mig", info.model_name, locked, geometry.to_mask(info.current) & ~locked, False,
            not info.current, info.frozen_reason is not None, info.allowed)


_Evaluation = tuple[Cost, tuple[tuple[int, str, Slice | None], ...], tuple[int, ...]]


_CANDIDATE_NODES = 4
"""How many nodes a multi-unit pod compares (the best few GPUs' nodes for its largest unit)."""
_HEAP_LOOKAHEAD = 256
"""How many heap entries to look through for those nodes before scanning every node."""


class _Search:
    def __init__(self, problem: Problem, reservations: int = DEFAULT_RESERVATIONS) -> None:
        self.problem = problem
        self.states = _States(problem.demand)
        self.dead = self.states.intern(("none", False))
        """A state that offers nothing: what a GPU reserved by an earlier pod looks like."""
        self.reservations = reservations
        self.reserved: dict[int, int] = {}
        """GPU id -> the position of the waiting pod that reserved it (see :mod:`reserve`)."""
        self.owners: dict[int, tuple[int, ...]] = {}
        """Reserving pod position -> its GPUs."""
        self.position = -1
        """The pod being placed: GPUs reserved by an earlier pod are closed to it."""
        self.sid: list[int] = []
        wanted = sorted({r for p in problem.pods for r, _ in p.demand})
        self.offers_by_gpu: list[tuple[str, ...]] = []
        """The resources each GPU could ever give (of those some pod asks for)."""
        # A GPU's state and what it could offer follow from a few facts that fleets repeat
        # (the layout sets are shared between GPUs with the same layout): work out each once.
        known: dict[tuple[object, ...], tuple[int, tuple[str, ...]]] = {}
        for info in problem.gpus:
            gpu = info.gpu
            if gpu.mode == "mig":
                facts: tuple[object, ...] = (info.model_name, info.in_use, info.current,
                                             info.frozen_reason is None, info.allowed)
            else:
                facts = (gpu.mode, gpu.in_use, gpu.shares, gpu.shares_in_use, gpu.share_resource)
            found = known.get(facts)
            if found is None:
                found = known[facts] = (self.states.intern(_state_key(info)),
                                        tuple(r for r in wanted if info.offers(r)))
            self.sid.append(found[0])
            self.offers_by_gpu.append(found[1])
        self.initial = tuple(self.sid)
        """Each GPU's state in the snapshot, which a repair repacks a node from."""
        self.assignments: dict[int, tuple[int, Sequence[Unit]]] = {}
        self.on_node: list[list[int]] = [[] for _ in problem.nodes]
        self.used = [0.0] * len(problem.nodes)
        """Per node, the :func:`_size` of the pods placed there (a lower bound on memory)."""
        self.trail: list[tuple[object, ...]] | None = None
        """While a repair tries a move: what changed, so that :meth:`undo` can roll it back."""
        self.version = [0] * len(problem.gpus)
        self.cpu = [n.free_cpu_milli for n in problem.nodes]
        self.memory = [n.free_memory_mib for n in problem.nodes]
        self.node_class = [0] * len(problem.nodes)
        for class_id, members in enumerate(problem.classes):
            for n in members:
                self.node_class[n] = class_id
        self.heaps: dict[tuple[int, str], list[tuple[Cost, int, int]]] = {}
        entries = self.states.entries
        for info in problem.gpus:
            gid = info.gid
            class_id = self.node_class[info.node]
            for resource, cost in entries(self.sid[gid], self.offers_by_gpu[gid]):
                self.heaps.setdefault((class_id, resource), []).append((cost, gid, 0))
        for heap in self.heaps.values():
            heapq.heapify(heap)
        self.evaluations: dict[tuple[tuple[str, ...], tuple[int, ...]], _Evaluation | None] = {}
        self.hopeless: set[tuple[object, ...]] = set()
        """Multi-unit demands that fit nowhere; capacity only shrinks, so they never will."""

    def barred(self, gid: int) -> bool:
        """Whether GPU ``gid`` is reserved by a pod before the one being placed."""
        owner = self.reserved.get(gid)
        return owner is not None and self.position > owner

    def node_sig(self, node: int, sig: Sequence[int] | None = None) -> tuple[int, ...]:
        """The node's GPU states (``sig``, else the current ones) as the pod being placed may
        use them: GPUs barred to it offer nothing."""
        gids = self.problem.node_gpus[node]
        states = sig if sig is not None else [self.sid[g] for g in gids]
        if not self.reserved:
            return tuple(states)
        return tuple(self.dead if self.barred(g) else s for g, s in zip(gids, states, strict=True))

    def unmask(self, node: int, before: Sequence[int], after: Sequence[int]) -> tuple[int, ...]:
        """``after`` (an evaluation on :meth:`node_sig`) with barred GPUs' states restored."""
        gids = self.problem.node_gpus[node]
        return tuple(b if self.barred(g) else a
                     for g, b, a in zip(gids, before, after, strict=True))

    def reserve_for(self, position: int) -> None:
        """Let pod ``position``, which found no place, reserve GPUs (up to the bound, and only
        once it has waited long enough: :attr:`PodInfo.may_reserve`)."""
        if len(self.owners) >= self.reservations or not self.problem.pods[position].may_reserve:
            return
        gids = reserve(self.problem, position, self.reserved.keys())
        if gids:
            self.owners[position] = gids
            for g in gids:
                self.reserved[g] = position

    def release_reservation(self, position: int) -> list[int]:
        """Pod ``position`` was placed after all: its GPUs open up; their nodes."""
        gids = self.owners.pop(position, ())
        for g in gids:
            del self.reserved[g]
        return sorted({self.problem.gpus[g].node for g in gids})

    def fits(self, node: int, pod: PodInfo) -> bool:
        cpu, memory = self.cpu[node], self.memory[node]
        return (cpu is None or cpu >= pod.pod.cpu_milli) and (
            memory is None or memory >= pod.pod.memory_mib
        )

    def set_state(self, gid: int, sid: int) -> None:
        if self.sid[gid] == sid:
            return
        if self.trail is not None:
            self.trail.append(("sid", gid, self.sid[gid]))
        self.sid[gid] = sid
        self.version[gid] += 1
        class_id = self.node_class[self.problem.gpus[gid].node]
        version = self.version[gid]
        for resource, cost in self.states.entries(sid, self.offers_by_gpu[gid]):
            heapq.heappush(self.heaps.setdefault((class_id, resource), []),
                           (cost, gid, version))

    def _best_entries(self, pod: PodInfo, resource: str, wanted: int
                      ) -> list[tuple[Cost, int]]:
        """Up to ``wanted`` live (cost, GPU) entries per class, cheapest first, for ``pod``."""
        found: list[tuple[Cost, int]] = []
        exhausted = True
        for class_id in pod.classes:
            heap = self.heaps.get((class_id, resource))
            if not heap:
                continue
            popped = []
            taken = 0
            while heap:
                entry = heapq.heappop(heap)
                cost, gid, version = entry
                if version != self.version[gid]:
                    continue
                popped.append(entry)
                if not self.barred(gid) and self.fits(self.problem.gpus[gid].node, pod):
                    found.append((cost, gid))
                    taken += 1
                    if taken >= wanted:
                        break
                if len(popped) >= _HEAP_LOOKAHEAD:
                    exhausted = False
                    break
            for entry in popped:
                heapq.heappush(heap, entry)
        self.exhausted = exhausted
        return sorted(found)

    def place_single(self, pod: PodInfo) -> tuple[int, list[Unit]] | None:
        resource = pod.demand[0][0]
        found = self._best_entries(pod, resource, 1)
        if not found:
            return None
        gid = found[0][1]
        option = self.states.offer(self.sid[gid], resource)
        assert option is not None
        self.set_state(gid, option.next)
        return self.problem.gpus[gid].node, [(gid, resource, option.take)]

    def evaluate(self, units: tuple[str, ...], sig: tuple[int, ...]) -> _Evaluation | None:
        memo_key = (units, sig)
        if memo_key in self.evaluations:
            return self.evaluations[memo_key]
        result: _Evaluation | None = None
        need: dict[str, int] = {}
        for resource in units:
            need[resource] = need.get(resource, 0) + 1
        capacity = self.states.capacity
        if all(sum([capacity(s, r) for s in sig]) >= n for r, n in need.items()):
            states = list(sig)
            total = _ZERO
            taken: list[tuple[int, str, Slice | None]] = []
            known, offer = self.states.known_offers, self.states.offer
            for resource in units:
                best: tuple[Cost, int, _Option] | None = None
                for position, sid in enumerate(states):
                    option = known.get((sid, resource), _UNKNOWN)
                    if option is _UNKNOWN:
                        option = offer(sid, resource)
                    if option is not None and (best is None or (option.cost, position) < best[:2]):
                        best = (option.cost, position, option)
                if best is None:
                    break
                cost, position, option = best
                total = _add(total, cost)
                states[position] = option.next
                taken.append((position, resource, option.take))
            else:
                result = (total, tuple(taken), tuple(states))
        self.evaluations[memo_key] = result
        return result

    def place_multi(self, pod: PodInfo) -> tuple[int, list[Unit]] | None:
        """Compare the nodes of the best few GPUs for the largest unit; scan all if none fits."""
        units = _unit_order(pod.demand)
        hopeless_key = (units, pod.classes, pod.pod.cpu_milli, pod.pod.memory_mib)
        if hopeless_key in self.hopeless:
            return None
        entries = self._best_entries(pod, units[0], 8 * _CANDIDATE_NODES)
        nodes: list[int] = []
        for _, gid in entries:
            node = self.problem.gpus[gid].node
            if node not in nodes:
                nodes.append(node)
        best = self._best_node(units, nodes, _CANDIDATE_NODES)
        if best is None and not self.exhausted:
            best = self._best_node(units, [n for c in pod.classes for n in self.problem.classes[c]
                                           if self.fits(n, pod)], None)
        if best is None:
            self.hopeless.add(hopeless_key)
            return None
        node, (_, taken, states) = best
        gids = self.problem.node_gpus[node]
        states = self.unmask(node, [self.sid[g] for g in gids], states)
        for position, sid in enumerate(states):
            self.set_state(gids[position], sid)
        return node, [(gids[position], resource, item) for position, resource, item in taken]

    def _best_node(self, units: tuple[str, ...], nodes: Sequence[int], enough: int | None
                   ) -> tuple[int, _Evaluation] | None:
        best: tuple[Cost, int, _Evaluation] | None = None
        feasible = 0
        for node in nodes:
            evaluation = self.evaluate(units, self.node_sig(node))
            if evaluation is None:
                continue
            feasible += 1
            if best is None or (evaluation[0], node) < best[:2]:
                best = (evaluation[0], node, evaluation)
            if enough is not None and feasible >= enough:
                break
        return None if best is None else (best[1], best[2])

    def run(self) -> Outcome:
        for position, pod in enumerate(self.problem.pods):
            if not pod.demand or not pod.eligible:
                continue
            self.position = position
            placed = self.place_single(pod) if pod.units == 1 else self.place_multi(pod)
            if placed is not None:
                self._assign(position, *placed)
            else:
                self.reserve_for(position)
        if any(p.demand and p.eligible and i not in self.assignments
               for i, p in enumerate(self.problem.pods)):
            _Repair(self).run()
        outcomes: dict[int, GpuOutcome] = {}
        gpus = []
        for sid in self.sid:
            found = outcomes.get(sid)
            if found is None:
                found = outcomes[sid] = self._outcome(sid)
            gpus.append(found)
        return Outcome(gpus=gpus, assignments=dict(sorted(self.assignments.items())),
                       reserved=dict(self.reserved))

    def _assign(self, position: int, node: int, units: Sequence[Unit]) -> None:
        pod = self.problem.pods[position]
        self.assignments[position] = (node, units)
        self.on_node[node].append(position)
        self.used[node] += _size(pod.demand)
        cpu, memory = self.cpu[node], self.memory[node]
        if cpu is not None:
            self.cpu[node] = cpu - pod.pod.cpu_milli
        if memory is not None:
            self.memory[node] = memory - pod.pod.memory_mib
        if self.trail is not None:
            self.trail.append(("assign", position))

    def _unassign(self, position: int) -> None:
        pod = self.problem.pods[position]
        node, units = self.assignments.pop(position)
        self.on_node[node].remove(position)
        self.used[node] -= _size(pod.demand)
        cpu, memory = self.cpu[node], self.memory[node]
        if cpu is not None:
            self.cpu[node] = cpu + pod.pod.cpu_milli
        if memory is not None:
            self.memory[node] = memory + pod.pod.memory_mib
        if self.trail is not None:
            self.trail.append(("unassign", position, node, units))

    def undo(self, mark: int) -> None:
        """Roll the search back to when the trail was ``mark`` entries long."""
        trail = self.trail
        assert trail is not None
        self.trail = None
        while len(trail) > mark:
            entry = trail.pop()
            if entry[0] == "sid":
                self.set_state(entry[1], entry[2])  # type: ignore[arg-type]
            elif entry[0] == "assign":
                self._unassign(entry[1])  # type: ignore[arg-type]
            else:
                self._assign(entry[1], entry[2], entry[3])  # type: ignore[arg-type]
        self.trail = trail

    def _outcome(self, sid: int) -> GpuOutcome:
        key = self.states.keys[sid]
        if key[0] == "none":
            return GpuOutcome(frozenset(), frozenset(), bool(key[1]), 0)
        if key[0] == "mps":
            shares = key[1]
            assert isinstance(shares, int)
            return GpuOutcome(frozenset(), frozenset(), False, shares)
        model_name, locked, free = key[1], key[2], key[3]
        assert isinstance(model_name, str)
        assert isinstance(locked, int)
        assert isinstance(free, int)
        geometry = geometry_of(model_name)
        return GpuOutcome(geometry.to_slices(locked | free), geometry.to_slices(locked), False, 0)


_Taken = tuple[tuple[int, str, Slice | None], ...]
_Packed = tuple[dict[int, tuple[int, ...]], dict[int, tuple[int, _Taken]], list[int]]
"""Nodes repacked: their GPUs' states, each kept pod's node and units (by GPU position on
that node), the pods left out."""

_REPAIR_WORK = 16384
"""Pod placements (pods x nodes per repack) one repair may try: bounds the phase on a huge,
oversubscribed cluster to about a second; the seeded quality cases use at most ~2,500."""
_NODES_PER_POD = 8
"""Nodes a left-out pod tries (those with the most room), plainly and then evicting."""
_PAIRS = 4
"""Nodes, and partners for each, that a left-out pod tries repacking two at a time."""
_EVICTED_NODES = 4
_GROUP = 4
"""Last resort for a left-out pod: its best few nodes repacked together, at most this many."""
"""Nodes an evicted pod may repack to find a new place, after the greedy found it none."""


def _room(key: _Key) -> float:
    """A GPU's memory that a repack could hand out, as a fraction of the card (upper bound)."""
    if key[0] == "none":
        return 1.0 if key[1] else 0.0
    if key[0] == "mps":
        shares = key[1]
        assert isinstance(shares, int)
        return shares * resource_size(MPS_SHARE_RESOURCE)  # any share counts as tiny
    model_name, locked, free, frozen = key[1], key[2], key[3], key[6]
    assert isinstance(model_name, str)
    assert isinstance(locked, int)
    assert isinstance(free, int)
    geometry = geometry_of(model_name)
    held = free if frozen else locked
    memory = geometry.aggregate(held).memory
    slices = geometry.model.memory_slices
    room = bin(memory).count("1") if frozen else slices - bin(memory).count("1")
    return room / slices


class _Repair:
    """Second chances for the pods the greedy left out, by repacking nodes from scratch.

    The greedy puts each pod where it costs least *now*, so the small pods that come first
    scatter over the cards (a 3g at start 0 where a 4g had to go, two half-used cards where
    one would do), and a 7g, or a pod wanting a 7g plus a small slice, finds no card left
    whole. For each left-out pod, in planning order, a node's GPUs go back to their snapshot
    states and its pods plus the waiting one are placed again, largest first (the set is
    known to nearly fit, which is when largest first packs well); if all fit, the node takes
    the new layout. Failing that, the node may leave out a few of its pods if each finds a
    place elsewhere (where the greedy would put it, or another repack); failing that, two
    nodes are repacked together. A move only ever adds a pod and drops none, so the
    objective's first terms strictly improve (and the phase ends); a failed move is rolled
    back through the search's trail. Work is bounded by :data:`_REPAIR_WORK`, per-pod node
    caps and a memo of demands that found no room (retried only on nodes changed since).
    """

    def __init__(self, search: _Search) -> None:
        self.search = search
        keys = search.states.keys
        self.room = [sum(_room(keys[search.initial[g]]) for g in gids)
                     for gids in search.problem.node_gpus]
        self.budget = _REPAIR_WORK
        self.changed: list[int] = []
        """Nodes repacked, in order: a demand that failed need only retry these since."""
        self.failed: dict[tuple[object, ...], int] = {}
        self._eligible_sets: dict[int, frozenset[int]] = {}

    def run(self) -> None:
        search = self.search
        search.trail = []
        for position, pod in enumerate(search.problem.pods):
            if position in search.assignments or not pod.demand or not pod.eligible:
                continue
            if self.budget <= 0:
                break
            key = (pod.demand, pod.classes, pod.pod.cpu_milli, pod.pod.memory_mib)
            since = self.failed.get(key)
            if since is None:
                nodes: Sequence[int] = pod.eligible
            elif since == len(self.changed):
                continue  # nothing moved since this demand last found no room
            else:
                eligible = self._eligible(position)
                nodes = sorted({n for n in self.changed[since:] if n in eligible})
            search.position = position
            if self._add(position, self._candidates(pod, nodes)[:_NODES_PER_POD],
                         self._candidates(pod, nodes, evicting=True)[:_NODES_PER_POD]):
                # Placed after all: the GPUs it had reserved open to the pods after it.
                self.changed.extend(search.release_reservation(position))
            else:
                self.failed[key] = len(self.changed)
            del search.trail[:]
        search.trail = None

    def _candidates(self, pod: PodInfo, nodes: Sequence[int], evicting: bool = False
                    ) -> list[int]:
        """Nodes with the CPU, memory and card memory the pod needs, the most room first.

        ``evicting``: the node's own pods may move out, so only its whole room must suffice.
        """
        search = self.search
        size = _size(pod.demand) - 1e-9
        slack = [(search.used[n] - self.room[n], n) for n in nodes
                 if self.room[n] - (0.0 if evicting else search.used[n]) >= size
                 and search.fits(n, pod)]
        return [n for _, n in sorted(slack)]

    def _add(self, position: int, nodes: Sequence[int], evicting: Sequence[int]) -> bool:
        """Place the left-out pod ``position`` by repacking one node, then one node whose
        pods may move elsewhere, then two nodes together. A move may leave out pods that
        come after ``position`` in the planning order (placing an earlier pod outweighs
        every later one), never an earlier one."""
        search = self.search
        for node in nodes:
            if self.budget <= 0:
                return False
            packed = self._repack((node,), position, must=False)
            if packed is not None:
                self._apply(packed)
                return True
        for node in evicting:
            if self.budget <= 0:
                return False
            if self._evict((node,), position):
                return True
        partners = heapq.nsmallest(_PAIRS + 1, range(len(self.room)),
                                   key=lambda n: (search.used[n] - self.room[n], n))
        for node in evicting[:_PAIRS]:
            for other in [n for n in partners if n != node][:_PAIRS]:
                if self.budget <= 0:
                    return False
                if self._evict((node, other), position):
                    return True
        group = tuple(sorted(set(evicting[:_GROUP]) | set(partners[:_GROUP])))
        if 2 < len(group) <= _GROUP and self.budget > 0:
            return self._evict(group, position)
        return False

    def _evict(self, nodes: tuple[int, ...], position: int) -> bool:
        """Repack ``nodes`` with ``position`` in; the pods that no longer fit there find
        another place, or stay out if they come after ``position``; else roll back."""
        search = self.search
        packed = self._repack(nodes, position, must=True)
        if packed is None:
            return False
        mark = len(self.changed)
        trail = len(search.trail) if search.trail is not None else 0
        self._apply(packed)
        placed = [self._replace(p, nodes[0]) for p in sorted(packed[2])]
        if all(ok or p > position for p, ok in zip(sorted(packed[2]), placed, strict=True)):
            return True
        search.undo(trail)
        del self.changed[mark:]
        return False

    def _replace(self, position: int, left: int) -> bool:
        """Find an evicted pod a new place: where the greedy would put it, else by a repack."""
        search = self.search
        pod = search.problem.pods[position]
        search.hopeless.clear()  # repacks can make room, so "fits nowhere" no longer holds
        placing, search.position = search.position, position
        try:
            placed = search.place_single(pod) if pod.units == 1 else search.place_multi(pod)
            if placed is not None:
                search._assign(position, *placed)
                return True
            others = [n for n in self._candidates(pod, pod.eligible) if n != left]
            for node in others[:_EVICTED_NODES]:
                packed = self._repack((node,), position, must=False)
                if packed is not None:
                    self._apply(packed)
                    return True
            return False
        finally:
            search.position = placing

    def _apply(self, packed: _Packed) -> None:
        search = self.search
        states, taken, _ = packed
        for node in states:
            for p in list(search.on_node[node]):
                search._unassign(p)
        for node, sig in states.items():
            gids = search.problem.node_gpus[node]
            for index, sid in enumerate(sig):
                search.set_state(gids[index], sid)
            self.changed.append(node)
        for p, (node, units) in taken.items():
            gids = search.problem.node_gpus[node]
            search._assign(p, node, [(gids[i], r, item) for i, r, item in units])

    def _eligible(self, position: int) -> frozenset[int]:
        found = self._eligible_sets.get(position)
        if found is None:
            found = self._eligible_sets[position] = frozenset(
                self.search.problem.pods[position].eligible)
        return found

    def _repack(self, nodes: Sequence[int], extra: int, must: bool) -> _Packed | None:
        """Place the nodes' pods and ``extra`` afresh, from the snapshot states, largest first.

        Each pod goes to the group's node where it costs least. ``must`` False: every pod
        must fit. True: ``extra`` must, the others may be left out; the order that leaves out
        the least (fewest pods, then smallest) wins.
        """
        search = self.search
        problem = search.problem
        pods = problem.pods
        positions = [p for n in nodes for p in search.on_node[n]] + [extra]
        self.budget -= len(positions) * len(nodes)
        by_size = sorted(positions, key=lambda p: (_bulk(pods[p].demand), p))
        orders = [by_size, sorted(positions, key=lambda p: (
            -_largest(pods[p].demand), _bulk(pods[p].demand), p))]
        if must:
            orders.insert(0, [extra, *(p for p in by_size if p != extra)])
        if search.reserved:
            # Pods shut out of reserved GPUs have fewer places: most constrained first.
            gids = [g for n in nodes for g in problem.node_gpus[n]]

            def shut_out(p: int) -> int:
                return sum(1 for g in gids if search.reserved.get(g, p) < p)

            orders.append(sorted(positions, key=lambda p: (-shut_out(p), _bulk(pods[p].demand),
                                                           p)))
        best: tuple[tuple[int, int, float], _Packed] | None = None
        for order in orders:
            sigs = {n: tuple(search.initial[g] for g in problem.node_gpus[n]) for n in nodes}
            cpu = {n: problem.nodes[n].free_cpu_milli for n in nodes}
            memory = {n: problem.nodes[n].free_memory_mib for n in nodes}
            taken: dict[int, tuple[int, _Taken]] = {}
            left: list[int] = []
            for p in order:
                pod = pods[p]
                units = _unit_order(pod.demand)
                choice: tuple[Cost, int, _Evaluation] | None = None
                placing, search.position = search.position, p
                for n in nodes:
                    free_cpu, free_memory = cpu[n], memory[n]
                    if ((free_cpu is not None and free_cpu < pod.pod.cpu_milli)
                            or (free_memory is not None and free_memory < pod.pod.memory_mib)
                            or (len(nodes) > 1 and n not in self._eligible(p))):
                        continue
                    evaluation = search.evaluate(units, search.node_sig(n, sigs[n]))
                    if evaluation is not None and (choice is None or evaluation[0] < choice[0]):
                        choice = (evaluation[0], n, evaluation)
                if choice is not None:
                    chosen_node = choice[1]
                    after = search.unmask(chosen_node, sigs[chosen_node], choice[2][2])
                search.position = placing
                if choice is None:
                    if not must or p == extra:
                        break
                    left.append(p)
                    continue
                _, n, evaluation = choice
                sigs[n] = after
                taken[p] = (n, evaluation[1])
                free_cpu, free_memory = cpu[n], memory[n]
                if free_cpu is not None:
                    cpu[n] = free_cpu - pod.pod.cpu_milli
                if free_memory is not None:
                    memory[n] = free_memory - pod.pod.memory_mib
            else:
                score = (sum(1 for p in left if p < extra), len(left),
                         sum(_size(pods[p].demand) for p in left))
                if best is None or score < best[0]:
                    best = (score, (sigs, taken, left))
                if not left:
                    break
        return None if best is None else best[1]


def solve_fast(problem: Problem, reservations: int = DEFAULT_RESERVATIONS) -> Outcome:
    """Place pods one by one in the problem's order, each where it costs least (a pod that
    fits nowhere reserves GPUs against the pods after it), then repair."""
    return _Search(problem, reservations).run()
