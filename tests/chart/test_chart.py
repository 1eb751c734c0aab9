"""The chart as helm renders it: what an admin's values produce, and which values it refuses.

helm comes from the test cluster's binaries (``make cluster-bins``); nothing here needs a
running cluster.
"""

from __future__ import annotations

import json
import subprocess
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml

from tessera.api.v1alpha1 import PartitionPolicySpec
from tessera.cli.controller_cmd import settings_of
from tessera.cli.main import build_parser
from tessera.controller.loop import ControllerSettings
from tessera.testing.cluster._cluster import Binaries
from tessera.testing.cluster.fixtures import require_binaries

CHART = Path(__file__).resolve().parents[2] / "charts" / "tessera"


@pytest.fixture(scope="module")
def binaries() -> Binaries:
    return require_binaries()


def helm(binaries: Binaries, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([binaries["helm"], *args], capture_output=True, text=True,
                          timeout=60, check=False)


def render(binaries: Binaries, *sets: str) -> list[dict[str, Any]]:
    flags = [f for s in sets for f in ("--set", s)]
    result = helm(binaries, "template", "tessera", str(CHART), "-n", "tessera", *flags)
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def test_the_chart_lints_clean(binaries: Binaries) -> None:
    result = helm(binaries, "lint", str(CHART))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(("value", "message"), [
    ("controller.solver=best", "at '/controller/solver': value must be one of 'fast', 'exact'"),
    ("agent.nvml=fake", "at '/agent/nvml': 'fake' does not match pattern"),
    ("controler.replicas=3", "additional properties 'controler' not allowed"),
    ("controller.replicas=0", "at '/controller/replicas'"),
    ("controller.reservations=-1", "at '/controller/reservations'"),
    ("controller.reservations=0.5", "at '/controller/reservations'"),
    ("controller.reserveAfterWaits=-1", "at '/controller/reserveAfterWaits'"),
    ("admission.failurePolicy=Sometimes", "at '/admission/failurePolicy'"),
    ("defaultPolicy.spec.mode=greedy", "at '/defaultPolicy/spec/mode'"),
    ("agent.nvml=sim:relative.json", "at '/agent/nvml'"),
    ("agent.simulatedDriver.library=/lib/libcuda.so.1", "at '/agent/simulatedDriver/library'"),
    ("apiServer.port=http", "at '/apiServer/port'"),
    ("apiServer.hots=x", "additional properties 'hots' not allowed"),
    ("agent.livenessProbe.periodSeconds=0", "at '/agent/livenessProbe/periodSeconds'"),
])
def test_bad_values_are_refused_naming_the_field(binaries: Binaries, value: str,
                                                 message: str) -> None:
    result = helm(binaries, "template", "tessera", str(CHART), "--set", value)
    assert result.returncode != 0
    assert message in result.stderr


def _containers(binaries: Binaries, *sets: str) -> dict[str, dict[str, Any]]:
    """The agent's and the controller's container, by workload kind."""
    return {d["kind"]: d["spec"]["template"]["spec"]["containers"][0]
            for d in render(binaries, *sets) if d["kind"] in ("Deployment", "DaemonSet")}


def _pod_specs(binaries: Binaries, *sets: str) -> dict[str, dict[str, Any]]:
    return {d["kind"]: d["spec"]["template"]["spec"]
            for d in render(binaries, *sets) if d["kind"] in ("Deployment", "DaemonSet")}


def test_both_components_have_probes_on_their_metrics_port(binaries: Binaries) -> None:
    """The agent is on the node's network by default, so the kubelet (in that network) asks
    it on loopback; the controller is on the pod network unless controller.hostNetwork."""
    containers = _containers(binaries)
    agent, controller = containers["DaemonSet"], containers["Deployment"]
    assert agent["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics",
                                                 "host": "127.0.0.1"}
    assert agent["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics",
                                                  "host": "127.0.0.1"}
    assert controller["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert controller["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    specs = _pod_specs(binaries)
    assert specs["DaemonSet"]["hostNetwork"] is True
    assert specs["DaemonSet"]["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert "hostNetwork" not in specs["Deployment"]
    on_host = _containers(binaries, "controller.hostNetwork=true", "agent.hostNetwork=false")
    assert on_host["Deployment"]["livenessProbe"]["httpGet"]["host"] == "127.0.0.1"
    assert "host" not in on_host["DaemonSet"]["livenessProbe"]["httpGet"]


def test_the_agent_s_liveness_probe_is_tunable(binaries: Binaries) -> None:
    probe = _containers(binaries)["DaemonSet"]["livenessProbe"]
    assert (probe["periodSeconds"], probe["failureThreshold"],
            probe["terminationGracePeriodSeconds"]) == (20, 3, 30)
    fast = _containers(binaries, "agent.livenessProbe.periodSeconds=2",
                       "agent.livenessProbe.failureThreshold=2")["DaemonSet"]["livenessProbe"]
    assert (fast["periodSeconds"], fast["failureThreshold"]) == (2, 2)


def test_api_server_values_set_the_in_cluster_address_of_both_components(
        binaries: Binaries) -> None:
    for containers in (_containers(binaries), _containers(binaries, "apiServer.port=6443")):
        for container in containers.values():
            assert not [e for e in container.get("env", [])
                        if e["name"].startswith("KUBERNETES_SERVICE")], "default: the Service"
    containers = _containers(binaries, "apiServer.host=10.0.0.1", "apiServer.port=6443")
    for container in containers.values():
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["KUBERNETES_SERVICE_HOST"] == "10.0.0.1"
        assert env["KUBERNETES_SERVICE_PORT"] == "6443"
    only_host = _containers(binaries, "apiServer.host=api.internal")["DaemonSet"]
    env = {e["name"]: e.get("value") for e in only_host["env"]}
    assert env["KUBERNETES_SERVICE_PORT"] == "443"


def test_the_agent_runs_as_root_and_the_controller_as_the_image_s_user(
        binaries: Binaries) -> None:
    containers = _containers(binaries)
    assert containers["DaemonSet"]["securityContext"] == {"privileged": True, "runAsUser": 0}
    controller = containers["Deployment"]["securityContext"]
    assert (controller["runAsNonRoot"], controller["runAsUser"],
            controller["runAsGroup"]) == (True, 65532, 65532)


def test_a_simulated_gpu_s_state_folder_is_mounted_only_for_sim(binaries: Binaries) -> None:
    spec = _pod_specs(binaries, "agent.nvml=sim:/var/lib/tessera-sim/node.json")["DaemonSet"]
    (volume,) = [v for v in spec["volumes"] if v["name"] == "nvml-sim"]
    assert volume["hostPath"] == {"path": "/var/lib/tessera-sim", "type": "Directory"}
    (mount,) = [m for m in spec["containers"][0]["volumeMounts"] if m["name"] == "nvml-sim"]
    assert mount["mountPath"] == "/var/lib/tessera-sim"
    assert "--nvml=sim:/var/lib/tessera-sim/node.json" in spec["containers"][0]["args"]
    real = _pod_specs(binaries)["DaemonSet"]
    assert not [v for v in real["volumes"] if v["name"] == "nvml-sim"]


def test_a_simulated_driver_is_mounted_where_the_toolkit_mounts_the_driver_s(
        binaries: Binaries) -> None:
    """The agent then runs its production path (--nvml=real): pynvml's dlopen of
    libnvidia-ml.so.1 finds the simulated library, which finds the simulator's socket."""
    spec = _pod_specs(binaries, "agent.simulatedDriver.library="
                      "/var/lib/tessera-sim/driver/libnvidia-ml.so.1")["DaemonSet"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["name"]: m for m in spec["containers"][0]["volumeMounts"]}
    assert volumes["simulated-driver"]["hostPath"] == {
        "path": "/var/lib/tessera-sim/driver/libnvidia-ml.so.1", "type": "File"}
    assert mounts["simulated-driver"] == {
        "name": "simulated-driver", "readOnly": True,
        "mountPath": "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"}
    assert volumes["simulated-driver-socket"]["hostPath"]["path"] == "/var/lib/tessera-sim"
    assert mounts["simulated-driver-socket"]["mountPath"] == "/var/lib/tessera-sim"
    assert "--nvml=real" in spec["containers"][0]["args"]
    real = _pod_specs(binaries)["DaemonSet"]
    assert not {"simulated-driver", "simulated-driver-socket"} & {v["name"] for v in
                                                                  real["volumes"]}


def test_the_controller_has_a_disruption_budget_when_it_has_a_standby(
    binaries: Binaries,
) -> None:
    (budget,) = [d for d in render(binaries) if d["kind"] == "PodDisruptionBudget"]
    assert budget["spec"]["maxUnavailable"] == 1
    assert not [d for d in render(binaries, "controller.replicas=1")
                if d["kind"] == "PodDisruptionBudget"]


def controller_args(binaries: Binaries, *sets: str) -> list[str]:
    (deployment,) = [d for d in render(binaries, *sets) if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return typing.cast(list[str], container["args"])


def test_the_controller_parses_every_flag_the_chart_gives_it(binaries: Binaries) -> None:
    """The chart's defaults are ControllerSettings' own, and the values an admin sets reach the
    controller's settings through its flags."""
    parse = build_parser().parse_args
    defaults = settings_of(parse(controller_args(binaries)))
    assert defaults.reservations == ControllerSettings.reservations
    assert defaults.reserve_after_waits == ControllerSettings.reserve_after_waits
    assert defaults.backlog_batch_s == ControllerSettings.backlog_batch_s
    chosen = settings_of(parse(controller_args(
        binaries, "controller.reservations=0", "controller.reserveAfterWaits=4")))
    assert (chosen.reservations, chosen.reserve_after_waits) == (0, 4.0)


def test_a_default_policy_is_optional_and_survives_uninstall(binaries: Binaries) -> None:
    assert not [d for d in render(binaries) if d["kind"] == "PartitionPolicy"]
    (policy,) = [d for d in render(binaries, "defaultPolicy.enabled=true")
                 if d["kind"] == "PartitionPolicy"]
    assert policy["spec"] == {"mode": "dynamic", "nodeSelector": {
        "matchLabels": {"nvidia.com/gpu.present": "true"}}}
    assert policy["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def test_the_notes_say_what_to_do_next(binaries: Binaries) -> None:
    result = helm(binaries, "install", "tessera", str(CHART), "-n", "tessera",
                  "--dry-run=client")
    notes = result.stdout.split("NOTES:", 1)[1]
    assert "kind: PartitionPolicy" in notes  # the example to apply
    assert "kubectl get nodepartitions" in notes
    assert "Uninstalling" in notes


def test_the_default_policys_modes_are_the_crds() -> None:
    """values.schema.json repeats the PartitionPolicy's mode enum; it must not drift."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    enum = schema["properties"]["defaultPolicy"]["properties"]["spec"]["properties"]["mode"]
    modes = typing.get_args(PartitionPolicySpec.model_fields["mode"].annotation)
    assert enum["enum"] == list(modes)
