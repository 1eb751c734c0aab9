"""NVIDIA's ``nvidia-mig-parted`` (v0.10.0, built from its module by ``make nvidia-tools``) as a
client of the simulated driver, and Tessera side by side with it on the same simulated card.

mig-parted was written against the real driver by the people who wrote it: every entry of the
GPU operator's default config that it applies and asserts on a simulated card is a check that
the simulator answers as the driver does (the calls, their order, the structs, the placement
rules and the errors mig-parted handles). Then Tessera must agree with it both ways:

* after ``mig-parted apply``, Tessera's agent (through the same library, its production path)
  reports that layout, and the policy ``tessera policy import-mig-parted`` makes of the same
  entry plans the same counts for the card, and no change to it;
* a layout Tessera's agent applies from that policy passes ``mig-parted assert`` of the entry.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tessera.agent.reconciler import Reconciler
from tessera.api.migparted import policy_from_mig_parted
from tessera.api.v1alpha1 import NodePartition, NodePartitionSpec, NodePartitionStatus, ObjectMeta
from tessera.controller.policies import policy_gpu_specs
from tessera.core import catalogue
from tessera.core.errors import InvalidInputError
from tessera.core.layout import layout_for_counts
from tessera.nvml.sim.server import NvmlServer
from tessera.nvml.sim.state import new_node_state
from tessera.nvml.sim.store import load_state_file, write_new_state_file
from tessera.testing import nvml_library, short_socket_dir
from tessera.testing.cluster.fixtures import require_nvidia_tools, require_nvml_library
from tessera.testing.nvidia_host import NvidiaHost, mig_parted_readable
from tests._nvml_calls import documented

MODELS = ("A100-80GB", "H100-80GB", "H200-141GB", "B200-180GB")
"""The cards the issue names; the 2026 default config covers B200 (v0.10.0's own does not)."""

CONFIG_MAP = Path(__file__).parents[2] / "api" / "data" / \
    "gpu-operator-default-mig-parted-config.yaml"
"""The GPU operator's default mig-parted ConfigMap, as it ships."""

SKIP_RESET = {"MIG_PARTED_SKIP_RESET": "true"}
"""Every card starts in MIG mode, so no entry asks for a mode change and a GPU reset; this only
keeps mig-parted from reaching for ``nvidia-smi`` if one ever did."""


@functools.cache
def _document() -> dict[str, Any]:
    config_map = yaml.safe_load(CONFIG_MAP.read_text())
    return mig_parted_readable(yaml.safe_load(config_map["data"]["config.yaml"]))


def _canonical(model: catalogue.GpuModel, counts: Mapping[str, int]) -> Counter[str]:
    return Counter({model.profile(name).name: number for name, number in counts.items()})


@functools.cache
def _entries(model_name: str) -> list[tuple[str, Counter[str]]]:
    """Each config of the default file that cuts this card into MIG devices, with its counts:
    an entry filtered to one of the card's PCI ids, or an unfiltered one whose profiles the
    card has and fits (mig-parted would fail on any other card too)."""
    model = catalogue.model(model_name)
    ids = {f"0x{number:08x}" for number in model.pci_device_ids}
    found = []
    for name, entries in _document()["mig-configs"].items():
        for entry in entries:
            if not entry.get("mig-enabled") or not entry.get("mig-devices"):
                continue
            filters = entry.get("device-filter")
            if filters is not None:
                wanted = {filters.lower()} if isinstance(filters, str) else {
                    f.lower() for f in filters}
                if not ids & wanted:
                    continue
            else:
                try:
                    layout_for_counts(model, entry["mig-devices"])
                except InvalidInputError:
                    continue
            found.append((name, _canonical(model, entry["mig-devices"])))
            break
    return found


def _counts(status: NodePartitionStatus) -> list[Counter[str]]:
    return [Counter(s.profile for s in gpu.slices) for gpu in status.gpus]


def _report(status: NodePartitionStatus | None = None, *,
            spec: NodePartitionSpec | None = None) -> NodePartition:
    return NodePartition(metadata=ObjectMeta(name="node-a", generation=1),
                         spec=spec or NodePartitionSpec(gpus=[]), status=status)


@contextlib.contextmanager
def _tessera_agent(socket: Path) -> Iterator[Reconciler]:
    """Tessera's agent runtime on the node, reaching its cards through the library."""
    with nvml_library.agent_beside_stand_in(socket) as runtime:
        yield Reconciler(runtime)


@dataclass
class _Node:
    host: NvidiaHost
    reconciler: Reconciler
    server: NvmlServer

    def calls(self, *, ours: bool) -> set[str]:
        """The calls the simulator saw from this process (Tessera's agent), or from others
        (mig-parted)."""
        return set().union(*(names for pid, names in self.server.calls_by_client.items()
                             if (pid == os.getpid()) == ours))


@contextlib.contextmanager
def _node(tmp_path: Path, model: str) -> Iterator[_Node]:
    """One card of ``model`` in MIG mode, empty, behind the library; NVIDIA's tools and
    Tessera's agent both reach it."""
    library = require_nvml_library()
    state = tmp_path / "node.json"
    write_new_state_file(state, new_node_state("node-a", [model]))
    with short_socket_dir() as sockets, NvmlServer(state, sockets / "nvml.sock") as server:
        host = NvidiaHost(tmp_path / "host", load_state_file(state), library,
                          sockets / "nvml.sock")
        with _tessera_agent(sockets / "nvml.sock") as reconciler:
            yield _Node(host, reconciler, server)


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("mig-parted") / "config.yaml"
    path.write_text(yaml.safe_dump(_document()))
    return path


@pytest.fixture(scope="module")
def mig_parted() -> str:
    return str(require_nvidia_tools() / "nvidia-mig-parted")


def test_the_default_config_names_every_size_of_each_card_and_the_balanced_mix() -> None:
    for model in MODELS:
        names = [name for name, _ in _entries(model)]
        assert "all-balanced" in names, model
        sizes = {p.name for p in catalogue.model(model).profiles}
        covered = {profile for _, counts in _entries(model) for profile in counts}
        assert covered == sizes, f"{model}: the file cuts no card into {sizes - covered}"


@pytest.mark.parametrize("model", MODELS)
def test_mig_parted_applies_each_entry_and_tessera_reports_and_plans_the_same(
        model: str, config: Path, mig_parted: str, tmp_path: Path) -> None:
    document = yaml.safe_load(config.read_text())
    with _node(tmp_path, model) as node:
        host, reconciler = node.host, node.reconciler
        for name, counts in _entries(model):  # one card taken through every entry in turn
            applied = host.run([mig_parted, "apply", "-f", str(config), "-c", name],
                               env=SKIP_RESET)
            assert applied.returncode == 0, f"{name}: {applied.stdout}{applied.stderr}"
            asserted = host.run([mig_parted, "assert", "-f", str(config), "-c", name])
            assert asserted.returncode == 0, f"{name}: {asserted.stdout}{asserted.stderr}"
            exported = host.run([mig_parted, "export"])
            assert exported.returncode == 0, exported.stderr
            (current,) = yaml.safe_load(exported.stdout)["mig-configs"].values()
            assert [_canonical(catalogue.model(model), e["mig-devices"]) for e in current] == [
                counts], f"{name}: mig-parted exports what it applied"

            status = reconciler.reconcile(_report()).status
            assert _counts(status) == [counts], f"{name}: Tessera's agent reports the layout"

            policy = policy_from_mig_parted(document, name).policy
            specs = policy_gpu_specs(policy, _report(status))
            assert specs is not None
            assert [Counter(s.profile for s in spec.slices) for spec in specs] == [counts], \
                f"{name}: the imported policy plans the same counts"
            held = reconciler.reconcile(_report(status, spec=NodePartitionSpec(
                gpus=specs, plan_id=name)))
            assert held.done == [], f"{name}: the policy keeps mig-parted's layout as it is"
            assert host.run([mig_parted, "assert", "-f", str(config), "-c",
                             name]).returncode == 0
        seen = node.calls(ours=False)
        assert seen <= documented("mig-parted"), "the README's table lists every call it makes"
        assert documented("mig-parted") - seen <= {"nvmlDeviceSetMigMode"}, \
            "and no other (mode changes: tests/e2e/test_nvidia_device_plugin.py)"


@pytest.mark.parametrize("model", MODELS)
def test_a_layout_tessera_applies_from_an_imported_entry_passes_mig_parted_assert(
        model: str, config: Path, mig_parted: str, tmp_path: Path) -> None:
    document = yaml.safe_load(config.read_text())
    with _node(tmp_path, model) as node:
        host, reconciler = node.host, node.reconciler
        for name, counts in _entries(model):
            status = reconciler.reconcile(_report()).status
            specs = policy_gpu_specs(policy_from_mig_parted(document, name).policy,
                                     _report(status))
            assert specs is not None
            result = reconciler.reconcile(_report(status, spec=NodePartitionSpec(
                gpus=specs, plan_id=name)))
            applied = next(c for c in result.status.conditions if c.type == "Applied")
            assert applied.status == "True", f"{name}: {applied.message}"
            assert _counts(result.status) == [counts]
            asserted = host.run([mig_parted, "assert", "-f", str(config), "-c", name])
            assert asserted.returncode == 0, f"{name}: {asserted.stdout}{asserted.stderr}"
            others = [other for other, theirs in _entries(model) if theirs != counts]
            refused = host.run([mig_parted, "assert", "-f", str(config), "-c", others[0]])
            assert refused.returncode != 0, f"{name}: assert of {others[0]} must fail"
