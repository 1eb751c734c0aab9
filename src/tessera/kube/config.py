"""Connect to the API server: an explicit kubeconfig, the in-cluster service account, or the
user's default kubeconfig, in that order."""

from __future__ import annotations

import os

from kubernetes import client, config
from kubernetes.client import rest

from tessera.core.errors import InvalidInputError

__all__ = ["api_client"]

POOL_SIZE = 32
"""Connections kept per API server: the controller releases pods and posts Events from pools
of threads (the client's default of 4 would drop and reopen connections under a burst)."""


def api_client(kubeconfig: str | None = None, context: str | None = None) -> client.ApiClient:
    """``context`` picks a kubeconfig context (default: its current one)."""
    api = _connect(kubeconfig, context)
    api.configuration.connection_pool_maxsize = POOL_SIZE
    api.rest_client = rest.RESTClientObject(api.configuration)
    return api


def _connect(kubeconfig: str | None, context: str | None) -> client.ApiClient:
    if kubeconfig:
        if not os.path.exists(kubeconfig):
            raise InvalidInputError("--kubeconfig", f"{kubeconfig} does not exist")
        try:
            return config.new_client_from_config(config_file=kubeconfig, context=context)
        except config.ConfigException as exc:
            raise InvalidInputError("--context", f"{kubeconfig}: {exc}") from exc
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config()
        return client.ApiClient()
    try:
        return config.new_client_from_config(context=context)
    except config.ConfigException as exc:
        raise InvalidInputError(
            "--kubeconfig", "no in-cluster service account and no kubeconfig found; pass "
            "--kubeconfig FILE") from exc
