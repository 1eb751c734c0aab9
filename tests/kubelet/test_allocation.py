"""Allocation policy as plain functions: Allocate content and preferred allocations."""

from __future__ import annotations

import pytest

from tessera.kubelet.allocation import (
    AllocateOptions,
    DeviceListStrategy,
    Mount,
    container_allocation,
    preferred_allocation,
    resolve_request,
)
from tessera.kubelet.errors import AllocationRefusedError
from tessera.kubelet.inventory import PluginDevice

from .conftest import MIG_1G, MPS_RES, gpu_uuid, mig, mig_uuid, mps

S = DeviceListStrategy


def test_envvar_lists_mig_uuids() -> None:
    got = container_allocation(MIG_1G, [mig(0, 1), mig(1, 1)], AllocateOptions())
    assert got.envs == {"NVIDIA_VISIBLE_DEVICES": f"{mig_uuid(0, 1)},{mig_uuid(1, 1)}"}
    assert (got.mounts, got.device_nodes, got.cdi_devices) == ((), (), ())
    assert dict(got.annotations) == {}


def test_cdi_cri_alone_sets_cdi_devices_and_no_visible_devices_env() -> None:
    got = container_allocation(MIG_1G, [mig(0, 1)], AllocateOptions(strategies=(S.CDI_CRI,)))
    assert got.cdi_devices == (f"nvidia.com/gpu={mig_uuid(0, 1)}",)
    assert "NVIDIA_VISIBLE_DEVICES" not in got.envs


def test_cdi_annotations_use_one_stable_key_per_resource() -> None:
    options = AllocateOptions(strategies=(S.CDI_ANNOTATIONS,), cdi_kind="k8s.example.com/gpu")
    got = container_allocation(MIG_1G, [mig(0, 1), mig(0, 2)], options)
    assert dict(got.annotations) == {
        "cdi.k8s.io/tessera_nvidia.com_mig-1g.10gb":
            f"k8s.example.com/gpu={mig_uuid(0, 1)},k8s.example.com/gpu={mig_uuid(0, 2)}"}
    assert container_allocation(MIG_1G, [mig(0, 1)], options).annotations.keys() == \
        got.annotations.keys()


def test_volume_mounts_point_visible_devices_at_a_directory_of_dev_null_mounts() -> None:
    got = container_allocation(MIG_1G, [mig(0, 1)],
                               AllocateOptions(strategies=(S.VOLUME_MOUNTS,)))
    assert got.envs["NVIDIA_VISIBLE_DEVICES"] == "/var/run/nvidia-container-devices"
    assert got.mounts == (Mount(f"/var/run/nvidia-container-devices/{mig_uuid(0, 1)}",
                                "/dev/null", read_only=True),)


def test_strategies_combine() -> None:
    got = container_allocation(MIG_1G, [mig(0, 1)],
                               AllocateOptions(strategies=(S.ENVVAR, S.CDI_CRI)))
    assert got.envs["NVIDIA_VISIBLE_DEVICES"] == mig_uuid(0, 1)
    assert got.cdi_devices == (f"nvidia.com/gpu={mig_uuid(0, 1)}",)


def test_device_specs_include_control_nodes_and_the_devices_own_nodes_once() -> None:
    a = mig(0, 1, device_nodes=("/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap12"))
    b = mig(0, 2, device_nodes=("/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap21"))
    options = AllocateOptions(pass_device_specs=True, dev_root="/run/nvidia/driver",
                              control_device_nodes=("/dev/nvidiactl",))
    got = container_allocation(MIG_1G, [a, b], options)
    assert [(n.container_path, n.host_path, n.permissions) for n in got.device_nodes] == [
        ("/dev/nvidiactl", "/run/nvidia/driver/dev/nvidiactl", "rw"),
        ("/dev/nvidia0", "/run/nvidia/driver/dev/nvidia0", "rw"),
        ("/dev/nvidia-caps/nvidia-cap12", "/run/nvidia/driver/dev/nvidia-caps/nvidia-cap12", "rw"),
        ("/dev/nvidia-caps/nvidia-cap21", "/run/nvidia/driver/dev/nvidia-caps/nvidia-cap21", "rw"),
    ]


def test_an_mps_share_gets_its_pipe_and_per_share_limits() -> None:
    got = container_allocation(MPS_RES, [mps(0, 2)], AllocateOptions())
    assert got.envs == {
        "NVIDIA_VISIBLE_DEVICES": gpu_uuid(0),
        "CUDA_MPS_PIPE_DIRECTORY": "/run/tessera/mps/pipe",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=10240M",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
    }
    assert got.mounts == (Mount("/run/tessera/mps/pipe", "/run/tessera/mps/pipe"),
                          Mount("/dev/shm", "/run/tessera/mps/shm"))


