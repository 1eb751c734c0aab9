"""``tessera status`` (or ``kubectl tessera status``): what is on the GPUs, and who waits why.

Read-only. Per node and GPU: model, mode, each slice (or share pool) with its placement, its
state and the pods holding it; then the pods waiting for GPU capacity with the reason the
controller's planner gives now (the same :meth:`Controller.preview` as ``tessera plan
--kubeconfig``), and the plans written but not yet applied. Slice states:

- ``free`` / ``allocated``: exists on the card, and the kubelet gave it to no pod / to pods;
- ``creating``: in the node's plan, not on the card yet;
- ``draining``: on the card, not in the plan (it goes once free; ``blocked`` while held).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

from tessera.api.v1alpha1 import NodePartition
from tessera.cli import reservation_flags
from tessera.cli.plan_cmd import live_cluster
from tessera.controller.dra import serves_dra
from tessera.core.planner import Plan

__all__ = ["GpuRow", "Status", "build_status", "register", "run"]


@dataclass
class SliceRow:
    slice: str
    state: str
    pods: list[str] = field(default_factory=list)
    shares: int | None = None


@dataclass
class GpuRow:
    node: str
    gpu: int
    model: str
    mode: str
    healthy: bool
    slices: list[SliceRow] = field(default_factory=list)


@dataclass
class Status:
    gpus: list[GpuRow]
    waiting: list[tuple[str, str]]
    """(pod, what the planner says now: where it would go, or why it cannot)."""
    in_flight: list[tuple[str, str, str]]
    """(node, plan written, plan the agent last applied)."""


def _mig_rows(spec_slices: set[str], observed: Sequence[Any]) -> list[SliceRow]:
    rows = []
    seen = set()
    for item in sorted(observed, key=lambda s: s.start):
        name = f"{item.profile}@{item.start}"
        seen.add(name)
        if name not in spec_slices and spec_slices:
            state = "blocked" if item.pods or item.processes else "draining"
        elif item.uuid is None:
            state = "creating"
        else:
            state = "allocated" if item.pods else "free"
        rows.append(SliceRow(name, state, list(item.pods),
                             item.mps.shares if item.mps is not None else None))
    rows += [SliceRow(name, "creating") for name in sorted(spec_slices - seen)]
    return rows


def build_status(partitions: Mapping[str, NodePartition], preview: Plan,
                 node: str | None = None) -> Status:
    """The view from NodePartitions (what the agents report) and a preview plan."""
    gpus: list[GpuRow] = []
    in_flight: list[tuple[str, str, str]] = []
    for name, partition in sorted(partitions.items()):
        if node is not None and name != node:
            continue
        wanted = partition.spec.plan_id
        applied = partition.status.applied_plan_id if partition.status else None
        if wanted and wanted != applied:
            in_flight.append((name, wanted, applied or "-"))
        specs = {g.index: g for g in partition.spec.gpus}
        on_dra = serves_dra(partition)
        for observed in partition.status.gpus if partition.status else []:
            spec = specs.get(observed.index)
            row = GpuRow(name, observed.index, observed.model or observed.name,
                         f"{observed.mode} (dra)" if on_dra else observed.mode,
                         observed.healthy)
            if observed.mode == "mig" and on_dra:
                # the scheduler picks placements: slices exist only for prepared claims
                row.slices = _mig_rows(set(), observed.slices) or [
                    SliceRow("any placement", "free")]
            elif observed.mode == "mig":
                wanted_slices = {f"{s.profile}@{s.start}" for s in spec.slices} if (
                    spec is not None and spec.mode == "mig") else set()
                row.slices = _mig_rows(wanted_slices, observed.slices)
            elif observed.mps is not None:
                row.slices = [SliceRow(observed.mps.resource, observed.mps.daemon.lower(),
                                       shares=observed.mps.shares)]
            elif observed.timeslice is not None:
                row.slices = [SliceRow(observed.timeslice.resource, "replicas",
                                       shares=observed.timeslice.replicas)]
            else:
                row.slices = [SliceRow("whole", "whole")]
            gpus.append(row)
    waiting: list[tuple[str, str]] = []
    for placement in preview.placements:
        if node is None or placement.node == node:
            waiting.append((placement.pod, f"goes to {placement.node} with the next plan"))
    if node is None:
        waiting += [(u.pod, u.reason) for u in preview.unplaced]
    return Status(gpus, sorted(waiting), in_flight)


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "status", help="what is on the GPUs and who waits why (read-only)",
        description="Per node and GPU: slices, their state and the pods holding them; the "
        "pods waiting for GPU capacity and why; plans in flight. Read-only.")
    parser.add_argument("--node", help="only this node")
    parser.add_argument("-o", "--output", choices=("table", "wide", "json"), default="table",
                        help="table (default), wide (with shares) or json")
    parser.add_argument("--kubeconfig", help="the cluster's kubeconfig (default: in-cluster "
                        "or the default kubeconfig)")
    parser.add_argument("--context", help="the kubeconfig context to use")
    reservation_flags.add(parser, same_as="give the controller's: the pods' next placement "
                          "is its plan")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    controller = live_cluster(args.kubeconfig, args.context, "fast",
                              reservation_flags.settings(args))
    _, _, partitions, _ = controller.cache.view()
    status = build_status(partitions, controller.preview(), args.node)
    if args.output == "json":
        print(json.dumps(asdict(status), indent=2))
        return 0
    render(status, wide=args.output == "wide", console=Console(soft_wrap=True))
    return 0


def render(status: Status, *, wide: bool, console: Console) -> None:
    """``kubectl get``-like tables: upper-case headers, no borders."""
    table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    columns = ["NODE", "GPU", "MODEL", "MODE", "SLICE", "STATE", "PODS"]
    if wide:
        columns.insert(6, "SHARES")
    for column in columns:
        table.add_column(column)
    colour = {"free": "green", "allocated": "cyan", "creating": "yellow", "draining": "yellow",
              "blocked": "red", "failed": "red"}
    for gpu in status.gpus:
        for item in gpu.slices:
            cells = [gpu.node, str(gpu.gpu), gpu.model, gpu.mode + ("" if gpu.healthy
                                                                   else " (unhealthy)"),
                     item.slice, f"[{colour.get(item.state, 'white')}]{item.state}[/]",
                     ",".join(item.pods) or "-"]
            if wide:
                cells.insert(6, "-" if item.shares is None else str(item.shares))
            table.add_row(*cells)
    console.print(table)
    if status.waiting:
        console.print()
        waiting = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
        waiting.add_column("WAITING POD")
        waiting.add_column("REASON")
        for pod, reason in status.waiting:
            waiting.add_row(pod, reason)
        console.print(waiting)
    for node, wanted, applied in status.in_flight:
        console.print(f"plan in flight on {node}: {wanted} (the agent last applied {applied})")
