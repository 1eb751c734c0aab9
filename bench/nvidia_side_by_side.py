"""An admin changes a node's MIG layout: NVIDIA's stack and Tessera side by side, in one run.

One cluster (real etcd, API server, scheduler, controller manager, kubelets v1.37.2, fake
container runtime) with two simulated nodes of 2 x A100-80GB, each behind its own simulated
``libnvidia-ml.so.1`` (``make nvml-lib``):

- *NVIDIA*: ``nvidia-mig-parted`` and NVIDIA's ``k8s-device-plugin`` (v0.10.0, v0.17.4, ``make
  nvidia-tools``; MIG strategy ``mixed``), driven as the GPU operator's mig-manager drives them:
  stop the device plugin, ``nvidia-mig-parted apply``, start the device plugin again;
- *Tessera*: ``tessera agent`` (``--nvml real``, through the library) and ``tessera
  controller``; the admin edits the node's static PartitionPolicy, the controller writes the
  NodePartition, the agent reshapes the card, and the controller releases the waiting pod.

Both start with GPU 0 cut into 7 x 1g.10gb and GPU 1 as the default config's ``all-balanced``
(2 x 1g.10gb, 2g.20gb, 3g.40gb), with a pod Running on GPU 1's 2g.20gb and one on its 3g.40gb,
and a pod waiting for a ``mig-7g.80gb``. The change cuts GPU 0 into one 7g.80gb. Measured from
the moment the admin acts: when the node's allocatable shows the 7g.80gb, when the waiting pod
is Running, and for how long the node offered less of GPU 1's untouched slices than before
(sampled every 0.1 s), and whether the running pods and their MIG devices survived. Rounds
alternate between the stacks (and the change is undone between rounds, untimed) so both meet
the same machine load, and each starts at a seeded random phase of the kubelets' status sync.

Run: ``.venv/bin/python bench/nvidia_side_by_side.py [--rounds 3] [--status-frequency 10s]
[--seed 1] [--controller-args '--backlog-batch-seconds 0.5']``
(needs ``make cluster-bins nvml-lib nvidia-tools``). Prints a table and writes JSON beside this
file.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from tessera.nvml.sim.server import NvmlServer
from tessera.nvml.sim.state import new_node_state
from tessera.nvml.sim.store import load_state_file, write_new_state_file
from tessera.testing import nvml_library
from tessera.testing.cluster import Cluster, Node
from tessera.testing.deployment import TesseraDeployment
from tessera.testing.nvidia_host import NvidiaHost, tools

CARDS = ["A100-80GB", "A100-80GB"]
BALANCED = {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
BEFORE = [{"1g.10gb": 7}, BALANCED]
AFTER = [{"7g.80gb": 1}, BALANCED]
UNTOUCHED = {"nvidia.com/mig-1g.10gb": 2, "nvidia.com/mig-2g.20gb": 1,
             "nvidia.com/mig-3g.40gb": 1}
"""GPU 1's slices: the node never offers fewer of them than this, unless something withdrew
them."""
NVIDIA_NAMESPACE = "nvidia-stack"
TESSERA_POOL = {"tessera.dev/pool": "side-by-side"}


def _mig_parted_config(layouts: list[dict[str, int]]) -> dict[str, Any]:
    return {"version": "v1", "mig-configs": {"node": [
        {"devices": [index], "mig-enabled": True, "mig-devices": counts}
        for index, counts in enumerate(layouts)]}}


def _policy(layouts: list[dict[str, int]]) -> dict[str, Any]:
    return {"apiVersion": "tessera.dev/v1alpha1", "kind": "PartitionPolicy",
            "metadata": {"name": "side-by-side"},
            "spec": {"nodeSelector": {"matchLabels": TESSERA_POOL}, "mode": "static",
                     "static": [{"devices": [index], "migEnabled": True, "migDevices": counts}
                                for index, counts in enumerate(layouts)]}}


def _pod(name: str, namespace: str, resource: str, selector: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": {"bench": "nvside"}},
            "spec": {"nodeSelector": selector, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": "registry.invalid/infer:1",
                                     "resources": {"limits": {resource: "1"}}}]}}


def _wait(what: str, check: Callable[[], bool], timeout: float = 180.0) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if check():
            return time.monotonic() - started
        time.sleep(0.05)
    raise TimeoutError(f"{what} after {timeout} s")


def _allocatable(cluster: Cluster, node: str) -> dict[str, int]:
    status = (cluster.get_node(node) or {}).get("status", {})
    return {k: int(v) for k, v in status.get("allocatable", {}).items()
            if k.startswith("nvidia.com/")}


def _running(core: client.CoreV1Api, namespace: str, name: str) -> bool:
    pod = core.read_namespaced_pod(name, namespace)
    return bool(pod.status.phase == "Running")


class _Sampler:
    """Seconds during which a node offered fewer of :data:`UNTOUCHED` than it holds."""

    def __init__(self, cluster: Cluster, node: str) -> None:
        self.cluster, self.node = cluster, node
        self.short_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.is_set():
            offered = _allocatable(self.cluster, self.node)
            now = time.monotonic()
            if any(offered.get(r, 0) < n for r, n in UNTOUCHED.items()):
                self.short_s += now - last
            last = now
            self._stop.wait(0.1)

    def __enter__(self) -> _Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


class NvidiaNode:
    """A node run the GPU operator's way, with mig-parted and NVIDIA's device plugin."""

    def __init__(self, cluster: Cluster, scratch: Path) -> None:
        self.cluster = cluster
        self.node: Node = cluster.add_node("nvidia-node")
        self.state = scratch / "nvidia-node.json"
        write_new_state_file(self.state, new_node_state(self.node.name, CARDS))
        socket = Path("/tmp") / f"nvside-{id(self)}.sock"
        self.server = NvmlServer(self.state, socket)
        self.host = NvidiaHost(scratch / "nvidia-host", load_state_file(self.state),
                               nvml_library.locate(), socket,
                               kubelet_device_plugins=self.node.device_plugin_dir)
        self.config = scratch / "mig-parted.yaml"
        self.plugin: subprocess.Popen[bytes] | None = None
        self.selector = {"kubernetes.io/hostname": self.node.name}

    def apply(self, layouts: list[dict[str, int]]) -> None:
        self.config.write_text(yaml.safe_dump(_mig_parted_config(layouts)))
        result = self.host.run([str(tools() / "nvidia-mig-parted"), "apply", "-f",
                                str(self.config), "-c", "node"],
                               env={"MIG_PARTED_SKIP_RESET": "true"})
        if result.returncode:
            raise RuntimeError(f"mig-parted apply: {result.stdout}{result.stderr}")

    def start_plugin(self) -> None:
        self.plugin = self.host.device_plugin(self.node.logs / "nvidia-device-plugin.log")

    def stop_plugin(self) -> None:
        if self.plugin is not None:
            self.plugin.terminate()
            self.plugin.wait(timeout=30)
            self.plugin = None

    def change(self, layouts: list[dict[str, int]]) -> None:
        """As mig-manager: the device plugin stops, mig-parted applies, the plugin starts."""
        self.stop_plugin()
        self.apply(layouts)
        self.start_plugin()

    def close(self) -> None:
        self.stop_plugin()
        self.server.close()


def _mig_uuids(state: Path, gpu: int) -> set[str]:
    card = load_state_file(state).gpus[gpu]
    return {c.uuid for i in card.instances for c in i.compute_instances}


@dataclass(frozen=True)
class Stack:
    """One side: where its pods go, its node and simulated state, and how its admin acts."""

    name: str
    namespace: str
    selector: dict[str, str]
    node: str
    state: Path
    change: Callable[[], None]
    undo: Callable[[], None]


def _round(stack: Stack, cluster: Cluster, core: client.CoreV1Api, index: int,
           jitter_s: float) -> dict[str, Any]:
    """One timed change; returns its figures. The waiting pod is created (and seen Pending)
    first; after ``jitter_s`` more the admin acts and the clock starts (a random phase
    against the kubelets' status sync: without it, rounds of equal length meet the sync at
    the same phase every time, and the sync's phase, not the stack, sets the figure)."""
    waiting = f"{stack.name}-wait-{index}"
    core.create_namespaced_pod(stack.namespace, _pod(
        waiting, stack.namespace, "nvidia.com/mig-7g.80gb", stack.selector))
    time.sleep(2.0)  # the scheduler (or the controller) has seen it and found no room
    assert not _running(core, stack.namespace, waiting)
    time.sleep(jitter_s)
    survivors = _mig_uuids(stack.state, 1)
    with _Sampler(cluster, stack.node) as sampler:
        started = time.monotonic()
        stack.change()
        acted = time.monotonic() - started
        offered = _wait("7g.80gb allocatable", lambda: _allocatable(
            cluster, stack.node).get("nvidia.com/mig-7g.80gb") == 1)
        running = _wait(f"{waiting} Running", lambda: _running(core, stack.namespace, waiting))
    steady = [core.read_namespaced_pod(f"{stack.name}-{p}", stack.namespace)
              for p in ("2g", "3g")]
    return {
        "admin_action_s": acted,
        "allocatable_s": acted + offered,
        "running_s": acted + offered + running,
        "untouched_withdrawn_s": sampler.short_s,
        "running_pods_kept": all(p.status.phase == "Running" and not any(
            (c.restart_count or 0) for c in p.status.container_statuses or []) for p in steady),
        "gpu1_slices_kept": _mig_uuids(stack.state, 1) == survivors,
    }


def _undo(stack: Stack, cluster: Cluster, core: client.CoreV1Api, index: int) -> None:
    name = f"{stack.name}-wait-{index}"
    core.delete_namespaced_pod(name, stack.namespace, grace_period_seconds=0)
    _wait("the waiting pod gone", lambda: not core.list_namespaced_pod(
        stack.namespace, field_selector=f"metadata.name={name}").items)
    stack.undo()
    _wait("the layout back", lambda: _allocatable(cluster, stack.node).get(
        "nvidia.com/mig-1g.10gb") == 9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--status-frequency", default="10s",
                        help="the kubelets' nodeStatusUpdateFrequency (default: its default)")
    parser.add_argument("--seed", type=int, default=1,
                        help="seeds each round's random phase against the status sync")
    parser.add_argument("--controller-args", default="",
                        help="more flags for tessera controller, e.g. "
                        "'--backlog-batch-seconds 0.5'")
    args = parser.parse_args()
    results: dict[str, list[dict[str, Any]]] = {"NVIDIA": [], "Tessera": []}
    with Cluster(node_status_update_frequency=args.status_frequency) as cluster:
        system = TesseraDeployment(cluster).install()
        nvidia: NvidiaNode | None = None
        try:
            core = system.core
            core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(
                name=NVIDIA_NAMESPACE, labels={"tessera.dev/placement": "disabled"})))
            scratch = cluster.root / "side-by-side"
            scratch.mkdir()
            nvidia = NvidiaNode(cluster, scratch)
            nvidia.apply(BEFORE)
            nvidia.start_plugin()

            system.create_policy(_policy(BEFORE))
            system.add_gpu_node("tessera-node", TESSERA_POOL, CARDS, mig=True, nvml="library")
            system.start_controller("bench", *args.controller_args.split())
            _wait("NodePartition tessera-node", lambda: system.reported("tessera-node"))
            for name in ("nvidia-node", "tessera-node"):
                _wait(f"{name} cut", lambda n=name: _allocatable(cluster, n).get(
                    "nvidia.com/mig-1g.10gb") == 9)
            for side, namespace, selector in (
                    ("nvidia", NVIDIA_NAMESPACE, nvidia.selector),
                    ("tessera", "default", TESSERA_POOL)):
                for profile in ("2g", "3g"):
                    resource = f"nvidia.com/mig-{profile}.{'20gb' if profile == '2g' else '40gb'}"
                    core.create_namespaced_pod(namespace, _pod(f"{side}-{profile}", namespace,
                                                               resource, selector))
                for profile in ("2g", "3g"):
                    _wait(f"{side}-{profile} Running",
                          lambda s=side, p=profile, n=namespace: _running(core, n, f"{s}-{p}"))

            def policy(layouts: list[dict[str, int]]) -> Callable[[], None]:
                def edit() -> None:
                    system.custom.patch_cluster_custom_object(
                        "tessera.dev", "v1alpha1", "partitionpolicies", "side-by-side",
                        {"spec": _policy(layouts)["spec"]})
                return edit

            on_nvidia = nvidia
            stacks = (
                Stack("nvidia", NVIDIA_NAMESPACE, nvidia.selector, "nvidia-node", nvidia.state,
                      lambda: on_nvidia.change(AFTER), lambda: on_nvidia.change(BEFORE)),
                Stack("tessera", "default", TESSERA_POOL, "tessera-node",
                      system.states["tessera-node"], policy(AFTER), policy(BEFORE)),
            )
            rng = random.Random(args.seed)
            period = float(args.status_frequency.removesuffix("s"))
            for index in range(args.rounds):
                for stack, label in zip(stacks, results, strict=True):
                    results[label].append(_round(stack, cluster, core, index,
                                                 rng.uniform(0, period)))
                    _undo(stack, cluster, core, index)
        finally:
            if nvidia is not None:
                nvidia.close()
            system.uninstall()
    print(f"kubelet nodeStatusUpdateFrequency {args.status_frequency}, {args.rounds} rounds, "
          f"controller flags {args.controller_args or '(defaults)'}")
    print(f"{'stack':<8} {'7g allocatable p50/max s':>26} {'pod Running p50/max s':>24} "
          f"{'GPU 1 withdrawn p50/max s':>27} {'running pods kept':>18}")
    summary: dict[str, Any] = {}
    for stack, rounds in results.items():
        def column(key: str, rows: list[dict[str, Any]] = rounds) -> tuple[float, float]:
            values = [r[key] for r in rows]
            return statistics.median(values), max(values)
        kept = all(r["running_pods_kept"] and r["gpu1_slices_kept"] for r in rounds)
        summary[stack] = {"rounds": rounds, "kept": kept}
        a, b, c = column("allocatable_s"), column("running_s"), column("untouched_withdrawn_s")
        print(f"{stack:<8} {a[0]:>12.2f} / {a[1]:<11.2f} {b[0]:>11.2f} / {b[1]:<10.2f} "
              f"{c[0]:>12.2f} / {c[1]:<12.2f} {kept!s:>18}")
    suffix = "_".join(args.controller_args.replace("--", "").split())
    out = Path(__file__).with_name(
        f"nvidia_side_by_side_{args.status_frequency}{'_' + suffix if suffix else ''}.json")
    out.write_text(json.dumps({"status_frequency": args.status_frequency,
                               "controller_args": args.controller_args, **summary}, indent=2))


if __name__ == "__main__":
    main()
