"""Allocate, GetPreferredAllocation and PreStartContainer over the socket, as the kubelet
calls them."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from tessera.kubelet import _wire
from tessera.kubelet._wire import dp
from tessera.kubelet.allocation import AllocateOptions, DeviceListStrategy
from tessera.kubelet.inventory import Inventory
from tessera.kubelet.plugins import PluginManager
from tessera.testing import AdmissionError, Container, KubeletStandIn, Pod

from .conftest import (
    MIG_1G,
    MIG_3G,
    MPS_RES,
    WAIT,
    StartPlugins,
    gpu_uuid,
    mig,
    mig_uuid,
    mps,
)


@pytest.fixture
def stub(plugins: PluginManager) -> Iterator[_wire.DevicePluginStub]:
    """A raw client on the 1g plugin's socket, for calls the kubelet would make."""
    with _wire.unix_channel(plugins.socket_path(MIG_1G)) as channel:
        yield _wire.device_plugin_stub(channel)


def allocate(stub: _wire.DevicePluginStub, *ids: str) -> dp.ContainerAllocateResponse:
    request = dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=ids)])
    response = stub.Allocate(request, timeout=WAIT)
    assert len(response.container_responses) == 1
    return response.container_responses[0]


def test_an_admitted_pod_sees_its_mig_device(kubelet: KubeletStandIn,
                                             plugins: PluginManager) -> None:
    pod = Pod("ml", "train", (Container("main", {MIG_3G: 1}),))
    assert kubelet.admit(pod) == {"main": {MIG_3G: (mig_uuid(1, 2),)}}
    assert kubelet.run_options(pod, "main").envs == {"NVIDIA_VISIBLE_DEVICES": mig_uuid(1, 2)}


def test_a_multi_slice_request_is_steered_onto_one_gpu(kubelet: KubeletStandIn,
                                                       plugins: PluginManager) -> None:
    pod = Pod("ml", "two", (Container("main", {MIG_1G: 2}),))
    got = kubelet.admit(pod)["main"][MIG_1G]
    assert set(got) <= {mig_uuid(0, 1), mig_uuid(0, 2), mig_uuid(0, 3)}


def test_allocate_refuses_unknown_ids_with_invalid_argument_naming_them(
        stub: _wire.DevicePluginStub) -> None:
    with pytest.raises(grpc.RpcError) as info:
        allocate(stub, mig_uuid(0, 1), "MIG-not-here", mig_uuid(1, 2))
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "MIG-not-here" in info.value.details()
    assert mig_uuid(1, 2) in info.value.details()  # another resource's id is unknown here
    assert mig_uuid(0, 1) not in info.value.details()


def test_allocate_refuses_unhealthy_ids(stub: _wire.DevicePluginStub,
                                        inventory: Inventory) -> None:
    inventory.set_health(mig_uuid(0, 2), healthy=False)
    with pytest.raises(grpc.RpcError) as info:
        allocate(stub, mig_uuid(0, 2))
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert f"unhealthy device ids {mig_uuid(0, 2)}" in info.value.details()


class HeldBackInventory(Inventory):
    """An inventory that can hold back change notifications, to play a race: the device is
    gone from the plugin's view but the kubelet still has the old list when it calls Allocate.
    """

    held = False

    def _notify(self) -> None:
        if not self.held:
            super()._notify()


def test_the_refusal_reaches_the_pod_admission_error(kubelet: KubeletStandIn,
                                                     start_plugins: StartPlugins) -> None:
    inventory = HeldBackInventory({MIG_3G: [mig(1, 2)]})
    start_plugins(inventory)
    kubelet.wait_until(lambda k: k.allocatable().get(MIG_3G) == 1, WAIT)
    inventory.held = True
    inventory.set_devices(MIG_3G, [])  # repartitioned away; the kubelet has not heard yet
    pod = Pod("ml", "late", (Container("main", {MIG_3G: 1}),))
    with pytest.raises(AdmissionError) as info:
        kubelet.admit(pod)
    assert "code = InvalidArgument" in str(info.value)
    assert f"unknown device ids {mig_uuid(1, 2)}" in str(info.value)
    assert kubelet.allocated(MIG_3G) == set()


