"""A kubelet stand-in: the kubelet's device manager and PodResources server, over real sockets.

It speaks the generated v1beta1/v1 protobuf on Unix sockets exactly as the kubelet does, so
a plugin that works against it works against the kubelet. What it copies from the kubelet
(``pkg/kubelet/cm/devicemanager``, ``plugin/v1beta1``, ``apis/podresources``):

- **Start**: delete every *socket* in the plugin directory (not the checkpoint, not
  directories), then serve ``v1beta1.Registration`` on ``kubelet.sock``.
- **Register**: refuse an unsupported version or a name failing ``IsExtendedResourceName``
  with the kubelet's messages; then, *inside* the call, dial ``<dir>/<endpoint>`` (10 s,
  blocking) and call ``GetDevicePluginOptions``; any failure is the Register error. A new
  registration for a resource replaces the old endpoint.
- **ListAndWatch**: each message replaces the resource's whole device set; capacity =
  healthy + unhealthy, allocatable = healthy (only the exact string ``"Healthy"`` counts).
  When the stream ends every device turns unhealthy and the endpoint is stopped; after the
  stop grace period (5 min) capacity is reported as 0.
- **Admission** (:meth:`KubeletStandIn.admit`): per init container then container, per
  resource: ``devicesToAllocate`` with the kubelet's checks and error strings, then
  ``GetPreferredAllocation`` (only if the plugin offers it) and ``Allocate``; the response is
  cached per container and replayed on :meth:`KubeletStandIn.run_options`, which merges
  resources first-wins and calls ``PreStartContainer`` when the plugin asks for it.
- **Restart** (:meth:`KubeletStandIn.restart`): connections drop, registered resources come
  back empty with a stopped endpoint (as from the checkpoint), allocations survive, plugin
  sockets are deleted and ``kubelet.sock`` is re-created.
- **PodResources**: ``List``, ``Get`` and ``GetAllocatableResources`` from its own state.

Not modelled: the TopologyManager (no NUMA alignment), node-status sync delay, the checkpoint
file itself, and the pluginwatcher registration path for device plugins.

:class:`DraKubelet` stands in for the other kubelet path, DRA drivers: the plugin watcher's
handshake on ``plugins_registry`` sockets and the DRA manager's Prepare/Unprepare calls, over
the real ``pluginregistration`` and ``dra/v1`` protobuf (see its docstring).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import stat
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc

from tessera.kubelet import _wire
from tessera.kubelet._wire import dp, dra, pr, reg
from tessera.kubelet.constants import (
    CHECKPOINT_NAME,
    HEALTHY,
    KUBELET_DIAL_TIMEOUT_S,
    KUBELET_SOCKET_NAME,
    PRE_START_CONTAINER_TIMEOUT_S,
    SUPPORTED_VERSIONS,
)
from tessera.kubelet.dra import (
    DRA_PLUGIN_SERVICE,
    DRA_PLUGIN_TYPE,
    KUBELET_DRA_CALL_TIMEOUT_S,
    KUBELET_DRA_SERVICES,
    KUBELET_GET_INFO_TIMEOUT_S,
    KUBELET_NOTIFY_TIMEOUT_S,
    KUBELET_REGISTRATION_DIAL_TIMEOUT_S,
    ClaimRef,
)
from tessera.kubelet.plugins import socket_id
from tessera.kubelet.resourcenames import is_extended_resource_name

ENDPOINT_STOP_GRACE_PERIOD_S = 300.0


class AdmissionError(Exception):
    """The kubelet would reject the pod (UnexpectedAdmissionError and friends)."""


@dataclasses.dataclass(frozen=True)
class Container:
    name: str
    requests: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """Extended resources requested (requests == limits for extended resources)."""


@dataclasses.dataclass(frozen=True)
class Pod:
    namespace: str
    name: str
    containers: tuple[Container, ...]
    init_containers: tuple[Container, ...] = ()
    uid: str = dataclasses.field(default_factory=lambda: str(uuid.uuid4()))


@dataclasses.dataclass(frozen=True)
class Options:
    """DevicePluginOptions as plain data."""

    pre_start_required: bool
    get_preferred_allocation_available: bool

    @classmethod
    def of(cls, message: dp.DevicePluginOptions) -> Options:
        return cls(message.pre_start_required, message.get_preferred_allocation_available)


@dataclasses.dataclass(frozen=True)
class Registration:
    """One Register call as the stand-in saw it."""

    resource_name: str
    endpoint: str
    version: str
    request_options: Options
    """Options sent in RegisterRequest (the kubelet ignores them; it asks the plugin)."""
    options: Options | None
    """What GetDevicePluginOptions answered during Register; None if it was never reached."""
    socket_present: bool
    """Whether the endpoint socket existed when Register arrived (serve-before-register)."""
    accepted: bool
    error: str | None
    at: float
    """time.monotonic() when Register finished."""


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """What the runtime gets for one container, merged across its resources (first wins)."""

    envs: dict[str, str]
    mounts: tuple[tuple[str, str, bool], ...]
    """(container_path, host_path, read_only)."""
    devices: tuple[tuple[str, str, str], ...]
    """(container_path, host_path, permissions)."""
    annotations: dict[str, str]
    cdi_devices: tuple[str, ...]


@dataclasses.dataclass
class _Endpoint:
    resource: str
    socket_path: str
    channel: grpc.Channel
    stub: _wire.DevicePluginStub
    options: dp.DevicePluginOptions
    stream: Any = None
    thread: threading.Thread | None = None
    stopped_at: float | None = None
    updates: int = 0
    """ListAndWatch messages received on this endpoint."""


@dataclasses.dataclass
class _Allocation:
    device_ids: tuple[str, ...]
    response: dp.ContainerAllocateResponse


class KubeletStandIn:
    """Serves kubelet.sock and the PodResources socket; see the module docstring.

    ::

        with short_socket_dir() as root, KubeletStandIn(root / "device-plugins") as kubelet:
            ... start plugins against kubelet.plugin_dir ...
            kubelet.wait_for_registration("nvidia.com/mig-1g.10gb", timeout=10)
            kubelet.wait_until(lambda k: k.allocatable().get("nvidia.com/mig-1g.10gb") == 2)
            pod = Pod("default", "p", (Container("c", {"nvidia.com/mig-1g.10gb": 1}),))
            kubelet.admit(pod)
            kubelet.run_options(pod, "c").envs["NVIDIA_VISIBLE_DEVICES"]
    """

    def __init__(
        self,
        plugin_dir: str | os.PathLike[str],
        *,
        pod_resources_socket: str | os.PathLike[str] | None = None,
        dial_timeout: float = KUBELET_DIAL_TIMEOUT_S,
        rpc_timeout: float = 30.0,
        stop_grace_period: float = ENDPOINT_STOP_GRACE_PERIOD_S,
    ) -> None:
        self.plugin_dir = Path(plugin_dir)
        self.kubelet_socket = self.plugin_dir / KUBELET_SOCKET_NAME
        self.pod_resources_socket = Path(
            pod_resources_socket if pod_resources_socket is not None
            else self.plugin_dir.parent / "pod-resources" / KUBELET_SOCKET_NAME)
        _wire.unix_target(self.kubelet_socket)
        _wire.unix_target(self.pod_resources_socket)
        self.dial_timeout = dial_timeout
        self.rpc_timeout = rpc_timeout
        self.stop_grace_period = stop_grace_period
        self._cond = threading.Condition()
        self._endpoints: dict[str, _Endpoint] = {}
        self._healthy: dict[str, set[str]] = {}
        self._unhealthy: dict[str, set[str]] = {}
        self._all: dict[str, dict[str, dp.Device]] = {}
        self._registrations: list[Registration] = []
        self._pods: dict[str, Pod] = {}
        self._allocations: dict[tuple[str, str, str], _Allocation] = {}
        self._admission = threading.Lock()
        """The kubelet admits pods one at a time (its sync loop); so does the stand-in."""
        self._server: grpc.Server | None = None
        self._pr_server: grpc.Server | None = None
        self.starts = 0
        self._pods_known = True
        """False from a restart until :meth:`know_pods`: PodResources lists no pods, as a real
        kubelet's does until its sync loop has run (its pod manager is empty until then)."""

    # --- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Start as the kubelet does: clean stale sockets, then serve kubelet.sock."""
        if self._server is not None:
            return
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        self.pod_resources_socket.parent.mkdir(parents=True, exist_ok=True)
        self._remove_stale_sockets()
        with self._cond:
            # From the checkpoint: every known resource is back, empty, with a stopped endpoint.
            now = time.monotonic()
            for resource in list(self._healthy.keys() | self._unhealthy.keys()):
                self._healthy[resource] = set()
                self._unhealthy[resource] = set()
                self._all[resource] = {}
                endpoint = self._endpoints.get(resource)
                if endpoint is not None and endpoint.stopped_at is None:
                    endpoint.stopped_at = now
        _wire.remove_stale_socket(self.pod_resources_socket)
        pr_server = grpc.server(ThreadPoolExecutor(max_workers=4,
                                                   thread_name_prefix="standin-podres"))
        _wire.add_pod_resources_servicer(_PodResourcesServicer(self), pr_server)
        pr_server.add_insecure_port(_wire.unix_target(self.pod_resources_socket))
        pr_server.start()
        server = grpc.server(ThreadPoolExecutor(max_workers=16,
                                                thread_name_prefix="standin-kubelet"))
        _wire.add_registration_servicer(_RegistrationServicer(self), server)
        server.add_insecure_port(_wire.unix_target(self.kubelet_socket))
        server.start()
        with self._cond:
            self._server, self._pr_server = server, pr_server
            self.starts += 1
            self._cond.notify_all()

    def stop(self) -> None:
        """Stop as a killed kubelet would: servers gone, every plugin connection dropped."""
        with self._cond:
            server, pr_server = self._server, self._pr_server
            self._server = self._pr_server = None
            endpoints = list(self._endpoints.values())
        for srv in (server, pr_server):
            if srv is not None:
                srv.stop(grace=None).wait(timeout=5.0)
        for endpoint in endpoints:
            self._close_endpoint(endpoint)
        with self._cond:
            self._cond.notify_all()

    def restart(self, *, pods_known: bool = True) -> None:
        """A kubelet restart: drop connections, delete plugin sockets, re-create kubelet.sock.

        ``pods_known=False`` holds the new kubelet in the window a real one has after it
        starts serving PodResources and before its sync loop has added its pods: ``List``
        answers, with no pods, until :meth:`know_pods` (about 0.8 s on the kubelet the e2e
        tests build, longer under load)."""
        self.stop()
        with self._cond:
            self._pods_known = pods_known
        self.start()

    def know_pods(self) -> None:
        """The restarted kubelet's sync loop has run: PodResources lists its pods again."""
        with self._cond:
            self._pods_known = True

    def __enter__(self) -> KubeletStandIn:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # --- observation ---------------------------------------------------------------------

    @property
    def registrations(self) -> list[Registration]:
        with self._cond:
            return list(self._registrations)

    def devices(self, resource: str) -> dict[str, str]:
        """``{device id: health}`` as last listed by the plugin."""
        with self._cond:
            return {i: d.health for i, d in self._all.get(resource, {}).items()}

    def capacity(self) -> dict[str, int]:
        """Healthy + unhealthy per resource; 0 once an endpoint is stopped past the grace."""
        with self._cond:
            return {r: (0 if self._expired(r) else
                        len(self._healthy.get(r, ())) + len(self._unhealthy.get(r, ())))
                    for r in self._healthy.keys() | self._unhealthy.keys()}

    def allocatable(self) -> dict[str, int]:
        """Healthy devices per resource (what the scheduler may place)."""
        with self._cond:
            return {r: 0 if self._expired(r) else len(self._healthy.get(r, ()))
                    for r in self._healthy.keys() | self._unhealthy.keys()}

    def allocated(self, resource: str) -> set[str]:
        with self._cond:
            return {i for (_, _, r), a in self._allocations.items() if r == resource
                    for i in a.device_ids}

    def updates(self, resource: str) -> int:
        """ListAndWatch messages received from the current endpoint of ``resource``."""
        with self._cond:
            endpoint = self._endpoints.get(resource)
            return endpoint.updates if endpoint is not None else 0

    def endpoint_stopped(self, resource: str) -> bool:
        with self._cond:
            endpoint = self._endpoints.get(resource)
            return endpoint is None or endpoint.stopped_at is not None

    def wait_until(self, predicate: Callable[[KubeletStandIn], bool], timeout: float = 10.0,
                   what: str = "condition") -> None:
        """Block until ``predicate(self)`` holds.

        Re-checked on every state change, and at least every 50 ms because some state (the
        stop grace period) changes with time alone.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate(self):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"kubelet stand-in: {what} not reached in {timeout} s")
                self._cond.wait(min(left, 0.05))

    def wait_for_registration(self, resource: str, *, count: int = 1,
                              timeout: float = 10.0) -> Registration:
        """The ``count``-th accepted registration of ``resource`` (waiting for it)."""
        def accepted() -> list[Registration]:
            return [r for r in self._registrations if r.resource_name == resource and r.accepted]

        self.wait_until(lambda _: len(accepted()) >= count, timeout,
                        f"registration #{count} of {resource}")
        with self._cond:
            return accepted()[count - 1]

    # --- pods ----------------------------------------------------------------------------

    def admit(self, pod: Pod) -> dict[str, dict[str, tuple[str, ...]]]:
        """Admit a pod as the kubelet's device manager does; ``{container: {resource: ids}}``.

        On failure nothing stays allocated and :class:`AdmissionError` carries the kubelet's
        message (for a plugin error: ``Allocate failed due to rpc error: code = ... desc =
        ...``).
        """
        with self._admission:
            return self._admit(pod)

    def _admit(self, pod: Pod) -> dict[str, dict[str, tuple[str, ...]]]:
        reusable: dict[str, set[str]] = {}
        result: dict[str, dict[str, tuple[str, ...]]] = {}
        with self._cond:
            self._pods[pod.uid] = pod
        try:
            for container in pod.init_containers:
                got = self._allocate_container(pod, container, reusable)
                result[container.name] = got
                for resource, ids in got.items():
                    reusable.setdefault(resource, set()).update(ids)
            for container in pod.containers:
                got = self._allocate_container(pod, container, reusable)
                result[container.name] = got
                for resource, ids in got.items():
                    reusable.get(resource, set()).difference_update(ids)
        except BaseException:
            self.remove_pod(pod.uid)
            raise
        return result

    def remove_pod(self, uid: str) -> None:
        """The pod terminated: its devices become free."""
        with self._cond:
            self._pods.pop(uid, None)
            for key in [k for k in self._allocations if k[0] == uid]:
                del self._allocations[key]
            self._cond.notify_all()

    def allocate_response(self, pod: Pod, container: str,
                          resource: str) -> dp.ContainerAllocateResponse:
        """The cached ContainerAllocateResponse (what the kubelet checkpoints)."""
        with self._cond:
            return self._allocations[(pod.uid, container, resource)].response

    def run_options(self, pod: Pod, container: str) -> RunOptions:
        """Merge the container's cached responses like ``GetDeviceRunContainerOptions``."""
        with self._cond:
            items = sorted((k[2], a) for k, a in self._allocations.items()
                           if k[0] == pod.uid and k[1] == container)
        envs: dict[str, str] = {}
        mounts: dict[str, tuple[str, str, bool]] = {}
        devices: dict[str, tuple[str, str, str]] = {}
        annotations: dict[str, str] = {}
        cdi: dict[str, None] = {}
        for resource, alloc in items:
            self._pre_start(resource, alloc.device_ids)
            response = alloc.response
            for key, value in response.envs.items():
                envs.setdefault(key, value)
            for m in response.mounts:
                mounts.setdefault(m.container_path, (m.container_path, m.host_path, m.read_only))
            for d in response.devices:
                devices.setdefault(d.container_path, (d.container_path, d.host_path,
                                                      d.permissions))
            for key, value in response.annotations.items():
                annotations.setdefault(key, value)
            for c in response.cdi_devices:
                cdi.setdefault(c.name, None)
        return RunOptions(envs, tuple(mounts.values()), tuple(devices.values()), annotations,
                          tuple(cdi))

    # --- device manager internals --------------------------------------------------------

    def _allocate_container(self, pod: Pod, container: Container,
                            reusable: dict[str, set[str]]) -> dict[str, tuple[str, ...]]:
        got: dict[str, tuple[str, ...]] = {}
        for resource, count in sorted(container.requests.items()):
            if count <= 0:
                continue
            with self._cond:
                known = resource in self._healthy or any(
                    k[2] == resource for k in self._allocations)
            if not known:
                raise AdmissionError(f"Node didn't have enough resource: {resource}, "
                                     f"requested: {count}, used: 0, capacity: 0")
            ids = self._devices_to_allocate(pod, container.name, resource, count,
                                            reusable.get(resource, set()))
            if ids is None:
                with self._cond:
                    got[resource] = self._allocations[(pod.uid, container.name,
                                                       resource)].device_ids
                continue
            with self._cond:
                endpoint = self._endpoints.get(resource)
            if endpoint is None:
                raise AdmissionError(f"unknown Device Plugin {resource}")
            if endpoint.stopped_at is not None:
                raise AdmissionError(f"Allocate failed due to endpoint {endpoint.socket_path}"
                                     " has been stopped, which is unexpected")
            try:
                response = endpoint.stub.Allocate(
                    dp.AllocateRequest(container_requests=[
                        dp.ContainerAllocateRequest(devices_ids=list(ids))]),
                    timeout=self.rpc_timeout)
            except grpc.RpcError as error:
                raise AdmissionError(f"Allocate failed due to {_go_rpc_error(error)}, "
                                     "which is unexpected") from error
            if not response.container_responses:
                raise AdmissionError("Allocate failed due to no containers return in "
                                     "allocation response, which is unexpected")
            with self._cond:
                self._allocations[(pod.uid, container.name, resource)] = _Allocation(
                    tuple(ids), response.container_responses[0])
                self._cond.notify_all()
            got[resource] = tuple(ids)
        return got

    def _devices_to_allocate(self, pod: Pod, container: str, resource: str, required: int,
                             reusable: set[str]) -> list[str] | None:
        """``devicesToAllocate``: None when the container already holds its devices."""
        with self._cond:
            previous = self._allocations.get((pod.uid, container, resource))
            needed = required
            if previous is not None:
                needed -= len(previous.device_ids)
                if needed != 0:
                    raise AdmissionError(
                        f'pod "{pod.uid}" container "{container}" changed request for resource '
                        f'"{resource}" from {len(previous.device_ids)} to {required}')
            healthy = set(self._healthy.get(resource, set()))
            if resource not in self._healthy:
                raise AdmissionError(f"cannot allocate unregistered device {resource}")
            if not healthy:
                raise AdmissionError(
                    f"no healthy devices present; cannot allocate unhealthy devices {resource}")
            if previous is not None and not healthy.issuperset(previous.device_ids):
                raise AdmissionError("previously allocated devices are no longer healthy; "
                                     f"cannot allocate unhealthy devices {resource}")
            if needed == 0:
                return None
            allocated: list[str] = []
            for device in sorted(reusable - set(allocated)):
                if needed == 0:
                    break
                allocated.append(device)
                needed -= 1
            if needed == 0:
                return allocated
            in_use = {i for (_, _, r), a in self._allocations.items() if r == resource
                      for i in a.device_ids}
            available = healthy - in_use
            if len(available) < needed:
                raise AdmissionError(f"requested number of devices unavailable for {resource}. "
                                     f"Requested: {needed}, Available: {len(available)}")
            endpoint = self._endpoints.get(resource)
        preferred: list[str] = []
        if (endpoint is not None and endpoint.stopped_at is None
                and endpoint.options.get_preferred_allocation_available):
            request = dp.PreferredAllocationRequest(container_requests=[
                dp.ContainerPreferredAllocationRequest(
                    available_deviceIDs=sorted(available | set(allocated)),
                    must_include_deviceIDs=list(allocated), allocation_size=required)])
            try:
                answer = endpoint.stub.GetPreferredAllocation(request, timeout=self.rpc_timeout)
            except grpc.RpcError as error:
                raise AdmissionError("device plugin GetPreferredAllocation rpc failed with err: "
                                     f"{_go_rpc_error(error)}") from error
            if answer.container_responses:
                preferred = list(answer.container_responses[0].deviceIDs)
        for device in [*[p for p in preferred if p in available], *sorted(available)]:
            if needed == 0:
                break
            if device not in allocated:
                allocated.append(device)
                needed -= 1
        return allocated

    def _pre_start(self, resource: str, device_ids: Sequence[str]) -> None:
        with self._cond:
            endpoint = self._endpoints.get(resource)
        if endpoint is None or not endpoint.options.pre_start_required:
            return
        try:
            endpoint.stub.PreStartContainer(
                dp.PreStartContainerRequest(devices_ids=list(device_ids)),
                timeout=PRE_START_CONTAINER_TIMEOUT_S)
        except grpc.RpcError as error:
            raise AdmissionError("device plugin PreStartContainer rpc failed with err: "
                                 f"{_go_rpc_error(error)}") from error

    def _expired(self, resource: str) -> bool:
        endpoint = self._endpoints.get(resource)
        return (endpoint is not None and endpoint.stopped_at is not None
                and time.monotonic() - endpoint.stopped_at > self.stop_grace_period)

    def _remove_stale_sockets(self) -> None:
        for entry in self.plugin_dir.iterdir():
            if entry.name == CHECKPOINT_NAME:
                continue
            try:
                if stat.S_ISSOCK(entry.lstat().st_mode):
                    entry.unlink()
            except FileNotFoundError:
                continue

    # --- registration and streams ----------------------------------------------------------

    def _register(self, request: dp.RegisterRequest) -> str | None:
        """Handle Register; returns the error message, or None when accepted."""
        socket_path = os.path.join(self.plugin_dir, request.endpoint)
        present = _is_socket(socket_path)
        options: dp.DevicePluginOptions | None = None
        error: str | None = None
        if request.version not in SUPPORTED_VERSIONS:
            error = (f"requested API version {json.dumps(request.version)} is not supported by "
                     f"kubelet. Supported version is {json.dumps(list(SUPPORTED_VERSIONS))}")
        elif not is_extended_resource_name(request.resource_name):
            error = f"the ResourceName {json.dumps(request.resource_name)} is invalid"
        else:
            channel = _wire.unix_channel(socket_path)
            try:
                grpc.channel_ready_future(channel).result(timeout=self.dial_timeout)
            except grpc.FutureTimeoutError:
                error = ("failed to dial device plugin: context deadline exceeded "
                         f"({socket_path})")
            if error is None:
                stub = _wire.device_plugin_stub(channel)
                try:
                    options = stub.GetDevicePluginOptions(dp.Empty(), timeout=self.rpc_timeout)
                except grpc.RpcError as rpc_error:
                    error = f"failed to get device plugin options: {_go_rpc_error(rpc_error)}"
            if error is not None:
                channel.close()
            else:
                assert options is not None
                self._connect(request.resource_name, socket_path, channel, stub, options)
        record = Registration(
            resource_name=request.resource_name, endpoint=request.endpoint,
            version=request.version, request_options=Options.of(request.options),
            options=Options.of(options) if options is not None else None,
            socket_present=present, accepted=error is None, error=error, at=time.monotonic())
        with self._cond:
            self._registrations.append(record)
            self._cond.notify_all()
        return error

    def _connect(self, resource: str, socket_path: str, channel: grpc.Channel,
                 stub: _wire.DevicePluginStub, options: dp.DevicePluginOptions) -> None:
        endpoint = _Endpoint(resource, socket_path, channel, stub, options)
        with self._cond:
            old = self._endpoints.get(resource)
            self._endpoints[resource] = endpoint
            self._healthy.setdefault(resource, set())
            self._unhealthy.setdefault(resource, set())
            self._all.setdefault(resource, {})
            self._cond.notify_all()
        if old is not None:
            self._close_endpoint(old)
        endpoint.stream = stub.ListAndWatch(dp.Empty())
        endpoint.thread = threading.Thread(target=self._consume, args=(endpoint,),
                                           name=f"standin-law-{resource}", daemon=True)
        endpoint.thread.start()

    def _consume(self, endpoint: _Endpoint) -> None:
        try:
            for response in endpoint.stream:
                with self._cond:
                    if self._endpoints.get(endpoint.resource) is not endpoint:
                        break
                    devices = {d.ID: d for d in response.devices}
                    self._all[endpoint.resource] = devices
                    self._healthy[endpoint.resource] = {i for i, d in devices.items()
                                                        if d.health == HEALTHY}
                    self._unhealthy[endpoint.resource] = {i for i, d in devices.items()
                                                          if d.health != HEALTHY}
                    endpoint.updates += 1
                    self._cond.notify_all()
        except grpc.RpcError:
            pass  # "ListAndWatch ended unexpectedly"
        with self._cond:
            if self._endpoints.get(endpoint.resource) is endpoint:
                # markResourceUnhealthy: every device of the resource becomes unhealthy.
                resource = endpoint.resource
                self._unhealthy[resource] = self._unhealthy.get(resource, set()) | \
                    self._healthy.get(resource, set())
                self._healthy[resource] = set()
                for device in self._all.get(resource, {}).values():
                    device.health = "Unhealthy"
                if endpoint.stopped_at is None:
                    endpoint.stopped_at = time.monotonic()
            self._cond.notify_all()

    def _close_endpoint(self, endpoint: _Endpoint) -> None:
        if endpoint.stream is not None:
            endpoint.stream.cancel()
        endpoint.channel.close()
        if endpoint.thread is not None and endpoint.thread is not threading.current_thread():
            endpoint.thread.join(timeout=5.0)

    # --- PodResources views ----------------------------------------------------------------

    def _list_pods(self) -> list[pr.PodResources]:
        with self._cond:
            pods = list(self._pods.values()) if self._pods_known else []
            allocations = dict(self._allocations)
            all_devices = {r: dict(d) for r, d in self._all.items()}
        out = []
        for pod in pods:
            containers = []
            for container in (*pod.init_containers, *pod.containers):
                devices = []
                for (uid, name, resource), alloc in sorted(allocations.items()):
                    if uid != pod.uid or name != container.name:
                        continue
                    by_numa: dict[int | None, list[str]] = {}
                    for device_id in alloc.device_ids:
                        device = all_devices.get(resource, {}).get(device_id)
                        nodes = [n.ID for n in device.topology.nodes] if device else []
                        by_numa.setdefault(nodes[0] if nodes else None, []).append(device_id)
                    for numa, ids in by_numa.items():
                        entry = pr.ContainerDevices(resource_name=resource, device_ids=ids)
                        if numa is not None:
                            entry.topology.nodes.add(ID=numa)
                        devices.append(entry)
                containers.append(pr.ContainerResources(name=container.name, devices=devices))
            out.append(pr.PodResources(name=pod.name, namespace=pod.namespace,
                                       containers=containers))
        return out

    def _allocatable_devices(self) -> list[pr.ContainerDevices]:
        with self._cond:
            snapshot = {r: [self._all[r][i] for i in sorted(ids) if i in self._all.get(r, {})]
                        for r, ids in self._healthy.items()}
        out = []
        for resource, devices in sorted(snapshot.items()):
            for device in devices:
                nodes = [n.ID for n in device.topology.nodes]
                if not nodes:
                    out.append(pr.ContainerDevices(resource_name=resource,
                                                   device_ids=[device.ID]))
                for node in nodes:
                    entry = pr.ContainerDevices(resource_name=resource, device_ids=[device.ID])
                    entry.topology.nodes.add(ID=node)
                    out.append(entry)
        return out


