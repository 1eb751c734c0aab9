"""Typed access to the generated gRPC modules, and Unix-socket plumbing shared by all clients.

grpcio-tools generates untyped ``*_pb2_grpc`` modules (and ``grpc`` itself ships no types), so
under ``mypy --strict`` every call into them would be an untyped call. This module is the one
place that touches them: it declares the stubs we use as Protocols with message types from
the generated ``.pyi`` files and casts the generated objects to them. Method paths still come
from the generated code, so they cannot drift from proto/.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from typing import Any, Protocol, TypeVar, cast

import grpc

from tessera.kubelet._pb.deviceplugin.v1beta1 import api_pb2 as dp
from tessera.kubelet._pb.deviceplugin.v1beta1 import api_pb2_grpc as _dp_grpc_module
from tessera.kubelet._pb.dra.v1 import api_pb2 as dra
from tessera.kubelet._pb.dra.v1 import api_pb2_grpc as _dra_grpc_module
from tessera.kubelet._pb.pluginregistration.v1 import api_pb2 as reg
from tessera.kubelet._pb.pluginregistration.v1 import api_pb2_grpc as _reg_grpc_module
from tessera.kubelet._pb.podresources.v1 import api_pb2 as pr
from tessera.kubelet._pb.podresources.v1 import api_pb2_grpc as _pr_grpc_module
from tessera.kubelet.constants import UNIX_SOCKET_PATH_MAX

_dp_grpc: Any = _dp_grpc_module
_pr_grpc: Any = _pr_grpc_module
_dra_grpc: Any = _dra_grpc_module
_reg_grpc: Any = _reg_grpc_module

__all__ = ["dp", "dra", "pr", "reg"]

T_co = TypeVar("T_co", covariant=True)


class Stream(Protocol[T_co]):
    """A server-streaming call: iterate for messages, ``cancel()`` to stop."""

    def __iter__(self) -> Iterator[T_co]: ...
    def __next__(self) -> T_co: ...
    def cancel(self) -> bool: ...


class RegistrationStub(Protocol):
    """``v1beta1.Registration``: the device plugin side, served by the kubelet on kubelet.sock."""

    def Register(self, request: dp.RegisterRequest, *, timeout: float | None = None) -> dp.Empty:
        ...


class DevicePluginStub(Protocol):
    def GetDevicePluginOptions(
        self, request: dp.Empty, *, timeout: float | None = None,
    ) -> dp.DevicePluginOptions: ...

    def ListAndWatch(
        self, request: dp.Empty, *, timeout: float | None = None,
    ) -> Stream[dp.ListAndWatchResponse]: ...

    def GetPreferredAllocation(
        self, request: dp.PreferredAllocationRequest, *, timeout: float | None = None,
    ) -> dp.PreferredAllocationResponse: ...

    def Allocate(
        self, request: dp.AllocateRequest, *, timeout: float | None = None,
    ) -> dp.AllocateResponse: ...

    def PreStartContainer(
        self, request: dp.PreStartContainerRequest, *, timeout: float | None = None,
    ) -> dp.PreStartContainerResponse: ...


class PodResourcesStub(Protocol):
    def List(
        self, request: pr.ListPodResourcesRequest, *, timeout: float | None = None,
        wait_for_ready: bool | None = None,
    ) -> pr.ListPodResourcesResponse: ...

    def GetAllocatableResources(
        self, request: pr.AllocatableResourcesRequest, *, timeout: float | None = None,
        wait_for_ready: bool | None = None,
    ) -> pr.AllocatableResourcesResponse: ...

    def Get(
        self, request: pr.GetPodResourcesRequest, *, timeout: float | None = None,
        wait_for_ready: bool | None = None,
    ) -> pr.GetPodResourcesResponse: ...


class PluginRegistrationStub(Protocol):
    """``pluginregistration.Registration``: served by a plugin, called by the plugin watcher."""

    def GetInfo(self, request: reg.InfoRequest, *, timeout: float | None = None,
                ) -> reg.PluginInfo: ...

    def NotifyRegistrationStatus(
        self, request: reg.RegistrationStatus, *, timeout: float | None = None,
    ) -> reg.RegistrationStatusResponse: ...


class DraPluginStub(Protocol):
    """``k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin``: served by a DRA driver on its endpoint."""

    def NodePrepareResources(
        self, request: dra.NodePrepareResourcesRequest, *, timeout: float | None = None,
    ) -> dra.NodePrepareResourcesResponse: ...

    def NodeUnprepareResources(
        self, request: dra.NodeUnprepareResourcesRequest, *, timeout: float | None = None,
    ) -> dra.NodeUnprepareResourcesResponse: ...


def registration_stub(channel: grpc.Channel) -> RegistrationStub:
    return cast(RegistrationStub, _dp_grpc.RegistrationStub(channel))


def device_plugin_stub(channel: grpc.Channel) -> DevicePluginStub:
    return cast(DevicePluginStub, _dp_grpc.DevicePluginStub(channel))


def pod_resources_stub(channel: grpc.Channel) -> PodResourcesStub:
    return cast(PodResourcesStub, _pr_grpc.PodResourcesListerStub(channel))


def plugin_registration_stub(channel: grpc.Channel) -> PluginRegistrationStub:
    return cast(PluginRegistrationStub, _reg_grpc.RegistrationStub(channel))


def dra_plugin_stub(channel: grpc.Channel) -> DraPluginStub:
    return cast(DraPluginStub, _dra_grpc.DRAPluginStub(channel))


def add_registration_servicer(servicer: object, server: grpc.Server) -> None:
    _dp_grpc.add_RegistrationServicer_to_server(servicer, server)


def add_device_plugin_servicer(servicer: object, server: grpc.Server) -> None:
    _dp_grpc.add_DevicePluginServicer_to_server(servicer, server)


def add_pod_resources_servicer(servicer: object, server: grpc.Server) -> None:
    _pr_grpc.add_PodResourcesListerServicer_to_server(servicer, server)


def add_plugin_registration_servicer(servicer: object, server: grpc.Server) -> None:
    _reg_grpc.add_RegistrationServicer_to_server(servicer, server)


def add_dra_plugin_servicer(servicer: object, server: grpc.Server) -> None:
    _dra_grpc.add_DRAPluginServicer_to_server(servicer, server)


def unix_target(path: str | os.PathLike[str]) -> str:
    """gRPC target for a Unix socket path; refuses paths the kernel cannot bind or dial."""
    text = os.path.abspath(os.fspath(path))
    if len(text.encode()) > UNIX_SOCKET_PATH_MAX:
        raise ValueError(f"Unix socket path is longer than {UNIX_SOCKET_PATH_MAX} bytes: {text}")
    return f"unix://{text}"


def unix_channel(path: str | os.PathLike[str]) -> grpc.Channel:
    """An insecure channel to a Unix socket, with the ``localhost`` authority the kubelet uses.

    Reconnect backoff is kept short: after a kubelet restart the socket comes back within a
    second and a default (up to 120 s) backoff would hide it.
    """
    return grpc.insecure_channel(
        unix_target(path),
        options=[
            ("grpc.default_authority", "localhost"),
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1000),
            ("grpc.enable_http_proxy", 0),
        ],
    )


def describe_rpc_error(error: grpc.RpcError) -> str:
    """``CODE: details`` of a failed call (grpc's RpcError str() is a multi-line dump)."""
    code = error.code() if hasattr(error, "code") else None
    details = error.details() if hasattr(error, "details") else None
    return f"{getattr(code, 'name', code)}: {details}"


def remove_stale_socket(path: str | os.PathLike[str]) -> None:
    """Delete a leftover socket file at ``path`` (never a regular file or directory)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISSOCK(mode):
        os.unlink(path)
    else:
        raise FileExistsError(f"{os.fspath(path)} exists and is not a socket; refusing to remove")
