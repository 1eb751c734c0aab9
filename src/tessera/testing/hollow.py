"""Hollow GPU nodes: many simulated GPU nodes in one process against the real API server, as
Kubernetes' kubemark runs hollow kubelets, for the scale benchmark (``bench/scale_bench.py``).

Each hollow node is a Node object whose allocatable follows its slices (what its kubelet would
publish from the device plugins' devices), a NodePartition, and the agent's own Kubernetes
side: :class:`~tessera.agent.runner.AgentRunner` (status written only when it changed,
Events) over :class:`~tessera.agent.reconciler.Reconciler` on a simulated NVML node. What is
left out is what needs a machine: no kubelet, no device-plugin sockets, no pods run (a pod the
controller releases is bound by the scheduler and stays Pending).

The NVML simulator is process-global (it sits in ``pynvml.nvmlLib``), so one worker thread
reconciles the nodes one at a time, switching the simulated library to each node's before its
pass. One watch on all NodePartitions wakes the node a change is for (a real agent watches its
own; 2,000 watches from one Python process would measure this process, not the API server),
and every node also resyncs every ``resync_s``.

Run it as a process: ``python -m tessera.testing.hollow --kubeconfig K --nodes 500
--prefix hollow- --models A100-80GB x8`` prints ``ready`` once every node has reported. With
``--shard I/P`` a process serves every P-th node from the I-th: P processes apply plans to
different nodes at once, as real agents do (one worker applying every node's plan in turn
measured this process, not the controller: a 1,000-pod burst's last 6 s were its queue).
"""

from __future__ import annotations

import argparse
import heapq
import logging
import queue
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pynvml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tessera.agent.node import NodeRuntime, RuntimeSettings
from tessera.agent.reconciler import Reconciler
from tessera.agent.runner import AgentRunner
from tessera.api.v1alpha1 import GROUP, VERSION
from tessera.kube.config import api_client
from tessera.kube.events import EventRecorder
from tessera.kube.partitions import NodePartitions
from tessera.nvml.backend import PynvmlBackend
from tessera.nvml.sim.fakelib import FakeNvmlLib
from tessera.nvml.sim.state import new_node_state
from tessera.nvml.sim.store import MemoryStore

__all__ = ["HollowNode", "HollowNodes", "main"]

log = logging.getLogger(__name__)

NOT_READY_TAINT = "node.kubernetes.io/not-ready"


@contextmanager
def _nvml(lib: FakeNvmlLib) -> Iterator[None]:
    """Every pynvml call in the block talks to ``lib`` (one node's simulated cards)."""
    with pynvml.libLoadLock:
        pynvml.nvmlLib = lib
        pynvml._nvmlGetFunctionPointer_cache.clear()
    yield


class HollowNode:
    """One node: its simulated cards, the agent's runner over them, and the allocatable its
    kubelet would publish."""

    def __init__(self, name: str, models: Sequence[str], api: client.ApiClient,
                 labels: dict[str, str], events: EventRecorder) -> None:
        self.name = name
        self.labels = labels
        self.lib = FakeNvmlLib(MemoryStore(new_node_state(name, list(models), mig=True)))
        with _nvml(self.lib):
            self.backend = PynvmlBackend()
            self.runtime = NodeRuntime(self.backend, RuntimeSettings(
                pod_resources_socket=None, device_plugins=False))
        self.runner = AgentRunner(name, self.runtime, Reconciler(self.runtime),
                                  NodePartitions(api), events=events, resync_s=0)
        self.published: dict[str, int] = {}

    def advertised(self) -> dict[str, int]:
        """Healthy devices per resource: what the kubelet's status sync would publish."""
        inventory = self.runtime.inventory
        return {name: sum(1 for d in inventory.devices(name) if d.healthy)
                for name in inventory.resource_names()}

    def node_body(self) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": self.name, "labels": {
                    "kubernetes.io/hostname": self.name, **self.labels}},
                "spec": {}}

    def reconcile(self) -> None:
        with _nvml(self.lib):
            self.runner.reconcile_now()


