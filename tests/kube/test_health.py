"""The probe and metrics port: what a kubelet and Prometheus read."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter

from tessera.kube.health import HealthServer


class Flags:
    live = True
    ready = False

    def broken(self) -> bool:
        raise RuntimeError("probe crashed")


@pytest.fixture
def served() -> Iterator[tuple[HealthServer, Flags]]:
    registry = CollectorRegistry()
    Counter("tessera_test_total", "a test counter", registry=registry).inc()
    flags = Flags()
    server = HealthServer(0, registry, live=lambda: flags.live, ready=lambda: flags.ready,
                          address="127.0.0.1")
    yield server, flags
    server.close()


def get(server: HealthServer, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_readiness_follows_the_probe(served: tuple[HealthServer, Flags]) -> None:
    server, flags = served
    assert get(server, "/readyz")[0] == 503
    flags.ready = True
    assert get(server, "/readyz") == (200, "ok\n")


def test_liveness_fails_when_the_loops_stop(served: tuple[HealthServer, Flags]) -> None:
    server, flags = served
    assert get(server, "/healthz")[0] == 200
    flags.live = False
    assert get(server, "/healthz")[0] == 503


def test_metrics_and_unknown_paths(served: tuple[HealthServer, Flags]) -> None:
    server, _ = served
    status, body = get(server, "/metrics")
    assert status == 200
    assert "tessera_test_total 1.0" in body
    assert get(server, "/nope")[0] == 404


def test_a_probe_that_raises_reads_not_ok() -> None:
    flags = Flags()
    server = HealthServer(0, CollectorRegistry(), live=flags.broken, ready=flags.broken,
                          address="127.0.0.1")
    try:
        assert get(server, "/healthz")[0] == 503
    finally:
        server.close()
