"""The agent's DRA driver on a simulated node: what it publishes, and what a prepare makes.

The kubelet's calls arrive through :class:`DraDriver`'s ``ClaimPreparer`` methods (the gRPC
translation has its own tests in tests/kubelet/test_dra.py); the API server is replaced by a
claim table and a pool recorder. The real API server and kubelet run in tests/e2e/test_dra.py.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from tessera.agent.dra import DraDriver, DraReconciler, PrepareError
from tessera.agent.mps import MpsManager
from tessera.api.v1alpha1 import (
    DraCuration,
    DraSpec,
    NodePartition,
    NodePartitionSpec,
    ObjectMeta,
)
from tessera.core import dra
from tessera.kube.resourceslices import ClaimDevice
from tessera.kubelet.dra import ClaimRef
from tessera.nvml.sim import operations

from .conftest import AgentNode
from .test_mps import StandIn, standin

__all__ = ["standin"]  # the MPS stand-in fixture, shared with the MPS tests

NODE = "node-a"


class Claims:
    """The API server's ResourceClaims, as far as the driver reads them."""

    def __init__(self) -> None:
        self.table: dict[str, tuple[ClaimRef, list[ClaimDevice]]] = {}

    def allocate(self, name: str, *devices: str) -> ClaimRef:
        claim = ClaimRef("default", f"uid-{name}", name)
        self.table[claim.uid] = (claim, [ClaimDevice(f"req-{i}", dra.DRIVER, NODE, d)
                                         for i, d in enumerate(devices)])
        return claim

    def allocated(self, namespace: str, name: str, uid: str) -> list[ClaimDevice] | None:
        found = self.table.get(uid)
        return None if found is None else list(found[1])


class Pool:
    def __init__(self) -> None:
        self.specs: dict[str, dict[str, Any]] = {}
        self.syncs = 0

    def sync(self, node: str, specs: Mapping[str, dict[str, Any]]) -> bool:
        self.syncs += 1
        changed = dict(specs) != self.specs
        self.specs = dict(specs)
        return changed

    def devices(self) -> dict[str, dict[str, Any]]:
        return {d["name"]: d for s in self.specs.values() for d in s.get("devices", [])}

    def counters(self, gpu: int) -> dict[str, int]:
        for spec in self.specs.values():
            for counter_set in spec.get("sharedCounters", []):
                if counter_set["name"] == dra.counter_set_name(gpu):
                    return {k: int(v["value"]) for k, v in counter_set["counters"].items()}
        raise KeyError(gpu)


@pytest.fixture
def parts(agent_node: AgentNode, tmp_path: Path) -> tuple[DraDriver, Claims, Pool]:
    claims, pool = Claims(), Pool()
    driver = DraDriver(NODE, agent_node.runtime, claims, pool, tmp_path / "plugin",
                       cdi_dir=tmp_path / "cdi")
    driver.publish()
    return driver, claims, pool


def test_the_pool_offers_every_placement_of_every_gpu_in_mig_mode(
        agent_node: AgentNode, parts: tuple[DraDriver, Claims, Pool]) -> None:
    _driver, _claims, pool = parts
    assert all(g.mig_current for g in agent_node.backend.gpus()), "MIG turned on for DRA"
    devices = pool.devices()
    assert len(devices) == 3 * 25
    assert devices["gpu-0-1g10gb-at-6"]["attributes"]["profile"] == {"string": "1g.10gb"}
    assert pool.counters(2)["compute-slices"] == 7
    slice_counts = {s["pool"]["resourceSliceCount"] for s in pool.specs.values()}
    assert slice_counts == {4}, "one counter slice and one device slice per GPU"


def test_prepare_makes_the_allocated_slice_and_answers_its_cdi_id(
        agent_node: AgentNode, parts: tuple[DraDriver, Claims, Pool], tmp_path: Path) -> None:
    driver, claims, _pool = parts
    claim = claims.allocate("a", "gpu-1-3g40gb-at-4")
    prepared = driver.prepare(claim)
    assert agent_node.layout(1) == {"3g.40gb@4"}
    (instance,) = agent_node.backend.gpu_instances(1)
    (device,) = prepared.devices
    assert device.cdi_device_ids == (f"gpu.tessera.dev/mig={instance.uuid}",)
    assert (device.pool_name, device.device_name, device.request_names) == (
        NODE, "gpu-1-3g40gb-at-4", ("req-0",))
    cdi = (tmp_path / "cdi" / f"gpu.tessera.dev-{claim.uid}.json").read_text()
    assert f"NVIDIA_VISIBLE_DEVICES={instance.uuid}" in cdi
    assert driver.prepare(claim) == prepared, "a repeated prepare gives the same device"
    restarted = DraDriver(NODE, agent_node.runtime, claims, Pool(), tmp_path / "plugin")
    assert restarted.prepare(claim) == prepared, "and so does the agent after a restart"
    assert agent_node.layout(1) == {"3g.40gb@4"}


