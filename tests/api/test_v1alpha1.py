"""The custom resources: what a valid object looks like on the wire, and what is refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from tessera.api.v1alpha1 import GpuSpec, NodePartition, PartitionPolicySpec

ROOT = Path(__file__).resolve().parents[2]


def test_a_node_partition_round_trips_in_camel_case() -> None:
    wire = {
        "apiVersion": "tessera.dev/v1alpha1",
        "kind": "NodePartition",
        "metadata": {"name": "node-a", "generation": 3},
        "spec": {"planId": "p-7", "gpus": [
            {"index": 0, "mode": "mig", "slices": [{"profile": "1g.10gb+me", "start": 0}]},
            {"uuid": "GPU-29740a30-5529-5daa-940a-26ee53ffc511", "mode": "mps",
             "mps": {"shares": 4, "memoryMiB": 8192}},
        ]},
    }
    partition = NodePartition.model_validate(wire)
    assert partition.spec.gpus[1].mps is not None
    assert partition.spec.gpus[1].mps.memory_mi_b == 8192
    assert partition.spec.plan_id == "p-7"
    assert partition.to_wire()["spec"] == wire["spec"]


def test_unknown_spec_fields_are_refused_with_their_name() -> None:
    with pytest.raises(ValidationError) as error:
        GpuSpec.model_validate({"index": 0, "mode": "mig", "slice": []})
    assert error.value.errors()[0]["loc"] == ("slice",)


@pytest.mark.parametrize(("spec", "field"), [
    ({"index": 0, "mode": "split"}, "mode"),
    ({"index": 0, "mode": "mig", "slices": [{"profile": "1g.10gb", "start": 12}]}, "slices"),
    ({"index": 0, "mode": "mig", "slices": [{"profile": "1g.10gb+me-me", "start": 0}]},
     "slices"),
    ({"index": 0, "mode": "mps", "mps": {"shares": 49}}, "mps"),
    ({"index": 0, "mode": "mps", "mps": {"shares": 2, "threadPercentage": 101}}, "mps"),
])
def test_out_of_range_values_are_refused(spec: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError) as error:
        GpuSpec.model_validate(spec)
    assert error.value.errors()[0]["loc"][0] == field


def test_a_policy_takes_mig_parted_style_static_layouts() -> None:
    policy = PartitionPolicySpec.model_validate({
        "nodeSelector": {"matchLabels": {"gpu": "a100"}},
        "mode": "static",
        "static": [{"devices": [0, 1], "migEnabled": True, "migDevices": {"1g.10gb": 7}}],
    })
    assert policy.static[0].mig_devices == {"1g.10gb": 7}


def test_the_crd_manifests_are_generated_from_the_models() -> None:
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "gen_crds.py"), "--check"],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_crds_carry_status_columns_and_cel_rules() -> None:
    path = ROOT / "charts" / "tessera" / "crds" / "tessera.dev_nodepartitions.yaml"
    crd = yaml.safe_load(path.read_text())
    assert crd["spec"]["scope"] == "Cluster"
    (version,) = crd["spec"]["versions"]
    assert version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]][:3] == [
        "Plan", "Applied", "Ready"]
    gpu = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["gpus"]
    rules = [r["rule"] for r in gpu["items"]["x-kubernetes-validations"]]
    assert "has(self.index) != has(self.uuid)" in rules
    assert gpu["maxItems"] == 64  # CEL cost estimation needs bounded lists

    def no_refs(node: object) -> bool:
        if isinstance(node, dict):
            return "$ref" not in node and "anyOf" not in node and all(
                no_refs(v) for v in node.values())
        if isinstance(node, list):
            return all(no_refs(v) for v in node)
        return True

    assert no_refs(version["schema"]), "a structural schema has no $ref or anyOf"


def test_an_empty_spec_is_still_sent() -> None:
    """The CRD requires ``spec``; an agent creating its empty NodePartition must send one."""
    wire = NodePartition.model_validate({"metadata": {"name": "n"}}).to_wire()
    assert wire["spec"] == {}
    assert (wire["apiVersion"], wire["kind"]) == ("tessera.dev/v1alpha1", "NodePartition")
