"""``tessera dev cluster up|down``: the e2e tests' cluster, for a developer's kubectl.

``up`` starts etcd, kube-apiserver, kube-controller-manager, kube-scheduler and ``--nodes``
simulated nodes (real kubelets on a fake runtime) on loopback, writes ``DIR/kubeconfig`` and
``DIR/state.json``, and stays in the foreground until Ctrl-C or SIGTERM, when it stops
everything. ``up --detach`` runs that same foreground process in the background and returns once
the cluster is ready; ``down`` SIGTERMs it, waits, and kills whatever a crash may have left
(every process id is in ``state.json``). One process owns every component, so the kernel kills
them all (parent-death signal) even if that owner is SIGKILLed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tessera.core.errors import TesseraError

DEFAULT_DIR = Path("/tmp/tessera-dev-cluster")
"""Short on purpose: node sockets live under it and Unix socket paths are limited to 107 bytes."""

STATE_FILE = "state.json"
DETACH_LOG = "up.log"
DETACH_READY_TIMEOUT_S = 120.0
DOWN_TIMEOUT_S = 30.0


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "cluster", help="a local Kubernetes test cluster (real components on loopback)",
        description="Start or stop the cluster the e2e tests use: etcd, kube-apiserver, "
        "kube-controller-manager, kube-scheduler and simulated nodes (real kubelets on a "
        "fake container runtime), built by `make cluster-bins`.")
    actions = parser.add_subparsers(dest="cluster_action", required=True, metavar="ACTION")
    up = actions.add_parser("up", help="start the cluster (foreground until Ctrl-C)",
                            description="Start the cluster; print the kubeconfig path.")
    up.add_argument("--dir", type=Path, default=DEFAULT_DIR,
                    help=f"state, certificates, logs and kubeconfig (default {DEFAULT_DIR})")
    up.add_argument("--nodes", type=int, default=1,
                    help="simulated nodes to add, named tessera-node-1.. (default 1)")
    up.add_argument("--runtime", choices=("fake", "containerd"), default="fake",
                    help="the nodes' container runtime: fake (nothing runs; fast) or "
                    "containerd (real containers over runc; `make containerd image` first, "
                    "and Tessera's image is imported into every node)")
    up.add_argument("--detach", action="store_true",
                    help="run in the background; stop it with `tessera dev cluster down`")
    up.add_argument("--bin-dir", type=Path, default=None,
                    help="where the binaries are (default tools/k8s/bin/<version>)")
    up.set_defaults(run=run_up)
    down = actions.add_parser("down", help="stop a cluster started with up",
                              description="Stop the cluster recorded in DIR/state.json and "
                              "remove DIR.")
    down.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    down.add_argument("--keep", action="store_true", help="keep DIR (logs, certificates)")
    down.set_defaults(run=run_down)


def read_state(directory: Path) -> dict[str, Any] | None:
    """The recorded state, or None when there is none."""
    try:
        state: dict[str, Any] = json.loads((directory / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return state


def _alive(pid: int) -> bool:
    from tessera.testing.cluster import pid_alive  # noqa: PLC0415 - see _foreground

    return pid_alive(pid)


def run_up(args: argparse.Namespace) -> int:
    directory: Path = args.dir
    if args.nodes < 0:
        raise TesseraError("--nodes: must not be negative")
    state = read_state(directory)
    if state is not None and _alive(int(state.get("supervisor_pid", 0))):
        raise TesseraError(f"--dir: a cluster is already running from {directory} "
                           f"(pid {state['supervisor_pid']}); `tessera dev cluster down` first")
    if args.detach:
        return _detach(args)
    return _foreground(args)


def _detach(args: argparse.Namespace) -> int:
    directory: Path = args.dir
    directory.mkdir(parents=True, exist_ok=True)
    (directory / STATE_FILE).unlink(missing_ok=True)
    argv = [sys.executable, "-m", "tessera.cli.main", "dev", "cluster", "up",
            "--dir", str(directory), "--nodes", str(args.nodes), "--runtime", args.runtime]
    if args.bin_dir is not None:
        argv += ["--bin-dir", str(args.bin_dir)]
    with open(directory / DETACH_LOG, "ab") as log:
        owner = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + DETACH_READY_TIMEOUT_S
    while time.monotonic() < deadline:
        state = read_state(directory)
        if state is not None and state.get("supervisor_pid") == owner.pid:
            print(f"cluster up (pid {owner.pid}); export KUBECONFIG={state['kubeconfig']}")
            return 0
        if owner.poll() is not None:
            tail = (directory / DETACH_LOG).read_text(errors="replace").splitlines()[-20:]
            raise TesseraError("up: the cluster did not start:\n" + "\n".join(tail))
        time.sleep(0.2)
    owner.terminate()
    raise TesseraError(f"up: not ready after {DETACH_READY_TIMEOUT_S:.0f}s; "
                       f"see {directory / DETACH_LOG}")


def _foreground(args: argparse.Namespace) -> int:
    # Imported here so that every other `tessera` command starts without the kubernetes
    # client and `cryptography` (a dev dependency the cluster's certificates need).
    from tessera.testing.cluster import Binaries, Cluster  # noqa: PLC0415

    directory: Path = args.dir
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    directory.mkdir(parents=True, exist_ok=True)
    (directory / STATE_FILE).unlink(missing_ok=True)
    binaries = Binaries.locate(args.bin_dir)
    root = directory / "cluster"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir()
    cluster = Cluster(root, binaries=binaries, keep_root=True)
    try:
        cluster.start()
        for index in range(1, args.nodes + 1):
            cluster.add_node(f"tessera-node-{index}", runtime=args.runtime)
        kubeconfig = directory / "kubeconfig"
        shutil.copyfile(cluster.kubeconfig, kubeconfig)
        kubeconfig.chmod(0o600)
        state = {**cluster.state(), "supervisor_pid": os.getpid(),
                 "kubeconfig": str(kubeconfig)}
        _write_atomically(directory / STATE_FILE, json.dumps(state, indent=2))
        print(f"cluster up at {cluster.server} in {cluster.timings['total']:.1f}s; "
              f"export KUBECONFIG={kubeconfig}", flush=True)
        print("Ctrl-C stops it.", flush=True)
        while not stop.wait(1.0):
            dead = [p.name for p in cluster.processes() if not p.alive()]
            if dead:
                print(f"tessera: {', '.join(dead)} exited; stopping", file=sys.stderr)
                return 1
        return 0
    finally:
        cluster.stop()
        (directory / STATE_FILE).unlink(missing_ok=True)


def _write_atomically(path: Path, text: str) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(text)
    temporary.replace(path)


def run_down(args: argparse.Namespace) -> int:
    directory: Path = args.dir
    state = read_state(directory)
    if state is None:
        print(f"no cluster recorded in {directory}")
        if not args.keep:
            shutil.rmtree(directory, ignore_errors=True)
        return 0
    owner = int(state.get("supervisor_pid", 0))
    if owner and _alive(owner):
        os.kill(owner, signal.SIGTERM)
        deadline = time.monotonic() + DOWN_TIMEOUT_S
        while _alive(owner) and time.monotonic() < deadline:
            time.sleep(0.1)
    # Whatever survived a crashed owner: each component leads its own process group.
    leftovers = [pid for pid in state.get("pids", {}).values() if _alive(int(pid))]
    for pid in leftovers:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(int(pid), signal.SIGKILL)
    if owner and _alive(owner):
        os.kill(owner, signal.SIGKILL)
    if not args.keep:
        shutil.rmtree(directory, ignore_errors=True)
    else:
        (directory / STATE_FILE).unlink(missing_ok=True)
    suffix = f" (killed {len(leftovers)} leftover processes)" if leftovers else ""
    print(f"cluster down{suffix}")
    return 0
