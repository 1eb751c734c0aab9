"""Device plugin gRPC servers: one per resource name, each on its own Unix socket.

Lifecycle, as the kubelet requires it (see reference/kubelet_deviceplugin_behaviour.json):

1. :class:`DevicePluginServer` starts serving ``v1beta1.DevicePlugin`` on
   ``<plugin dir>/tessera-<domain>_<name>.sock`` and confirms it answers by dialing itself;
2. only then it calls ``Register`` on ``kubelet.sock``. Inside that call the kubelet dials the
   plugin back and calls ``GetDevicePluginOptions``, so the server runs on a thread pool that is
   free while ``Register`` is pending;
3. the kubelet opens ``ListAndWatch`` and reads it forever. We send the full list at once and
   again whenever the inventory changes; the stream never ends while the plugin lives (an
   ended stream makes the kubelet mark every device unhealthy).

:class:`PluginManager` owns the servers of every resource in the inventory and one watcher
thread. The watcher starts servers for resource names that appear (names never go away: a
resource with no devices stays registered advertising zero), and detects kubelet restarts: the
new kubelet deletes the plugin sockets and re-creates ``kubelet.sock``. On either sign
(our socket gone, or ``kubelet.sock`` a different file than the one we registered with) it
re-serves and re-registers, polling every 100 ms so this takes well under a second.

The servicer only translates between protobuf and :mod:`tessera.kubelet.allocation`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NoReturn

import grpc

from tessera.kubelet import _wire, allocation
from tessera.kubelet._wire import dp
from tessera.kubelet.allocation import AllocateOptions, ContainerAllocation
from tessera.kubelet.constants import (
    DEVICE_PLUGIN_DIR,
    HEALTHY,
    KUBELET_SOCKET_NAME,
    UNHEALTHY,
)
from tessera.kubelet.errors import AllocationRefusedError, RegistrationError
from tessera.kubelet.inventory import DeviceInventory, PluginDevice
from tessera.kubelet.registration import REGISTER_TIMEOUT_S, register
from tessera.kubelet.resourcenames import socket_name, validate_resource_name

log = logging.getLogger(__name__)

PLUGIN_OPTIONS = dp.DevicePluginOptions(pre_start_required=False,
                                        get_preferred_allocation_available=True)
"""What every Tessera plugin announces (as NVIDIA's does): preferred allocation, no PreStart."""


@dataclasses.dataclass(frozen=True)
class PluginSettings:
    """Where the plugins live and how they answer; defaults are the kubelet's."""

    plugin_dir: str = DEVICE_PLUGIN_DIR
    """Directory holding kubelet.sock and the plugin sockets."""
    allocate: AllocateOptions = dataclasses.field(default_factory=AllocateOptions)
    watch_interval_s: float = 0.1
    """How often the watcher checks for a kubelet restart (bounds re-registration delay)."""
    max_workers: int = 16
    """gRPC worker threads per plugin; each ListAndWatch stream holds one for its lifetime."""
    register_timeout_s: float = REGISTER_TIMEOUT_S
    self_dial_timeout_s: float = 5.0
    """How long a new server may take to answer its own GetDevicePluginOptions (NVIDIA: 5 s)."""

    @property
    def kubelet_socket(self) -> str:
        return os.path.join(self.plugin_dir, KUBELET_SOCKET_NAME)


class DevicePluginServicer:
    """``v1beta1.DevicePlugin`` for one resource: protobuf in, policy call, protobuf out."""

    def __init__(self, resource_name: str, inventory: DeviceInventory,
                 options: AllocateOptions) -> None:
        self._resource = resource_name
        self._inventory = inventory
        self._options = options
        self._stopping = threading.Event()
        self._streams_lock = threading.Lock()
        self._stream_wakers: set[threading.Event] = set()

    def stop(self) -> None:
        """End every ListAndWatch stream (only when the whole server goes away)."""
        self._stopping.set()
        with self._streams_lock:
            wakers = list(self._stream_wakers)
        for wake in wakers:
            wake.set()

    def GetDevicePluginOptions(self, request: dp.Empty,
                               context: grpc.ServicerContext) -> dp.DevicePluginOptions:
        return PLUGIN_OPTIONS

    def ListAndWatch(self, request: dp.Empty,
                     context: grpc.ServicerContext) -> Iterator[dp.ListAndWatchResponse]:
        wake = threading.Event()
        unsubscribe = self._inventory.subscribe(wake.set)
        context.add_callback(wake.set)  # the RPC ended: client gone or server stopping
        with self._streams_lock:
            self._stream_wakers.add(wake)
        try:
            last: tuple[tuple[str, bool, int | None], ...] | None = None
            while not self._stopping.is_set() and context.is_active():
                wake.clear()  # before reading, so a change after the read wakes us again
                devices = self._inventory.devices(self._resource)
                key = tuple((d.id, d.healthy, d.numa_node) for d in devices)
                if key != last:
                    last = key
                    yield list_and_watch_response(devices)
                # The timeout is only a safety net; every change and every end sets ``wake``.
                wake.wait(timeout=5.0)
        finally:
            unsubscribe()
            with self._streams_lock:
                self._stream_wakers.discard(wake)

    def GetPreferredAllocation(self, request: dp.PreferredAllocationRequest,
                               context: grpc.ServicerContext) -> dp.PreferredAllocationResponse:
        devices = self._inventory.devices(self._resource)
        responses = []
        for container in request.container_requests:
            available = list(container.available_deviceIDs)
            must = list(container.must_include_deviceIDs)
            size = container.allocation_size
            try:
                ids = allocation.preferred_allocation(available, must, size, devices)
            except Exception:  # best effort: an error here would fail the pod's admission
                log.exception("%s: preferred allocation failed; answering in kubelet order",
                              self._resource)
                ids = list(dict.fromkeys([*must, *available]))[:max(size, len(must))]
            responses.append(dp.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return dp.PreferredAllocationResponse(container_responses=responses)

    def Allocate(self, request: dp.AllocateRequest,
                 context: grpc.ServicerContext) -> dp.AllocateResponse:
        devices = self._inventory.devices(self._resource)
        responses = []
        for container in request.container_requests:
            try:
                chosen = allocation.resolve_request(self._resource, list(container.devices_ids),
                                                    devices)
                content = allocation.container_allocation(self._resource, chosen,
                                                          self._options)
            except AllocationRefusedError as refused:
                log.warning("refusing Allocate: %s", refused)
                _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(refused))
            responses.append(container_allocate_response(content))
        return dp.AllocateResponse(container_responses=responses)

    def PreStartContainer(self, request: dp.PreStartContainerRequest,
                          context: grpc.ServicerContext) -> dp.PreStartContainerResponse:
        return dp.PreStartContainerResponse()


def list_and_watch_response(devices: Sequence[PluginDevice]) -> dp.ListAndWatchResponse:
    """The wire form of a device list."""
    out = []
    for dev in devices:
        message = dp.Device(ID=dev.id, health=HEALTHY if dev.healthy else UNHEALTHY)
        if dev.numa_node is not None:
            message.topology.nodes.add(ID=dev.numa_node)
        out.append(message)
    return dp.ListAndWatchResponse(devices=out)


def container_allocate_response(content: ContainerAllocation) -> dp.ContainerAllocateResponse:
    """The wire form of one container's allocation."""
    return dp.ContainerAllocateResponse(
        envs=dict(content.envs),
        mounts=[dp.Mount(container_path=m.container_path, host_path=m.host_path,
                         read_only=m.read_only) for m in content.mounts],
        devices=[dp.DeviceSpec(container_path=n.container_path, host_path=n.host_path,
                               permissions=n.permissions) for n in content.device_nodes],
        annotations=dict(content.annotations),
        cdi_devices=[dp.CDIDevice(name=name) for name in content.cdi_devices],
    )


def _abort(context: grpc.ServicerContext, code: grpc.StatusCode, message: str) -> NoReturn:
    context.abort(code, message)
    raise AssertionError("grpc context.abort returned")  # pragma: no cover


class DevicePluginServer:
    """One resource's gRPC server on its own socket; can be stopped and served again."""

    def __init__(self, resource_name: str, inventory: DeviceInventory,
                 settings: PluginSettings) -> None:
        self.resource_name = validate_resource_name(resource_name)
        self.endpoint = socket_name(resource_name)
        self.socket_path = os.path.join(settings.plugin_dir, self.endpoint)
        _wire.unix_target(self.socket_path)  # refuse an over-long path now, not at bind time
        self._inventory = inventory
        self._settings = settings
        self._server: grpc.Server | None = None
        self._servicer: DevicePluginServicer | None = None

    @property
    def serving(self) -> bool:
        return self._server is not None

    def serve(self) -> None:
        """Listen on the socket (replacing a stale one) and check the server answers."""
        self.stop()
        os.makedirs(self._settings.plugin_dir, exist_ok=True)
        _wire.remove_stale_socket(self.socket_path)
        servicer = DevicePluginServicer(self.resource_name, self._inventory,
                                        self._settings.allocate)
        server = grpc.server(
            ThreadPoolExecutor(max_workers=self._settings.max_workers,
                               thread_name_prefix=f"plugin-{self.endpoint}"))
        _wire.add_device_plugin_servicer(servicer, server)
        if not server.add_insecure_port(_wire.unix_target(self.socket_path)):
            raise OSError(f"cannot listen on {self.socket_path}")
        server.start()
        self._server, self._servicer = server, servicer
        with _wire.unix_channel(self.socket_path) as channel:
            _wire.device_plugin_stub(channel).GetDevicePluginOptions(
                dp.Empty(), timeout=self._settings.self_dial_timeout_s)
        log.info("serving %s on %s", self.resource_name, self.socket_path)

    def register(self) -> None:
        """Register with the kubelet; the server must be serving (it is dialed back)."""
        if not self.serving:
            raise RegistrationError(self._settings.kubelet_socket,
                                    f"{self.resource_name} is not serving; serve before Register")
        register(self._settings.kubelet_socket, endpoint=self.endpoint,
                 resource_name=self.resource_name, options=PLUGIN_OPTIONS,
                 timeout=self._settings.register_timeout_s)
        log.info("registered %s with the kubelet", self.resource_name)

    def stop(self) -> None:
        """Stop serving and remove our socket file; ends ListAndWatch streams."""
        server, servicer = self._server, self._servicer
        self._server = self._servicer = None
        if servicer is not None:
            servicer.stop()
        if server is not None:
            server.stop(grace=None).wait(timeout=5.0)
            try:
                _wire.remove_stale_socket(self.socket_path)
            except FileExistsError:
                log.warning("%s is no longer a socket; left in place", self.socket_path)


@dataclasses.dataclass
class PluginStatus:
    """What the watcher knows about one resource's plugin."""

    serving: bool = False
    registered: bool = False
    registrations: int = 0
    """Successful Register calls so far (one more after each kubelet restart)."""
    last_error: str | None = None


_SocketId = tuple[int, int, int]


class PluginManager:
    """Runs a plugin per inventory resource; re-serves and re-registers after kubelet restarts.

    ::

        inventory = Inventory({"nvidia.com/mig-1g.10gb": [PluginDevice.mig(...)]})
        with PluginManager(inventory, PluginSettings(plugin_dir=...)) as plugins:
            plugins.wait_until_registered(timeout=5)
            inventory.set_devices(...)   # pushed on ListAndWatch, nothing restarts
    """

    def __init__(self, inventory: DeviceInventory, settings: PluginSettings | None = None,
                 resource_names: Iterable[str] = ()) -> None:
        self._inventory = inventory
        self._settings = settings or PluginSettings()
        self._extra = tuple(validate_resource_name(name) for name in resource_names)
        self._servers: dict[str, DevicePluginServer] = {}
        self._registered_with: dict[str, _SocketId] = {}
        self._retry_at: dict[str, float] = {}
        self._failures: dict[str, int] = {}
        self._failed_against: dict[str, _SocketId] = {}
        self._status: dict[str, PluginStatus] = {}
        self._changed = threading.Condition()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._unsubscribe: Callable[[], None] | None = None

    # --- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Serve every resource and start registering; returns without waiting for kubelet."""
        if self._thread is not None:
            return
        for name in self._inventory.resource_names():
            validate_resource_name(name)
        self._stop.clear()
        self._unsubscribe = self._inventory.subscribe(self._wake.set)
        self._reconcile()
        self._thread = threading.Thread(target=self._watch, name="tessera-plugin-watcher",
                                        daemon=True)
        self._thread.start()

    def running(self) -> bool:
        """The watcher that serves and re-registers the plugins is alive (a liveness fact:
        registration itself depends on the kubelet, which may be restarting)."""
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> None:
        """Stop the watcher and every server; sockets are removed."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10.0)
            self._thread = None
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        for server in self._servers.values():
            server.stop()
        with self._changed:
            for status in self._status.values():
                status.serving = status.registered = False
            self._changed.notify_all()

    def __enter__(self) -> PluginManager:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- observation ---------------------------------------------------------------------

    def status(self) -> dict[str, PluginStatus]:
        with self._changed:
            return {name: dataclasses.replace(s) for name, s in self._status.items()}

    def socket_path(self, resource_name: str) -> str:
        return os.path.join(self._settings.plugin_dir, socket_name(resource_name))

    def wait_until_registered(self, timeout: float,
                              resource_names: Iterable[str] | None = None) -> bool:
        """Block until every (given) resource is registered; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                names = (list(resource_names) if resource_names is not None
                         else list(self._status))
                if names and all(self._status.get(n, PluginStatus()).registered for n in names):
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)

    # --- the watcher ---------------------------------------------------------------------

    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                self._reconcile()
            except Exception:  # keep watching; a crashed watcher would never re-register
                log.exception("device plugin watcher iteration failed")
            self._wake.wait(self._settings.watch_interval_s)
            self._wake.clear()

    def _reconcile(self) -> None:
        names = dict.fromkeys([*self._inventory.resource_names(), *self._extra])
        for name in names:
            if name not in self._servers:
                self._servers[name] = DevicePluginServer(name, self._inventory, self._settings)
                self._update(name, serving=False, registered=False)
        kubelet = socket_id(self._settings.kubelet_socket)
        for name, server in self._servers.items():
            if self._stop.is_set():
                return
            registered_with = self._registered_with.get(name)
            lost_socket = server.serving and not _is_socket(server.socket_path)
            kubelet_changed = (registered_with is not None and kubelet is not None
                               and kubelet != registered_with)
            if not server.serving or lost_socket or kubelet_changed:
                if server.serving:
                    log.info("%s: kubelet restarted (%s); serving again and re-registering",
                             name, "plugin socket deleted" if lost_socket
                             else "kubelet.sock re-created")
                self._registered_with.pop(name, None)
                self._update(name, registered=False)
                try:
                    server.serve()
                except Exception as error:  # retried next tick
                    log.warning("%s: cannot serve on %s: %s", name, server.socket_path, error)
                    self._update(name, serving=False, last_error=str(error))
                    continue
                self._update(name, serving=True)
                self._retry_at[name] = 0.0
            if name not in self._registered_with:
                self._try_register(name, server, kubelet)

    def _try_register(self, name: str, server: DevicePluginServer,
                      kubelet: _SocketId | None) -> None:
        if kubelet is None:
            return  # no kubelet.sock yet; its appearance is noticed on the next tick
        last_seen = self._failed_against.get(name)
        if time.monotonic() < self._retry_at.get(name, 0.0) and last_seen == kubelet:
            return
        try:
            server.register()
        except RegistrationError as error:
            failures = self._failures.get(name, 0) + 1
            self._failures[name] = failures
            self._failed_against[name] = kubelet
            self._retry_at[name] = time.monotonic() + min(1.0, 0.1 * 2 ** (failures - 1))
            log.warning("%s: %s (attempt %d)", name, error, failures)
            self._update(name, last_error=str(error))
            return
        self._failures.pop(name, None)
        self._failed_against.pop(name, None)
        self._registered_with[name] = kubelet
        with self._changed:
            status = self._status.setdefault(name, PluginStatus())
            status.registered = True
            status.registrations += 1
            status.last_error = None
            self._changed.notify_all()

    def _update(self, name: str, **fields: object) -> None:
        with self._changed:
            status = self._status.setdefault(name, PluginStatus())
            for key, value in fields.items():
                setattr(status, key, value)
            self._changed.notify_all()


def socket_id(path: str) -> _SocketId | None:
    """Identity of the file at ``path``: a socket the kubelet re-created (kubelet.sock, the
    PodResources socket) has a new inode or ctime; None when there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_ctime_ns


def _is_socket(path: str) -> bool:
    return Path(path).is_socket()
