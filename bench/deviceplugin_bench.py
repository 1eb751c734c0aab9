"""Device plugin benchmarks over real Unix sockets, with the kubelet stand-in as the client.

Usage::

    .venv/bin/python bench/deviceplugin_bench.py            # defaults, about 10 s
    .venv/bin/python bench/deviceplugin_bench.py --quick    # smaller counts, about 3 s

Measures, against the targets of issue #3:

- Allocate latency (p50/p99) and throughput, calling the plugin socket exactly as the kubelet
  does (one ContainerAllocateRequest per call), sequentially for latency and from 8 threads
  for throughput; plus a full stand-in admission (GetPreferredAllocation + Allocate), and a
  no-op RPC (PreStartContainer) on the same channel as the floor that gRPC Python sets.
  Target: p99 <= 2 ms.
- ListAndWatch push: from an inventory change to the stand-in having the new list. Target
  <= 100 ms.
- Re-registration: from the start of a simulated kubelet restart to the plugin's accepted
  Register. Target <= 1 s.

The plugins run in a child process, as in production (the agent and the kubelet are separate
processes); in one process the client and server would contend for one GIL. Inventory changes
are sent to the child over a pipe, so the push figure includes that hop.

Everything is bounded by counts (and loopback Unix sockets only); nothing is left running.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import multiprocessing.connection
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tessera.kubelet import _wire
from tessera.kubelet._wire import dp
from tessera.kubelet.inventory import Inventory, PluginDevice
from tessera.kubelet.plugins import PluginManager, PluginSettings
from tessera.kubelet.resourcenames import socket_name
from tessera.testing import Container, KubeletStandIn, Pod, short_socket_dir

RESOURCE = "nvidia.com/mig-1g.10gb"


def _mig(gpu: int, n: int) -> PluginDevice:
    return PluginDevice.mig(f"MIG-{gpu:04x}{n:04x}-1111-4000-8000-000000000000",
                            f"GPU-{gpu:08x}-0000-4000-8000-000000000000", gpu)


def _layout(size: int) -> list[PluginDevice]:
    return [_mig(gpu, n) for gpu in range(8) for n in range(size)]


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _summary(samples_s: list[float]) -> dict[str, float]:
    ms = [s * 1000 for s in samples_s]
    return {"n": len(ms), "p50_ms": round(_pct(ms, 0.50), 3), "p99_ms": round(_pct(ms, 0.99), 3),
            "max_ms": round(max(ms), 3), "mean_ms": round(statistics.fmean(ms), 3)}


def _plugin_process(plugin_dir: str, commands: multiprocessing.connection.Connection) -> None:
    """Child process: our plugins for RESOURCE; obeys ("layout", n) and ("stop",)."""
    logging.basicConfig(level=logging.ERROR)
    inventory = Inventory({RESOURCE: _layout(7)})
    with PluginManager(inventory, PluginSettings(plugin_dir=plugin_dir)):
        commands.send("started")
        while True:
            command = commands.recv()
            if command[0] == "stop":
                break
            inventory.set_devices(RESOURCE, _layout(command[1]))
    commands.send("stopped")


def bench_allocate(socket_path: str, calls: int) -> dict[str, object]:
    ids = [d.id for d in _layout(7)]
    with _wire.unix_channel(socket_path) as channel:
        stub = _wire.device_plugin_stub(channel)

        def one(n: int) -> float:
            request = dp.AllocateRequest(container_requests=[
                dp.ContainerAllocateRequest(devices_ids=[ids[n % len(ids)]])])
            start = time.perf_counter()
            stub.Allocate(request, timeout=10)
            return time.perf_counter() - start

        def noop(n: int) -> float:
            request = dp.PreStartContainerRequest(devices_ids=[ids[n % len(ids)]])
            start = time.perf_counter()
            stub.PreStartContainer(request, timeout=10)
            return time.perf_counter() - start

        for n in range(min(200, calls)):  # warm up the channel and the server's threads
            one(n)
        latency = [one(n) for n in range(calls)]
        baseline = [noop(n) for n in range(calls)]
        with ThreadPoolExecutor(max_workers=8) as pool:
            start = time.perf_counter()
            list(pool.map(one, range(calls)))
            elapsed = time.perf_counter() - start
    return {"sequential": _summary(latency),
            "noop_rpc_baseline": _summary(baseline),
            "throughput_per_s_8_threads": round(calls / elapsed)}


def bench_admission(kubelet: KubeletStandIn, pods: int) -> dict[str, float]:
    samples = []
    for n in range(pods):
        pod = Pod("bench", f"p{n}", (Container("c", {RESOURCE: 2}),))
        start = time.perf_counter()
        kubelet.admit(pod)
        samples.append(time.perf_counter() - start)
        kubelet.remove_pod(pod.uid)
    return _summary(samples)


def bench_push(kubelet: KubeletStandIn, commands: multiprocessing.connection.Connection,
               changes: int) -> dict[str, float]:
    samples = []
    for n in range(changes):
        target = 6 - n % 3  # always differs from the previous layout
        before = kubelet.updates(RESOURCE)
        start = time.perf_counter()
        commands.send(("layout", target))
        kubelet.wait_until(lambda k, b=before: k.updates(RESOURCE) > b, 10, "push")
        samples.append(time.perf_counter() - start)
        assert kubelet.capacity()[RESOURCE] == 8 * target
    return _summary(samples)


def bench_reregister(kubelet: KubeletStandIn, restarts: int) -> dict[str, float]:
    samples = []
    for _ in range(restarts):
        count = len([r for r in kubelet.registrations if r.accepted])
        start = time.monotonic()
        kubelet.restart()
        registration = kubelet.wait_for_registration(RESOURCE, count=count + 1, timeout=10)
        samples.append(registration.at - start)
        kubelet.wait_until(lambda k: k.allocatable().get(RESOURCE, 0) > 0, 10, "relist")
    return _summary(samples)


def run(quick: bool) -> dict[str, object]:
    calls, pods, changes, restarts = (500, 50, 20, 5) if quick else (3000, 300, 100, 20)
    context = multiprocessing.get_context("spawn")
    with short_socket_dir("tsb-") as root:
        plugin_dir = Path(root) / "device-plugins"
        with KubeletStandIn(plugin_dir) as kubelet:
            ours, theirs = context.Pipe()
            child = context.Process(target=_plugin_process, args=(str(plugin_dir), theirs),
                                    daemon=True)
            child.start()
            try:
                if not ours.poll(30) or ours.recv() != "started":
                    raise RuntimeError("plugin process did not start")
                kubelet.wait_until(lambda k: k.allocatable().get(RESOURCE) == 56, 10,
                                   "first list")
                socket_path = str(plugin_dir / socket_name(RESOURCE))
                return {
                    "allocate_rpc": bench_allocate(socket_path, calls),
                    "admission_preferred_plus_allocate": bench_admission(kubelet, pods),
                    "list_and_watch_push": bench_push(kubelet, ours, changes),
                    "reregister_after_kubelet_restart": bench_reregister(kubelet, restarts),
                }
            finally:
                ours.send(("stop",))
                child.join(timeout=10)
                if child.is_alive():
                    child.kill()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="device plugin benchmarks")
    parser.add_argument("--quick", action="store_true", help="smaller counts")
    options = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    results = run(options.quick)
    print(json.dumps(results, indent=2))
    allocate = results["allocate_rpc"]
    assert isinstance(allocate, dict)
    checks = {
        "Allocate p99 <= 2 ms": allocate["sequential"]["p99_ms"] <= 2.0,
        "ListAndWatch push p99 <= 100 ms":
            results["list_and_watch_push"]["p99_ms"] <= 100.0,  # type: ignore[index]
        "re-register max <= 1 s":
            results["reregister_after_kubelet_restart"]["max_ms"] <= 1000.0,  # type: ignore[index]
    }
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'MISS'} {name}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
