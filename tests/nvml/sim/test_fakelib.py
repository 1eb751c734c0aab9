"""The simulator answers pynvml's real wrappers the way the driver does, refusals included.

These tests call ``pynvml`` directly (not Tessera's backend) so they pin the simulator to NVML's
own surface: return codes become pynvml's ``NVMLError_*`` classes, out-parameters arrive through
pynvml's ctypes structs, and handles behave like opaque driver handles.
"""

from __future__ import annotations

import ctypes
import time

import pynvml
import pytest

from tessera.core import catalogue
from tessera.nvml.sim.state import SimFault, SimGpu, SimProcess, new_node_state
from tessera.nvml.sim.store import StateStore

from ...conftest import SimNode

A100 = catalogue.model("A100-SXM4-40GB")


def _placement(start: int, size: int) -> pynvml.c_nvmlGpuInstancePlacement_t:
    placement = pynvml.c_nvmlGpuInstancePlacement_t()
    placement.start = start
    placement.size = size
    return placement


def _create(device: object, profile_name: str, start: int) -> object:
    profile = A100.profile(profile_name)
    info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(device, profile.nvml_constant)
    return pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(
        device, info.id, ctypes.byref(_placement(start, profile.memory_slices)))


def _full_ci(gi: object, compute_slices: int) -> object:
    constant = catalogue.compute_instance_profile_for_slices(compute_slices)
    info = pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, constant, 0)
    return pynvml.nvmlGpuInstanceCreateComputeInstance(gi, info.id)


@pytest.fixture
def a100(sim_node: SimNode) -> tuple[StateStore, object]:
    store, _ = sim_node("A100-SXM4-40GB")
    return store, pynvml.nvmlDeviceGetHandleByIndex(0)


class TestProfiles:
    def test_profile_info_takes_the_constant_and_returns_the_device_id(self, a100) -> None:
        _, device = a100
        info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(
            device, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2)
        assert info.id == 15
        assert info.version == pynvml.nvmlGpuInstanceProfileInfo_v2
        assert (info.sliceCount, info.instanceCount, info.memorySizeMB) == (1, 4, 9856)
        assert info.name == "MIG 1g.10gb"

    def test_enumeration_stops_with_invalid_argument_past_the_last_constant(self, a100) -> None:
        _, device = a100
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlDeviceGetGpuInstanceProfileInfo(device, 18)
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetGpuInstanceProfileInfo(
                device, pynvml.NVML_GPU_INSTANCE_PROFILE_6_SLICE)

    def test_the_v_variant_is_not_supported_while_mig_is_off(self, sim_node: SimNode) -> None:
        sim_node("H100-80GB", mig=False)
        device = pynvml.nvmlDeviceGetHandleByIndex(0)
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetGpuInstanceProfileInfo(device, 0)
        info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(device, 0, version=1)
        assert info.id == 19

    def test_possible_placements_are_every_placement_of_the_profile(self, a100) -> None:
        _, device = a100
        count = ctypes.c_uint(0)
        pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(device, 14, None, ctypes.byref(count))
        assert count.value == 3
        array = (pynvml.c_nvmlGpuInstancePlacement_t * 3)()
        pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(device, 14, array, ctypes.byref(count))
        assert [(p.start, p.size) for p in array] == [(0, 2), (2, 2), (4, 2)]


