"""The controller process around the loop: it plans only on a cache that holds the cluster, and
says in an Event what each release did."""

from __future__ import annotations

import threading
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tessera.controller.loop import ClusterCache
from tessera.controller.operator import ApiWriter, ControllerMetrics, prime, prime_until_done
from tests.controller.test_loop import DYNAMIC, node, partition, pod


def _listers(failures: list[int]) -> list[tuple[str, Any]]:
    def pods() -> list[dict[str, Any]]:
        if failures[0] > 0:
            failures[0] -= 1
            raise ApiException(status=503, reason="Service Unavailable")
        return [pod("bound", gated=False, node_name="node-a"), pod("waits")]

    return [("pod", pods), ("node", lambda: [node("node-a")]),
            ("nodepartition", lambda: [partition("node-a", [])]),
            ("partitionpolicy", lambda: [DYNAMIC])]


def test_the_cache_is_primed_with_every_kind_before_the_loop_may_plan() -> None:
    cache = ClusterCache()
    prime(cache, _listers([0]))
    pods, nodes, partitions, policies = cache.view()
    assert set(pods) == {"ml/bound", "ml/waits"}
    assert set(nodes) == set(partitions) == {"node-a"}
    assert set(policies) == {"a100-dynamic"}


def test_priming_is_retried_until_the_api_server_answers_then_marked_synced() -> None:
    cache, stop, synced = ClusterCache(), threading.Event(), threading.Event()
    prime_until_done(cache, _listers([2]), stop, synced, first_delay=0.01)
    assert synced.is_set()
    assert "ml/bound" in cache.view()[0]


def test_a_stopped_controller_gives_up_priming_without_claiming_a_sync() -> None:
    cache, stop, synced = ClusterCache(), threading.Event(), threading.Event()
    stop.set()
    prime_until_done(cache, _listers([5]), stop, synced, first_delay=0.01)
    assert not synced.is_set()


class _Events:
    def __init__(self) -> None:
        self.posted: list[dict[str, Any]] = []

    def record(self, **event: Any) -> None:
        self.posted.append(event)


class _NoWrites:
    def release(self, *args: Any, **kwargs: Any) -> bool:
        raise AssertionError("a pod without the gate cannot be pinned: nothing to write")


def test_a_pod_never_gated_is_not_written_and_its_event_does_not_claim_a_pin() -> None:
    events = _Events()
    writer = ApiWriter(client.ApiClient(), events)  # type: ignore[arg-type]
    writer._pods = _NoWrites()  # type: ignore[assignment]
    writer.release_pod("ml/late", "node-a", "node-a", gated=False)
    [event] = events.posted
    assert (event["name"], event["namespace"], event["reason"]) == ("late", "ml", "NotGated")
    assert "room made on node-a" in event["message"]
    assert "cannot be pinned" in event["message"]


def test_the_released_counter_leaves_out_a_pod_the_gate_missed_but_its_wait_counts() -> None:
    metrics = ControllerMetrics()
    metrics.record_release(12.0)
    metrics.record_release(30.0, pinned=False)
    sample = metrics.registry.get_sample_value
    assert sample("tessera_controller_pods_released_total") == 1.0
    assert sample("tessera_controller_pod_wait_seconds_count") == 2.0
