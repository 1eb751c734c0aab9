"""Connect to the API server: an explicit kubeconfig, the in-cluster service account, or the
user's default kubeconfig, in that order."""

from __future__ import annotations

import os

from kubernetes import client, config

from tessera.core.errors import InvalidInputError

__all__ = ["api_client"]


def api_client(kubeconfig: str | None = None) -> client.ApiClient:
    if kubeconfig:
        if not os.path.exists(kubeconfig):
            raise InvalidInputError("--kubeconfig", f"{kubeconfig} does not exist")
        return config.new_client_from_config(config_file=kubeconfig)
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config()
        return client.ApiClient()
    try:
        return config.new_client_from_config()
    except config.ConfigException as exc:
        raise InvalidInputError(
            "--kubeconfig", "no in-cluster service account and no kubeconfig found; pass "
            "--kubeconfig FILE") from exc
