"""Leader election over a ``coordination.k8s.io`` Lease, as Kubernetes' own controllers do.

Only the holder plans; a replica that cannot renew within the lease duration stops acting
before another may take over, so two replicas never write plans at once.
"""

from __future__ import annotations

import datetime
import logging
import threading

from kubernetes import client
from kubernetes.client.exceptions import ApiException

__all__ = ["LeaderElector"]

log = logging.getLogger(__name__)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class LeaderElector:
    def __init__(self, api: client.ApiClient, namespace: str, name: str, identity: str, *,
                 lease_s: int = 15, renew_s: float = 3.0) -> None:
        self._api = client.CoordinationV1Api(api)
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_s = lease_s
        self.renew_s = renew_s
        self._leader_until: datetime.datetime | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)

    def is_leader(self) -> bool:
        until = self._leader_until
        return until is not None and _now() < until

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(self.renew_s * 2 + 1)
        if self.is_leader():
            self._release()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._try()
            except ApiException as exc:
                log.warning("lease %s/%s: %s %s", self.namespace, self.name, exc.status,
                            exc.reason)
            except Exception as exc:
                log.warning("lease %s/%s: %s", self.namespace, self.name, exc)
            self._stop.wait(self.renew_s)

    def _spec(self, acquired: datetime.datetime | None, transitions: int) -> client.V1LeaseSpec:
        now = _now()
        return client.V1LeaseSpec(holder_identity=self.identity,
                                  lease_duration_seconds=self.lease_s,
                                  acquire_time=acquired or now, renew_time=now,
                                  lease_transitions=transitions)

    def _try(self) -> None:
        started = _now()
        try:
            lease = self._api.read_namespaced_lease(self.name, self.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            body = client.V1Lease(metadata=client.V1ObjectMeta(name=self.name,
                                                               namespace=self.namespace),
                                  spec=self._spec(None, 0))
            self._api.create_namespaced_lease(self.namespace, body)
            self._became(started)
            return
        spec = lease.spec or client.V1LeaseSpec()
        holder = spec.holder_identity
        renewed = spec.renew_time or spec.acquire_time
        expired = renewed is None or (
            renewed + datetime.timedelta(seconds=spec.lease_duration_seconds or self.lease_s)
            < _now())
        if holder not in (self.identity, None, "") and not expired:
            if self.is_leader():
                log.warning("lost the lease to %s", holder)
            self._leader_until = None
            return
        transitions = (spec.lease_transitions or 0) + (0 if holder == self.identity else 1)
        acquired = spec.acquire_time if holder == self.identity else None
        lease.spec = self._spec(acquired, transitions)
        self._api.replace_namespaced_lease(self.name, self.namespace, lease)  # 409 if raced
        self._became(started)

    def _became(self, started: datetime.datetime) -> None:
        if not self.is_leader():
            log.info("%s is the leader (lease %s/%s)", self.identity, self.namespace, self.name)
        # Counted from before the request, so clock skew in the round trip only shortens it.
        self._leader_until = started + datetime.timedelta(seconds=self.lease_s * 2 / 3)

    def _release(self) -> None:
        try:
            lease = self._api.read_namespaced_lease(self.name, self.namespace)
            if lease.spec is not None and lease.spec.holder_identity == self.identity:
                lease.spec.holder_identity = ""
                lease.spec.lease_duration_seconds = 1
                self._api.replace_namespaced_lease(self.name, self.namespace, lease)
        except ApiException:
            pass
        self._leader_until = None