def test_two_shares_of_one_gpu_add_up() -> None:
    got = container_allocation(MPS_RES, [mps(0, 0), mps(0, 1)], AllocateOptions())
    assert got.envs["NVIDIA_VISIBLE_DEVICES"] == gpu_uuid(0)
    assert got.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
    assert got.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"


def test_shares_on_two_gpus_list_a_limit_per_ordinal_and_the_smaller_thread_grant() -> None:
    got = container_allocation(MPS_RES, [mps(0, 0), mps(0, 1), mps(1, 0)], AllocateOptions())
    assert got.envs["NVIDIA_VISIBLE_DEVICES"] == f"{gpu_uuid(0)},{gpu_uuid(1)}"
    assert got.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M,1=10240M"
    assert got.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"


def test_shares_behind_two_mps_daemons_are_refused() -> None:
    with pytest.raises(AllocationRefusedError, match="2 MPS daemons"):
        container_allocation(MPS_RES, [mps(0, 0, pipe="/a"), mps(1, 0, pipe="/b")],
                             AllocateOptions())


def test_unknown_and_unhealthy_ids_are_refused_by_name() -> None:
    devices = [mig(0, 1), mig(0, 2, healthy=False)]
    with pytest.raises(AllocationRefusedError) as info:
        resolve_request(MIG_1G, [mig_uuid(0, 1), "MIG-stale", mig_uuid(0, 2)], devices)
    message = str(info.value)
    assert "unknown device ids MIG-stale" in message
    assert f"unhealthy device ids {mig_uuid(0, 2)}" in message
    assert info.value.device_ids == ("MIG-stale", mig_uuid(0, 2))


def test_known_healthy_ids_resolve_in_request_order() -> None:
    devices = [mig(0, 1), mig(0, 2)]
    got = resolve_request(MIG_1G, [mig_uuid(0, 2), mig_uuid(0, 1)], devices)
    assert [d.id for d in got] == [mig_uuid(0, 2), mig_uuid(0, 1)]


def test_allocate_options_refuse_an_empty_strategy_list() -> None:
    with pytest.raises(ValueError, match="strategies"):
        AllocateOptions(strategies=())


# --- preferred allocation -------------------------------------------------------------------

SHARES = [mps(g, s) for g in range(3) for s in range(4)]


def ids(gpu: int, *shares: int) -> list[str]:
    return [f"{gpu_uuid(gpu)}::{s}" for s in shares]


def test_a_multi_share_request_lands_on_one_gpu_when_one_has_room() -> None:
    available = ids(0, 0) + ids(1, 0, 1, 2) + ids(2, 0, 1, 2, 3)
    # GPU 1 is the tightest fit for three (GPU 2 keeps its four together).
    assert preferred_allocation(available, [], 3, SHARES) == ids(1, 0, 1, 2)


def test_must_include_is_kept_and_its_gpu_is_filled_first() -> None:
    available = ids(0, 0, 1, 2) + ids(1, 0, 1, 2, 3)
    got = preferred_allocation(available, ids(1, 3), 3, SHARES)
    assert got[0] == ids(1, 3)[0]
    assert got == ids(1, 3) + ids(1, 0, 1)


def test_a_request_larger_than_any_gpu_uses_the_fewest_gpus() -> None:
    available = ids(0, 0) + ids(1, 0, 1) + ids(2, 0, 1, 2)
    got = preferred_allocation(available, [], 4, SHARES)
    assert {i.split("::")[0] for i in got} == {gpu_uuid(2), gpu_uuid(0)}
    assert len(got) == 4


def test_share_numbers_sort_numerically() -> None:
    many = [mps(0, s) for s in range(12)]
    available = [d.id for d in many]
    assert preferred_allocation(available, [], 3, many) == ids(0, 0, 1, 2)


def test_never_fails_when_too_few_devices_or_unknown_ids() -> None:
    assert preferred_allocation(ids(0, 0), [], 5, SHARES) == ids(0, 0)
    assert preferred_allocation(["GPU-unknown::1", "MIG-x"], [], 1, SHARES) in (
        ["GPU-unknown::1"], ["MIG-x"])
    assert preferred_allocation([], ["MIG-x"], 0, []) == ["MIG-x"]


def test_whole_devices_prefer_one_parent_gpu() -> None:
    devices = [mig(0, 1), mig(1, 1), mig(1, 2), PluginDevice.gpu(gpu_uuid(5), 5)]
    got = preferred_allocation([d.id for d in devices], [], 2, devices)
    assert got == [mig_uuid(1, 1), mig_uuid(1, 2)]

