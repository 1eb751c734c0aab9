"""The controller at cluster scale: hollow GPU nodes on the real API server (issue #20).

For each size N (default 500, 1000, 2000 nodes of 8 A100-80GB), in a fresh control plane
(etcd, API server, controller manager, scheduler; no kubelets) with the chart installed (its
admission gate gates every GPU pod):

1. N hollow nodes (``tessera.testing.hollow``, ``--hollow-processes`` processes each serving
   a share of the nodes: the agent's own status code over simulated cards, allocatable
   following the slices) register and report;
2. the controller starts (a real ``tessera controller`` process, with a standby replica);
3. **at rest**, over ``--rest-seconds``: API requests per second by verb and resource (the
   API server's ``apiserver_request_total``), agent status writes per node per minute, the
   controller's CPU share and resident memory;
4. **burst**: ``--pods`` gated pods asking ``nvidia.com/mig-1g.10gb`` created as fast as
   eight threads can; each pod's time from its creation to its release (gate lifted, pinned),
   p50/p95/max, and the release of the last one after the last creation;
5. **failover**: the leader is killed; the time until the standby's first plan (a pod created
   right after the kill is planned and released).

Run: ``.venv/bin/python bench/scale_bench.py [--sizes 500,1000,2000] [--pods 1000]
[--baseline-src DIR] [--hollow-processes 4]`` (needs ``make cluster-bins``). With
``--baseline-src`` (the ``src`` of another checkout, e.g. a ``git worktree`` of an older
commit) each size runs twice in this one
run, the controller first from there and then from this tree, so the two are compared side by
side. Prints the results and writes JSON beside this file.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import ssl
import statistics
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import urllib3
import yaml
from kubernetes import client, watch

from tessera.api.v1alpha1 import GROUP, VERSION
from tessera.testing.cluster import Cluster, Process
from tessera.testing.deployment import TesseraDeployment

LABELS = {"tessera.dev/hollow": "true"}
RESOURCE = "nvidia.com/mig-1g.10gb"
GATE = "tessera.dev/placement"
_REQUEST = re.compile(r'^apiserver_request_total\{([^}]*)\} ([0-9.e+]+)$')


def _api_metrics(cluster: Cluster) -> dict[tuple[str, str, str], float]:
    """``apiserver_request_total`` summed by (verb, resource, subresource)."""
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    user = config["users"][0]["user"]
    context = ssl.create_default_context(cafile=config["clusters"][0]["cluster"].get(
        "certificate-authority"))
    context.load_cert_chain(user["client-certificate"], user["client-key"])
    with urllib.request.urlopen(f"{cluster.server}/metrics", context=context,
                                timeout=30) as response:
        text = response.read().decode()
    found: dict[tuple[str, str, str], float] = {}
    for line in text.splitlines():
        match = _REQUEST.match(line)
        if not match:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
        key = (labels.get("verb", ""), labels.get("resource", ""),
               labels.get("subresource", ""))
        found[key] = found.get(key, 0.0) + float(match.group(2))
    return found


def _rates(before: dict[tuple[str, str, str], float], after: dict[tuple[str, str, str], float],
           seconds: float) -> dict[str, float]:
    rates = {}
    for key, value in after.items():
        delta = value - before.get(key, 0.0)
        if delta > 0:
            verb, resource, sub = key
            rates[f"{verb} {resource}{'/' + sub if sub else ''}"] = round(delta / seconds, 2)
    return dict(sorted(rates.items(), key=lambda kv: -kv[1]))


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _wait_log(process: Process, text: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        content = process.log_path.read_text(errors="replace")
        for line in content.splitlines():
            if text in line:
                return line
        if not process.alive():
            raise RuntimeError(f"{process.name} exited:\n{process.log_tail()}")
        time.sleep(0.5)
    raise TimeoutError(f"{process.name}: no {text!r} after {timeout} s")


def _pod(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "labels": {"bench": "scale"}},
            "spec": {"terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": "registry.invalid/infer:1",
                                     "resources": {"limits": {RESOURCE: "1"}}}]}}


class ReleaseWatch:
    """When each bench pod lost its gate, seen by a watch (not by polling a thousand pods)."""

    def __init__(self, core: client.CoreV1Api) -> None:
        self.core = core
        self.released: dict[str, float] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            stream = watch.Watch()
            try:
                for event in stream.stream(self.core.list_namespaced_pod, "default",
                                           label_selector="bench=scale", timeout_seconds=30):
                    pod = event["object"]
                    gates = [g.name for g in pod.spec.scheduling_gates or []]
                    if GATE not in gates and pod.metadata.name not in self.released:
                        self.released[pod.metadata.name] = time.monotonic()
                    if self.stop.is_set():
                        break
            except (urllib3.exceptions.HTTPError, client.ApiException, OSError):
                # The API server cut the stream (it is stopped at the end of a size, or was
                # too busy): watch again; the new watch lists every pod first, so a release
                # made meanwhile is still seen (its time then a little late, never lost).
                time.sleep(0.2)


def _controller(deployment: TesseraDeployment, identity: str, src: str | None) -> Process:
    """A controller process, importing Tessera from ``src`` when given (the baseline)."""
    saved = os.environ.get("PYTHONPATH")
    if src:
        os.environ["PYTHONPATH"] = src
    try:
        return deployment.start_controller(identity, "--batch-idle-seconds", "0.5")
    finally:
        if src:
            if saved is None:
                del os.environ["PYTHONPATH"]
            else:
                os.environ["PYTHONPATH"] = saved


def _size(sizes_n: int, pods: int, rest_s: float, out: Path,
          src: str | None = None, *, processes: int = 4) -> dict[str, Any]:
    result: dict[str, Any] = {"nodes": sizes_n, "gpus": sizes_n * 8, "pods": pods,
                              "controller": src or "this tree", "hollow_processes": processes}
    with Cluster() as cluster:
        cluster.start()
        deployment = TesseraDeployment(cluster, "tessera").install()
        deployment.create_policy({
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "PartitionPolicy",
            "metadata": {"name": "hollow"},
            "spec": {"mode": "dynamic", "nodeSelector": {"matchLabels": LABELS}}})
        began = time.monotonic()
        hollows = [Process(f"hollow-{i}", [
            sys.executable, "-m", "tessera.testing.hollow", "--kubeconfig",
            str(cluster.kubeconfig), "--nodes", str(sizes_n), "--label",
            "tessera.dev/hollow=true", "--resync-seconds", "60", "--shard", f"{i}/{processes}"],
            log_path=cluster.root / "logs" / f"hollow-{i}.log") for i in range(processes)]
        for hollow in hollows:
            _wait_log(hollow, "ready", 60 + sizes_n * 0.5)
        result["hollow_start_s"] = round(time.monotonic() - began, 1)
        result["hollow_rss_mib"] = round(sum(_rss_mib(h.pid) for h in hollows), 0)
        leader = _controller(deployment, "c1", src)
        _wait_log(leader, "is the leader", 120)
        _wait_log(leader, "cache primed", 120)
        standby = _controller(deployment, "c2", src)
        time.sleep(10)  # the standby primes; the leader writes its first policy specs
        core = deployment.core
        # -- at rest
        before, cpu0, t0 = _api_metrics(cluster), _cpu_seconds(leader.pid), time.monotonic()
        time.sleep(rest_s)
        after, cpu1, t1 = _api_metrics(cluster), _cpu_seconds(leader.pid), time.monotonic()
        rest = _rates(before, after, t1 - t0)
        status_writes = rest.get("PATCH nodepartitions/status", 0.0)
        result["rest"] = {
            "seconds": round(t1 - t0, 1), "api_requests_per_s": rest,
            "status_writes_per_node_per_min": round(status_writes * 60 / sizes_n, 3),
            "controller_cpu_share": round((cpu1 - cpu0) / (t1 - t0), 3),
            "controller_rss_mib": round(_rss_mib(leader.pid), 0)}
        # -- burst
        watcher = ReleaseWatch(core)
        created: dict[str, float] = {}
        before, cpu0 = _api_metrics(cluster), _cpu_seconds(leader.pid)
        burst_began = time.monotonic()

        def create(i: int) -> None:
            name = f"b-{i:05d}"
            core.create_namespaced_pod("default", _pod(name))
            created[name] = time.monotonic()

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(create, range(pods)))
        last_created = max(created.values())
        deadline = time.monotonic() + 600
        while len(watcher.released) < pods and time.monotonic() < deadline:
            time.sleep(0.2)
        burst_ended = time.monotonic()
        after, cpu1 = _api_metrics(cluster), _cpu_seconds(leader.pid)
        waits = [watcher.released[n] - created[n] for n in created if n in watcher.released]
        after_last = [watcher.released[n] - last_created for n in created
                      if n in watcher.released]
        result["burst"] = {
            "released": len(waits), "create_s": round(last_created - burst_began, 1),
            "wait_p50_s": round(statistics.median(waits), 2) if waits else None,
            "wait_p95_s": round(_percentile(waits, 0.95), 2) if waits else None,
            "wait_max_s": round(max(waits), 2) if waits else None,
            "after_last_creation_p95_s": round(_percentile(after_last, 0.95), 2)
            if after_last else None,
            "after_last_creation_max_s": round(max(after_last), 2) if after_last else None,
            "api_requests_per_s": dict(list(_rates(before, after,
                                                   burst_ended - burst_began).items())[:12]),
            "controller_cpu_share": round((cpu1 - cpu0) / (burst_ended - burst_began), 3),
            "controller_rss_mib": round(_rss_mib(leader.pid), 0)}
        # -- failover
        killed = time.monotonic()
        leader.signal(signal.SIGKILL)
        core.create_namespaced_pod("default", _pod("after-failover"))
        while "after-failover" not in watcher.released and time.monotonic() - killed < 300:
            time.sleep(0.1)
        result["failover_to_release_s"] = round(
            watcher.released.get("after-failover", float("nan")) - killed, 1)
        result["standby_rss_mib"] = round(_rss_mib(standby.pid), 0)
        watcher.stop.set()
        for hollow in hollows:
            hollow.signal(signal.SIGTERM)
            hollow.stop()
        for process in deployment.controllers:
            process.stop()
    out.write_text(json.dumps(result, indent=2))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="500,1000,2000")
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--rest-seconds", type=float, default=60.0)
    parser.add_argument("--baseline-src", default=None)
    parser.add_argument("--hollow-processes", type=int, default=4,
                        help="processes serving the hollow nodes (real agents work in "
                        "parallel; one process applying every node's plan in turn is a queue "
                        "the controller does not have)")
    args = parser.parse_args()
    results = []
    here = Path(__file__).parent
    for n in (int(s) for s in args.sizes.split(",")):
        variants = [args.baseline_src, None] if args.baseline_src else [None]
        for src in variants:
            tag = "baseline" if src else "tree"
            found = _size(n, args.pods, args.rest_seconds,
                          here / f"scale_results_{n}_{tag}.json", src,
                          processes=args.hollow_processes)
            results.append(found)
            print(json.dumps(found, indent=2), flush=True)
    (here / "scale_results.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
