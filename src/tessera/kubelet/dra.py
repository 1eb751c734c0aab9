"""The kubelet-facing side of a DRA (Dynamic Resource Allocation) driver: two Unix sockets.

How the kubelet finds and uses a DRA driver (k8s.io/kubernetes v1.37
``pkg/kubelet/pluginmanager`` and ``pkg/kubelet/cm/dra``; the layout is that of the reference
helper ``k8s.io/dynamic-resource-allocation/kubeletplugin``, which NVIDIA's driver uses):

1. The driver serves ``k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`` on its endpoint,
   ``/var/lib/kubelet/plugins/<driver>/dra.sock``. It does so *first*: the kubelet never dials
   the endpoint during registration (it opens a lazy connection), so a driver that registered
   before serving would only show up as failing pods.
2. Then it serves ``pluginregistration.Registration`` on
   ``/var/lib/kubelet/plugins_registry/<driver>-reg.sock``. The kubelet's plugin watcher sees
   the socket appear (any socket there whose name does not start with ``.``), dials it (10 s),
   calls ``GetInfo`` with a **1 s** deadline (so it is answered from memory), checks
   ``type == "DRAPlugin"`` and that ``supported_versions`` lists a DRA service it speaks (1.37:
   ``v1.DRAPlugin`` or ``v1beta1.DRAPlugin``; the first match in the *plugin's* order is
   used), then calls ``NotifyRegistrationStatus`` (5 s) with the outcome. A refused
   registration is retried with exponential backoff, so the plugin may be told more than once.
3. Deleting the registration socket deregisters the driver; a socket replaced by a new one is
   deregistered and registered again (that is how a restarted driver comes back).
4. When a pod starts, the kubelet sends the pod's claims for this driver in one
   ``NodePrepareResources`` (45 s deadline); ``NodeUnprepareResources`` after it is gone. The
   response must hold an entry for *every* claim, keyed by claim UID; a non-empty ``error``
   fails that claim (and the pod's start, retried later) and its devices are ignored. Calls
   repeat for claims already (un)prepared, so the :class:`ClaimPreparer` must be idempotent.

The servicer only translates (as in our device plugins): protobuf claims become
:class:`ClaimRef` values, one :meth:`ClaimPreparer.prepare` call each, whose
:class:`PreparedClaim` (or error) becomes that claim's entry. What to create on the GPU and
which CDI devices to hand out is the preparer's business, never this module's.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import Final, Protocol

import grpc

from tessera.core.errors import InvalidInputError
from tessera.kubelet import _wire
from tessera.kubelet._wire import dra, reg

log = logging.getLogger(__name__)

KUBELET_PLUGINS_DIR: Final = "/var/lib/kubelet/plugins"
"""Parent of each driver's own directory holding its DRA endpoint (``kubeletplugin``)."""

KUBELET_REGISTRY_DIR: Final = "/var/lib/kubelet/plugins_registry"
"""``<kubelet root-dir>/plugins_registry``: where the plugin watcher looks for sockets."""

DRA_SOCKET_NAME: Final = "dra.sock"
REGISTRATION_SOCKET_SUFFIX: Final = "-reg.sock"

DRA_PLUGIN_TYPE: Final = "DRAPlugin"
"""``PluginInfo.type`` of a DRA driver (pluginregistration/v1 constants.go)."""

DRA_PLUGIN_SERVICE: Final = "v1.DRAPlugin"
"""What a plugin serving dra/v1 lists in ``supported_versions`` (dra/v1 types.go)."""

KUBELET_DRA_SERVICES: Final = (DRA_PLUGIN_SERVICE, "v1beta1.DRAPlugin")
"""DRA services the 1.37 kubelet accepts (``servicesSupportedByKubelet``)."""

KUBELET_REGISTRATION_DIAL_TIMEOUT_S: Final = 10.0
KUBELET_GET_INFO_TIMEOUT_S: Final = 1.0
KUBELET_NOTIFY_TIMEOUT_S: Final = 5.0
KUBELET_DRA_CALL_TIMEOUT_S: Final = 45.0
"""Deadline of each NodePrepareResources/NodeUnprepareResources call (whole batch)."""

STOP_GRACE_S: Final = 5.0
"""How long stop() lets an in-flight prepare finish: an answer lost is a pod start retried."""

