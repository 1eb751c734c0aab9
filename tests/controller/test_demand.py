"""What the controller reads off raw Pod payloads: here, when a pod was bound."""

from __future__ import annotations

from typing import Any

from tessera.controller.demand import created_at, scheduled_at


def _pod(node: str | None, *conditions: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"creationTimestamp": "2026-12-02T10:00:00Z"},
            "spec": {"nodeName": node} if node else {},
            "status": {"conditions": list(conditions)}}


def _scheduled(status: str, at: str = "2026-12-02T10:00:42Z") -> dict[str, Any]:
    return {"type": "PodScheduled", "status": status, "lastTransitionTime": at}


def test_a_bound_pod_was_scheduled_when_its_podscheduled_condition_turned_true() -> None:
    raw = _pod("node-a", {"type": "Ready", "status": "True",
                          "lastTransitionTime": "2026-12-02T11:00:00Z"}, _scheduled("True"))
    at, created = scheduled_at(raw), created_at(raw)
    assert at is not None
    assert created is not None
    assert at - created == 42.0


def test_a_pod_not_bound_has_no_scheduling_time() -> None:
    # Gated: PodScheduled is False (SchedulingGated) since creation; that is no binding.
    assert scheduled_at(_pod(None, _scheduled("False", "2026-12-02T10:00:00Z"))) is None
    assert scheduled_at(_pod("node-a", _scheduled("False"))) is None
    assert scheduled_at(_pod("node-a")) is None, "bound, but no condition to read it from"
