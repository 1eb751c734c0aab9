"""The simulated ``libnvidia-ml.so.1``: a C library any program loads as the driver's, forwarding
each NVML call to :mod:`tessera.nvml.sim.server`.

The backend's whole contract runs through it already (``tests/nvml/test_backend_contract.py``,
the ``library`` door). These are what only the library can get wrong: what it exports, its
return codes with no driver, a NULL or wrong-version argument, a second process on the same
card, threads, and a simulator that restarts.
"""

from __future__ import annotations

import ctypes
import inspect
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest

from tessera.agent.reconciler import Reconciler
from tessera.api.v1alpha1 import GpuSpec, NodePartition, NodePartitionSpec, ObjectMeta, SliceSpec
from tessera.core.layout import parse_slice
from tessera.nvml import sim
from tessera.nvml.backend import open_backend
from tessera.nvml.sim import FakeNvmlLib, FileStore, abi, operations
from tessera.nvml.sim.fakelib import codes
from tessera.nvml.sim.server import NvmlServer
from tessera.nvml.sim.state import new_node_state
from tessera.nvml.sim.store import write_new_state_file
from tessera.testing import nvml_library, short_socket_dir
from tessera.testing.cluster.fixtures import require_nvml_library
from tests._nvml_calls import documented


@pytest.fixture
def library() -> ctypes.CDLL:
    return ctypes.CDLL(str(require_nvml_library()))


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    with short_socket_dir() as directory:
        yield directory


@pytest.fixture
def node(tmp_path: Path, socket_dir: Path) -> Iterator[tuple[Path, Path, NvmlServer]]:
    state = tmp_path / "node.json"
    write_new_state_file(state, new_node_state("lib-node", ["A100-SXM4-80GB", "H100-80GB"]))
    with NvmlServer(state, socket_dir / "nvml.sock") as server:
        yield state, socket_dir / "nvml.sock", server


def _exported(path: Path) -> set[str]:
    out = subprocess.run(["nm", "-D", "--defined-only", str(path)], check=True,
                         capture_output=True, text=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.strip()}


def test_exports_exactly_the_modelled_entry_points_under_their_versioned_names() -> None:
    exported = _exported(require_nvml_library())
    assert exported == set(abi.SYMBOLS) | {"nvmlErrorString"}
    assert {"nvmlInit_v2", "nvmlDeviceGetCount_v2", "nvmlDeviceGetHandleByIndex_v2",
            "nvmlDeviceGetGpuInstancePossiblePlacements_v2",
            "nvmlDeviceGetGpuInstanceProfileInfoV"} <= exported
    # an entry point the simulator does not model is absent, as on an older driver, never a stub
    assert "nvmlDeviceGetClockInfo" not in exported
    assert "nvmlInit" not in exported


def test_the_table_and_the_simulator_name_the_same_entry_points() -> None:
    modelled = {name for name, _ in inspect.getmembers(FakeNvmlLib, inspect.isfunction)
                if name.startswith("nvml")}
    assert modelled == set(abi.SYMBOLS) | {"nvmlErrorString"}
    for symbol in abi.SYMBOLS.values():
        parameters = list(inspect.signature(getattr(FakeNvmlLib, symbol.name)).parameters)[1:]
        assert len(parameters) == len(symbol.args), symbol.name


def test_with_no_simulator_init_says_the_driver_is_not_loaded(
        library: ctypes.CDLL, socket_dir: Path) -> None:
    """In a process of its own, as on a node without a driver: the library's state is the
    process's, and this test's process has talked to simulators before."""
    script = (
        "import ctypes, sys\n"
        f"lib = ctypes.CDLL({str(nvml_library.locate())!r})\n"
        "count = ctypes.c_uint(7)\n"
        "print(lib.nvmlInit_v2(), lib.nvmlDeviceGetCount_v2(ctypes.byref(count)), count.value)\n")
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True,
        env={**os.environ, nvml_library.SOCKET_ENV: str(socket_dir / "absent.sock")})
    assert result.stdout.split() == [str(codes.DRIVER_NOT_LOADED), str(codes.UNINITIALIZED),
                                      "7"]


def test_with_no_state_file_init_says_the_driver_is_not_loaded(
        library: ctypes.CDLL, tmp_path: Path, socket_dir: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    with NvmlServer(tmp_path / "missing.json", socket_dir / "nvml.sock"):
        monkeypatch.setenv(nvml_library.SOCKET_ENV, str(socket_dir / "nvml.sock"))
        assert library.nvmlInit_v2() == codes.DRIVER_NOT_LOADED
        library.nvmlErrorString.restype = ctypes.c_char_p
        assert library.nvmlErrorString(codes.DRIVER_NOT_LOADED) == b"Driver Not Loaded"


def _init(library: ctypes.CDLL, socket: Path, monkeypatch: pytest.MonkeyPatch) -> ctypes.c_void_p:
    monkeypatch.setenv(nvml_library.SOCKET_ENV, str(socket))
    assert library.nvmlInit_v2() == codes.SUCCESS
    device = ctypes.c_void_p()
    assert library.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(device)) == codes.SUCCESS
    return device


