"""The node's live parts: NVML backend, device plugins, PodResources, health, in one object.

Both processes that serve a node use it: ``tessera device-plugin`` (advertise what is on the
cards) and ``tessera agent`` (also reconcile the NodePartition spec). :meth:`NodeRuntime.refresh`
is the one place an observation is taken and published to the plugins, so what the kubelet is
offered is always what was last observed.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Mapping

from tessera.agent.advertising import Advertiser, MpsAdvert, TimesliceAdvert
from tessera.agent.allocations import DEFAULT_SETTLE_S, KubeletAllocations
from tessera.agent.health import HealthTracker, XidWatcher
from tessera.agent.observation import NodeObservation, observe, owners_of
from tessera.kubelet.health import XidFilter
from tessera.kubelet.inventory import Inventory
from tessera.kubelet.plugins import PluginManager, PluginSettings
from tessera.kubelet.podresources import PodResourcesClient
from tessera.nvml.backend import GpuBackend

__all__ = ["NodeRuntime", "RuntimeSettings"]

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class RuntimeSettings:
    plugins: PluginSettings = dataclasses.field(default_factory=PluginSettings)
    pod_resources_socket: str | None = "/var/lib/kubelet/pod-resources/kubelet.sock"
    """None: a node without a kubelet, where only NVML's processes say what is in use. A socket
    that is set but cannot be read makes every slice count as possibly in use."""
    pod_resources_timeout_s: float = 2.0
    kubelet_settle_s: float = DEFAULT_SETTLE_S
    """After a kubelet restart, how long at most every slice counts as possibly in use while
    the new kubelet has not listed again the devices the old one listed
    (:mod:`tessera.agent.allocations`)."""
    xid_filter: XidFilter = dataclasses.field(default_factory=XidFilter)
    xid_recovery_s: float = 0.0
    xid_poll_s: float = 0.5
    device_plugins: bool = True
    """False on a DRA node: the kubelet gets the GPUs through DRA, never both APIs at once."""


class NodeRuntime:
    def __init__(self, backend: GpuBackend, settings: RuntimeSettings | None = None) -> None:
        self.backend = backend
        self.settings = settings or RuntimeSettings()
        self.inventory = Inventory()
        self.advertiser = Advertiser(self.inventory, self.settings.xid_filter)
        self.health = HealthTracker(self.advertiser, self.settings.xid_recovery_s)
        self.plugins = PluginManager(self.inventory, self.settings.plugins)
        self._pod_resources: PodResourcesClient | None = None
        self._allocations: KubeletAllocations | None = None
        if self.settings.pod_resources_socket:
            self._pod_resources = PodResourcesClient(
                self.settings.pod_resources_socket,
                timeout=self.settings.pod_resources_timeout_s)
            self._allocations = KubeletAllocations(
                self._pod_resources, self.settings.pod_resources_socket,
                settle_s=self.settings.kubelet_settle_s)
        self._lock = threading.RLock()
        self._started = False
        self._latest: NodeObservation | None = None
        self.mps_adverts: dict[str, MpsAdvert] = {}
        self.timeslices: dict[str, TimesliceAdvert] = {}
        """Time-sliced GPUs by UUID: nothing on the card changes, only what is advertised."""
        self.health_changed: Callable[[], None] = lambda: None
        """Called after an Xid changed a device's health (the agent reconciles, to report it)."""
        self._xid = XidWatcher(backend, self.health, lambda: self._latest,
                               self.settings.xid_poll_s, self._health_changed)

    def _health_changed(self) -> None:
        self.health_changed()  # looked up per call: the agent sets it after construction

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Publish the cards and start serving; a second call does nothing."""
        if self._started:
            return
        self._started = True
        self.refresh()
        if self.settings.device_plugins:
            self.plugins.start()
        self._xid.start()

    def stop(self) -> None:
        self._xid.stop()
        self.plugins.stop()
        if self._pod_resources is not None:
            self._pod_resources.close()

    # -- observing --------------------------------------------------------------------------

    def allocations(self) -> dict[str, tuple[str, ...]] | None:
        """Device id -> pods holding it, from the kubelet; None if it cannot be asked, or has
        restarted and not listed its pods again yet (:mod:`tessera.agent.allocations`)."""
        if self._allocations is None:
            return {}
        with self._lock:
            return self._allocations.read()

    def refresh(self, mps: Mapping[str, MpsAdvert] | None = None) -> NodeObservation:
        """Observe the cards, apply health, and publish the result to the device plugins."""
        with self._lock:
            if mps is not None:
                self.mps_adverts = dict(mps)
            raw = observe(self.backend, self.allocations())
            self.health.observe(raw)
            gpus = []
            for gpu in raw.gpus:
                if gpu.info.lost:
                    gpus.append(gpu)
                    continue
                mig_uuids = tuple(i.mig_uuid for i in gpu.instances if i.mig_uuid)
                healthy, last_xid = self.health.gpu_health(gpu.info.uuid, mig_uuids)
                gpus.append(dataclasses.replace(gpu, healthy=healthy, last_xid=last_xid))
            observation = NodeObservation(gpus=tuple(gpus))
            self.advertiser.publish(observation, self.mps_adverts, self.timeslices)
            self._latest = observation
            return observation

    @property
    def latest(self) -> NodeObservation | None:
        return self._latest

    # -- the SliceGuard the executor uses before destroying -----------------------------------

    def withdraw(self, uuid: str) -> None:
        self.advertiser.withhold(uuid)
        if self._latest is not None:
            self.advertiser.publish(self._latest, self.mps_adverts, self.timeslices)

    def restore(self, uuid: str) -> None:
        self.advertiser.release(uuid)

    def set_timeslice(self, uuid: str, advert: TimesliceAdvert | None) -> None:
        """Advertise GPU ``uuid`` as replicas (None: whole again), at once."""
        with self._lock:
            if advert is None:
                self.timeslices.pop(uuid, None)
            else:
                self.timeslices[uuid] = advert
            if self._latest is not None:
                self.advertiser.publish(self._latest, self.mps_adverts, self.timeslices)

    def holders(self, uuid: str) -> tuple[str, ...] | None:
        allocations = self.allocations()
        if allocations is None:
            return None
        return owners_of(allocations, uuid)
