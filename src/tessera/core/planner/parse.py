"""CLUSTER.json / PENDING.json (already loaded into dicts) to planner values, and plans to JSON.

Pure functions: the CLI reads the files, this module only checks shapes and meaning. Every
refusal is an :class:`InvalidInputError` whose ``field`` is the JSON path of the culprit
(``nodes[2].gpus[0].slices[1].profile``) and, where the valid values form a closed set, lists
them. Unknown fields are ignored on purpose, so a snapshot dumped from a richer source (kubectl
output, a NodePartition status) can be fed in as it is.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from tessera.core import catalogue, layout
from tessera.core.catalogue import MIG_RESOURCE_PREFIX, WHOLE_GPU_RESOURCE
from tessera.core.errors import InvalidInputError
from tessera.core.planner.model import (
    MPS_SHARE_RESOURCE,
    Gpu,
    GpuSlice,
    MatchExpression,
    Node,
    PendingPod,
    Plan,
    Policy,
    Snapshot,
    Taint,
    Toleration,
)
from tessera.core.planner.slice_shares import is_slice_share

__all__ = ["parse_cluster", "parse_pending", "plan_to_dict"]

_MODES = ("mig", "none", "mps")
_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_AFFINITY_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")


def _mapping(value: object, path: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidInputError(path, f"expected an object, got {type(value).__name__}")
    return value


def _list(value: object, path: str) -> list[Any]:
    if not isinstance(value, list):
        raise InvalidInputError(path, f"expected a list, got {type(value).__name__}")
    return value


def _str(value: object, path: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidInputError(path, "expected a non-empty string")
    return value


def _int(value: object, path: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidInputError(path, f"expected an integer >= {minimum}, got {value!r}")
    return value


def _number(value: object, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInputError(path, f"expected a number, got {value!r}")
    return float(value)


def _bool(value: object, path: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidInputError(path, f"expected true or false, got {value!r}")
    return value


def _string_map(value: object, path: str) -> tuple[tuple[str, str], ...]:
    items = _mapping(value, path)
    for key, item in items.items():
        if not isinstance(item, str):
            raise InvalidInputError(f"{path}.{key}", "expected a string value")
    return tuple(sorted(items.items()))


_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([a-zA-Z]*)$")
_SUFFIX = {
    "": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
}


def _quantity(value: object, path: str) -> float:
    """A Kubernetes quantity (``500m``, ``16Gi``, ``2``) as a plain number of base units."""
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
        return float(value)
    match = _QUANTITY.match(value) if isinstance(value, str) else None
    if match is None or match.group(2) not in _SUFFIX:
        raise InvalidInputError(path, f"{value!r} is not a quantity such as 500m, 4 or 16Gi")
    return float(match.group(1)) * _SUFFIX[match.group(2)]


def _cpu_milli(value: object, path: str) -> int:
    return round(_quantity(value, path) * 1000)


def _memory_mib(value: object, path: str) -> int:
    return int(_quantity(value, path) // 2**20)


def _policy(value: object, path: str, default: Policy) -> Policy:
    if value is None:
        return default
    raw = _mapping(value, path)
    mode = raw.get("mode", default.mode)
    if mode not in ("dynamic", "static"):
        raise InvalidInputError(f"{path}.mode", f"unknown mode {mode!r}", ["dynamic", "static"])
    allowed: frozenset[str] | None = default.allowed_profiles
    if raw.get("allowed_profiles") is not None:
        known = sorted({p.name for m in catalogue.models() for p in m.profiles})
        names = []
        for i, item in enumerate(_list(raw["allowed_profiles"], f"{path}.allowed_profiles")):
            name = _str(item, f"{path}.allowed_profiles[{i}]")
            if name.startswith(MIG_RESOURCE_PREFIX):
                name = catalogue.profile_name_from_resource(name)
            if name not in known:
                raise InvalidInputError(
                    f"{path}.allowed_profiles[{i}]", f"no model has profile {name!r}", known
                )
            names.append(name)
        allowed = frozenset(names)
    interval = default.min_repartition_interval_s
    if "min_repartition_interval_s" in raw:
        interval = _number(raw["min_repartition_interval_s"], f"{path}.min_repartition_interval_s")
    share = raw.get("share", default.share)
    if share not in (None, "mps", "timeslice"):
        raise InvalidInputError(f"{path}.share", f"unknown sharing {share!r}",
                                ["mps", "timeslice"])
    count = _int(raw.get("share_count", default.share_count), f"{path}.share_count")
    sizes = tuple(_int(v, f"{path}.share_sizes_gib[{i}]") for i, v in enumerate(
        _list(raw.get("share_sizes_gib", list(default.share_sizes_gib)),
              f"{path}.share_sizes_gib")))
    if any(size < 1 for size in sizes):
        raise InvalidInputError(f"{path}.share_sizes_gib", "sizes are GiB, at least 1")
    if share is not None and count < 1:
        raise InvalidInputError(f"{path}.share_count", "sharing needs share_count >= 1")
    return Policy(
        name=_str(raw.get("name", default.name), f"{path}.name"),
        mode="static" if mode == "static" else "dynamic",
        allowed_profiles=allowed,
        min_repartition_interval_s=interval,
        share="mps" if share == "mps" else ("timeslice" if share == "timeslice" else None),
        share_count=count if share else 0,
        share_sizes_gib=sizes if share else (),
    )


def _gpu(raw_value: object, path: str) -> Gpu:
    raw = _mapping(raw_value, path)
    index = _int(raw.get("index"), f"{path}.index")
    raw_slices = _list(raw.get("slices", []), f"{path}.slices")
    mode = raw.get("mode", "mig")
    if mode not in _MODES:
        raise InvalidInputError(f"{path}.mode", f"unknown mode {mode!r}", _MODES)
    if mode != "mig":  # any card serves whole or shared, MIG-capable or not (L4, T4 ...)
        card = catalogue.card(_str(raw.get("model"), f"{path}.model"), field_name=f"{path}.model")
        if raw_slices:
            raise InvalidInputError(f"{path}.slices",
                                    f"a GPU in mode {mode!r} has no MIG slices")
        return _whole_gpu(raw, path, index, card.name, mode)
    model = catalogue.model(_str(raw.get("model"), f"{path}.model"), field_name=f"{path}.model")
    slices = []
    for i, item in enumerate(raw_slices):
        entry = _mapping(item, f"{path}.slices[{i}]")
        profile = model.profile(
            _str(entry.get("profile"), f"{path}.slices[{i}].profile"),
            field_name=f"{path}.slices[{i}].profile",
        )
        slices.append(
            GpuSlice(
                profile=profile.name,
                start=_int(entry.get("start"), f"{path}.slices[{i}].start"),
                in_use=_bool(entry.get("in_use", False), f"{path}.slices[{i}].in_use"),
            )
        )
    layout.check_layout(model, [s.slice for s in slices], field=f"{path}.slices")
    last_change = raw.get("last_change")
    return Gpu(
        index=index, model=model.name, mode="mig", slices=tuple(slices),
        last_change=None if last_change is None else _number(last_change, f"{path}.last_change"))


def _whole_gpu(raw: Mapping[str, Any], path: str, index: int, model: str, mode: str) -> Gpu:
    shares = _int(raw.get("shares", 0), f"{path}.shares")
    shares_in_use = _int(raw.get("shares_in_use", 0), f"{path}.shares_in_use")
    if mode == "mps" and shares < 1:
        raise InvalidInputError(f"{path}.shares", "a GPU in mode 'mps' needs shares >= 1")
    if shares_in_use > shares:
        raise InvalidInputError(f"{path}.shares_in_use", f"more than its {shares} shares")
    last_change = raw.get("last_change")
    resource = _str(raw.get("share_resource", MPS_SHARE_RESOURCE), f"{path}.share_resource")
    if not catalogue.is_gpu_share(resource):
        raise InvalidInputError(f"{path}.share_resource", f"{resource!r} is not a GPU share "
                                "resource", [MPS_SHARE_RESOURCE, catalogue.shared_resource(8)])
    return Gpu(
        index=index,
        model=model,
        mode="none" if mode == "none" else "mps",
        share_resource=resource,
        in_use=_bool(raw.get("in_use", False), f"{path}.in_use"),
        shares=shares,
        shares_in_use=shares_in_use,
        last_change=None if last_change is None else _number(last_change, f"{path}.last_change"),
    )


def _taint(raw_value: object, path: str) -> Taint:
    raw = _mapping(raw_value, path)
    effect = raw.get("effect", "NoSchedule")
    if effect not in _EFFECTS:
        raise InvalidInputError(f"{path}.effect", f"unknown effect {effect!r}", _EFFECTS)
    value = raw.get("value", "")
    return Taint(_str(raw.get("key"), f"{path}.key"), value if isinstance(value, str) else "",
                 effect)


def _free(raw: Mapping[str, Any], path: str, resource: str) -> float | None:
    allocatable = _mapping(raw.get("allocatable", {}), f"{path}.allocatable")
    if resource not in allocatable:
        return None
    allocated = _mapping(raw.get("allocated", {}), f"{path}.allocated")
    total = _quantity(allocatable[resource], f"{path}.allocatable.{resource}")
    used = _quantity(allocated.get(resource, 0), f"{path}.allocated.{resource}")
    return max(0.0, total - used)


def parse_cluster(data: object) -> Snapshot:
    """CLUSTER.json to a :class:`Snapshot`; see the README's "Planning" section for the shape."""
    root = _mapping(data, "cluster")
    default_policy = _policy(root.get("policy"), "policy", Policy())
    nodes: list[Node] = []
    names: set[str] = set()
    for n, raw_node in enumerate(_list(root.get("nodes"), "nodes")):
        path = f"nodes[{n}]"
        raw = _mapping(raw_node, path)
        name = _str(raw.get("name"), f"{path}.name")
        if name in names:
            raise InvalidInputError(f"{path}.name", f"node {name!r} appears twice")
        names.add(name)
        gpus = tuple(
            _gpu(g, f"{path}.gpus[{i}]") for i, g in enumerate(_list(raw.get("gpus", []),
                                                                      f"{path}.gpus"))
        )
        indices = [g.index for g in gpus]
        for i, gpu in enumerate(gpus):
            if indices.index(gpu.index) != i:
                raise InvalidInputError(f"{path}.gpus[{i}].index", f"GPU {gpu.index} twice")
        cpu = _free(raw, path, "cpu")
        memory = _free(raw, path, "memory")
        nodes.append(
            Node(
                name=name,
                labels=_string_map(raw.get("labels", {}), f"{path}.labels"),
                taints=tuple(
                    _taint(t, f"{path}.taints[{i}]")
                    for i, t in enumerate(_list(raw.get("taints", []), f"{path}.taints"))
                ),
                free_cpu_milli=None if cpu is None else round(cpu * 1000),
                free_memory_mib=None if memory is None else int(memory // 2**20),
                gpus=tuple(sorted(gpus, key=lambda g: g.index)),
                policy=_policy(raw.get("policy"), f"{path}.policy", default_policy),
            )
        )
    now = root.get("now")
    return Snapshot(
        nodes=tuple(nodes), now=None if now is None else _number(now, "now")
    )


def _gpu_resource(name: str, path: str) -> bool:
    """Whether ``name`` is a GPU resource the planner places; unknown MIG names are refused."""
    if name == WHOLE_GPU_RESOURCE or catalogue.is_gpu_share(name) or is_slice_share(name):
        return True
    if not name.startswith(MIG_RESOURCE_PREFIX):
        return False
    known = sorted({r for m in catalogue.models() for r in m.resource_names})
    if name not in known:
        raise InvalidInputError(path, f"no GPU model offers {name!r}", known)
    return True


def _requests(raw: Mapping[str, Any], path: str, totals: dict[str, float]) -> None:
    for name, value in _mapping(raw, path).items():
        field_path = f'{path}["{name}"]'
        if _gpu_resource(name, field_path):
            totals[name] = totals.get(name, 0) + _int(value, field_path)
        elif name == "cpu":
            totals[name] = totals.get(name, 0) + _cpu_milli(value, field_path)
        elif name == "memory":
            totals[name] = totals.get(name, 0) + _memory_mib(value, field_path)


def _affinity(raw: object, path: str) -> tuple[tuple[MatchExpression, ...], ...]:
    node_affinity = _mapping(raw, path).get("nodeAffinity")
    if node_affinity is None:
        return ()
    required = _mapping(node_affinity, f"{path}.nodeAffinity").get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if required is None:
        return ()
    term_path = f"{path}.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    terms = []
    raw_terms = _list(_mapping(required, term_path).get("nodeSelectorTerms", []),
                      f"{term_path}.nodeSelectorTerms")
    for t, raw_term in enumerate(raw_terms):
        t_path = f"{term_path}.nodeSelectorTerms[{t}]"
        expressions = []
        raw_exprs = _list(_mapping(raw_term, t_path).get("matchExpressions", []),
                          f"{t_path}.matchExpressions")
        for e, raw_expr in enumerate(raw_exprs):
            e_path = f"{t_path}.matchExpressions[{e}]"
            expr = _mapping(raw_expr, e_path)
            operator = expr.get("operator")
            if operator not in _AFFINITY_OPERATORS:
                raise InvalidInputError(f"{e_path}.operator", f"unknown operator {operator!r}",
                                        _AFFINITY_OPERATORS)
            values = tuple(
                _str(v, f"{e_path}.values[{i}]")
                for i, v in enumerate(_list(expr.get("values", []), f"{e_path}.values"))
            )
            expressions.append(MatchExpression(_str(expr.get("key"), f"{e_path}.key"),
                                               operator, values))
        terms.append(tuple(expressions))
    return tuple(terms)


def _toleration(raw_value: object, path: str) -> Toleration:
    raw = _mapping(raw_value, path)
    operator = raw.get("operator", "Equal")
    if operator not in ("Equal", "Exists"):
        raise InvalidInputError(f"{path}.operator", f"unknown operator {operator!r}",
                                ["Equal", "Exists"])
    effect = raw.get("effect", "") or ""
    if effect and effect not in _EFFECTS:
        raise InvalidInputError(f"{path}.effect", f"unknown effect {effect!r}", _EFFECTS)
    key = raw.get("key", "") or ""
    value = raw.get("value", "") or ""
    if not isinstance(key, str) or not isinstance(value, str):
        raise InvalidInputError(path, "key and value must be strings")
    return Toleration(key, operator, value, effect)


def _time(value: object, path: str) -> float:
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            raise InvalidInputError(path, f"{value!r} is not an RFC 3339 time") from None
    return _number(value, path)


def parse_pending(data: object) -> tuple[PendingPod, ...]:
    """PENDING.json to pods; ``requests`` may be pod-level or per container (they add up)."""
    root = _mapping(data, "pending")
    pods: list[PendingPod] = []
    seen: set[str] = set()
    for p, raw_pod in enumerate(_list(root.get("pods"), "pods")):
        path = f"pods[{p}]"
        raw = _mapping(raw_pod, path)
        totals: dict[str, float] = {}
        if "requests" in raw:
            _requests(raw["requests"], f"{path}.requests", totals)
        for c, container in enumerate(_list(raw.get("containers", []), f"{path}.containers")):
            c_raw = _mapping(container, f"{path}.containers[{c}]")
            _requests(c_raw.get("requests", {}), f"{path}.containers[{c}].requests", totals)
        pod = PendingPod(
            namespace=_str(raw.get("namespace", "default"), f"{path}.namespace"),
            name=_str(raw.get("name"), f"{path}.name"),
            requests=tuple(sorted((k, int(v)) for k, v in totals.items()
                                  if k not in ("cpu", "memory") and v > 0)),
            priority=_int(raw.get("priority", 0), f"{path}.priority", minimum=-(2**31)),
            creation_time=_time(raw.get("creation_time", 0), f"{path}.creation_time"),
            cpu_milli=int(totals.get("cpu", 0)),
            memory_mib=int(totals.get("memory", 0)),
            node_selector=_string_map(raw.get("nodeSelector", {}), f"{path}.nodeSelector"),
            affinity_terms=_affinity(raw.get("affinity", {}), f"{path}.affinity"),
            tolerations=tuple(
                _toleration(t, f"{path}.tolerations[{i}]")
                for i, t in enumerate(_list(raw.get("tolerations", []), f"{path}.tolerations"))
            ),
        )
        if pod.key in seen:
            raise InvalidInputError(f"{path}.name", f"pod {pod.key} appears twice")
        seen.add(pod.key)
        pods.append(pod)
    return tuple(pods)


def plan_to_dict(plan: Plan) -> dict[str, object]:
    """The documented plan JSON: ``{"gpus": [...], "placements": [...], "unplaced": [...]}``."""
    return {
        "solver": plan.solver,
        "gpus": [
            {
                "node": g.node,
                "index": g.index,
                "model": g.model,
                "mode": g.mode,
                "slices": [{"profile": s.profile, "start": s.start} for s in g.slices],
                "destroy": [{"profile": s.profile, "start": s.start} for s in g.destroy],
                "create": [{"profile": s.profile, "start": s.start} for s in g.create],
                **({"shares": g.shares, "sharing": g.sharing, "share_resource": g.share_resource}
                   if g.mode == "mps" else {}),
            }
            for g in plan.gpus
        ],
        "placements": [
            {
                "pod": p.pod,
                "node": p.node,
                "slices": [_assigned(a) for a in p.slices],
            }
            for p in plan.placements
        ],
        "unplaced": [{"pod": u.pod, "reason": u.reason} for u in plan.unplaced],
    }


def _assigned(item: Any) -> dict[str, object]:
    if item.profile is not None and not is_slice_share(item.resource):
        return {"gpu": item.gpu, "profile": item.profile, "start": item.start}
    if catalogue.is_gpu_share(item.resource) or is_slice_share(item.resource):
        found: dict[str, object] = {"gpu": item.gpu, "resource": item.resource,
                                    "shares": item.count}
        if item.profile is not None:
            found.update(profile=item.profile, start=item.start)
        return found
    return {"gpu": item.gpu, "resource": item.resource}
