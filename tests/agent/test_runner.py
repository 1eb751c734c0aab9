"""The cluster-connected loop, with Tessera's own API wrappers faked (kopf's first level).

The real API server runs in the e2e suite; here the point is the loop's own behaviour: it
reconciles on a spec change and on a health change, writes status only when it changed, and
tells an admin with Events what it did and what blocks it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

from tessera.agent.runner import AgentRunner
from tessera.api.v1alpha1 import NodePartition, NodePartitionSpec, NodePartitionStatus, ObjectMeta
from tessera.nvml.sim import operations

from .conftest import AgentNode, mig


class FakePartitions:
    """Stands in for :class:`tessera.kube.partitions.NodePartitions` (same methods)."""

    def __init__(self) -> None:
        self.objects: dict[str, NodePartition] = {}
        self.status_writes = 0
        self.reads = 0
        self.delivered: str | None = None
        """The last version the watch delivered and the runner handled."""
        self._changed = threading.Condition()
        self._version = 0

    def _bump(self, partition: NodePartition) -> NodePartition:
        self._version += 1
        meta = partition.metadata.model_copy(update={"resource_version": str(self._version)})
        stored = partition.model_copy(update={"metadata": meta})
        self.objects[meta.name] = stored
        with self._changed:
            self._changed.notify_all()
        return stored

    def get(self, name: str) -> NodePartition | None:
        self.reads += 1
        return self.objects.get(name)

    def ensure(self, name: str) -> NodePartition:
        self.reads += 1
        return self.objects.get(name) or self._bump(NodePartition(
            metadata=ObjectMeta(name=name, generation=1), spec=NodePartitionSpec()))

    def set_spec(self, name: str, spec: NodePartitionSpec) -> None:
        current = self.objects.get(name) or self.ensure(name)
        meta = current.metadata.model_copy(update={"generation": (current.metadata.generation
                                                                  or 0) + 1})
        self._bump(current.model_copy(update={"spec": spec, "metadata": meta}))

    def write_status(self, name: str, status: NodePartitionStatus) -> NodePartition:
        self.status_writes += 1
        return self._bump(self.objects[name].model_copy(update={"status": status}))

    def watch(self, name: str, version: str | None, timeout_s: int = 60,
              ) -> Iterator[tuple[str, NodePartition]]:
        """As the API server's watch: from ``version`` on, only what changed after it (from
        none, the object as it is). It used to yield the object every half second whether
        it changed or not, which refilled the runner's cache behind a test's back: under
        CPU load the pass that should read afresh came after the refill (a CI flake)."""
        def newer() -> NodePartition | None:
            found = self.objects.get(name)
            return found if found is not None and (
                found.metadata.resource_version != version) else None

        with self._changed:
            if newer() is None:
                self._changed.wait(min(timeout_s, 0.5))
        found = newer()
        if found is not None:
            yield "MODIFIED", found
            # Resumed: the runner has handled the event (the body of its loop ran).
            self.delivered = found.metadata.resource_version


class FakeEvents:
    def __init__(self) -> None:
        self.posted: list[tuple[str, str, bool]] = []

    def record(self, *, kind: str, name: str, api_version: str, reason: str, message: str,
               warning: bool = False, **_: object) -> None:
        self.posted.append((reason, message, warning))


def _runner(agent_node: AgentNode, partitions: FakePartitions,
            events: FakeEvents) -> tuple[AgentRunner, threading.Thread]:
    runner = AgentRunner("node-a", agent_node.runtime, agent_node.reconciler,
                         partitions, events=events, resync_s=0.3)  # type: ignore[arg-type]
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    return runner, thread


def _wait(predicate: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached")


def test_a_new_plan_is_applied_reported_and_announced(agent_node: AgentNode) -> None:
    partitions, events = FakePartitions(), FakeEvents()
    runner, thread = _runner(agent_node, partitions, events)
    try:
        _wait(lambda: "node-a" in partitions.objects and partitions.status_writes >= 1)
        partitions.set_spec("node-a", NodePartitionSpec(
            gpus=[mig(0, "3g.40gb@4", "3g.40gb@0")], plan_id="plan-9"))
        _wait(lambda: (partitions.objects["node-a"].status is not None and
                       partitions.objects["node-a"].status.applied_plan_id == "plan-9"))
        status = partitions.objects["node-a"].status
        assert status is not None
        applied = next(c for c in status.conditions if c.type == "Applied")
        assert (applied.status, applied.observed_generation) == ("True", 2)
        assert agent_node.layout(0) == {"3g.40gb@4", "3g.40gb@0"}
        (event,) = [e for e in events.posted if e[0] == "Applied"]
        assert event[1] == ("GPU 0: enable MIG mode; GPU 0: create 3g.40gb@0; GPU 0: create "
                            "3g.40gb@4 for plan plan-9")
        writes = partitions.status_writes
        reconciles = runner.reconciles
        _wait(lambda: runner.reconciles >= reconciles + 3)
        assert partitions.status_writes == writes, "an unchanged status is not written again"
    finally:
        runner.stop()
        thread.join(10)


def test_an_idle_agent_reads_what_its_watch_delivered_not_the_api_server(
    agent_node: AgentNode,
) -> None:
    """At 2,000 nodes a GET per resync is hundreds of requests a second for nothing: a pass
    reads the NodePartition the watch (or the agent's own status write) last showed."""
    partitions, events = FakePartitions(), FakeEvents()
    runner, thread = _runner(agent_node, partitions, events)
    try:
        _wait(lambda: "node-a" in partitions.objects and partitions.status_writes >= 1)
        _wait(lambda: runner.reconciles >= 3)
        reads, reconciles = partitions.reads, runner.reconciles
        _wait(lambda: runner.reconciles >= reconciles + 5)
        assert partitions.reads == reads
        partitions.set_spec("node-a", NodePartitionSpec(
            gpus=[mig(0, "7g.80gb@0")], plan_id="plan-w"))
        _wait(lambda: (partitions.objects["node-a"].status is not None and
                       partitions.objects["node-a"].status.applied_plan_id == "plan-w"))
        assert partitions.reads == reads, "the new spec came by the watch"
        # The watch may still be delivering the agent's own status write; once it has, nothing
        # newer is coming, and the cache stays empty until a pass reads.
        _wait(lambda: partitions.delivered == partitions.objects["node-a"].metadata.
              resource_version)
        runner.seen(None)  # the watch failed: the next pass reads the object afresh
        _wait(lambda: partitions.reads > reads)
    finally:
        runner.stop()
        thread.join(10)


def test_a_health_change_is_reported_without_waiting_for_a_resync(
    agent_node: AgentNode,
) -> None:
    partitions, events = FakePartitions(), FakeEvents()
    partitions.set_spec("node-a", NodePartitionSpec(gpus=[mig(0, "7g.80gb@0")]))
    runner, thread = _runner(agent_node, partitions, events)
    runner.resync_s = 30.0
    try:
        _wait(lambda: agent_node.layout(0) == {"7g.80gb@0"})
        _wait(lambda: partitions.status_writes >= 1)
        (instance,) = agent_node.backend.gpu_instances(0)
        assert instance.uuid is not None
        with agent_node.store.mutate() as state:
            operations.inject_xid(state, instance.uuid, 94)
        _wait(lambda: any(e[0] == "Degraded" for e in events.posted), timeout=10)
        status = partitions.objects["node-a"].status
        assert status is not None
        degraded = next(c for c in status.conditions if c.type == "Degraded")
        assert degraded.status == "True"
        assert "last Xid 94" in degraded.message
    finally:
        runner.stop()
        thread.join(10)


def test_probes_follow_the_reconcile_loop(agent_node: AgentNode) -> None:
    partitions, events = FakePartitions(), FakeEvents()
    runner = AgentRunner("node-a", agent_node.runtime, agent_node.reconciler,
                         partitions, events=events, resync_s=0.3)  # type: ignore[arg-type]
    assert not runner.live(), "not live before the loop runs"
    assert not runner.ready()
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    try:
        _wait(runner.ready)
        assert runner.live()
    finally:
        runner.stop()
        thread.join(10)
    assert not runner.live(), "a stopped loop is not live: the kubelet restarts the container"
