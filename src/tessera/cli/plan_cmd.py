"""``tessera plan --cluster CLUSTER.json --pending PENDING.json``: a dry run of the planner.

Reads the two files, plans, and prints the plan; nothing is changed anywhere. Live-cluster mode
(``--kubeconfig``) comes with the controller and is not here yet.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from tessera.core.errors import InvalidInputError
from tessera.core.planner import SOLVERS, Plan, parse_cluster, parse_pending, plan, plan_to_dict


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "plan",
        help="plan target layouts and placements for pending pods (dry run)",
        description="Plan target MIG layouts and pod placements from a cluster snapshot and "
        "pending pods, without touching anything. File formats: see the README's Planning "
        "section.",
    )
    parser.add_argument("--cluster", required=True, type=Path, help="CLUSTER.json")
    parser.add_argument("--pending", required=True, type=Path, help="PENDING.json")
    parser.add_argument("--solver", choices=SOLVERS, default="fast",
                        help="fast (default, any size) or exact (HiGHS, small clusters)")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.set_defaults(run=run)


def _load(path: Path, what: str) -> object:
    try:
        return json.loads(path.read_text())
    except OSError as exc:
        raise InvalidInputError(f"--{what}", f"cannot read {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise InvalidInputError(
            f"--{what}", f"{path} is not JSON: line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from None


def run(args: argparse.Namespace) -> int:
    snapshot = parse_cluster(_load(args.cluster, "cluster"))
    pods = parse_pending(_load(args.pending, "pending"))
    result = plan(snapshot, pods, args.solver)
    if args.json:
        print(json.dumps(plan_to_dict(result), indent=2))
    else:
        print(render(result))
    return 0


def render(result: Plan) -> str:
    """The plan as three short tables: GPU changes, placements, pods that wait and why."""
    lines = [f"GPUs changed ({len(result.gpus)}):"]
    for g in result.gpus:
        slices = " ".join(str(s) for s in g.slices) or "(empty)"
        steps = [f"-{s}" for s in g.destroy] + [f"+{s}" for s in g.create]
        lines.append(f"  {g.node}/gpu{g.index} {g.model}: {slices}   [{' '.join(steps)}]")
    lines.append(f"Placed ({len(result.placements)}):")
    for p in result.placements:
        items = ", ".join(
            f"gpu{s.gpu} {s.profile}@{s.start}" if s.profile is not None
            else f"gpu{s.gpu} {s.resource}" + (f" x{s.count}" if s.count > 1 else "")
            for s in p.slices
        )
        lines.append(f"  {p.pod} -> {p.node}: {items}")
    lines.append(f"Unplaced ({len(result.unplaced)}):")
    lines.extend(f"  {u.pod}: {u.reason}" for u in result.unplaced)
    return "\n".join(lines)