def test_a_wrong_struct_version_is_a_version_mismatch(
        library: ctypes.CDLL, node: tuple[Path, Path, NvmlServer],
        monkeypatch: pytest.MonkeyPatch) -> None:
    device = _init(library, node[1], monkeypatch)
    info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
    info.version = 1
    assert library.nvmlDeviceGetGpuInstanceProfileInfoV(
        device, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE, ctypes.byref(info)) == (
        codes.ARGUMENT_VERSION_MISMATCH)
    info.version = pynvml.nvmlGpuInstanceProfileInfo_v2
    assert library.nvmlDeviceGetGpuInstanceProfileInfoV(
        device, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE, ctypes.byref(info)) == codes.SUCCESS
    assert (info.id, info.memorySizeMB, info.name) == (19, 9728, "MIG 1g.10gb")


def test_a_null_out_pointer_is_an_invalid_argument_and_a_short_buffer_too_small(
        library: ctypes.CDLL, node: tuple[Path, Path, NvmlServer],
        monkeypatch: pytest.MonkeyPatch) -> None:
    device = _init(library, node[1], monkeypatch)
    assert library.nvmlDeviceGetCount_v2(None) == codes.INVALID_ARGUMENT
    short = ctypes.create_string_buffer(8)
    assert library.nvmlDeviceGetUUID(device, short, 8) == codes.INSUFFICIENT_SIZE
    uuid = ctypes.create_string_buffer(96)
    assert library.nvmlDeviceGetUUID(device, uuid, 96) == codes.SUCCESS
    assert uuid.value.startswith(b"GPU-")


def test_a_query_with_no_array_returns_the_count_and_never_writes_past_the_callers(
        library: ctypes.CDLL, node: tuple[Path, Path, NvmlServer],
        monkeypatch: pytest.MonkeyPatch) -> None:
    device = _init(library, node[1], monkeypatch)
    count = ctypes.c_uint(0)
    assert library.nvmlDeviceGetGpuInstancePossiblePlacements_v2(
        device, 19, None, ctypes.byref(count)) == codes.SUCCESS
    assert count.value == 7  # 1g.10gb on an A100-80GB: starts 0..6
    guarded = (pynvml.c_nvmlGpuInstancePlacement_t * 4)()
    canary = ctypes.c_uint64.from_address(ctypes.addressof(guarded) + 3 * 8)
    canary.value = 0xDEADBEEF
    count.value = 3
    assert library.nvmlDeviceGetGpuInstancePossiblePlacements_v2(
        device, 19, guarded, ctypes.byref(count)) == codes.INSUFFICIENT_SIZE
    assert count.value == 7
    assert canary.value == 0xDEADBEEF


def test_both_doors_see_one_card(node: tuple[Path, Path, NvmlServer], tmp_path: Path) -> None:
    """A slice made by another process through the library is on the card the in-process
    simulator reads, and the reverse."""
    state, socket, _ = node
    child = f"""
import ctypes, sys, pynvml
pynvml.nvmlLib = ctypes.CDLL({str(require_nvml_library())!r})
from tessera.nvml.backend import PynvmlBackend
backend = PynvmlBackend()
backend.create_slice(0, "3g.40gb", 4)
print(sorted(s.profile for s in backend.gpu_instances(0)))
"""
    env = {"PATH": "/usr/bin:/bin", nvml_library.SOCKET_ENV: str(socket)}
    out = subprocess.run([sys.executable, "-c", child], env=env, check=True,
                         capture_output=True, text=True, timeout=60).stdout
    assert out.strip() == "['3g.40gb']"
    gpu = FileStore(state).read().gpus[0]
    assert [(i.profile_id, i.start) for i in gpu.instances] == [(9, 4)]  # 3g.40gb@4
    in_process = open_backend(f"sim:{state}")
    try:
        in_process.create_slice(0, "1g.10gb", 0)
    finally:
        in_process.close()
        sim.uninstall()
    again = subprocess.run(
        [sys.executable, "-c", child.replace('backend.create_slice(0, "3g.40gb", 4)\n', "")],
        env=env, check=True, capture_output=True, text=True, timeout=60).stdout
    assert again.strip() == "['1g.10gb', '3g.40gb']"


