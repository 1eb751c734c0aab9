"""Kubernetes Events: what an admin reads in ``kubectl describe`` to learn what happened and why.

Events are best effort: failing to post one is logged, never fatal, since the status conditions
carry the same facts durably. A recorder with ``workers`` posts them from a small pool of its
own, so a burst of a thousand pods' Events never holds up the caller (the controller's
releases waited on them, one round trip each).
"""

from __future__ import annotations

import datetime
import logging
import os
import uuid as uuid_lib
from concurrent.futures import ThreadPoolExecutor

from kubernetes import client
from kubernetes.client.exceptions import ApiException

__all__ = ["EventRecorder"]

log = logging.getLogger(__name__)


class EventRecorder:
    def __init__(self, api: client.ApiClient, component: str, *, workers: int = 0) -> None:
        self._core = client.CoreV1Api(api)
        self._component = component
        self._host = os.uname().nodename
        self._recent: dict[tuple[str, str, str], datetime.datetime] = {}
        self._pool = (ThreadPoolExecutor(workers, thread_name_prefix=f"{component}-events")
                      if workers else None)

    def record(self, *, kind: str, name: str, api_version: str, reason: str, message: str,
               warning: bool = False, namespace: str | None = None, uid: str | None = None,
               dedupe_s: float = 300.0) -> None:
        """Post one Event about an object; the same message within ``dedupe_s`` is not repeated."""
        now = datetime.datetime.now(datetime.UTC)
        key = (f"{kind}/{namespace}/{name}", reason, message)
        last = self._recent.get(key)
        if last is not None and (now - last).total_seconds() < dedupe_s:
            return
        self._recent[key] = now
        if len(self._recent) > 20_000:  # a long-lived controller sees every pod once
            self._recent = {k: t for k, t in self._recent.items()
                            if (now - t).total_seconds() < dedupe_s}
        # An Event lives in its object's namespace; one about a cluster-scoped object (a
        # NodePartition, a Node) must live in "default", as the API server insists.
        target_namespace = namespace or "default"
        body = client.CoreV1Event(
            metadata=client.V1ObjectMeta(
                name=f"{name}.{uuid_lib.uuid4().hex[:12]}", namespace=target_namespace),
            involved_object=client.V1ObjectReference(
                kind=kind, name=name, namespace=namespace, api_version=api_version, uid=uid),
            reason=reason,
            message=message[:1024],
            type="Warning" if warning else "Normal",
            source=client.V1EventSource(component=self._component, host=self._host),
            first_timestamp=now,
            last_timestamp=now,
            count=1,
            reporting_component=f"tessera.dev/{self._component}",
            reporting_instance=self._host,
        )
        if self._pool is not None:
            self._pool.submit(self._post, target_namespace, body)
        else:
            self._post(target_namespace, body)

    def _post(self, namespace: str, body: client.CoreV1Event) -> None:
        try:
            self._core.create_namespaced_event(namespace, body)
        except ApiException as exc:
            log.warning("could not post event %s on %s %s: %s", body.reason,
                        body.involved_object.kind, body.involved_object.name, exc.reason)
        except Exception as exc:  # a connection reset: an Event is not worth more
            log.warning("could not post event %s: %s", body.reason, exc)
