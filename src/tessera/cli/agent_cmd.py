"""``tessera agent`` and ``tessera device-plugin``: the processes that serve a GPU node."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import threading
from pathlib import Path
from typing import Any

import yaml

from tessera.agent.dra import DraDriver, DraReconciler
from tessera.agent.metrics import AgentMetrics
from tessera.agent.mps import MpsManager
from tessera.agent.node import NodeRuntime, RuntimeSettings
from tessera.agent.reconciler import Reconciler
from tessera.agent.runner import AgentRunner
from tessera.api.v1alpha1 import NodePartition
from tessera.cli import logs
from tessera.core import dra
from tessera.core.catalogue import MPS_MAX_CLIENTS
from tessera.core.errors import BackendError, InvalidInputError, StateFileError
from tessera.kube.config import api_client
from tessera.kube.events import EventRecorder
from tessera.kube.health import HealthServer
from tessera.kube.partitions import NodePartitions
from tessera.kube.resourceslices import ResourceClaims, ResourceSlices
from tessera.kubelet.allocation import AllocateOptions, DeviceListStrategy
from tessera.kubelet.constants import DEVICE_PLUGIN_DIR, POD_RESOURCES_SOCKET
from tessera.kubelet.dra import KUBELET_PLUGINS_DIR, KUBELET_REGISTRY_DIR, DraPluginServer
from tessera.kubelet.health import XidFilter
from tessera.kubelet.plugins import PluginSettings
from tessera.nvml.backend import GpuBackend, check_backend, open_backend


def _node_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nvml", default="real", metavar="real|sim:FILE",
                        help="the node's NVML: the driver, or a simulator state file")
    parser.add_argument("--plugin-dir", default=DEVICE_PLUGIN_DIR,
                        help="the kubelet's device-plugin directory (holds kubelet.sock)")
    parser.add_argument("--pod-resources-socket", default=POD_RESOURCES_SOCKET,
                        help="the kubelet's PodResources socket")
    parser.add_argument("--no-kubelet", action="store_true",
                        help="no kubelet on this node: only NVML processes mark slices in use")
    parser.add_argument("--device-list-strategy", default="envvar",
                        help="comma list of: " + ", ".join(s.value for s in DeviceListStrategy))
    parser.add_argument("--pass-device-specs", action="store_true")
    parser.add_argument("--disable-healthchecks", default=None, metavar="all|XIDS",
                        help="as NVIDIA's DP_DISABLE_HEALTHCHECKS")
    parser.add_argument("--enable-healthchecks", default=None, metavar="XIDS",
                        help="as NVIDIA's DP_ENABLE_HEALTHCHECKS")
    parser.add_argument("--xid-recovery-seconds", type=float, default=0.0,
                        help="mark a device healthy again after this long without a critical "
                        "Xid (0: never, as NVIDIA's plugin)")
    parser.add_argument("--log-level", default="INFO")


def _mps_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mps-root", default=None,
                        help="host directory for MPS pipe/log dirs, one per device "
                        "(e.g. /run/tessera/mps); unset: MPS mode is refused")
    parser.add_argument("--mps-control", default="nvidia-cuda-mps-control",
                        help="the MPS control binary")
    parser.add_argument("--mps-shm-dir", default=None,
                        help="host directory mounted at /dev/shm in MPS clients")


def _mps(args: argparse.Namespace) -> MpsManager | None:
    if not args.mps_root:
        return None
    manager = MpsManager(Path(args.mps_root), args.mps_control,
                         shm_directory=args.mps_shm_dir)
    manager.recover()  # an agent restart must not kill running MPS clients
    return manager


def _settings(args: argparse.Namespace) -> RuntimeSettings:
    strategies = tuple(DeviceListStrategy(s.strip()) for s in
                       args.device_list_strategy.split(",") if s.strip())
    return RuntimeSettings(
        plugins=PluginSettings(plugin_dir=args.plugin_dir, allocate=AllocateOptions(
            strategies=strategies, pass_device_specs=args.pass_device_specs)),
        pod_resources_socket=None if args.no_kubelet else args.pod_resources_socket,
        xid_filter=XidFilter.from_settings(args.disable_healthchecks, args.enable_healthchecks),
        xid_recovery_s=args.xid_recovery_seconds,
    )


def register(commands: Any) -> None:
    agent = commands.add_parser(
        "agent", help="run the node agent",
        description="Reconcile this node's NodePartition: partition the GPUs (MIG, MPS), serve "
        "the device plugins, report status. --once --spec-file applies a spec without a "
        "cluster and prints the resulting status.")
    _node_flags(agent)
    _mps_flags(agent)
    agent.add_argument("--once", action="store_true", help="apply once and print the status")
    agent.add_argument("--spec-file", help="a NodePartition (YAML/JSON) to apply with --once")
    agent.add_argument("--node-name", default=os.environ.get("NODE_NAME"),
                       help="this node's name (default: $NODE_NAME, set from the downward API)")
    agent.add_argument("--kubeconfig", default=None,
                       help="kubeconfig file (default: in-cluster service account)")
    agent.add_argument("--metrics-port", type=int, default=9400,
                       help="Prometheus /metrics port (0: off)")
    agent.add_argument("--resync-seconds", type=float, default=10.0,
                       help="reconcile at least this often, to notice freed slices")
    agent.add_argument("--api", choices=("device-plugin", "dra"), default="device-plugin",
                       help="how the kubelet gets the GPUs: device plugins serving the slices "
                       "the NodePartition spec makes, or DRA (the node publishes every MIG "
                       "placement as ResourceSlices and makes a slice when a claim is "
                       "prepared); a node uses one or the other, never both")
    agent.add_argument("--plugins-registry", default=KUBELET_REGISTRY_DIR,
                       help="the kubelet's plugin registry (--api dra)")
    agent.add_argument("--dra-plugin-dir", default=None,
                       help="directory for the DRA socket and checkpoint (--api dra; default "
                       f"{KUBELET_PLUGINS_DIR}/{dra.DRIVER})")
    agent.add_argument("--dra-mps-shares", type=int, default=0, metavar="N",
                       help="--api dra: offer each GPU without MIG as N MPS shares (one device "
                       "with consumable capacity; needs --mps-root); 0: not offered")
    agent.add_argument("--dra-keep-slices", action="store_true",
                       help="--api dra: leave a released claim's slice on the card, free, so "
                       "the next pod of that placement starts without a create (a claim that "
                       "needs its room destroys it first)")
    agent.add_argument("--cdi-dir", default="/var/run/cdi",
                       help="where CDI specs of prepared devices are written (--api dra; "
                       "empty: none)")
    agent.set_defaults(run=run_agent)

    plugin = commands.add_parser(
        "device-plugin", help="run only the device plugins for the cards as they are",
        description="Advertise the node's current MIG devices / GPUs to the kubelet, one "
        "plugin per resource name, following layout and health changes.")
    _node_flags(plugin)
    plugin.add_argument("--poll-seconds", type=float, default=2.0,
                        help="how often the cards are re-read for layout changes")
    plugin.set_defaults(run=run_device_plugin)


def load_partition(path: str) -> NodePartition:
    try:
        document = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise InvalidInputError("--spec-file", f"cannot read {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise InvalidInputError("--spec-file", f"{path} is not UTF-8 text (byte {exc.start}); "
                                "give a NodePartition as YAML or JSON") from exc
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" at line {where.line + 1}" if where is not None else ""
        raise InvalidInputError("--spec-file", f"{path} is not valid YAML or JSON{line}: "
                                f"{getattr(exc, 'problem', None) or exc}") from exc
    if not isinstance(document, dict):
        raise InvalidInputError("--spec-file", f"{path} is not a NodePartition object")
    document.setdefault("metadata", {"name": "local"})
    from pydantic import ValidationError  # noqa: PLC0415

    try:
        return NodePartition.model_validate(document)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise InvalidInputError(f"{path}: {where}", first["msg"]) from exc


def run_agent(args: argparse.Namespace) -> int:
    logs.configure(args.log_level)
    if not args.once:
        return _run_connected(args)
    if args.api == "dra":
        raise InvalidInputError("--once", "a DRA node has no layout to apply: the scheduler "
                                "chooses placements and the agent makes them as claims are "
                                "prepared; drop --once (or --api dra)")
    if not args.spec_file:
        raise InvalidInputError("--spec-file", "--once needs the NodePartition to apply")
    partition = load_partition(args.spec_file)
    backend = open_backend(args.nvml)
    runtime = NodeRuntime(backend, _settings(args))
    try:
        result = Reconciler(runtime, _mps(args)).reconcile(partition)
    finally:
        runtime.stop()
        backend.close()
    print(yaml.safe_dump({"status": result.status.to_wire()}, sort_keys=False, width=100),
          end="")
    applied = next(c for c in result.status.conditions if c.type == "Applied")
    return 0 if applied.status == "True" else 1


log = logging.getLogger(__name__)

NVML_RETRY_S = 10.0
"""How often an agent whose NVML is not usable tries again."""


class _Probes:
    """The runner's probes once it runs; before that, live (the process answers) and not
    ready, so that a node without a usable NVML shows a pod that is not Ready, with the reason
    in its log, instead of a crash loop."""

    def __init__(self) -> None:
        self.runner: AgentRunner | None = None

    def live(self) -> bool:
        return self.runner.live() if self.runner is not None else True

    def ready(self) -> bool:
        return self.runner.ready() if self.runner is not None else False


def wait_for_nvml(spec: str, stop: threading.Event,
                  retry_s: float = NVML_RETRY_S) -> GpuBackend | None:
    """``open_backend(spec)``, tried again every ``retry_s`` while the driver's library or the
    simulator's state file is missing or refuses (a node whose driver is still installing, a
    mistyped path); each new reason is logged once, naming the flag and the chart value that
    set it. None when ``stop`` is set first. A malformed ``spec`` is refused at once."""
    said = ""
    while not stop.is_set():
        try:
            return open_backend(spec)
        except (BackendError, StateFileError) as exc:
            if str(exc) != said:
                said = str(exc)
                log.error("NVML is not usable, so the agent is not ready: --nvml %s: %s. "
                          "The chart sets it with agent.nvml (real: the driver's "
                          "libnvidia-ml.so.1, which the NVIDIA container toolkit mounts; "
                          "sim:FILE: a simulated node's state file). Trying again every %g s",
                          spec, exc, retry_s)
        stop.wait(retry_s)
    return None


def _run_connected(args: argparse.Namespace) -> int:
    if not args.node_name:
        raise InvalidInputError("--node-name", "the agent must know its node: pass --node-name "
                                "or set NODE_NAME (the chart sets it from spec.nodeName)")
    if args.api == "dra":
        _check_dra_flags(args)
    check_backend(args.nvml)  # a flag error exits 2 at once; only the node's state is waited for
    api = api_client(args.kubeconfig)
    metrics = AgentMetrics()
    probes = _Probes()
    stopped = threading.Event()

    def stop(*_: object) -> None:
        stopped.set()
        if probes.runner is not None:
            probes.runner.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if args.metrics_port:
        HealthServer(args.metrics_port, metrics.registry, live=probes.live, ready=probes.ready)
    backend = wait_for_nvml(args.nvml, stopped)
    if backend is None:
        return 0
    if args.api == "dra":
        runner = _dra_runner(args, api, backend, metrics)
    else:
        runtime = NodeRuntime(backend, _settings(args))
        runner = AgentRunner(args.node_name, runtime, Reconciler(runtime, _mps(args)),
                             NodePartitions(api),
                             events=EventRecorder(api, "agent"),
                             metrics=metrics, resync_s=args.resync_seconds)
    probes.runner = runner
    if stopped.is_set():
        runner.stop()
    try:
        runner.run()
    finally:
        backend.close()
    return 0


def _check_dra_flags(args: argparse.Namespace) -> None:
    """Refuse bad DRA settings before anything connects or starts."""
    if args.dra_mps_shares < 0 or args.dra_mps_shares > MPS_MAX_CLIENTS:
        raise InvalidInputError("--dra-mps-shares", f"{args.dra_mps_shares} is not 0 to "
                                f"{MPS_MAX_CLIENTS} (an MPS server serves at most "
                                f"{MPS_MAX_CLIENTS} clients)")
    if args.dra_mps_shares and not args.mps_root:
        raise InvalidInputError("--dra-mps-shares", "MPS shares need --mps-root (where the "
                                "daemons' pipes live), e.g. --mps-root /run/tessera/mps")


def _dra_runner(args: argparse.Namespace, api: Any, backend: GpuBackend,
                metrics: AgentMetrics) -> AgentRunner:
    """The DRA node's agent: the same runner loop, the DRA driver instead of the reconciler,
    and the kubelet plugin instead of the device plugins."""
    settings = dataclasses.replace(_settings(args), device_plugins=False)
    runtime = NodeRuntime(backend, settings)
    plugin_dir = Path(args.dra_plugin_dir or f"{KUBELET_PLUGINS_DIR}/{dra.DRIVER}")
    mps = _mps(args)
    driver = DraDriver(args.node_name, runtime, ResourceClaims(api), ResourceSlices(api),
                       plugin_dir, cdi_dir=Path(args.cdi_dir) if args.cdi_dir else None,
                       mps=mps, mps_shares=args.dra_mps_shares,
                       keep_slices=args.dra_keep_slices, metrics=metrics)
    server = DraPluginServer(dra.DRIVER, driver, plugins_registry_dir=args.plugins_registry,
                             plugin_dir=plugin_dir)
    runner = AgentRunner(args.node_name, runtime, DraReconciler(driver), NodePartitions(api),
                         events=EventRecorder(api, "agent"), metrics=metrics,
                         resync_s=args.resync_seconds, services=(server,))
    driver.changed = runner.wake
    return runner


def run_device_plugin(args: argparse.Namespace) -> int:
    logs.configure(args.log_level)
    backend = open_backend(args.nvml)
    runtime = NodeRuntime(backend, _settings(args))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    runtime.start()
    try:
        while not stop.wait(args.poll_seconds):
            runtime.refresh()
    finally:
        runtime.stop()
        backend.close()
    return 0