def test_a_device_the_node_does_not_offer_fails_and_creates_nothing(
        agent_node: AgentNode, parts: tuple[DraDriver, Claims, Pool]) -> None:
    driver, claims, _pool = parts
    claim = claims.allocate("b", "gpu-0-1g10gb-at-0", "gpu-7-1g10gb-at-0")
    with pytest.raises(PrepareError, match="gpu-7-1g10gb-at-0 is not offered by node node-a"):
        driver.prepare(claim)
    assert agent_node.layout(0) == set()
    assert driver.prepared_claims() == {}


def test_an_unhealthy_gpu_is_tainted_and_refuses_prepares(
        agent_node: AgentNode, parts: tuple[DraDriver, Claims, Pool]) -> None:
    driver, claims, pool = parts
    driver.prepare(claims.allocate("a", "gpu-0-1g10gb-at-6"))
    (instance,) = agent_node.backend.gpu_instances(0)
    assert instance.uuid is not None
    with agent_node.store.mutate() as state:
        operations.inject_xid(state, instance.uuid, 48)
    deadline = time.monotonic() + 5  # the Xid watcher polls NVML's events
    while not agent_node.runtime.health.gpu_health(agent_node.backend.gpus()[0].uuid, ())[1]:
        assert time.monotonic() < deadline, "the Xid was never noticed"
        time.sleep(0.05)
    driver.publish()
    taints = pool.devices()["gpu-0-7g80gb-at-0"].get("taints", [])
    assert taints == [{"key": dra.TAINT_UNHEALTHY, "value": "xid-48", "effect": "NoSchedule"}]
    assert "taints" not in pool.devices()["gpu-1-7g80gb-at-0"]
    with pytest.raises(PrepareError, match="tainted unhealthy after Xid 48; nothing was created"):
        driver.prepare(claims.allocate("b", "gpu-0-1g10gb-at-5"))
    assert agent_node.layout(0) == {"1g.10gb@6"}


def test_a_prepare_cut_short_by_a_crash_adopts_the_slice_it_made(
        agent_node: AgentNode, parts: tuple[DraDriver, Claims, Pool], tmp_path: Path) -> None:
    driver, claims, _pool = parts
    claim = claims.allocate("a", "gpu-2-2g20gb-at-2")
    driver._record(claim, agent_node.runtime.refresh())  # recorded; the agent dies mid-create
    agent_node.backend.create_slice(2, "2g.20gb", 2)
    restarted = DraDriver(NODE, agent_node.runtime, claims, Pool(), tmp_path / "plugin")
    restarted.publish()
    assert agent_node.layout(2) == {"2g.20gb@2"}, "a recorded slice is no stray"
    (device,) = restarted.prepare(claim).devices
    (instance,) = agent_node.backend.gpu_instances(2)
    assert device.cdi_device_ids == (f"gpu.tessera.dev/mig={instance.uuid}",)


def test_a_claim_deleted_mid_prepare_is_undone(
        agent_node: AgentNode, parts: tuple[DraDriver, Claims, Pool], tmp_path: Path) -> None:
    driver, claims, _pool = parts
    claim = claims.allocate("a", "gpu-2-2g20gb-at-2")
    driver._record(claim, agent_node.runtime.refresh())
    agent_node.backend.create_slice(2, "2g.20gb", 2)
    del claims.table[claim.uid]
    restarted = DraDriver(NODE, agent_node.runtime, claims, Pool(), tmp_path / "plugin")
    restarted.publish()
    assert agent_node.layout(2) == set()
    assert restarted.prepared_claims() == {}


def test_unprepare_destroys_the_slice_and_is_idempotent(
        agent_node: AgentNode, parts: tuple[DraDriver, Claims, Pool], tmp_path: Path) -> None:
    driver, claims, _pool = parts
    claim = claims.allocate("a", "gpu-0-4g40gb-at-0")
    driver.prepare(claim)
    assert driver.unprepare(claim) is None
    assert agent_node.layout(0) == set()
    assert driver.unprepare(claim) is None
    assert not list((tmp_path / "cdi").iterdir())