class TestGpuInstances:
    def test_overlap_is_insufficient_resources(self, a100) -> None:
        _, device = a100
        _create(device, "3g.20gb", 4)
        with pytest.raises(pynvml.NVMLError_InsufficientResources):
            _create(device, "1g.5gb", 5)

    def test_a_start_the_profile_does_not_offer_is_invalid_argument(self, a100) -> None:
        _, device = a100
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            _create(device, "1g.5gb", 7)

    def test_a_placement_passed_by_value_is_a_caller_bug(self, a100) -> None:
        _, device = a100
        with pytest.raises(TypeError, match="by pointer"):
            pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(device, 19, _placement(0, 1))

    def test_gi_ids_follow_the_placement(self, a100) -> None:
        _, device = a100
        gi = _create(device, "1g.5gb", 3)
        info = pynvml.nvmlGpuInstanceGetInfo(gi)
        assert (info.id, info.profileId, info.placement.start, info.placement.size) == (
            10, 19, 3, 1)
        assert pynvml.nvmlDeviceGetIndex(info.device) == 0

    def test_remaining_capacity_counts_free_non_overlapping_placements(self, a100) -> None:
        _, device = a100
        _create(device, "3g.20gb", 4)
        assert pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity(device, 19) == 4
        assert pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity(device, 9) == 1
        assert pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity(device, 0) == 0

    def test_creation_without_placement_is_greedy_in_the_observed_order(self, a100) -> None:
        _, device = a100
        starts = []
        for _ in range(7):
            gi = pynvml.nvmlDeviceCreateGpuInstance(device, 19)
            starts.append(pynvml.nvmlGpuInstanceGetInfo(gi).placement.start)
        assert starts == [6, 4, 5, 0, 1, 2, 3]
        with pytest.raises(pynvml.NVMLError_InsufficientResources):
            pynvml.nvmlDeviceCreateGpuInstance(device, 19)

    def test_the_mig_guides_order_trap_is_reproduced(self, a100) -> None:
        """``-cgi 19,19,14,9`` fails with Insufficient Resources; ``9,19,14,19`` succeeds."""
        _, device = a100
        created = [pynvml.nvmlDeviceCreateGpuInstance(device, pid) for pid in (19, 19, 14)]
        with pytest.raises(pynvml.NVMLError_InsufficientResources):
            pynvml.nvmlDeviceCreateGpuInstance(device, 9)
        for gi in created:
            pynvml.nvmlGpuInstanceDestroy(gi)
        for profile_id in (9, 19, 14, 19):
            pynvml.nvmlDeviceCreateGpuInstance(device, profile_id)
        assert pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity(device, 19) == 0

    def test_instances_cannot_be_created_while_mig_is_off(self, sim_node: SimNode) -> None:
        sim_node("A100-SXM4-40GB", mig=False)
        device = pynvml.nvmlDeviceGetHandleByIndex(0)
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(
                device, 19, ctypes.byref(_placement(0, 1)))

    def test_a_gi_with_compute_instances_cannot_be_destroyed(self, a100) -> None:
        _, device = a100
        gi = _create(device, "2g.10gb", 0)
        ci = _full_ci(gi, 2)
        with pytest.raises(pynvml.NVMLError_InUse) as error:
            pynvml.nvmlGpuInstanceDestroy(gi)
        assert str(error.value) == "In use by another client"
        pynvml.nvmlComputeInstanceDestroy(ci)
        pynvml.nvmlGpuInstanceDestroy(gi)
        with pytest.raises(pynvml.NVMLError_NotFound):
            pynvml.nvmlDeviceGetGpuInstanceById(device, 3)

    def test_a_compute_instance_with_processes_cannot_be_destroyed(self, a100) -> None:
        store, device = a100
        gi = _create(device, "1g.5gb", 0)
        ci = _full_ci(gi, 1)
        with store.mutate() as state:
            state.gpus[0].processes.append(SimProcess(pid=4242, used_mib=512, gi=7, ci=0))
        with pytest.raises(pynvml.NVMLError_InUse):
            pynvml.nvmlComputeInstanceDestroy(ci)
        with store.mutate() as state:
            state.gpus[0].processes.clear()
        pynvml.nvmlComputeInstanceDestroy(ci)

    def test_a_stale_handle_is_invalid_argument(self, a100) -> None:
        _, device = a100
        gi = _create(device, "1g.5gb", 0)
        pynvml.nvmlGpuInstanceDestroy(gi)
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlGpuInstanceGetInfo(gi)


class TestMigDevices:
    def test_mig_devices_have_uuids_names_memory_and_processes(self, a100) -> None:
        store, device = a100
        gi = _create(device, "3g.20gb", 0)
        _full_ci(gi, 3)
        mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(device, 0)
        assert pynvml.nvmlDeviceIsMigDeviceHandle(mig)
        uuid = pynvml.nvmlDeviceGetUUID(mig)
        assert uuid.startswith("MIG-")
        assert uuid[4 + 14] == "5"  # the version nibble R470+ drivers print
        assert pynvml.nvmlDeviceGetName(mig) == "NVIDIA A100-SXM4-40GB MIG 3g.20gb"
        assert pynvml.nvmlDeviceGetMemoryInfo(mig).total == 19968 * 1024 * 1024
        assert pynvml.nvmlDeviceGetGpuInstanceId(mig) == 1
        assert pynvml.nvmlDeviceGetComputeInstanceId(mig) == 0
        by_uuid = pynvml.nvmlDeviceGetHandleByUUID(uuid)
        assert pynvml.nvmlDeviceGetUUID(by_uuid) == uuid
        parent = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
        assert pynvml.nvmlDeviceGetUUID(parent) == pynvml.nvmlDeviceGetUUID(device)
        assert pynvml.nvmlDeviceGetComputeRunningProcesses(mig) == []
        with store.mutate() as state:
            state.gpus[0].processes.append(SimProcess(pid=7, used_mib=1024, gi=1, ci=0))
        (process,) = pynvml.nvmlDeviceGetComputeRunningProcesses(mig)
        assert (process.pid, process.usedGpuMemory) == (7, 1024 * 1024 * 1024)
        assert (process.gpuInstanceId, process.computeInstanceId) == (1, 0)

    def test_mig_devices_are_ordered_by_gi_then_ci_and_shift(self, a100) -> None:
        _, device = a100
        _full_ci(_create(device, "1g.5gb", 6), 1)   # GI 13
        _full_ci(_create(device, "2g.10gb", 0), 2)  # GI 3
        ids = [pynvml.nvmlDeviceGetGpuInstanceId(
            pynvml.nvmlDeviceGetMigDeviceHandleByIndex(device, i)) for i in range(2)]
        assert ids == [3, 13]
        with pytest.raises(pynvml.NVMLError_NotFound):
            pynvml.nvmlDeviceGetMigDeviceHandleByIndex(device, 2)

    def test_events_cannot_be_registered_on_mig_handles(self, a100) -> None:
        _, device = a100
        _full_ci(_create(device, "7g.40gb", 0), 7)
        mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(device, 0)
        event_set = pynvml.nvmlEventSetCreate()
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceRegisterEvents(mig, pynvml.nvmlEventTypeXidCriticalError, event_set)
        pynvml.nvmlEventSetFree(event_set)


