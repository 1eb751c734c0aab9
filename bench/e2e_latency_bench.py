"""Pending pod to Running on the real control plane, with the default batching window.

Two cases, 20 pods each, one at a time so every pod's latency is its own:

- *new slice*: the GPUs are in MIG mode but empty, so every pod waits for the controller to
  plan, the agent to create a 1g.10gb slice, the plugin to advertise it and the kubelet to
  publish it (``nodeStatusUpdateFrequency``, default 10 s, is the floor), then the scheduler;
- *free slice*: the same pods again after the first ones were deleted, so each fits a slice
  that is already there;
- *new slice, DRA*: the same unchanged pods on two nodes whose agents run ``--api dra`` (the
  chart's ``dra.enabled``): the controller hands each pod to the scheduler at once, the
  scheduler allocates a placement, and the agent creates the slice when the kubelet prepares
  the claim; no node-status sync in the way.

All three run in one cluster, in one run, so they are compared side by side; with
``--runtimes fake,containerd`` (the default) each on nodes of both kinds of kubelet runtime:
the fake one (nothing runs) and containerd with runc (the pod's sandbox and container start
for real, from Tessera's image; ``make containerd image``). The agents are processes beside
the kubelets on both, so the runtime is the one difference.

Run: ``.venv/bin/python bench/e2e_latency_bench.py [--status-frequency 10s] [--pods 20]
[--runtimes fake,containerd]`` (needs ``make cluster-bins``). Prints a table and writes JSON
beside this file.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from kubernetes import client

from tessera.testing.cluster import Cluster
from tessera.testing.cluster._containerd import Images
from tessera.testing.deployment import TesseraDeployment

POOL = {"tessera.dev/pool": "bench"}
DRA_POOL = {"tessera.dev/pool": "bench-dra", "tessera.dev/api": "dra"}
RESOURCE = "nvidia.com/mig-1g.10gb"


def _pools(runtime: str) -> tuple[dict[str, str], dict[str, str]]:
    """The device-plugin and the DRA pool of nodes on ``runtime``."""
    if runtime == "fake":
        return POOL, DRA_POOL
    return ({"tessera.dev/pool": f"bench-{runtime}"},
            {"tessera.dev/pool": f"bench-dra-{runtime}", "tessera.dev/api": "dra"})


def _pod(name: str, pool: dict[str, str], image: str | None) -> dict[str, Any]:
    """``image``: a real one the node has (containerd), or None on the fake runtime."""
    container: dict[str, Any] = {"name": "main", "image": image or "registry.invalid/infer:1",
                                 "resources": {"limits": {RESOURCE: "1"}}}
    if image is not None:
        container.update(imagePullPolicy="Never", command=["/bin/sh", "-c", "sleep 3600"])
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "labels": {"bench": "e2e"}},
            "spec": {"nodeSelector": {"tessera.dev/pool": pool["tessera.dev/pool"]},
                     "terminationGracePeriodSeconds": 0, "containers": [container]}}


def _time_to_running(core: client.CoreV1Api, name: str, pool: dict[str, str],
                     image: str | None, timeout: float = 120.0) -> float:
    started = time.monotonic()
    core.create_namespaced_pod("default", _pod(name, pool, image))
    while time.monotonic() - started < timeout:
        if core.read_namespaced_pod(name, "default").status.phase == "Running":
            return time.monotonic() - started
        time.sleep(0.05)
    raise TimeoutError(f"{name} not Running after {timeout} s")


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--status-frequency", default="10s",
                        help="the kubelet's nodeStatusUpdateFrequency (default: its default)")
    parser.add_argument("--pods", type=int, default=20)
    parser.add_argument("--runtimes", default="fake,containerd",
                        help="the nodes' runtimes, each with its own pools (default both)")
    args = parser.parse_args()
    runtimes = [r.strip() for r in args.runtimes.split(",") if r.strip()]
    image = Images.locate().image if "containerd" in runtimes else None
    results: dict[str, list[float]] = {}
    with Cluster(node_status_update_frequency=args.status_frequency) as cluster:
        system = TesseraDeployment(cluster).install("dra.enabled=true")
        try:
            for runtime in runtimes:
                pool, dra_pool = _pools(runtime)
                suffix = "" if runtime == "fake" else f"-{runtime[:4]}"
                for name in ("a", "b"):
                    system.add_gpu_node(f"bench{suffix}-{name}", pool,
                                        ["A100-80GB", "A100-80GB"], mig=True, runtime=runtime)
                    system.add_gpu_node(f"bench-dra{suffix}-{name}", dra_pool,
                                        ["A100-80GB", "A100-80GB"], mig=True, api="dra",
                                        runtime=runtime)
                system.create_policy({
                    "apiVersion": "tessera.dev/v1alpha1", "kind": "PartitionPolicy",
                    "metadata": {"name": f"bench{suffix}"},
                    "spec": {"nodeSelector": {"matchLabels": pool}, "mode": "dynamic"}})
            system.start_controller("bench", "--dra-node-selector", "tessera.dev/api=dra")
            for name in system.nodes:
                while not system.reported(name):
                    time.sleep(0.2)
            core = system.core
            # Runtime by runtime within each case, pod by pod alternating, so that both
            # runtimes meet the same machine load.
            cases = (("new slice", "new", False), ("free slice", "free", False),
                     ("new slice, DRA", "dra", True))
            for case, prefix, dra in cases:
                for i in range(args.pods):
                    for runtime in runtimes:
                        pool, dra_pool = _pools(runtime)
                        key = case if runtime == "fake" else f"{case} ({runtime})"
                        results.setdefault(key, []).append(_time_to_running(
                            core, f"{prefix}-{runtime[:4]}-{i}", dra_pool if dra else pool,
                            image if runtime == "containerd" else None))
                if prefix == "new":
                    for pod in core.list_namespaced_pod("default",
                                                        label_selector="bench=e2e").items:
                        core.delete_namespaced_pod(pod.metadata.name, "default",
                                                   grace_period_seconds=0)
                    while core.list_namespaced_pod("default", label_selector="bench=e2e").items:
                        time.sleep(0.2)
                    time.sleep(3)  # the agents report the slices free again
        finally:
            system.uninstall()
    print(f"kubelet nodeStatusUpdateFrequency {args.status_frequency}, {args.pods} pods each,"
          " controller batching 0.5 s idle / 3 s max")
    print(f"{'case':<30} {'p50 s':>7} {'p95 s':>7} {'mean s':>7} {'max s':>7}")
    summary = {}
    for case, values in results.items():
        row = {"p50": _percentile(values, 0.5), "p95": _percentile(values, 0.95),
               "mean": statistics.fmean(values), "max": max(values)}
        summary[case] = {**row, "samples": values}
        print(f"{case:<30} {row['p50']:7.2f} {row['p95']:7.2f} {row['mean']:7.2f} "
              f"{row['max']:7.2f}")
    out = Path(__file__).with_name("e2e_latency_results.json")
    out.write_text(json.dumps({"status_frequency": args.status_frequency, **summary},
                              indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