def test_unprepare_never_destroys_a_slice_with_processes(
        agent_node: AgentNode, parts: tuple[DraDriver, Claims, Pool]) -> None:
    driver, claims, _pool = parts
    claim = claims.allocate("a", "gpu-0-4g40gb-at-0")
    driver.prepare(claim)
    (instance,) = agent_node.backend.gpu_instances(0)
    assert instance.uuid is not None
    with agent_node.store.mutate() as state:
        operations.add_process(state, instance.uuid, pid=77)
    with pytest.raises(PrepareError, match="still has processes"):
        driver.unprepare(claim)
    assert agent_node.layout(0) == {"4g.40gb@0"}
    assert driver.prepared_claims() == {claim.uid: ("gpu-0-4g40gb-at-0",)}


def test_slices_no_claim_owns_are_destroyed_when_free_and_held_out_of_counters_when_busy(
        agent_node: AgentNode, parts: tuple[DraDriver, Claims, Pool]) -> None:
    driver, _claims, pool = parts
    agent_node.backend.create_slice(0, "7g.80gb", 0)
    busy = agent_node.backend.create_slice(1, "3g.40gb", 0)
    assert busy.uuid is not None
    with agent_node.store.mutate() as state:
        operations.add_process(state, busy.uuid, pid=99)
    driver.publish()
    assert agent_node.layout(0) == set()
    assert agent_node.layout(1) == {"3g.40gb@0"}
    counters = pool.counters(1)
    assert counters["memory-slice-0"] == 0
    assert counters["compute-slices"] == 4
    assert pool.counters(0)["compute-slices"] == 7


def test_the_controllers_curation_taints_those_profiles(
        agent_node: AgentNode, parts: tuple[DraDriver, Claims, Pool]) -> None:
    driver, _claims, pool = parts
    uuid = agent_node.backend.gpus()[1].uuid
    partition = NodePartition(metadata=ObjectMeta(name=NODE, generation=3), spec=NodePartitionSpec(
        dra=DraSpec(curated=[DraCuration(gpu=uuid, profiles=["1g.10gb"])])))
    result = DraReconciler(driver).reconcile(partition)
    tainted = {name for name, d in pool.devices().items() if d.get("taints")}
    assert tainted == {f"gpu-1-1g10gb-at-{s}" for s in range(7)}
    assert result.status.api == "dra"
    applied = next(c for c in result.status.conditions if c.type == "Applied")
    assert (applied.status, applied.reason) == ("True", "Published")


def test_status_names_the_claim_each_slice_was_made_for(
        agent_node: AgentNode, parts: tuple[DraDriver, Claims, Pool]) -> None:
    driver, claims, _pool = parts
    driver.prepare(claims.allocate("a", "gpu-0-1g10gb-at-6"))
    result = DraReconciler(driver).reconcile(NodePartition(metadata=ObjectMeta(name=NODE)))
    (item,) = result.status.gpus[0].slices
    assert (item.profile, item.start, item.allocated, item.pods) == (
        "1g.10gb", 6, True, ["default/a"])


# -- MPS shares of GPUs without MIG: one device allocated many times (consumable capacity) --

SHARED_NODE = pytest.mark.parametrize("agent_node", [["L4-24GB", "A100-80GB"]], indirect=True)


@pytest.fixture
def shared(agent_node: AgentNode, standin: StandIn, tmp_path: Path
           ) -> tuple[DraDriver, Claims, Pool]:
    claims, pool = Claims(), Pool()
    driver = DraDriver(NODE, agent_node.runtime, claims, pool, tmp_path / "plugin",
                       cdi_dir=tmp_path / "cdi",
                       mps=MpsManager(standin.root, env=standin.env, timeout_s=5.0),
                       mps_shares=4)
    driver.publish()
    return driver, claims, pool


def _allocate_share(claims: Claims, name: str, shares: int = 1) -> ClaimRef:
    claim = ClaimRef("default", f"uid-{name}", name)
    claims.table[claim.uid] = (claim, [ClaimDevice("gpu", dra.DRIVER, NODE, "gpu-0-mps",
                                                   share_id=f"share-{name}", shares=shares)])
    return claim