class TestMigMode:
    def test_set_mig_mode_reports_a_busy_card_as_pending(self, sim_node: SimNode) -> None:
        store, _ = sim_node("A100-SXM4-40GB", mig=False)
        with store.mutate() as state:
            state.gpus[0].processes.append(SimProcess(pid=99))
        device = pynvml.nvmlDeviceGetHandleByIndex(0)
        status = pynvml.nvmlDeviceSetMigMode(device, pynvml.NVML_DEVICE_MIG_ENABLE)
        assert status == pynvml.NVML_ERROR_IN_USE
        assert pynvml.nvmlDeviceGetMigMode(device) == [0, 1]

    def test_set_mig_mode_on_an_idle_card_applies_at_once(self, sim_node: SimNode) -> None:
        sim_node("H100-80GB", mig=False)
        device = pynvml.nvmlDeviceGetHandleByIndex(0)
        assert pynvml.nvmlDeviceSetMigMode(device, pynvml.NVML_DEVICE_MIG_ENABLE) == 0
        assert pynvml.nvmlDeviceGetMigMode(device) == [1, 1]

    def test_a_pass_through_card_needs_a_reset(self, sim_node: SimNode) -> None:
        state = new_node_state("n", ["A100-80GB"], mig=False)
        state.gpus[0].reset_required = True
        sim_node(state=state)
        device = pynvml.nvmlDeviceGetHandleByIndex(0)
        status = pynvml.nvmlDeviceSetMigMode(device, pynvml.NVML_DEVICE_MIG_ENABLE)
        assert status == pynvml.NVML_ERROR_RESET_REQUIRED
        assert pynvml.nvmlDeviceGetMigMode(device) == [0, 1]

    def test_a_card_without_mig_says_not_supported(self, sim_node: SimNode) -> None:
        state = new_node_state("n", [])
        state.gpus.append(SimGpu(index=0, model="none", uuid="GPU-" + "0" * 8 + "-0000-0000-0000-"
                                 + "0" * 12, product_name="NVIDIA L4", memory_mib=23034,
                                 pci_device_id=0x27B810DE))
        sim_node(state=state)
        device = pynvml.nvmlDeviceGetHandleByIndex(0)
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetMigMode(device)
        assert pynvml.nvmlDeviceGetMaxMigDeviceCount(device) == 0


class TestFaultsAndEvents:
    def test_an_injected_fault_fails_the_nth_call_once(self, a100) -> None:
        store, device = a100
        with store.mutate() as state:
            state.faults.append(SimFault(function="nvmlDeviceCreateGpuInstanceWithPlacement",
                                         code=pynvml.NVML_ERROR_UNKNOWN, after=1))
        _create(device, "1g.5gb", 0)
        with pytest.raises(pynvml.NVMLError_Unknown):
            _create(device, "1g.5gb", 1)
        _create(device, "1g.5gb", 1)
        assert store.read().faults == []

    def test_a_lost_gpu_fails_every_call(self, a100) -> None:
        store, device = a100
        with store.mutate() as state:
            state.gpus[0].lost = True
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            pynvml.nvmlDeviceGetUUID(device)
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            pynvml.nvmlDeviceGetHandleByIndex(0)

    def test_xid_events_arrive_on_the_registered_set_and_waits_time_out(self, a100) -> None:
        store, device = a100
        event_set = pynvml.nvmlEventSetCreate()
        pynvml.nvmlDeviceRegisterEvents(device, pynvml.nvmlEventTypeXidCriticalError, event_set)
        started = time.monotonic()
        with pytest.raises(pynvml.NVMLError_Timeout):
            pynvml.nvmlEventSetWait_v2(event_set, 50)
        assert time.monotonic() - started >= 0.04
        with store.mutate() as state:
            state.post_event(0, 31, gi=7, ci=0)
        data = pynvml.nvmlEventSetWait_v2(event_set, 1000)
        assert (data.eventType, data.eventData) == (pynvml.nvmlEventTypeXidCriticalError, 31)
        assert (data.gpuInstanceId, data.computeInstanceId) == (7, 0)
        assert pynvml.nvmlDeviceGetUUID(data.device) == pynvml.nvmlDeviceGetUUID(device)
        pynvml.nvmlEventSetFree(event_set)

    def test_calls_before_init_fail_as_uninitialized(self, a100) -> None:
        pynvml.nvmlShutdown()
        try:
            with pytest.raises(pynvml.NVMLError_Uninitialized):
                pynvml.nvmlDeviceGetCount()
        finally:
            pynvml.nvmlInit()

    def test_functions_it_does_not_model_do_not_exist(self, a100) -> None:
        _, device = a100
        with pytest.raises(pynvml.NVMLError_FunctionNotFound):
            pynvml.nvmlDeviceGetPowerUsage(device)


