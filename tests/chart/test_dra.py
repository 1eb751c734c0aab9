"""The chart's DRA values: which nodes run which agent, and the DeviceClasses it installs."""

from __future__ import annotations

from typing import Any

import pytest

from tessera.core import catalogue, dra
from tessera.testing.cluster._cluster import Binaries
from tessera.testing.cluster.fixtures import require_binaries

from .test_chart import CHART, helm, render


@pytest.fixture(scope="module")
def binaries() -> Binaries:
    return require_binaries()


def _by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def test_dra_is_off_by_default(binaries: Binaries) -> None:
    docs = render(binaries)
    assert list(_by_kind(docs, "DaemonSet")) == ["tessera-agent"]
    assert not _by_kind(docs, "DeviceClass")
    (daemonset,) = _by_kind(docs, "DaemonSet").values()
    assert "affinity" not in daemonset["spec"]["template"]["spec"]


def test_a_node_runs_the_device_plugin_agent_or_the_dra_one_never_both(
        binaries: Binaries) -> None:
    docs = render(binaries, "dra.enabled=true", "dra.nodeSelector.pool=dra-a100")
    sets = _by_kind(docs, "DaemonSet")
    plugin, on_dra = sets["tessera-agent"], sets["tessera-agent-dra"]
    assert plugin["spec"]["selector"] != on_dra["spec"]["selector"], "two DaemonSets' pods"
    dra_selector = on_dra["spec"]["template"]["spec"]["nodeSelector"]
    assert dra_selector == {"nvidia.com/gpu.present": "true", "tessera.dev/api": "dra",
                            "pool": "dra-a100"}
    terms = plugin["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    # a node carrying every DRA label matches no term: no device-plugin agent there
    assert sorted(t["matchExpressions"][0]["key"] for t in terms) == ["pool", "tessera.dev/api"]
    assert all(t["matchExpressions"][0]["operator"] == "NotIn" for t in terms)
    args = on_dra["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--api=dra" in args
    assert "--plugins-registry=/var/lib/kubelet/plugins_registry" in args
    assert "--dra-keep-slices" not in args
    kept = _by_kind(render(binaries, "dra.enabled=true", "dra.keepSlices=true"), "DaemonSet")
    assert "--dra-keep-slices" in kept["tessera-agent-dra"]["spec"]["template"]["spec"][
        "containers"][0]["args"]
    (controller,) = _by_kind(docs, "Deployment").values()
    assert "--dra-node-selector=pool=dra-a100,tessera.dev/api=dra" in (
        controller["spec"]["template"]["spec"]["containers"][0]["args"])


def test_one_device_class_per_profile_name_maps_nvidias_resource_name(
        binaries: Binaries) -> None:
    classes = _by_kind(render(binaries, "dra.enabled=true"), "DeviceClass")
    names = dra.all_profile_names()
    assert len(classes) == len(names) + 2
    one = classes[dra.device_class_name("1g.10gb+me")]
    assert one["spec"]["extendedResourceName"] == catalogue.mig_resource_name("1g.10gb+me")
    assert one["spec"]["extendedResourceName"] == "nvidia.com/mig-1g.10gb.me"
    assert 'profile == "1g.10gb+me"' in one["spec"]["selectors"][0]["cel"]["expression"]
    assert "extendedResourceName" not in classes[f"mig.{dra.DRIVER}"]["spec"]
    shared = classes[dra.MPS_DEVICE_CLASS]["spec"]
    assert shared["extendedResourceName"] == catalogue.MPS_SHARED_RESOURCE
    assert 'mode == "mps"' in shared["selectors"][0]["cel"]["expression"]


def test_the_agent_may_write_resource_slices_only_with_dra(binaries: Binaries) -> None:
    def agent_rules(*sets: str) -> list[dict[str, Any]]:
        role = _by_kind(render(binaries, *sets), "ClusterRole")["tessera-agent"]
        return [r for r in role["rules"] if "resource.k8s.io" in r["apiGroups"]]

    assert agent_rules() == []
    assert {r["resources"][0] for r in agent_rules("dra.enabled=true")} == {
        "resourceslices", "resourceclaims"}
    policies = _by_kind(render(binaries, "dra.enabled=true"), "ValidatingAdmissionPolicy")
    assert "tessera-agent-own-slices" in policies


def test_an_empty_dra_node_selector_is_refused(binaries: Binaries) -> None:
    # null removes the default label: no label left would put every GPU node on DRA *and*
    # on device plugins
    result = helm(binaries, "template", "tessera", str(CHART), "--set", "dra.enabled=true",
                  "--set", "dra.nodeSelector.tessera\\.dev/api=null")
    assert result.returncode != 0
    assert "/dra/nodeSelector" in result.stderr


def test_the_controller_may_touch_only_the_shares_device_class(binaries: Binaries) -> None:
    """It annotates the MPS shares' DeviceClass to have the scheduler retry share pods."""
    roles = _by_kind(render(binaries, "dra.enabled=true"), "ClusterRole")
    rules = [r for r in roles["tessera-controller"]["rules"]
             if "deviceclasses" in r["resources"]]
    assert rules == [{"apiGroups": ["resource.k8s.io"], "resources": ["deviceclasses"],
                      "resourceNames": [dra.MPS_DEVICE_CLASS], "verbs": ["get", "patch"]}]
    off = _by_kind(render(binaries), "ClusterRole")["tessera-controller"]["rules"]
    assert not [r for r in off if "deviceclasses" in r["resources"]]
