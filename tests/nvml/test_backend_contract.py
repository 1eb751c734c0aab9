"""The contract every GPU backend keeps, checked on the simulator always and, read-only, on a real
GPU when one is present (``-m gpu``; nothing here changes MIG mode or instances on a real card).

On a real card these tests also check the catalogue itself: every profile NVML reports for a
known model must match the table (ids, slices, counts, memory, placements).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pynvml
import pytest

from tessera.core import catalogue, layout
from tessera.nvml import sim
from tessera.nvml.backend import GpuBackend, PynvmlBackend

from ..conftest import SimNode


def _real_backend() -> PynvmlBackend | None:
    sim.uninstall()
    try:
        return PynvmlBackend()
    except Exception:
        return None


def _mixed_layout(model: catalogue.GpuModel) -> list[layout.Slice]:
    """Largest plain profiles first, each at the lowest start that still fits: a full card of
    mixed sizes (on an A100-40GB 4g.20gb@0, 2g.10gb@4, 1g.5gb@6)."""
    chosen: list[layout.Slice] = []
    smaller = sorted((p for p in model.profiles if p.plain and p != model.full_profile),
                     key=lambda p: (-p.memory_slices, -p.compute_slices))
    for profile in smaller:
        for start in profile.starts:
            item = layout.Slice(profile.name, start)
            if layout.conflict_with(model, chosen, item) is None:
                chosen.append(item)
                break
    return chosen


@pytest.fixture(params=[
    "sim", "library", *(f"sim:{m.name}" for m in catalogue.models()),
    pytest.param("real", marks=pytest.mark.gpu)])
def backend(request: pytest.FixtureRequest, sim_node: SimNode) -> Iterator[GpuBackend]:
    """The simulator through both doors ("library": the simulated libnvidia-ml.so.1, loaded as
    the driver's is), each model of the catalogue, and the real card when there is one."""
    if request.param in ("sim", "library"):
        door = "library" if request.param == "library" else "in-process"
        _, simulated = sim_node("A100-SXM4-40GB", "H100-80GB", door=door)
        simulated.create_slice(0, "3g.20gb", 4)
        simulated.create_slice(0, "1g.5gb", 0)
        yield simulated
        return
    if request.param.startswith("sim:"):
        model = catalogue.model(request.param.removeprefix("sim:"))
        _, simulated = sim_node(model.name)
        mixed = _mixed_layout(model)
        assert len({s.profile for s in mixed}) > 1, "a mixed layout"
        for item in mixed:
            simulated.create_slice(0, item.profile, item.start)
        yield simulated
        return
    real = _real_backend()
    if real is None:
        pytest.skip("no NVIDIA driver on this machine")
    yield real
    real.close()


def test_gpus_have_uuids_names_and_memory(backend: GpuBackend) -> None:
    gpus = backend.gpus()
    assert gpus, "a backend lists at least one GPU"
    for gpu in gpus:
        assert gpu.uuid.startswith("GPU-")
        assert gpu.name.startswith("NVIDIA")
        assert gpu.memory_total_mib > 0
        assert gpu.pci_device_id & 0xFFFF == 0x10DE
        if gpu.model is not None:
            assert gpu.mig_current is not None


def test_instances_are_valid_layouts_with_mig_uuids(backend: GpuBackend) -> None:
    for gpu in backend.gpus():
        if gpu.model is None or not gpu.mig_current:
            continue
        model = catalogue.model(gpu.model)
        instances = backend.gpu_instances(gpu.index)
        slices = [layout.Slice(i.profile, i.start) for i in instances]
        layout.check_layout(model, slices)
        for instance in instances:
            profile = model.profile(instance.profile)
            assert instance.size == profile.memory_slices
            assert instance.id == model.gpu_instance_id(catalogue.Placement(instance.start,
                                                                            instance.size))
            for compute in instance.compute_instances:
                assert compute.uuid.startswith("MIG-")


def test_processes_can_be_listed_for_every_device(backend: GpuBackend) -> None:
    for gpu in backend.gpus():
        assert isinstance(backend.processes(gpu.uuid), list)
        if gpu.model is None or not gpu.mig_current:
            continue
        for instance in backend.gpu_instances(gpu.index):
            if instance.uuid is not None:
                assert isinstance(backend.processes(instance.uuid), list)


def test_nvml_profile_info_matches_the_catalogue(backend: GpuBackend) -> None:
    checked = 0
    for gpu in backend.gpus():
        if gpu.model is None:
            continue
        model = catalogue.model(gpu.model)
        handle = pynvml.nvmlDeviceGetHandleByIndex(gpu.index)
        for profile in model.profiles:
            try:
                info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(
                    handle, profile.nvml_constant, version=1)
            except pynvml.NVMLError_NotSupported:
                pytest.fail(f"{gpu.name} does not offer {profile.name}")
            observed = {"profile_id": info.id, "compute_slices": info.sliceCount,
                        "max_count": info.instanceCount, "memory_mib": info.memorySizeMB,
                        "sm_count": info.multiprocessorCount,
                        "engines": catalogue.Engines(
                            info.copyEngineCount, info.decoderCount, info.encoderCount,
                            info.jpegCount, info.ofaCount)}
            for field, value in observed.items():
                expected = getattr(profile, field)
                guessed = field in profile.unverified or "nvml_constant" in profile.unverified
                if guessed and value != expected:
                    warnings.warn(f"{model.name} {profile.name}: unverified {field} is "
                                  f"{value} on this card, table says {expected}", stacklevel=1)
                elif field != "sm_count" or not model.unverified:
                    assert value == expected, f"{profile.name} {field}"
            checked += 1
            if not gpu.mig_current:
                continue
            count = pynvml.c_uint(0)
            pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(
                handle, info.id, None, pynvml.byref(count))
            placements = (pynvml.c_nvmlGpuInstancePlacement_t * count.value)()
            pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(
                handle, info.id, placements, pynvml.byref(count))
            found = [(p.start, p.size) for p in placements[: count.value]]
            table = [(p.start, p.size) for p in profile.placements]
            if "placements" in profile.unverified and found != table:
                warnings.warn(f"{model.name} {profile.name}: unverified placements are {found} "
                              f"on this card, table says {table}", stacklevel=1)
            else:
                assert found == table, profile.name
    assert checked > 0