class TestWhatNvidiasToolsAsk:
    """Calls only NVIDIA's tools make (mig-parted, the device plugin and its go-nvlib and
    go-gpuallocator); each answer from the catalogue, or a refusal a real card gives."""

    def test_the_nvml_version_is_cuda_s_major_then_the_driver_s(self, a100) -> None:
        assert pynvml.nvmlSystemGetNVMLVersion() == (
            f"{pynvml.nvmlSystemGetCudaDriverVersion() // 1000}."
            f"{pynvml.nvmlSystemGetDriverVersion()}")

    def test_a_card_is_found_by_its_pci_bus_id_in_any_spelling(self, a100) -> None:
        _, device = a100
        bus_id = pynvml.nvmlDeviceGetPciInfo(device).busId
        bus_id = bus_id.decode() if isinstance(bus_id, bytes) else bus_id
        short = bus_id.split(":", 1)[1]
        for spelling in (bus_id, bus_id.lower(), short, "0000:" + short):
            found = pynvml.nvmlDeviceGetHandleByPciBusId(spelling)
            assert pynvml.nvmlDeviceGetUUID(found) == pynvml.nvmlDeviceGetUUID(device)
        with pytest.raises(pynvml.NVMLError_NotFound):
            pynvml.nvmlDeviceGetHandleByPciBusId("00000000:FF:1F.0")
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlDeviceGetHandleByPciBusId("not-a-bus-id")

    def test_compute_capability_is_the_catalogue_s_on_cards_and_mig_devices(
            self, sim_node: SimNode) -> None:
        sim_node("A100-80GB", "H100-80GB", "B200-180GB", "L4-24GB")
        expected = [(8, 0), (9, 0), (10, 0), (8, 9)]
        got = [pynvml.nvmlDeviceGetCudaComputeCapability(pynvml.nvmlDeviceGetHandleByIndex(i))
               for i in range(4)]
        assert got == expected

    def test_a_mig_device_s_attributes_are_its_profile_s(self, a100) -> None:
        _, device = a100
        profile = A100.profile("3g.20gb")
        _full_ci(_create(device, "3g.20gb", 4), profile.compute_slices)
        attributes = pynvml.nvmlDeviceGetAttributes(
            pynvml.nvmlDeviceGetMigDeviceHandleByIndex(device, 0))
        assert (attributes.multiprocessorCount, attributes.gpuInstanceSliceCount,
                attributes.computeInstanceSliceCount, attributes.memorySizeMB,
                attributes.sharedCopyEngineCount, attributes.sharedDecoderCount) == (
            profile.sm_count, 3, 3, profile.memory_mib, profile.engines.copy,
            profile.engines.decoders)
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetAttributes(device)

    def test_only_xid_events_are_supported_and_only_on_the_card(self, a100) -> None:
        _, device = a100
        assert pynvml.nvmlDeviceGetSupportedEventTypes(device) == \
            pynvml.nvmlEventTypeXidCriticalError
        _full_ci(_create(device, "1g.5gb", 0), 1)
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetSupportedEventTypes(
                pynvml.nvmlDeviceGetMigDeviceHandleByIndex(device, 0))

    def test_every_card_sits_under_one_cpu_with_no_nvlink(self, sim_node: SimNode) -> None:
        sim_node("A100-80GB", "A100-80GB")
        first, second = (pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(2))
        assert pynvml.nvmlDeviceGetTopologyCommonAncestor(first, second) == \
            pynvml.NVML_TOPOLOGY_NODE
        assert pynvml.nvmlDeviceGetTopologyCommonAncestor(first, first) == \
            pynvml.NVML_TOPOLOGY_INTERNAL
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetNvLinkState(first, 0)