DRIVER_NAME_MAX: Final = 63
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


# --- values the preparer sees and returns ---------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ClaimRef:
    """A ResourceClaim the kubelet asks about, as it names it (``dra.v1.Claim``)."""

    namespace: str
    uid: str
    name: str


@dataclasses.dataclass(frozen=True)
class PreparedDevice:
    """One allocated device made usable on the node (``dra.v1.Device``)."""

    request_names: tuple[str, ...]
    """Requests of the claim this device serves; empty means all of them. A subrequest
    reference ``req/sub`` is sent as ``req``, as the kubelet expects."""
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...] = ()
    """Fully qualified CDI names (``vendor.com/class=name``) the runtime injects."""
    share_id: str | None = None
    """Only for devices shared through consumable capacity; None leaves the field unset."""


@dataclasses.dataclass(frozen=True)
class PreparedClaim:
    """What preparing one claim produced."""

    devices: tuple[PreparedDevice, ...] = ()


class ClaimPreparer(Protocol):
    """The driver's policy, called once per claim and never concurrently with itself.

    Both methods may be called again for a claim they already handled (the kubelet retries
    whole batches) and must then give the same answer. A failure is returned as a message,
    or raised; either way it becomes that claim's ``error`` and the other claims proceed.
    """

    def prepare(self, claim: ClaimRef) -> PreparedClaim | str:
        """Make the claim's devices usable; the error message on failure."""
        ...

    def unprepare(self, claim: ClaimRef) -> str | None:
        """Undo :meth:`prepare` (also for a claim never prepared); None on success."""
        ...


# --- translation ----------------------------------------------------------------------------


def claim_ref(message: dra.Claim) -> ClaimRef:
    return ClaimRef(namespace=message.namespace, uid=message.uid, name=message.name)


def device_message(device: PreparedDevice) -> dra.Device:
    """The wire form of a prepared device (subrequest references cut to their request)."""
    message = dra.Device(
        request_names=[name.split("/", 1)[0] for name in device.request_names],
        pool_name=device.pool_name, device_name=device.device_name,
        cdi_device_ids=list(device.cdi_device_ids))
    if device.share_id is not None:
        message.share_id = device.share_id
    return message


def _error_text(error: BaseException) -> str:
    return str(error) or type(error).__name__


def _failure(message: str, what: str) -> str:
    """A failure is never sent as ``""``: the kubelet would read an empty error as success."""
    return message or f"{what} failed without a message"


class DraPluginServicer:
    """``dra.v1.DRAPlugin``: protobuf in, one preparer call per claim, protobuf out.

    Calls are serialized (the reference helper's default too): the kubelet may prepare two
    pods' claims at once, and a preparer that carves MIG slices must not race itself.
    """

    def __init__(self, driver_name: str, preparer: ClaimPreparer) -> None:
        self._driver = driver_name
        self._preparer = preparer
        self._lock = threading.Lock()

    def NodePrepareResources(self, request: dra.NodePrepareResourcesRequest,
                             context: grpc.ServicerContext) -> dra.NodePrepareResourcesResponse:
        response = dra.NodePrepareResourcesResponse()
        with self._lock:
            for message in request.claims:
                claim = claim_ref(message)
                response.claims[claim.uid].CopyFrom(self._prepare(claim))
        return response

    def NodeUnprepareResources(self, request: dra.NodeUnprepareResourcesRequest,
                               context: grpc.ServicerContext,
                               ) -> dra.NodeUnprepareResourcesResponse:
        response = dra.NodeUnprepareResourcesResponse()
        with self._lock:
            for message in request.claims:
                claim = claim_ref(message)
                response.claims[claim.uid].CopyFrom(self._unprepare(claim))
        return response

    def _prepare(self, claim: ClaimRef) -> dra.NodePrepareResourceResponse:
        try:
            outcome = self._preparer.prepare(claim)
            if isinstance(outcome, str):
                error = _failure(outcome, "prepare")
                log.warning("%s: preparing claim %s/%s (%s) failed: %s", self._driver,
                            claim.namespace, claim.name, claim.uid, error)
                return dra.NodePrepareResourceResponse(error=error)
            devices = [device_message(device) for device in outcome.devices]
        except Exception as exception:  # one claim's failure must not fail the batch
            log.exception("%s: preparing claim %s/%s (%s) raised", self._driver,
                          claim.namespace, claim.name, claim.uid)
            return dra.NodePrepareResourceResponse(error=_error_text(exception))
        log.info("%s: prepared claim %s/%s (%s): %s", self._driver, claim.namespace, claim.name,
                 claim.uid, ", ".join(d.device_name for d in outcome.devices) or "no devices")
        return dra.NodePrepareResourceResponse(devices=devices)

    def _unprepare(self, claim: ClaimRef) -> dra.NodeUnprepareResourceResponse:
        try:
            outcome = self._preparer.unprepare(claim)
        except Exception as exception:  # as in _prepare: the other claims still proceed
            log.exception("%s: unpreparing claim %s/%s (%s) raised", self._driver,
                          claim.namespace, claim.name, claim.uid)
            return dra.NodeUnprepareResourceResponse(error=_error_text(exception))
        if outcome is not None:
            error = _failure(outcome, "unprepare")
            log.warning("%s: unpreparing claim %s/%s (%s) failed: %s", self._driver,
                        claim.namespace, claim.name, claim.uid, error)
            return dra.NodeUnprepareResourceResponse(error=error)
        log.info("%s: unprepared claim %s/%s (%s)", self._driver, claim.namespace, claim.name,
                 claim.uid)
        return dra.NodeUnprepareResourceResponse()