def test_preferred_allocation_honours_must_include(stub: _wire.DevicePluginStub) -> None:
    available = [mig_uuid(0, 1), mig_uuid(0, 2), mig_uuid(0, 3), mig_uuid(1, 1)]
    request = dp.PreferredAllocationRequest(container_requests=[
        dp.ContainerPreferredAllocationRequest(available_deviceIDs=available,
                                               must_include_deviceIDs=[mig_uuid(1, 1)],
                                               allocation_size=2)])
    response = stub.GetPreferredAllocation(request, timeout=WAIT)
    chosen = list(response.container_responses[0].deviceIDs)
    assert len(chosen) == 2
    assert chosen[0] == mig_uuid(1, 1)


def test_preferred_allocation_never_errors(stub: _wire.DevicePluginStub) -> None:
    request = dp.PreferredAllocationRequest(container_requests=[
        dp.ContainerPreferredAllocationRequest(available_deviceIDs=["junk", "::", ""],
                                               allocation_size=7)])
    response = stub.GetPreferredAllocation(request, timeout=WAIT)
    assert len(response.container_responses) == 1


def test_pre_start_container_is_a_no_op(stub: _wire.DevicePluginStub) -> None:
    response = stub.PreStartContainer(dp.PreStartContainerRequest(devices_ids=[mig_uuid(0, 1)]),
                                      timeout=WAIT)
    assert response == dp.PreStartContainerResponse()


def test_many_concurrent_allocates_all_answer_correctly(stub: _wire.DevicePluginStub) -> None:
    ids = [mig_uuid(0, 1), mig_uuid(0, 2), mig_uuid(0, 3), mig_uuid(1, 1)]
    start = threading.Barrier(16)

    def call(n: int) -> str:
        if n < 16:
            start.wait(timeout=WAIT)
        return allocate(stub, ids[n % 4]).envs["NVIDIA_VISIBLE_DEVICES"]

    with ThreadPoolExecutor(max_workers=16) as pool:
        answers = list(pool.map(call, range(400)))
    assert answers == [ids[n % 4] for n in range(400)]


def test_concurrent_admissions_get_disjoint_devices(kubelet: KubeletStandIn,
                                                    plugins: PluginManager) -> None:
    pods = [Pod("ml", f"p{n}", (Container("c", {MIG_1G: 1}),)) for n in range(4)]
    with ThreadPoolExecutor(max_workers=4) as pool:
        got = list(pool.map(kubelet.admit, pods))
    assigned = [g["c"][MIG_1G][0] for g in got]
    assert len(set(assigned)) == 4
    with pytest.raises(AdmissionError, match="requested number of devices unavailable"):
        kubelet.admit(Pod("ml", "fifth", (Container("c", {MIG_1G: 1}),)))


def test_mps_shares_allocate_with_pipe_and_limits(kubelet: KubeletStandIn,
                                                  start_plugins: StartPlugins) -> None:
    inventory = Inventory({MPS_RES: [mps(0, s) for s in range(4)] + [mps(1, 0)]})
    start_plugins(inventory)
    kubelet.wait_until(lambda k: k.allocatable().get(MPS_RES) == 5, WAIT)
    pod = Pod("ml", "infer", (Container("c", {MPS_RES: 2}),))
    shares = kubelet.admit(pod)["c"][MPS_RES]
    assert {s.split("::")[0] for s in shares} == {gpu_uuid(0)}  # steered onto one GPU
    run = kubelet.run_options(pod, "c")
    assert run.envs["CUDA_MPS_PIPE_DIRECTORY"] == "/run/tessera/mps/pipe"
    assert run.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
    assert run.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert ("/run/tessera/mps/pipe", "/run/tessera/mps/pipe", False) in run.mounts


def test_cdi_strategies_reach_the_runtime_and_survive_two_resources(
        kubelet: KubeletStandIn, inventory: Inventory, start_plugins: StartPlugins) -> None:
    options = AllocateOptions(strategies=(DeviceListStrategy.ENVVAR, DeviceListStrategy.CDI_CRI))
    start_plugins(inventory, allocate=options)
    kubelet.wait_until(lambda k: k.allocatable() == {MIG_1G: 4, MIG_3G: 1}, WAIT)
    pod = Pod("ml", "both", (Container("c", {MIG_1G: 1, MIG_3G: 1}),))
    got = kubelet.admit(pod)["c"]
    run = kubelet.run_options(pod, "c")
    # The kubelet keeps one NVIDIA_VISIBLE_DEVICES (NVIDIA issue #728); CDI keeps both.
    assert run.envs["NVIDIA_VISIBLE_DEVICES"] in (got[MIG_1G][0], got[MIG_3G][0])
    assert set(run.cdi_devices) == {f"nvidia.com/gpu={got[MIG_1G][0]}",
                                    f"nvidia.com/gpu={got[MIG_3G][0]}"}
