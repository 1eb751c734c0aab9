"""End-to-end tests on a real control plane and real kubelets (``tessera.testing.cluster``).

One control plane and one GPU node serve the whole session; every test here is marked ``e2e``.
Without the binaries (``make cluster-bins``) the tests skip locally and fail under ``CI=true``.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from tessera.testing.cluster import Cluster, Node, log_excerpts
from tessera.testing.cluster.fixtures import cluster, cluster_binaries

__all__ = ["cluster", "cluster_binaries"]

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in Path(item.path).parents:
            item.add_marker(pytest.mark.e2e)


_STARTED = pytest.StashKey[float]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_STARTED] = time.time() - 1.0  # mtimes are coarse on some filesystems


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Generator[None, pytest.TestReport, None]:
    """A failed test's report carries what the components logged while it ran: the logs go
    with the cluster, and CI keeps only pytest's output."""
    outcome = yield
    report = outcome.get_result()
    running = getattr(item, "funcargs", {}).get("cluster")
    if report.failed and isinstance(running, Cluster) and _STARTED in item.stash:
        text = log_excerpts(running.root, item.stash[_STARTED])
        if text:
            report.sections.append((f"component logs ({call.when})", text))


@pytest.fixture(scope="session")
def gpu_node(cluster: Cluster) -> Iterator[Node]:
    """The session's one simulated GPU node; tests register their own device plugins on it."""
    node = cluster.add_node("gpu-node-1", labels={"tessera.dev/test-node": "true"})
    yield node
    cluster.remove_node(node.name)