class _RegistrationServicer:
    """``pluginregistration.Registration``: a fixed GetInfo and a recorder for the verdict."""

    def __init__(self, info: reg.PluginInfo, on_status: Callable[[bool, str], None]) -> None:
        self._info = info
        self._on_status = on_status

    def GetInfo(self, request: reg.InfoRequest,
                context: grpc.ServicerContext) -> reg.PluginInfo:
        return self._info

    def NotifyRegistrationStatus(self, request: reg.RegistrationStatus,
                                 context: grpc.ServicerContext) -> reg.RegistrationStatusResponse:
        # Acknowledged even when refused: the refusal is the kubelet's news, not a failed call.
        self._on_status(request.plugin_registered, request.error)
        return reg.RegistrationStatusResponse()


def validate_driver_name(name: str) -> str:
    """Return ``name``, or raise :class:`InvalidInputError`.

    The API server's rule for a driver name (``ValidateCSIDriverName``: at most 63 characters,
    a DNS subdomain once lower-cased), checked here because the name also becomes a socket
    file name and a directory: a ``/`` in it would put the socket somewhere else.
    """
    if not name:
        raise InvalidInputError("driver_name", "must not be empty")
    if len(name) > DRIVER_NAME_MAX:
        raise InvalidInputError("driver_name", f"{name!r} is longer than {DRIVER_NAME_MAX}")
    if _DNS1123_SUBDOMAIN.fullmatch(name.lower()) is None:
        raise InvalidInputError("driver_name", f"{name!r} is not a DNS subdomain "
                                "(e.g. gpu.tessera.dev)")
    return name


