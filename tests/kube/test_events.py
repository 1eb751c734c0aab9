"""Events are best effort and must never hold up their caller: a recorder with workers posts
them from its own pool, and the same message is posted once within the dedupe window."""

from __future__ import annotations

import threading
from typing import Any

from kubernetes import client

from tessera.kube.events import EventRecorder


class SlowCore:
    """Stands in for CoreV1Api: each post takes until the test lets it through."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.posted: list[tuple[str, Any]] = []

    def create_namespaced_event(self, namespace: str, body: Any) -> None:
        self.gate.wait(10)
        self.posted.append((namespace, body))


def recorder(workers: int) -> tuple[EventRecorder, SlowCore]:
    events = EventRecorder(client.ApiClient(), "test", workers=workers)
    core = SlowCore()
    events._core = core  # type: ignore[assignment]
    return events, core


def test_a_recorder_with_workers_returns_before_the_api_server_answers() -> None:
    events, core = recorder(workers=2)
    for i in range(5):
        events.record(kind="Pod", name=f"p{i}", namespace="ml", api_version="v1",
                      reason="Released", message="pinned")
    assert core.posted == []  # every call returned while the posts wait
    core.gate.set()
    events._pool.shutdown(wait=True)  # type: ignore[union-attr]
    assert sorted(b.involved_object.name for _, b in core.posted) == [f"p{i}" for i in range(5)]


def test_the_same_message_is_posted_once_within_the_window() -> None:
    events, core = recorder(workers=0)
    core.gate.set()
    for _ in range(3):
        events.record(kind="Pod", name="p", namespace="ml", api_version="v1",
                      reason="NoGPUFit", message="no room")
    events.record(kind="Pod", name="p", namespace="ml", api_version="v1",
                  reason="NoGPUFit", message="other reason")
    assert [b.message for _, b in core.posted] == ["no room", "other reason"]
