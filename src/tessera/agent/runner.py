"""The cluster-connected agent: watch this node's NodePartition, reconcile, report, repeat.

A reconcile runs when the NodePartition changes (watch), when a device's health changes, and
every ``resync_s`` anyway (a slice freed by a finished pod is only noticed by looking). Status
is written only when it changed, so an idle node costs the API server one GET per resync.
Events tell an admin what was done and what is blocked, once per distinct message.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Protocol

from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError as TransportError

from tessera.agent.metrics import AgentMetrics
from tessera.agent.node import NodeRuntime
from tessera.agent.reconcile import CreateSlice, DestroySlice, SetMigMode, StartMps, StopMps
from tessera.agent.reconciler import ReconcileResult
from tessera.api.v1alpha1 import API_VERSION, NodePartition, comparable
from tessera.kube.events import EventRecorder
from tessera.kube.partitions import NodePartitions

__all__ = ["AgentRunner"]

log = logging.getLogger(__name__)


class Service(Protocol):
    def start(self) -> None: ...

    def stop(self) -> None: ...

    @property
    def serving(self) -> bool: ...


class PartitionReconciler(Protocol):
    """The per-pass work: the device-plugin node's :class:`Reconciler`, or the DRA driver's."""

    def reconcile(self, partition: NodePartition) -> ReconcileResult: ...


class AgentRunner:
    def __init__(self, node_name: str, runtime: NodeRuntime, reconciler: PartitionReconciler,
                 partitions: NodePartitions, *, events: EventRecorder | None = None,
                 metrics: AgentMetrics | None = None, resync_s: float = 30.0,
                 services: Sequence[Service] = ()) -> None:
        self.node_name = node_name
        self.runtime = runtime
        self.reconciler = reconciler
        self.partitions = partitions
        self.events = events
        self.metrics = metrics or AgentMetrics()
        self.resync_s = resync_s
        self.services = tuple(services)
        """Servers beside the device plugins, started after the runtime (the DRA plugin)."""
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.reconciles = 0
        self._running = False
        self._last_pass = time.monotonic()
        self._watched: NodePartition | None = None
        """The NodePartition as the watch (or this agent's own last write) last showed it."""
        self._watched_lock = threading.Lock()

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def live(self) -> bool:
        """The reconcile loop is running and went round lately (a pass waits at most
        ``resync_s``; three missed ones mean it is stuck), and the plugin servers are up."""
        recent = time.monotonic() - self._last_pass < max(3 * self.resync_s, 60.0)
        serving = (self.runtime.plugins.running() if self.runtime.settings.device_plugins
                   else True) and all(s.serving for s in self.services)
        return self._running and recent and serving

    def ready(self) -> bool:
        """Reconciled once: the cards are partitioned and reported as the spec says."""
        return self.reconciles > 0

    def run(self) -> None:
        self.runtime.health_changed = self.wake
        self.runtime.start()
        for service in self.services:
            service.start()
        watcher = threading.Thread(target=self._watch, name="partition-watch", daemon=True)
        watcher.start()
        self._running = True
        try:
            while not self._stop.is_set():
                self._last_pass = time.monotonic()
                try:
                    self.reconcile_now()
                except ApiException as exc:
                    log.error("API error while reconciling: %s %s: %s", exc.status, exc.reason,
                              str(exc.body)[:2000])
                except TransportError as exc:
                    # One line, with the address: a wrong server (in a pod, the chart's
                    # apiServer.host/apiServer.port) is a setting to fix, not a bug to trace.
                    log.error("cannot reach the API server, so the agent is not ready: %s "
                              "(in a pod: the chart's apiServer.host and apiServer.port, or "
                              "the kubernetes Service); trying again in %g s", exc,
                              self.resync_s)
                except Exception:
                    log.exception("reconcile failed")
                self._wake.wait(self.resync_s)
                self._wake.clear()
        finally:
            self._running = False
            for service in self.services:
                service.stop()
            self.runtime.stop()

    def _watch(self) -> None:
        version: str | None = None
        while not self._stop.is_set():
            try:
                for kind, partition in self.partitions.watch(self.node_name, version, 30):
                    version = partition.metadata.resource_version
                    self.seen(None if kind == "DELETED" else partition)
                    self._wake.set()
                    if self._stop.is_set():
                        return
            except ApiException as exc:
                self.seen(None)  # what it showed may be stale now: read afresh next pass
                if exc.status == 410:  # too old: list again from now
                    version = None
                else:
                    log.warning("watch of NodePartition %s failed: %s", self.node_name,
                                exc.reason)
                    self._stop.wait(1.0)
            except Exception as exc:  # connection reset and the like: watch again
                self.seen(None)
                log.warning("watch of NodePartition %s ended: %s", self.node_name, exc)
                self._stop.wait(1.0)

    def seen(self, partition: NodePartition | None) -> None:
        """What the watch delivered (None: nothing to trust, read it next pass)."""
        with self._watched_lock:
            self._watched = partition

    def reconcile_now(self) -> ReconcileResult:
        with self._watched_lock:
            partition = self._watched
        if partition is None:
            partition = self.partitions.ensure(self.node_name)
        result = self.reconciler.reconcile(partition)
        self.reconciles += 1
        self.metrics.record(result)
        if comparable(result.status) != comparable(partition.status):
            written = self.partitions.write_status(self.node_name, result.status)
            with self._watched_lock:
                if self._watched is partition:  # the watch has shown nothing newer meanwhile
                    self._watched = written
        self._tell(partition, result)
        return result

    def _tell(self, partition: NodePartition, result: ReconcileResult) -> None:
        if self.events is None:
            return

        def event(reason: str, message: str, warning: bool = False) -> None:
            assert self.events is not None
            self.events.record(kind="NodePartition", name=self.node_name,
                               api_version=API_VERSION, reason=reason, message=message,
                               warning=warning)

        created = [str(s) for s in result.done if isinstance(s, CreateSlice)]
        destroyed = [str(s) for s in result.done if isinstance(s, DestroySlice)]
        other = [str(s) for s in result.done if isinstance(s, SetMigMode | StartMps | StopMps)]
        if created or destroyed or other:
            plan = f" for plan {partition.spec.plan_id}" if partition.spec.plan_id else ""
            event("Applied", f"{'; '.join(other + destroyed + created)}{plan}", False)
        for condition in result.status.conditions:
            if condition.status != "True":
                continue
            if condition.type == "Blocked":
                event("Blocked", condition.message, True)
            elif condition.type == "Invalid":
                event("InvalidSpec", condition.message, True)
            elif condition.type == "ResetRequired":
                event("ResetRequired", condition.message, True)
            elif condition.type == "Degraded":
                event("Degraded", condition.message, True)

    def wait_reconciled(self, count: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.reconciles < count and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.reconciles >= count