class DraPluginServer:
    """A DRA driver's two sockets: the DRA endpoint and the registration socket.

    ::

        server = DraPluginServer("gpu.tessera.dev", preparer)
        server.start()          # dra.sock first, then <driver>-reg.sock
        server.wait_until_registered(timeout=30)
        ...
        server.stop()           # registration socket first: the kubelet deregisters us

    ``start`` replaces stale sockets left by a crashed predecessor (never a regular file);
    ``stop`` removes both sockets. The server can be started again after a stop.
    """

    def __init__(self, driver_name: str, preparer: ClaimPreparer, *,
                 plugins_registry_dir: str | os.PathLike[str] = KUBELET_REGISTRY_DIR,
                 plugin_dir: str | os.PathLike[str] | None = None,
                 max_workers: int = 8) -> None:
        self.driver_name = validate_driver_name(driver_name)
        self.registration_socket = os.path.join(os.path.abspath(plugins_registry_dir),
                                                driver_name + REGISTRATION_SOCKET_SUFFIX)
        own_dir = (plugin_dir if plugin_dir is not None
                   else os.path.join(KUBELET_PLUGINS_DIR, driver_name))
        self.endpoint = os.path.join(os.path.abspath(own_dir), DRA_SOCKET_NAME)
        """Absolute path sent in GetInfo: the kubelet dials ``unix:<endpoint>`` as given."""
        _wire.unix_target(self.registration_socket)  # refuse over-long paths now
        _wire.unix_target(self.endpoint)
        self._preparer = preparer
        self._max_workers = max_workers
        self._info = reg.PluginInfo(type=DRA_PLUGIN_TYPE, name=driver_name,
                                    endpoint=self.endpoint,
                                    supported_versions=[DRA_PLUGIN_SERVICE])
        self._changed = threading.Condition()
        self._dra_server: grpc.Server | None = None
        self._registration_server: grpc.Server | None = None
        self._registered = False
        self._error: str | None = None
        self._notifications = 0

    # --- lifecycle -----------------------------------------------------------------------

    @property
    def serving(self) -> bool:
        return self._registration_server is not None

    def start(self) -> None:
        """Serve the DRA endpoint, then the registration socket; a no-op while serving."""
        if self.serving:
            return
        with self._changed:
            self._registered, self._error, self._notifications = False, None, 0
        servicer = DraPluginServicer(self.driver_name, self._preparer)
        self._dra_server = self._serve(
            self.endpoint, "dra", self._max_workers,
            lambda server: _wire.add_dra_plugin_servicer(servicer, server))
        registration = _RegistrationServicer(self._info, self._record_status)
        try:
            self._registration_server = self._serve(
                self.registration_socket, "dra-reg", 2,
                lambda server: _wire.add_plugin_registration_servicer(registration, server))
        except BaseException:
            self.stop()
            raise
        log.info("%s: serving DRA on %s, registration on %s", self.driver_name, self.endpoint,
                 self.registration_socket)

    def stop(self) -> None:
        """Stop serving and remove both sockets; registration goes first, so the kubelet stops
        sending work before the endpoint closes."""
        registration, endpoint = self._registration_server, self._dra_server
        self._registration_server = self._dra_server = None
        if registration is not None:
            registration.stop(grace=None).wait(timeout=STOP_GRACE_S)
            _remove_own_socket(self.registration_socket)
        if endpoint is not None:
            endpoint.stop(grace=STOP_GRACE_S).wait(timeout=STOP_GRACE_S + 1.0)
            _remove_own_socket(self.endpoint)
        with self._changed:
            self._registered = False
            self._changed.notify_all()

    def __enter__(self) -> DraPluginServer:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # --- what the kubelet told us --------------------------------------------------------

    @property
    def registered(self) -> bool:
        """The kubelet's last NotifyRegistrationStatus said registered (since start)."""
        with self._changed:
            return self._registered

    @property
    def registration_error(self) -> str | None:
        """The kubelet's error from its last refusal; None once it accepts."""
        with self._changed:
            return self._error

    @property
    def notifications(self) -> int:
        """NotifyRegistrationStatus calls received since start (refusals are retried)."""
        with self._changed:
            return self._notifications

    def wait_until_registered(self, timeout: float) -> bool:
        """Block until the kubelet accepts the registration; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not self._registered:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
            return True

    # --- internals -----------------------------------------------------------------------

    def _record_status(self, registered: bool, error: str) -> None:
        with self._changed:
            self._registered = registered
            self._error = None if registered else (error or "refused without a message")
            self._notifications += 1
            self._changed.notify_all()
        if registered:
            log.info("%s: registered with the kubelet", self.driver_name)
        else:
            log.warning("%s: the kubelet refused the registration: %s", self.driver_name,
                        error)

    def _serve(self, path: str, name: str, workers: int,
               add: Callable[[grpc.Server], None]) -> grpc.Server:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        _wire.remove_stale_socket(path)
        server = grpc.server(ThreadPoolExecutor(max_workers=workers,
                                                thread_name_prefix=f"{name}-{self.driver_name}"))
        add(server)
        if not server.add_insecure_port(_wire.unix_target(path)):
            raise OSError(f"cannot listen on {path}")
        server.start()
        return server


def _remove_own_socket(path: str) -> None:
    try:
        _wire.remove_stale_socket(path)
    except FileExistsError:
        log.warning("%s is no longer a socket; left in place", path)
