"""Helpers to write planner cases as the JSON a user would write."""

from __future__ import annotations

from typing import Any

from tessera.core.planner import Plan, parse_cluster, parse_pending, plan


def gpu(index: int, model: str = "A100-SXM4-40GB", *slices: str, **extra: Any) -> dict[str, Any]:
    """``gpu(0, "A100-SXM4-40GB", "3g.20gb@4*")``: ``*`` marks a slice in use."""
    parsed = []
    for text in slices:
        profile, _, start = text.rstrip("*").partition("@")
        parsed.append({"profile": profile, "start": int(start), "in_use": text.endswith("*")})
    return {"index": index, "model": model, "mode": "mig", "slices": parsed, **extra}


def pod(name: str, priority: int = 0, **requests: int) -> dict[str, Any]:
    """``pod("p1", mig_1g_5gb=2)`` asks for two ``nvidia.com/mig-1g.5gb``."""
    names = {k: "nvidia.com/" + k.replace("mig_", "mig-").replace("_", ".", 1).replace("_", ".")
             for k in requests}
    return {"name": name, "priority": priority,
            "requests": {names[k]: v for k, v in requests.items()}}


def run(nodes: list[dict[str, Any]], pods: list[dict[str, Any]], solver: str = "fast",
        **cluster: Any) -> Plan:
    return plan(parse_cluster({"nodes": nodes, **cluster}), parse_pending({"pods": pods}),
                solver)  # type: ignore[arg-type]