def test_a_thread_waiting_for_events_does_not_hold_up_the_others(
        library: ctypes.CDLL, node: tuple[Path, Path, NvmlServer],
        monkeypatch: pytest.MonkeyPatch) -> None:
    device = _init(library, node[1], monkeypatch)
    event_set = ctypes.c_void_p()
    assert library.nvmlEventSetCreate(ctypes.byref(event_set)) == codes.SUCCESS
    assert library.nvmlDeviceRegisterEvents(
        device, ctypes.c_ulonglong(pynvml.nvmlEventTypeXidCriticalError), event_set) == 0
    waited: list[int] = []
    data = pynvml.c_nvmlEventData_t()
    waiter = threading.Thread(target=lambda: waited.append(
        library.nvmlEventSetWait_v2(event_set, ctypes.byref(data), 3000)))
    waiter.start()
    time.sleep(0.2)
    started = time.monotonic()
    count = ctypes.c_uint()
    assert library.nvmlDeviceGetCount_v2(ctypes.byref(count)) == codes.SUCCESS
    assert count.value == 2
    answered_while_waiting = waiter.is_alive()
    assert answered_while_waiting, f"the count came {time.monotonic() - started:.1f}s later"
    with FileStore(node[0]).mutate() as state:
        operations.inject_xid(state, state.gpus[0].uuid, 79)
    waiter.join(5)
    assert waited == [codes.SUCCESS]
    assert data.eventData == 79


def test_after_the_simulator_restarts_init_starts_over_and_old_handles_fail(
        library: ctypes.CDLL, node: tuple[Path, Path, NvmlServer],
        monkeypatch: pytest.MonkeyPatch) -> None:
    state, socket, server = node
    device = _init(library, socket, monkeypatch)
    server.close()
    with NvmlServer(state, socket):
        name = ctypes.create_string_buffer(96)
        assert library.nvmlDeviceGetName(device, name, 96) == codes.UNKNOWN
        assert library.nvmlInit_v2() == codes.SUCCESS
        fresh = ctypes.c_void_p()
        assert library.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(fresh)) == codes.SUCCESS
        assert library.nvmlDeviceGetName(fresh, name, 96) == codes.SUCCESS
        assert name.value == b"NVIDIA A100-SXM4-80GB"


def test_the_server_listens_at_a_path_longer_than_a_socket_address_holds(
        tmp_path: Path, library: ctypes.CDLL, monkeypatch: pytest.MonkeyPatch) -> None:
    deep = tmp_path / ("node-folder-" * 8) / "var" / "lib" / "tessera-sim"
    deep.mkdir(parents=True)
    state = deep / "node.json"
    write_new_state_file(state, new_node_state("deep", ["L4-24GB"], mig=False))
    with NvmlServer(state, deep / "nvml.sock"), short_socket_dir() as short:
        assert len(str(deep / "nvml.sock")) > 107
        (short / "nvml.sock").symlink_to(deep / "nvml.sock")  # a client's own short path
        monkeypatch.setenv(nvml_library.SOCKET_ENV, str(short / "nvml.sock"))
        assert library.nvmlInit_v2() == codes.SUCCESS
        count = ctypes.c_uint()
        assert library.nvmlDeviceGetCount_v2(ctypes.byref(count)) == codes.SUCCESS
        assert count.value == 1


def test_the_agent_makes_the_calls_the_readme_table_gives_it(tmp_path: Path,
                                                              socket_dir: Path) -> None:
    """Tessera's agent through the library, as on a node: it observes, turns MIG on, cuts a
    card, reshapes it, watches for Xid events and lists processes; every NVML call it makes is
    in the README's table under Tessera, and the table claims no other."""
    state = tmp_path / "node.json"
    node = new_node_state("lib-node", ["A100-80GB", "H100-80GB"])
    node.gpus[1].mig_current = node.gpus[1].mig_pending = 0
    write_new_state_file(state, node)
    with (NvmlServer(state, socket_dir / "nvml.sock") as server,
          nvml_library.agent_beside_stand_in(socket_dir / "nvml.sock") as runtime):
        reconciler = Reconciler(runtime)
        for generation, layout in enumerate(
                (["3g.40gb@4", "1g.10gb@0"], ["7g.80gb@0"]), start=1):
            spec = NodePartitionSpec(plan_id=f"p{generation}", gpus=[
                GpuSpec(index=0, mode="mig", slices=[SliceSpec(
                    profile=parse_slice(s).profile, start=parse_slice(s).start)
                    for s in layout]),
                GpuSpec(index=1, mode="mig")])
            result = reconciler.reconcile(NodePartition(
                metadata=ObjectMeta(name="lib-node", generation=generation), spec=spec))
            assert result.status.gpus[1].mode == "mig"
        time.sleep(0.3)  # the Xid watcher has waited on its event set
    assert server.calls_by_client[os.getpid()] == documented("tessera")
