"""End-to-end tests on a real control plane and real kubelets (``tessera.testing.cluster``).

One control plane and one GPU node serve the whole session; every test here is marked ``e2e``.
Without the binaries (``make cluster-bins``) the tests skip locally and fail under ``CI=true``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tessera.testing.cluster import Cluster, Node
from tessera.testing.cluster.fixtures import cluster, cluster_binaries

__all__ = ["cluster", "cluster_binaries"]

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in Path(item.path).parents:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def gpu_node(cluster: Cluster) -> Iterator[Node]:
    """The session's one simulated GPU node; tests register their own device plugins on it."""
    node = cluster.add_node("gpu-node-1", labels={"tessera.dev/test-node": "true"})
    yield node
    cluster.remove_node(node.name)
