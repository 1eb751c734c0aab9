"""The plugin side of registration: one Register call on the kubelet's kubelet.sock."""

from __future__ import annotations

import os

import grpc

from tessera.kubelet import _wire
from tessera.kubelet._wire import describe_rpc_error as _describe
from tessera.kubelet._wire import dp
from tessera.kubelet.constants import API_VERSION, KUBELET_DIAL_TIMEOUT_S
from tessera.kubelet.errors import RegistrationError

REGISTER_TIMEOUT_S = KUBELET_DIAL_TIMEOUT_S + 5.0
"""Inside Register the kubelet dials the plugin back for up to 10 s; wait a little longer."""


def register(
    kubelet_socket: str | os.PathLike[str],
    *,
    endpoint: str,
    resource_name: str,
    options: dp.DevicePluginOptions,
    timeout: float = REGISTER_TIMEOUT_S,
) -> None:
    """Register a plugin that is already serving on ``endpoint`` (a file name in the same dir).

    Raises :class:`RegistrationError` carrying the kubelet's message when the kubelet is not
    listening or refuses the request (bad version, invalid resource name, plugin not dialable).
    The call does not wait for kubelet.sock to appear: callers retry, so a kubelet that is
    restarting is picked up as soon as it serves.
    """
    if "/" in endpoint or not endpoint or endpoint.startswith("."):
        raise RegistrationError(os.fspath(kubelet_socket),
                                f"endpoint {endpoint!r} must be a plain file name not starting "
                                "with '.' (the kubelet joins it to its device-plugin directory)")
    request = dp.RegisterRequest(version=API_VERSION, endpoint=endpoint,
                                 resource_name=resource_name, options=options)
    with _wire.unix_channel(kubelet_socket) as channel:
        try:
            _wire.registration_stub(channel).Register(request, timeout=timeout)
        except grpc.RpcError as error:
            raise RegistrationError(os.fspath(kubelet_socket),
                                    f"Register {resource_name}: {_describe(error)}") from error