class _RegistrationServicer:
    def __init__(self, kubelet: KubeletStandIn) -> None:
        self._kubelet = kubelet

    def Register(self, request: dp.RegisterRequest, context: grpc.ServicerContext) -> dp.Empty:
        error = self._kubelet._register(request)
        if error is not None:
            context.abort(grpc.StatusCode.UNKNOWN, error)
        return dp.Empty()


class _PodResourcesServicer:
    def __init__(self, kubelet: KubeletStandIn) -> None:
        self._kubelet = kubelet

    def List(self, request: pr.ListPodResourcesRequest,
             context: grpc.ServicerContext) -> pr.ListPodResourcesResponse:
        return pr.ListPodResourcesResponse(pod_resources=self._kubelet._list_pods())

    def Get(self, request: pr.GetPodResourcesRequest,
            context: grpc.ServicerContext) -> pr.GetPodResourcesResponse:
        for pod in self._kubelet._list_pods():
            if pod.name == request.pod_name and pod.namespace == request.pod_namespace:
                return pr.GetPodResourcesResponse(pod_resources=pod)
        context.abort(grpc.StatusCode.UNKNOWN, f"pod {request.pod_name} in namespace "
                      f"{request.pod_namespace} not found")
        raise AssertionError("unreachable")  # pragma: no cover

    def GetAllocatableResources(self, request: pr.AllocatableResourcesRequest,
                                context: grpc.ServicerContext,
                                ) -> pr.AllocatableResourcesResponse:
        return pr.AllocatableResourcesResponse(devices=self._kubelet._allocatable_devices())


