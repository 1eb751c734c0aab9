"""Turns the driver's Xid events into device health, and back again on recovery.

NVIDIA's plugin marks a device unhealthy on a critical Xid and never clears it. Tessera clears a
mark in two cases: a lost GPU that NVML can reach again, and, when ``recovery_s`` is set, a
device that has had no further critical Xid for that long (off by default, as NVIDIA does: many
Xids need a GPU reset). An event attributed to one GPU/compute instance marks only that MIG
device; an unattributed one marks the whole GPU.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from tessera.agent.advertising import Advertiser
from tessera.agent.observation import NodeObservation
from tessera.core.errors import BackendError
from tessera.nvml.backend import GpuBackend, XidEvent

__all__ = ["HealthTracker", "XidWatcher"]

log = logging.getLogger(__name__)


class HealthTracker:
    """Which devices are marked, why, and since when; what status reports per GPU."""

    def __init__(self, advertiser: Advertiser, recovery_s: float = 0.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.advertiser = advertiser
        self.recovery_s = recovery_s
        self._clock = clock
        self._lock = threading.Lock()
        self._marked: dict[str, float] = {}  # device uuid -> time of its last critical Xid
        self._last_xid: dict[str, int] = {}  # GPU uuid -> last Xid seen (any)
        self._lost: set[str] = set()

    def on_xid(self, event: XidEvent, observation: NodeObservation | None) -> bool:
        uuid = event.gpu_uuid
        if observation is not None and event.gpu_instance_id is not None:
            gpu = observation.by_uuid(event.gpu_uuid)
            for instance in gpu.instances if gpu else ():
                if instance.gi_id == event.gpu_instance_id and instance.mig_uuid:
                    uuid = instance.mig_uuid
        with self._lock:
            self._last_xid[event.gpu_uuid] = event.xid
        marked = self.advertiser.xid(uuid, event.xid)
        if marked:
            with self._lock:
                self._marked[uuid] = self._clock()
            log.warning("Xid %d on %s: marked unhealthy", event.xid, uuid)
        return marked

    def observe(self, observation: NodeObservation) -> None:
        """Clear marks that have recovered (reachable again, or quiet long enough)."""
        now = self._clock()
        reachable = {g.info.uuid for g in observation.gpus if not g.info.lost}
        known = self.advertiser.known_gpus()
        lost_now = known - reachable
        with self._lock:
            back = self._lost - lost_now
            self._lost = lost_now
            quiet = [u for u, at in self._marked.items()
                     if self.recovery_s > 0 and now - at >= self.recovery_s]
            for uuid in quiet:
                del self._marked[uuid]
        for uuid in [*back, *quiet]:
            self.advertiser.recovered(uuid)
            log.info("%s is healthy again", uuid)

    def gpu_health(self, gpu_uuid: str, mig_uuids: tuple[str, ...] = ()) -> tuple[bool, int | None]:
        with self._lock:
            marked = gpu_uuid in self._lost or gpu_uuid in self._marked or any(
                u in self._marked for u in mig_uuids)
            return not marked, self._last_xid.get(gpu_uuid)


class XidWatcher:
    """A thread waiting on the driver's event set; stops within ``poll_s`` of :meth:`stop`."""

    def __init__(self, backend: GpuBackend, tracker: HealthTracker,
                 observation: Callable[[], NodeObservation | None], poll_s: float = 0.5,
                 on_change: Callable[[], None] = lambda: None) -> None:
        self._on_change = on_change
        self._backend = backend
        self._tracker = tracker
        self._observation = observation
        self._poll_s = poll_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="xid-watcher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(self._poll_s * 4 + 1)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                event = self._backend.wait_xid(self._poll_s)
            except BackendError as exc:
                log.error("waiting for Xid events failed: %s", exc)
                self._stop.wait(self._poll_s)
                continue
            if event is not None and self._tracker.on_xid(event, self._observation()):
                self._on_change()