class HollowNodes:
    """The nodes and their one worker; :meth:`start` registers them, :meth:`run` serves."""

    def __init__(self, api: client.ApiClient, names: Sequence[str], models: Sequence[str], *,
                 labels: dict[str, str] | None = None, resync_s: float = 60.0) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        events = EventRecorder(api, "agent")
        self.nodes = {n: HollowNode(n, models, api, dict(labels or {}), events) for n in names}
        self.resync_s = resync_s
        self.woken: queue.SimpleQueue[str] = queue.SimpleQueue()
        self.stopped = threading.Event()
        self.passes = 0
        self.node_writes = 0

    def start(self) -> None:
        """Register every Node (untainted: no lifecycle controller runs), reconcile each once
        and publish its allocatable."""
        for node in self.nodes.values():
            try:
                body: Any = node.node_body()  # the client posts a plain dict as it is
                self.core.create_node(body)
            except ApiException as exc:
                if exc.status != 409:
                    raise
            self._untaint(node.name)
        for node in self.nodes.values():
            self._pass(node)

    def _untaint(self, name: str) -> None:
        raw = self.core.read_node(name)
        present = (raw.spec.taints if raw.spec is not None else None) or []
        taints = [t for t in present if t.key != NOT_READY_TAINT]
        if len(taints) != len(present):
            self.core.patch_node(name, {"spec": {"taints": taints or None}})

    def _pass(self, node: HollowNode) -> None:
        try:
            node.reconcile()
        except ApiException as exc:
            log.error("%s: API error while reconciling: %s %s", node.name, exc.status,
                      exc.reason)
            return
        self.passes += 1
        wanted = node.advertised()
        if wanted != node.published:
            self._publish(node, wanted)

    def _publish(self, node: HollowNode, counts: dict[str, int]) -> None:
        """The node status a kubelet writes: capacity and allocatable with its devices (a
        resource no longer offered is kept at 0, as the kubelet does), and Ready."""
        quantities = {r: str(n) for r, n in counts.items()}
        for gone in node.published.keys() - counts.keys():
            quantities[gone] = "0"
        base = {"cpu": "64", "memory": "512Gi", "pods": "110"}
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        body = {"status": {
            "capacity": {**base, **quantities}, "allocatable": {**base, **quantities},
            "conditions": [{"type": "Ready", "status": "True", "reason": "HollowNodeReady",
                            "message": "hollow node", "lastHeartbeatTime": stamp,
                            "lastTransitionTime": stamp}]}}
        self.core.patch_node_status(node.name, body)
        node.published = counts
        self.node_writes += 1

    def _watch(self) -> None:
        version: str | None = None
        partitions = NodePartitions(self.api)
        while not self.stopped.is_set():
            try:
                for _kind, seen_version, partition in partitions.watch_all(version, 60):
                    version = seen_version
                    if partition is None:
                        continue
                    node = self.nodes.get(partition.metadata.name)
                    if node is None:
                        continue
                    node.runner.seen(partition)
                    self.woken.put(node.name)
            except ApiException as exc:
                version = None if exc.status == 410 else version
                self._forget_watched()
                self.stopped.wait(1.0)
            except Exception as exc:  # connection reset and the like: watch again
                log.warning("NodePartition watch ended: %s", exc)
                self._forget_watched()
                self.stopped.wait(1.0)

    def _forget_watched(self) -> None:
        for node in self.nodes.values():
            node.runner.seen(None)

    def run(self) -> None:
        """Reconcile the node each change is for at once, and every node every resync."""
        threading.Thread(target=self._watch, name="hollow-watch", daemon=True).start()
        due = [(time.monotonic() + self.resync_s * i / max(1, len(self.nodes)), name)
               for i, name in enumerate(sorted(self.nodes))]
        heapq.heapify(due)
        while not self.stopped.is_set():
            timeout = max(0.0, due[0][0] - time.monotonic()) if due else 1.0
            try:
                woken: str | None = self.woken.get(timeout=min(timeout, 1.0))
            except queue.Empty:
                woken = None
            if woken is not None:
                self._pass(self.nodes[woken])
                continue
            now = time.monotonic()
            while due and due[0][0] <= now:
                _, name = heapq.heappop(due)
                self._pass(self.nodes[name])
                heapq.heappush(due, (now + self.resync_s, name))

    def reported(self) -> int:
        listed: Any = self.custom.list_cluster_custom_object(GROUP, VERSION, "nodepartitions")
        return sum(1 for item in listed.get("items", [])
                   if item["metadata"]["name"] in self.nodes
                   and (item.get("status") or {}).get("gpus"))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tessera.testing.hollow")
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--prefix", default="hollow-")
    parser.add_argument("--models", nargs="+", default=["A100-80GB"] * 8,
                        help="the GPUs of every node (repeat a model for several)")
    parser.add_argument("--label", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--resync-seconds", type=float, default=60.0)
    parser.add_argument("--shard", default="0/1", metavar="I/P",
                        help="serve nodes I, I+P, I+2P, ... of --nodes (P processes in all)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    labels = dict(item.split("=", 1) for item in args.label)
    index, _, count = args.shard.partition("/")
    if not (index.isdigit() and count.isdigit() and int(index) < int(count)):
        parser.error(f"--shard {args.shard!r}: give I/P with 0 <= I < P, e.g. 0/4")
    names = [f"{args.prefix}{i:05d}" for i in range(args.nodes)][int(index)::int(count)]
    nodes = HollowNodes(api_client(args.kubeconfig), names, args.models, labels=labels,
                        resync_s=args.resync_seconds)
    signal.signal(signal.SIGTERM, lambda *_: nodes.stopped.set())
    started = time.monotonic()
    nodes.start()
    print(f"ready {len(names)} {time.monotonic() - started:.1f}", flush=True)
    nodes.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