@SHARED_NODE
def test_a_gpu_without_mig_is_one_device_of_consumable_shares(
        shared: tuple[DraDriver, Claims, Pool]) -> None:
    _driver, _claims, pool = shared
    device = pool.devices()["gpu-0-mps"]
    assert device["allowMultipleAllocations"] is True
    assert device["capacity"]["shares"] == {"value": "4", "requestPolicy": {
        "default": "1", "validRange": {"min": "1", "max": "4", "step": "1"}}}
    assert device["attributes"]["mode"] == {"string": "mps"}
    assert set(device["capacity"]) == {"shares"}, "any other capacity would be taken whole"
    assert "consumesCounters" not in device
    assert "gpu-1-7g80gb-at-0" in pool.devices(), "the A100 beside it still offers MIG"


@SHARED_NODE
def test_a_share_starts_the_gpus_mps_daemon_and_hands_its_pipe_and_limits(
        agent_node: AgentNode, shared: tuple[DraDriver, Claims, Pool], standin: StandIn,
        tmp_path: Path) -> None:
    driver, claims, _pool = shared
    first = driver.prepare(_allocate_share(claims, "a"))
    second = driver.prepare(_allocate_share(claims, "b", shares=2))
    uuid = agent_node.backend.gpus()[0].uuid
    (one,) = first.devices
    assert one.share_id == "share-a"
    assert one.cdi_device_ids == (f"gpu.tessera.dev/mps={uuid}-share-a",)
    status = driver.mps_status()[uuid]
    assert (status.daemon, status.shares, status.thread_percentage) == ("Running", 4, 25)
    spec = (tmp_path / "cdi" / "gpu.tessera.dev-uid-b-mps.json").read_text()
    memory = agent_node.backend.gpus()[0].memory_total_mib * 2 // 4
    assert f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={memory}M" in spec
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50" in spec
    assert str(standin.root / uuid / "pipe") in spec
    (two,) = second.devices
    assert two.cdi_device_ids == (f"gpu.tessera.dev/mps={uuid}-share-b",)
    driver.unprepare(ClaimRef("default", "uid-a", "a"))
    assert driver.mps_status()[uuid].daemon == "Running", "a share is still out"
    driver.unprepare(ClaimRef("default", "uid-b", "b"))
    assert driver.mps_status()[uuid].daemon == "Stopped", "the last share stops the daemon"


def test_kept_slices_are_reused_or_make_room_and_stay_offered(
        agent_node: AgentNode, tmp_path: Path) -> None:
    claims, pool = Claims(), Pool()
    driver = DraDriver(NODE, agent_node.runtime, claims, pool, tmp_path / "keep",
                       keep_slices=True)
    driver.publish()
    first = claims.allocate("a", "gpu-0-3g40gb-at-4")
    (made,) = driver.prepare(first).devices
    driver.unprepare(first)
    driver.publish()
    assert agent_node.layout(0) == {"3g.40gb@4"}, "kept on the card"
    assert pool.counters(0)["compute-slices"] == 7, "and offered as free room"
    (again,) = driver.prepare(claims.allocate("b", "gpu-0-3g40gb-at-4")).devices
    assert again.cdi_device_ids == made.cdi_device_ids, "the same placement reuses it"
    driver.unprepare(ClaimRef("default", "uid-b", "b"))
    driver.prepare(claims.allocate("c", "gpu-0-7g80gb-at-0"))
    assert agent_node.layout(0) == {"7g.80gb@0"}, "a placement that needs its room replaces it"


def test_prepares_and_pool_writes_are_counted(parts: tuple[DraDriver, Claims, Pool]) -> None:
    driver, claims, _pool = parts
    registry = driver.metrics.registry
    writes = registry.get_sample_value("tessera_agent_dra_pool_writes_total")
    assert writes == 1, "the first publish wrote the pool"
    driver.prepare(claims.allocate("a", "gpu-0-1g10gb-at-6"))
    with pytest.raises(PrepareError):
        driver.prepare(claims.allocate("b", "gpu-9-1g10gb-at-6"))
    driver.publish()
    assert registry.get_sample_value("tessera_agent_dra_claims_total",
                                     {"operation": "prepare", "result": "ok"}) == 1
    assert registry.get_sample_value("tessera_agent_dra_claims_total",
                                     {"operation": "prepare", "result": "failed"}) == 1
    assert registry.get_sample_value("tessera_agent_dra_prepare_seconds_count") == 1
    assert registry.get_sample_value("tessera_agent_dra_pool_writes_total") == writes, \
        "a slice allocated through DRA changes no counter: nothing to rewrite"
