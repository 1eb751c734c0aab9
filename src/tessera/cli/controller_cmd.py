"""``tessera controller``: the cluster-wide operator that repartitions for pending GPU pods."""

from __future__ import annotations

import argparse
import os
from typing import Any

from tessera.cli import logs, reservation_flags
from tessera.controller import operator
from tessera.controller.loop import ControllerSettings
from tessera.core.errors import InvalidInputError
from tessera.kube.config import api_client


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "controller", help="run the controller (kopf operator)",
        description="Watch pending GPU pods, plan MIG layouts, write NodePartition specs, and "
        "release each pod once its slice is advertised. Run two replicas: a Lease elects "
        "the one that plans.")
    parser.add_argument("--kubeconfig", default=None,
                        help="kubeconfig file (default: in-cluster service account)")
    parser.add_argument("--namespace", default=os.environ.get("POD_NAMESPACE", "tessera"),
                        help="namespace of the leader Lease and of node-level Events")
    parser.add_argument("--metrics-port", type=int, default=9401)
    parser.add_argument("--batch-idle-seconds", type=float, default=0.5,
                        help="close a batch after this long without a new pending pod")
    parser.add_argument("--batch-max-seconds", type=float, default=3.0,
                        help="close a batch at the latest this long after it opened")
    parser.add_argument("--backlog-batch-seconds", type=float,
                        default=ControllerSettings.backlog_batch_s,
                        help="the batch window while pods the last plan could not place still "
                        "wait (a plan over a few seconds of changes packs better)")
    parser.add_argument("--plan-timeout-seconds", type=float, default=120.0,
                        help="give up waiting for an agent to report a plan after this long")
    parser.add_argument("--resync-seconds", type=float, default=30.0,
                        help="plan pods that did not fit again after this long even if "
                        "nothing changed (otherwise only on a change)")
    parser.add_argument("--solver", choices=["fast", "exact"], default="fast")
    reservation_flags.add(parser)
    parser.add_argument("--dra-node-selector", default="", metavar="KEY=VALUE[,...]",
                        help="labels of the DRA nodes (the chart's dra.nodeSelector): a pod "
                        "handed to DRA gets them as node selector (empty: every GPU node of "
                        "the pod's profile that reports api dra may take it)")
    parser.add_argument("--scale-up-priority-class", default="",
                        help="PriorityClass of scale-up placeholder pods (the chart's, below "
                        "every workload); empty: the cluster's default priority")
    parser.add_argument("--scale-up-ttl-seconds", type=float, default=900.0,
                        help="delete a placeholder no node answered this long")
    parser.add_argument("--scale-up-image", default="registry.k8s.io/pause:3.10",
                        help="image of placeholder pods (never started)")
    parser.add_argument("--identity", default=os.environ.get("POD_NAME"),
                        help="this replica's name in the leader Lease")
    parser.add_argument("--log-level", default="INFO")
    parser.set_defaults(run=run)


def _selector(text: str) -> tuple[tuple[str, str], ...]:
    pairs: list[tuple[str, str]] = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InvalidInputError("--dra-node-selector", f"{item!r} is not KEY=VALUE, e.g. "
                                    "tessera.dev/api=dra")
        pairs.append((key, value))
    return tuple(pairs)


def run(args: argparse.Namespace) -> int:
    logs.configure(args.log_level)
    settings = settings_of(args)  # a bad flag is refused before anything connects
    operator.run(api_client(args.kubeconfig), namespace=args.namespace, settings=settings,
                 metrics_port=args.metrics_port, identity=args.identity,
                 kubeconfig=args.kubeconfig)
    return 0


def settings_of(args: argparse.Namespace) -> ControllerSettings:
    """The controller's settings from its flags (each checked, naming the flag)."""
    return ControllerSettings(batch_idle_s=args.batch_idle_seconds,
                              batch_max_s=args.batch_max_seconds,
                              backlog_batch_s=args.backlog_batch_seconds,
                              plan_timeout_s=args.plan_timeout_seconds,
                              resync_s=args.resync_seconds, solver=args.solver,
                              dra_node_selector=_selector(args.dra_node_selector),
                              namespace=args.namespace,
                              scale_up_priority_class=args.scale_up_priority_class,
                              scale_up_ttl_s=args.scale_up_ttl_seconds,
                              scale_up_image=args.scale_up_image,
                              **reservation_flags.settings(args))
