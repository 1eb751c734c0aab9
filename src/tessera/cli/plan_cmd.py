"""``tessera plan``: a dry run of the planner, on files or on the live cluster.

``--cluster CLUSTER.json --pending PENDING.json`` plans what the files describe;
``--kubeconfig`` (or the in-cluster account, or the default kubeconfig) lists the live cluster
read-only and asks the controller's own code what its next plan would do: the same snapshot,
the same waiting pods, the same planner (:meth:`Controller.preview`). Nothing is written.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Collection
from pathlib import Path
from typing import Any, cast

from kubernetes.client.exceptions import ApiException

from tessera.cli import reservation_flags
from tessera.controller.loop import ClusterCache, Controller, ControllerSettings, Writer
from tessera.controller.operator import api_listers, prime
from tessera.core.errors import InvalidInputError
from tessera.core.planner import (
    SOLVERS,
    Plan,
    SolverName,
    parse_cluster,
    parse_pending,
    plan,
    plan_to_dict,
)
from tessera.kube.config import api_client


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "plan",
        help="plan target layouts and placements for pending pods (dry run)",
        description="Plan target MIG layouts and pod placements from a cluster snapshot and "
        "pending pods, without touching anything. File formats: see the README's Planning "
        "section.",
    )
    parser.add_argument("--cluster", type=Path, help="CLUSTER.json")
    parser.add_argument("--pending", type=Path, help="PENDING.json")
    parser.add_argument("--kubeconfig", help="plan the live cluster of this kubeconfig "
                        "(read-only; without --cluster/--pending the default kubeconfig)")
    parser.add_argument("--context", help="the kubeconfig context to use")
    parser.add_argument("--solver", choices=SOLVERS, default="fast",
                        help="fast (default, any size) or exact (HiGHS, small clusters)")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    reservation_flags.add(parser, same_as="give the controller's to preview its plan")
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
    held = reservation_flags.settings(args)
    if args.cluster is None and args.pending is None:
        result = live_plan(args.kubeconfig, args.context, args.solver, held)
    elif args.cluster is None or args.pending is None or args.kubeconfig or args.context:
        raise InvalidInputError("--cluster/--pending", "give both files, or neither to plan "
                                "the live cluster (--kubeconfig, --context)")
    elif args.reserve_after_waits is not None:
        raise InvalidInputError("--reserve-after-waits", "a snapshot file has no waits to "
                                "measure a pod's against, so its pods reserve at once: drop "
                                "the flag, or plan the live cluster (--kubeconfig)")
    else:
        snapshot = parse_cluster(_load(args.cluster, "cluster"))
        pods = parse_pending(_load(args.pending, "pending"))
        result = plan(snapshot, pods, args.solver, reservations=held["reservations"])
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


class _ReadOnly:
    """The controller's writer for a dry run: a preview writes nothing, so any call is a bug."""

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"tessera plan is read-only; the controller tried {name}")


def live_cache(kubeconfig: str | None, context: str | None,
               kinds: Collection[str] | None = None) -> ClusterCache:
    """A read-only listing of the live cluster into the controller's cache, with the
    controller's own listers: every kind it reads, or only ``kinds`` (``tessera simulate
    export`` lists pods alone, so it works on a cluster without Tessera's CRDs)."""
    api = api_client(kubeconfig, context)
    cache = ClusterCache()
    try:
        prime(cache, [(kind, lister) for kind, lister in api_listers(api)
                      if kinds is None or kind in kinds])
    except ApiException as exc:
        what = "the cluster" if kinds is None else " and ".join(f"{k}s" for k in kinds)
        raise InvalidInputError("--kubeconfig", f"listing {what} failed: {exc.status} "
                                f"{exc.reason}") from exc
    finally:
        api.close()  # type: ignore[no-untyped-call]
    return cache


def live_cluster(kubeconfig: str | None, context: str | None, solver: SolverName,
                 held: reservation_flags.Reservations) -> Controller:
    """A controller over a full, read-only listing of the live cluster, that writes nothing;
    ``held``: the live controller's reservation settings."""
    return Controller(live_cache(kubeconfig, context), cast(Writer, _ReadOnly()),
                      ControllerSettings(solver=solver, **held))


def live_plan(kubeconfig: str | None, context: str | None, solver: SolverName,
              held: reservation_flags.Reservations) -> Plan:
    """What the controller's next plan would be on the live cluster."""
    return live_cluster(kubeconfig, context, solver, held).preview()