# --- DRA: the plugin watcher and the DRA plugin manager --------------------------------------


@dataclasses.dataclass(frozen=True)
class DraRegistration:
    """One registration attempt on a socket in plugins_registry, as the stand-in made it."""

    socket_path: str
    plugin_type: str | None
    """``PluginInfo.type``; None when GetInfo was never answered."""
    name: str
    endpoint: str
    """As the kubelet uses it: the plugin's endpoint, or the socket path when that is empty."""
    supported_versions: tuple[str, ...]
    service: str | None
    """The DRA service chosen (first of the plugin's list the kubelet speaks)."""
    endpoint_present: bool
    """Whether the DRA endpoint socket existed at registration (serve before registering)."""
    accepted: bool
    error: str | None
    notified: bool
    """NotifyRegistrationStatus reached the plugin."""


@dataclasses.dataclass
class _DraPlugin:
    driver: str
    endpoint: str
    service: str
    socket_path: str
    socket_id: tuple[int, int, int] | None
    channel: grpc.Channel
    stub: _wire.DraPluginStub


class DraKubelet:
    """The kubelet's plugin watcher and DRA plugin manager, driven step by step by a test.

    What it copies (``pluginmanager/operationexecutor``, ``cm/dra/plugin``, ``cm/dra``):

    - **Watch**: every socket under the registry directory whose name does not start with
      ``.`` is a plugin; :meth:`sync` is one reconciler pass: sockets gone or replaced (new
      inode) are deregistered, sockets not registered yet (or refused before) are registered.
    - **Register**: dial (10 s, blocking); ``GetInfo`` (1 s); only type ``DRAPlugin`` has a
      handler; an empty endpoint means the socket itself; ``supported_versions`` must list a
      service of ``services``, the first in the plugin's order is chosen; an endpoint already
      registered for the driver is refused; then ``NotifyRegistrationStatus`` (5 s) with the
      kubelet's error strings. The endpoint is *not* dialed: the connection is lazy.
    - **Prepare/Unprepare**: one call per driver for the given claims, 45 s deadline, to the
      driver's latest registration; :func:`dra_response_error` is what the kubelet concludes.

    Not modelled: the exponential backoff between retries, ResourceSlice wiping, health
    streams, and the v1beta1 DRA service (accepted at registration like the kubelet does, but
    calls go out as v1 only).
    """

    def __init__(self, registry_dir: str | os.PathLike[str], *,
                 services: Sequence[str] = KUBELET_DRA_SERVICES,
                 dial_timeout: float = KUBELET_REGISTRATION_DIAL_TIMEOUT_S,
                 get_info_timeout: float = KUBELET_GET_INFO_TIMEOUT_S,
                 notify_timeout: float = KUBELET_NOTIFY_TIMEOUT_S,
                 call_timeout: float = KUBELET_DRA_CALL_TIMEOUT_S) -> None:
        self.registry_dir = Path(registry_dir)
        self.services = tuple(services)
        self.dial_timeout = dial_timeout
        self.get_info_timeout = get_info_timeout
        self.notify_timeout = notify_timeout
        self.call_timeout = call_timeout
        self._lock = threading.Lock()
        self._plugins: list[_DraPlugin] = []
        self._registrations: list[DraRegistration] = []

    def __enter__(self) -> DraKubelet:
        self.registry_dir.mkdir(parents=True, exist_ok=True)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Drop every driver connection (a stopped kubelet)."""
        with self._lock:
            plugins, self._plugins = self._plugins, []
        for plugin in plugins:
            plugin.channel.close()

    # --- observation ---------------------------------------------------------------------

    @property
    def registrations(self) -> list[DraRegistration]:
        with self._lock:
            return list(self._registrations)

    def drivers(self) -> dict[str, str]:
        """``{driver name: endpoint}`` of the registered drivers (latest registration wins)."""
        with self._lock:
            return {p.driver: p.endpoint for p in self._plugins}

    def sockets(self) -> list[str]:
        """The sockets the plugin watcher would hand to the reconciler."""
        found = []
        for folder, _, files in os.walk(self.registry_dir):
            for name in files:
                path = os.path.join(folder, name)
                if not name.startswith(".") and _is_socket(path):
                    found.append(path)
        return sorted(found)

    # --- the reconciler ------------------------------------------------------------------

    def sync(self) -> list[DraRegistration]:
        """One reconciler pass; returns the registration attempts it made."""
        present = {path: socket_id(path) for path in self.sockets()}
        with self._lock:
            gone: list[_DraPlugin] = []
            kept: list[_DraPlugin] = []
            for plugin in self._plugins:
                still_there = present.get(plugin.socket_path) == plugin.socket_id
                (kept if still_there else gone).append(plugin)
            self._plugins = kept
            known = {(p.socket_path, p.socket_id) for p in kept}
        for plugin in gone:
            plugin.channel.close()
        return [self.register(path) for path, identity in present.items()
                if (path, identity) not in known]

    def wait_for_driver(self, driver: str, timeout: float = 10.0) -> str:
        """Sync until ``driver`` is registered (as the watcher would notice it); its endpoint."""
        deadline = time.monotonic() + timeout
        while True:
            self.sync()
            endpoint = self.drivers().get(driver)
            if endpoint is not None:
                return endpoint
            if time.monotonic() > deadline:
                raise TimeoutError(f"DRA kubelet stand-in: {driver} not registered in "
                                   f"{timeout} s")
            time.sleep(0.05)

    def register(self, socket_path: str | os.PathLike[str]) -> DraRegistration:
        """Register the plugin behind one socket, as ``GenerateRegisterPluginFunc`` does."""
        path = os.fspath(socket_path)
        identity = socket_id(path)
        channel = _wire.unix_channel(path)
        try:
            return self._register(path, identity, channel)
        finally:
            channel.close()

    def _register(self, path: str, identity: tuple[int, int, int] | None,
                  channel: grpc.Channel) -> DraRegistration:
        try:
            grpc.channel_ready_future(channel).result(timeout=self.dial_timeout)
        except grpc.FutureTimeoutError:
            return self._record(DraRegistration(
                path, None, "", "", (), None, endpoint_present=False, accepted=False,
                error=f"RegisterPlugin error -- dial failed at socket {path}, err: failed to "
                      f"dial socket {path}, err: context deadline exceeded", notified=False))
        stub = _wire.plugin_registration_stub(channel)
        try:
            info = stub.GetInfo(reg.InfoRequest(), timeout=self.get_info_timeout)
        except grpc.RpcError as error:
            return self._record(DraRegistration(
                path, None, "", "", (), None, endpoint_present=False, accepted=False,
                error="RegisterPlugin error -- failed to get plugin info using RPC GetInfo at "
                      f"socket {path}, err: {_go_rpc_error(error)}", notified=False))
        endpoint = info.endpoint or path
        present = _is_socket(endpoint)
        service, problem = self._validate(path, info, endpoint)
        notified = True
        try:
            stub.NotifyRegistrationStatus(
                reg.RegistrationStatus(plugin_registered=problem is None, error=problem or ""),
                timeout=self.notify_timeout)
        except grpc.RpcError as error:
            notified = False
            what = "failed to send error" if problem else "failed to send registration status"
            problem = (f"RegisterPlugin error -- {what} at socket {path}, err: "
                       f"{problem + ': ' if problem else ''}{_go_rpc_error(error)}")
        if problem is None:
            assert service is not None
            connection = _wire.unix_channel(endpoint)  # lazy, like grpc.NewClient
            with self._lock:
                self._plugins.append(_DraPlugin(info.name, endpoint, service, path, identity,
                                                connection, _wire.dra_plugin_stub(connection)))
        return self._record(DraRegistration(
            path, info.type, info.name, endpoint, tuple(info.supported_versions), service,
            endpoint_present=present, accepted=problem is None, error=problem,
            notified=notified))

    def _record(self, attempt: DraRegistration) -> DraRegistration:
        with self._lock:
            self._registrations.append(attempt)
        return attempt

    def _validate(self, path: str, info: reg.PluginInfo,
                  endpoint: str) -> tuple[str | None, str | None]:
        """The handler lookup, ``ValidatePlugin`` and ``RegisterPlugin`` checks: (the chosen
        service, None) or (None, the error the kubelet notifies)."""
        if info.type != DRA_PLUGIN_TYPE:
            return None, (f"RegisterPlugin error -- no handler registered for plugin type: "
                          f"{info.type} at socket {path}")
        service, invalid = self._choose_service(list(info.supported_versions))
        if invalid is not None:
            return None, ("RegisterPlugin error -- plugin validation failed with err: invalid "
                          f"supported gRPC versions of DRA driver plugin {info.name} at "
                          f"endpoint {endpoint}: {invalid}")
        with self._lock:
            taken = any(p.driver == info.name and p.endpoint == endpoint for p in self._plugins)
        if taken:
            return None, ("RegisterPlugin error -- plugin registration failed with err: "
                          f"endpoint {endpoint} already registered for DRA driver plugin "
                          f"{info.name}")
        return service, None

    def _choose_service(self, offered: list[str]) -> tuple[str | None, str | None]:
        """``validateSupportedServices``: (chosen service, None) or (None, the error)."""
        if not offered:
            return None, "empty list of supported gRPC services (aka supported versions)"
        for candidate in offered:
            if candidate in self.services:
                return candidate, None
        return None, (f"none of services supported by the plugin ({_go_quote(offered)}) are "
                      f"supported by the kubelet ({_go_quote(self.services)})")

    # --- claims --------------------------------------------------------------------------

    def prepare(self, driver: str, claims: Sequence[ClaimRef]) -> dra.NodePrepareResourcesResponse:
        """One NodePrepareResources for ``claims``; the response as the driver sent it."""
        plugin = self._plugin(driver)
        request = dra.NodePrepareResourcesRequest(claims=[_claim(c) for c in claims])
        try:
            return plugin.stub.NodePrepareResources(request, timeout=self.call_timeout)
        except grpc.RpcError as error:
            raise AdmissionError(f"NodePrepareResources: {_go_rpc_error(error)}") from error

    def unprepare(self, driver: str,
                  claims: Sequence[ClaimRef]) -> dra.NodeUnprepareResourcesResponse:
        """One NodeUnprepareResources for ``claims``; the response as the driver sent it."""
        plugin = self._plugin(driver)
        request = dra.NodeUnprepareResourcesRequest(claims=[_claim(c) for c in claims])
        try:
            return plugin.stub.NodeUnprepareResources(request, timeout=self.call_timeout)
        except grpc.RpcError as error:
            raise AdmissionError(f"NodeUnprepareResources: {_go_rpc_error(error)}") from error

    def _plugin(self, driver: str) -> _DraPlugin:
        with self._lock:
            plugins = [p for p in self._plugins if p.driver == driver]
        if not plugins:
            raise AdmissionError(f"DRA driver {driver} is not registered")
        plugin = plugins[-1]
        if plugin.service != DRA_PLUGIN_SERVICE:
            raise NotImplementedError(f"the stand-in calls only {DRA_PLUGIN_SERVICE}, "
                                      f"{driver} chose {plugin.service}")
        return plugin


def dra_response_error(
    method: str, claims: Sequence[ClaimRef],
    response: dra.NodePrepareResourcesResponse | dra.NodeUnprepareResourcesResponse,
) -> str | None:
    """What the kubelet's DRA manager makes of a response: None if it accepts it, else its
    error (``method`` is ``NodePrepareResources`` or ``NodeUnprepareResources``)."""
    names = {c.uid: c.name for c in claims}
    for uid, result in response.claims.items():
        if uid not in names:
            return f"{method} returned result for unknown claim UID {uid}"
        if result.error:
            return f"{method} failed for ResourceClaim {names[uid]}: {result.error}"
    unfinished = len(claims) - len(response.claims)
    if unfinished:
        return f"{method} skipped {unfinished} ResourceClaims"
    return None


def _claim(claim: ClaimRef) -> dra.Claim:
    return dra.Claim(namespace=claim.namespace, uid=claim.uid, name=claim.name)


def _go_quote(items: Sequence[str]) -> str:
    """A string slice as Go's ``%q`` prints it: ``["a" "b"]``."""
    return "[" + " ".join(json.dumps(item) for item in items) + "]"


def _go_rpc_error(error: grpc.RpcError) -> str:
    """A gRPC error the way Go's status package prints it."""
    code = error.code() if hasattr(error, "code") else None
    name = "".join(part.capitalize() for part in str(getattr(code, "name", code)).split("_"))
    details = error.details() if hasattr(error, "details") else ""
    return f"rpc error: code = {name} desc = {details}"


def _is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.lstat(path).st_mode)
    except OSError:
        return False


@contextmanager
def short_socket_dir(prefix: str = "ts-") -> Iterator[Path]:
    """A fresh directory under /tmp short enough for Unix socket paths (107 bytes).

    pytest's ``tmp_path`` can be long enough that ``<tmp>/device-plugins/tessera-...sock``
    does not fit; this keeps test sockets binding everywhere. Removed afterwards.
    """
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)
