"""Client of the kubelet's PodResources API: which device ids each pod's containers hold.

Allocate carries no pod identity, so this is how the agent learns that a MIG device or MPS
share is in use (and must not be destroyed) and by whom. Answers are plain frozen dataclasses,
so callers never handle protobuf. The kubelet re-creates its socket on restart; the channel
reconnects by itself, which is why the socket path (in a mounted *directory*) is what we keep,
and calls wait (up to the timeout) for the socket to come back rather than failing at once.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from types import TracebackType

import grpc

from tessera.kubelet import _wire
from tessera.kubelet._wire import describe_rpc_error as _describe
from tessera.kubelet._wire import pr
from tessera.kubelet.constants import POD_RESOURCES_SOCKET
from tessera.kubelet.errors import PodResourcesError


@dataclasses.dataclass(frozen=True)
class ContainerDevices:
    resource_name: str
    device_ids: tuple[str, ...]
    numa_nodes: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class ContainerResources:
    name: str
    devices: tuple[ContainerDevices, ...] = ()


@dataclasses.dataclass(frozen=True)
class PodResources:
    namespace: str
    name: str
    containers: tuple[ContainerResources, ...] = ()


@dataclasses.dataclass(frozen=True)
class DeviceOwner:
    """Who holds one device id."""

    namespace: str
    pod: str
    container: str


class PodResourcesClient:
    """Blocking client; one channel, reused. Use as a context manager or call :meth:`close`."""

    def __init__(self, socket_path: str | os.PathLike[str] = POD_RESOURCES_SOCKET,
                 *, timeout: float = 10.0) -> None:
        self._socket = os.fspath(socket_path)
        self._timeout = timeout
        self._channel = _wire.unix_channel(self._socket)
        self._stub = _wire.pod_resources_stub(self._channel)

    def list(self) -> tuple[PodResources, ...]:
        """Every pod the kubelet has admitted, with the devices of each container."""
        try:
            response = self._stub.List(pr.ListPodResourcesRequest(), timeout=self._timeout,
                                     wait_for_ready=True)
        except grpc.RpcError as error:
            raise PodResourcesError(self._socket, f"List: {_describe(error)}") from error
        return tuple(_pod(p) for p in response.pod_resources)

    def get(self, namespace: str, name: str) -> PodResources:
        """One pod (kubelet 1.27+ with the KubeletPodResourcesGet gate, default on from 1.34)."""
        request = pr.GetPodResourcesRequest(pod_name=name, pod_namespace=namespace)
        try:
            response = self._stub.Get(request, timeout=self._timeout,
                                     wait_for_ready=True)
        except grpc.RpcError as error:
            raise PodResourcesError(self._socket, f"Get {namespace}/{name}: "
                                    f"{_describe(error)}") from error
        return _pod(response.pod_resources)

    def allocatable(self) -> tuple[ContainerDevices, ...]:
        """Healthy devices the kubelet knows, one entry per device (and NUMA node)."""
        try:
            response = self._stub.GetAllocatableResources(pr.AllocatableResourcesRequest(),
                                                          timeout=self._timeout,
                                     wait_for_ready=True)
        except grpc.RpcError as error:
            raise PodResourcesError(self._socket,
                                    f"GetAllocatableResources: {_describe(error)}") from error
        return tuple(_devices(d) for d in response.devices)

    def device_owners(self, resource_names: Iterable[str] | None = None,
                      ) -> dict[str, dict[str, DeviceOwner]]:
        """``{resource: {device id: owner}}`` for allocated devices, optionally filtered."""
        wanted = set(resource_names) if resource_names is not None else None
        owners: dict[str, dict[str, DeviceOwner]] = {}
        for pod in self.list():
            for container in pod.containers:
                for devs in container.devices:
                    if wanted is not None and devs.resource_name not in wanted:
                        continue
                    slot = owners.setdefault(devs.resource_name, {})
                    for device_id in devs.device_ids:
                        slot[device_id] = DeviceOwner(pod.namespace, pod.name, container.name)
        return owners

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> PodResourcesClient:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _devices(message: pr.ContainerDevices) -> ContainerDevices:
    numa = tuple(node.ID for node in message.topology.nodes) if message.HasField("topology") \
        else ()
    return ContainerDevices(message.resource_name, tuple(message.device_ids), numa)


def _pod(message: pr.PodResources) -> PodResources:
    containers = tuple(
        ContainerResources(c.name, tuple(_devices(d) for d in c.devices))
        for c in message.containers)
    return PodResources(message.namespace, message.name, containers)

