"""``tessera dev sim``: drive a simulated node from outside, as jobs and faults drive real cards."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tessera.cli.main import main
from tessera.core.errors import BackendError
from tessera.nvml import sim
from tessera.nvml.backend import open_backend
from tessera.nvml.sim.store import load_state_file
from tessera.testing import nvml_library, short_socket_dir
from tessera.testing.cluster.fixtures import require_nvml_library


@pytest.fixture
def node(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    path = tmp_path / "node.json"
    assert main(["dev", "sim", "init", str(path), "--gpus", "2xA100-SXM4-40GB,H100-80GB",
                 "--node", "node-a"]) == 0
    capsys.readouterr()
    return path


def _mig_uuid(path: Path, profile: str, start: int) -> str:
    backend = open_backend(f"sim:{path}")
    try:
        uuid = backend.create_slice(0, profile, start).uuid
    finally:
        backend.close()
        sim.uninstall()
    assert uuid is not None
    return uuid


def test_init_writes_idle_cards_and_refuses_to_overwrite(
    node: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    state = load_state_file(node)
    assert [g.model for g in state.gpus] == ["A100-SXM4-40GB"] * 2 + ["H100-80GB"]
    assert all(g.mig_current for g in state.gpus)
    assert main(["dev", "sim", "init", str(node), "--gpus", "A30-24GB"]) == 2
    assert "pass --force" in capsys.readouterr().err


def test_init_takes_the_model_names_nvml_reports(tmp_path: Path) -> None:
    path = tmp_path / "node.json"
    assert main(["dev", "sim", "init", str(path), "--gpus", "2xA100-SXM4-80GB,H100-80GB"]) == 0
    assert [g.model for g in load_state_file(path).gpus] == ["A100-80GB", "A100-80GB",
                                                            "H100-80GB"]


def test_init_names_a_bad_gpu_list(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dev", "sim", "init", str(tmp_path / "x.json"), "--gpus", "2xK80"]) == 2
    assert "--gpus: unknown GPU model 'K80'" in capsys.readouterr().err


def test_show_prints_what_nvidia_smi_l_prints(
    node: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    uuid = _mig_uuid(node, "3g.20gb", 4)
    assert main(["dev", "sim", "show", str(node)]) == 0
    lines = capsys.readouterr().out.splitlines()
    state = load_state_file(node)
    assert lines[0] == f"GPU 0: NVIDIA A100-SXM4-40GB (UUID: {state.gpus[0].uuid})"
    assert lines[1] == f"  MIG 3g.20gb     Device  0: (UUID: {uuid})"
    assert lines[3] == f"GPU 2: NVIDIA H100 80GB HBM3 (UUID: {state.gpus[2].uuid})"


def test_a_process_added_from_outside_makes_the_slice_in_use(node: Path) -> None:
    uuid = _mig_uuid(node, "2g.10gb", 0)
    assert main(["dev", "sim", "process", "add", str(node), "--device", uuid, "--pid", "4711",
                 "--used-mib", "2048"]) == 0
    backend = open_backend(f"sim:{node}")
    try:
        (process,) = backend.processes(uuid)
        assert (process.pid, process.used_mib) == (4711, 2048)
        (instance,) = backend.gpu_instances(0)
        with pytest.raises(BackendError) as error:
            backend.destroy_slice(0, instance.id)
        assert error.value.code == 19  # NVML_ERROR_IN_USE
        assert main(["dev", "sim", "process", "remove", str(node), "--device", uuid,
                     "--pid", "4711"]) == 0
        backend.destroy_slice(0, instance.id)
        assert backend.gpu_instances(0) == []
    finally:
        backend.close()
        sim.uninstall()


def test_a_pending_mig_mode_applies_when_the_last_job_leaves(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "node.json"
    assert main(["dev", "sim", "init", str(path), "--gpus", "A100-80GB", "--no-mig"]) == 0
    gpu_uuid = load_state_file(path).gpus[0].uuid
    assert main(["dev", "sim", "process", "add", str(path), "--device", gpu_uuid,
                 "--pid", "9"]) == 0
    backend = open_backend(f"sim:{path}")
    try:
        assert backend.set_mig_mode(0, True).pending_busy
        assert backend.gpus()[0].mig_change_pending
        assert main(["dev", "sim", "process", "remove", str(path), "--device", gpu_uuid,
                     "--pid", "9"]) == 0
        assert backend.gpus()[0].mig_current is True
    finally:
        backend.close()
        sim.uninstall()


def test_xid_and_lose_reach_a_running_backend(node: Path) -> None:
    uuid = _mig_uuid(node, "1g.5gb", 0)
    backend = open_backend(f"sim:{node}")
    try:
        assert backend.wait_xid(0.05) is None  # registers for events from now on
        assert main(["dev", "sim", "xid", str(node), "--device", uuid, "--code", "31"]) == 0
        event = backend.wait_xid(2)
        assert event is not None
        assert (event.xid, event.gpu_instance_id, event.compute_instance_id) == (31, 7, 0)
        assert main(["dev", "sim", "lose", str(node), "--gpu", "1"]) == 0
        lost = backend.wait_xid(2)
        assert lost is not None
        assert lost.xid == 79
    finally:
        backend.close()
        sim.uninstall()


def test_an_unknown_device_lists_the_known_ones(
    node: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["dev", "sim", "xid", str(node), "--device", "MIG-nope", "--code", "1"]) == 2
    err = capsys.readouterr().err
    assert "--device: no GPU or MIG device has UUID 'MIG-nope' (valid: GPU-" in err


def test_init_takes_cards_without_mig_and_leaves_mig_off_on_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "node.json"
    assert main(["dev", "sim", "init", str(path), "--gpus", "2xL4,T4,A10G,A100-80GB"]) == 0
    assert capsys.readouterr().out.splitlines()[:3] == [
        "GPU 0: NVIDIA L4 (UUID: GPU-29740a30-5529-5daa-940a-26ee53ffc511)",
        "GPU 1: NVIDIA L4 (UUID: GPU-3498ea97-71cb-586a-9580-2bffda034df8)",
        "GPU 2: Tesla T4 (UUID: GPU-cdf446e1-c474-5080-86fd-1cf872ed725d)"]
    gpus = load_state_file(path).gpus
    assert [g.model for g in gpus] == ["L4-24GB", "L4-24GB", "T4-16GB", "A10G-24GB", "A100-80GB"]
    assert [g.mig_current for g in gpus] == [0, 0, 0, 0, 1]
    backend = open_backend(f"sim:{path}")
    try:
        infos = backend.gpus()
    finally:
        backend.close()
        sim.uninstall()
    assert [(i.name, i.model, i.memory_total_mib) for i in infos[:4]] == [
        ("NVIDIA L4", None, 23034), ("NVIDIA L4", None, 23034), ("Tesla T4", None, 15360),
        ("NVIDIA A10G", None, 23028)]
    assert infos[0].pci_device_id == 0x27B810DE


def test_serve_answers_the_library_until_terminated(node: Path) -> None:
    """``dev sim serve`` is the simulated driver for programs that load libnvidia-ml.so.1."""
    library = require_nvml_library()
    with short_socket_dir() as directory:
        socket = directory / "nvml.sock"
        server = subprocess.Popen([sys.executable, "-m", "tessera.cli.main", "dev", "sim",
                                   "serve", str(node), "--socket", str(socket)],
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert server.stdout is not None
            assert server.stdout.readline().startswith("serving ")
            client = (f"import ctypes, pynvml; pynvml.nvmlLib = ctypes.CDLL({str(library)!r}); "
                      "pynvml.nvmlInit(); print(pynvml.nvmlDeviceGetCount())")
            out = subprocess.run([sys.executable, "-c", client], check=True, text=True,
                                 capture_output=True, timeout=60,
                                 env={**os.environ, nvml_library.SOCKET_ENV: str(socket)})
            assert out.stdout.strip() == str(len(load_state_file(node).gpus))
        finally:
            server.terminate()
            assert server.wait(10) == 0
        assert not socket.exists()


def test_serve_refuses_a_missing_state_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dev", "sim", "serve", str(tmp_path / "none.json"),
                 "--socket", str(tmp_path / "s.sock")]) == 2
    assert "none.json" in capsys.readouterr().err
