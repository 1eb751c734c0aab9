"""pytest fixtures for the test cluster. Import them into a conftest::

    from tessera.testing.cluster.fixtures import cluster, cluster_binaries  # noqa: F401

One control plane per test session (it takes seconds to start and ~500 MB to run); tests share
it and must clean up the objects they create. Missing binaries skip the tests on a developer's
machine (with the command that builds them) but *fail* them under ``CI=true``: CI must never
pass by not running the end-to-end tests.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest

from tessera.testing import nvidia_host, nvml_library
from tessera.testing.cluster._cluster import Binaries, BinariesMissingError, Cluster
from tessera.testing.cluster._containerd import ContainerdBinaries, Images


def unavailable(what: str, error: Exception) -> NoReturn:
    """Skip with the reason and the fix, or fail under ``CI=true``: CI never passes by not
    running a test."""
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"CI=true and {what} missing: {error}", pytrace=False)
    pytest.skip(str(error))


def require_binaries() -> Binaries:
    """The binaries, or skip (fail under CI) with the reason and the fix."""
    try:
        return Binaries.locate()
    except BinariesMissingError as error:
        unavailable("the test cluster binaries are", error)


def require_real_runtime() -> tuple[ContainerdBinaries, Images]:
    """containerd and runc (``make containerd``) and Tessera's image (``make image``), or
    skip (fail under CI) with what is missing and the command that makes it."""
    try:
        return ContainerdBinaries.locate(), Images.locate()
    except FileNotFoundError as missing:
        unavailable("the real runtime or the image is", missing)


def require_nvml_library() -> Path:
    """The simulated ``libnvidia-ml.so.1`` (``make nvml-lib``), or skip (fail under CI)."""
    try:
        return nvml_library.locate()
    except FileNotFoundError as missing:
        unavailable("the simulated libnvidia-ml.so.1 is", missing)


def require_nvidia_tools() -> Path:
    """NVIDIA's mig-parted and device plugin (``make nvidia-tools``), or skip (fail under CI)."""
    try:
        return nvidia_host.tools()
    except FileNotFoundError as missing:
        unavailable("NVIDIA's tools are", missing)


@pytest.fixture(scope="session")
def cluster_binaries() -> Binaries:
    """The Go-built binaries (``make cluster-bins``)."""
    return require_binaries()


@pytest.fixture(scope="session")
def cluster(cluster_binaries: Binaries) -> Iterator[Cluster]:
    """A running control plane shared by the whole session, stopped at its end (also when
    tests failed; and if pytest itself is killed, its children die with it)."""
    running = Cluster(binaries=cluster_binaries)
    try:
        running.start()
        yield running
    finally:
        running.stop()
