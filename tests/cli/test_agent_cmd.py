"""``tessera agent``: bad spec files and settings are usage errors naming the file or flag; a
node without a usable NVML gets an agent that waits, not Ready, saying why."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from tessera.cli.agent_cmd import wait_for_nvml
from tessera.cli.main import main
from tessera.core import catalogue
from tessera.nvml import sim
from tessera.nvml.backend import GpuBackend
from tessera.nvml.sim.server import NvmlServer
from tessera.nvml.sim.state import new_node_state
from tessera.nvml.sim.store import load_state_file, write_new_state_file
from tessera.testing import nvml_library, short_socket_dir
from tessera.testing.cluster import free_ports
from tessera.testing.cluster.fixtures import require_nvml_library


@pytest.mark.parametrize(("content", "problem"), [
    (b"\xff\xfe\x00k\x00i\x00n\x00d", "is not UTF-8 text"),
    (b"spec: [unclosed", "is not valid YAML or JSON at line"),
    (b"- just\n- a list\n", "is not a NodePartition object"),
])
def test_a_bad_spec_file_exits_2_naming_the_file_and_the_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, problem: str,
) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_bytes(content)
    code = main(["agent", "--once", "--spec-file", str(spec), "--nvml", "sim:" + str(
        tmp_path / "node.json"), "--no-kubelet"])
    err = capsys.readouterr().err
    assert code == 2
    assert "--spec-file" in err
    assert str(spec) in err
    assert problem in err
    assert "Traceback" not in err


@pytest.mark.parametrize(("gpus", "slices"), [
    ("B200", ["3g.90gb@4", "2g.45gb@0", "1g.23gb+me@2", "1g.23gb@3"]),
    ("GB300", ["4g.139gb@0", "1g.70gb@4", "1g.35gb+me@6"]),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition",
     ["1g.24gb+me.all@0", "1g.24gb-me@3", "2g.48gb-me@6"]),
    ("rtx-pro-6000", ["2g.48gb+gfx@0", "1g.24gb+gfx@6", "1g.24gb@9"]),
    ("H20", ["3g.48gb@0", "2g.24gb@4", "1g.12gb@6"]),
])
def test_a_mixed_layout_applies_on_a_2026_card(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], gpus: str, slices: list[str],
) -> None:
    state = tmp_path / "node.json"
    assert main(["dev", "sim", "init", str(state), "--gpus", gpus]) == 0
    spec = tmp_path / "partition.yaml"
    spec.write_text(yaml.safe_dump({
        "apiVersion": "tessera.dev/v1alpha1", "kind": "NodePartition",
        "metadata": {"name": "node-a"},
        "spec": {"gpus": [{"index": 0, "mode": "mig", "slices": [
            {"profile": s.split("@")[0], "start": int(s.split("@")[1])} for s in slices]}]}}))
    code = main(["agent", "--once", "--spec-file", str(spec), "--nvml", f"sim:{state}",
                 "--no-kubelet"])
    assert code == 0, capsys.readouterr()
    (gpu,) = load_state_file(state).gpus
    model = catalogue.model(gpu.model)
    created = sorted(f"{model.profile_by_id(i.profile_id).name}@{i.start}"  # type: ignore[union-attr]
                     for i in gpu.instances)
    assert created == sorted(slices)
    for instance in gpu.instances:
        assert instance.id == model.gpu_instance_id(catalogue.Placement(instance.start,
                                                                        instance.size))


@pytest.mark.parametrize(("args", "field", "problem"), [
    (["--once", "--api", "dra"], "--once", "a DRA node has no layout to apply"),
    (["--api", "dra", "--node-name", "n", "--kubeconfig", "/nonexistent", "--dra-mps-shares",
      "64"], "--dra-mps-shares", "64 is not 0 to 48"),
    (["--api", "dra", "--node-name", "n", "--dra-mps-shares", "4"], "--dra-mps-shares",
     "MPS shares need --mps-root"),
])
def test_bad_dra_settings_exit_2_naming_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], field: str,
    problem: str,
) -> None:
    code = main(["agent", "--nvml", "sim:" + str(tmp_path / "node.json"), *args])
    err = capsys.readouterr().err
    assert code == 2
    assert field in err
    assert problem in err
    assert "Traceback" not in err


class TestAnAgentWithoutAUsableNvml:
    """A node whose driver is missing (or a mistyped ``agent.nvml``) gets an agent that stays
    up, not Ready, and says why and which value sets it: not a crash loop."""

    def test_it_waits_says_why_once_and_starts_when_the_file_appears(
            self, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
        state = tmp_path / "node.json"
        stop = threading.Event()
        found: list[GpuBackend | None] = []
        waiter = threading.Thread(target=lambda: found.append(
            wait_for_nvml(f"sim:{state}", stop, retry_s=0.05)))
        with caplog.at_level(logging.ERROR):
            waiter.start()
            time.sleep(0.4)  # several tries
            assert waiter.is_alive(), "it keeps waiting"
            write_new_state_file(state, new_node_state("n", ["A100-SXM4-80GB"]))
            waiter.join(5)
        assert not waiter.is_alive()
        (backend,) = found
        assert backend is not None, "a backend once the file is there"
        backend.close()
        said = [r.getMessage() for r in caplog.records if "NVML is not usable" in r.getMessage()]
        assert len(said) == 1, "one line per reason, not one per try"
        assert f"--nvml sim:{state}" in said[0]
        assert "agent.nvml" in said[0]
        assert "no such file" in said[0]

    def test_it_gives_up_waiting_when_stopped(self, tmp_path: Path) -> None:
        stop = threading.Event()
        stop.set()
        assert wait_for_nvml(f"sim:{tmp_path / 'missing.json'}", stop) is None

    def test_with_the_driver_library_but_no_driver_it_waits_and_starts_when_one_answers(
            self, caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
        """The simulated libnvidia-ml.so.1 with no simulator behind it is a node whose
        driver is not loaded yet: nvmlInit says so, and the agent waits for it."""
        require_nvml_library()
        state = tmp_path / "node.json"
        write_new_state_file(state, new_node_state("n", ["A100-SXM4-80GB"]))
        stop = threading.Event()
        found: list[GpuBackend | None] = []
        with short_socket_dir() as directory, caplog.at_level(logging.ERROR):
            nvml_library.load(directory / "nvml.sock")
            waiter = threading.Thread(target=lambda: found.append(
                wait_for_nvml("real", stop, retry_s=0.05)))
            waiter.start()
            time.sleep(0.4)
            assert waiter.is_alive(), "it keeps waiting"
            with NvmlServer(state, directory / "nvml.sock"):
                waiter.join(5)
                assert not waiter.is_alive()
                (backend,) = found
                assert backend is not None
                assert len(backend.gpus()) == 1
                backend.close()
        sim.uninstall()
        said = [r.getMessage() for r in caplog.records if "NVML is not usable" in r.getMessage()]
        assert len(said) == 1, said
        assert "--nvml real" in said[0]
        assert "Driver Not Loaded" in said[0]

    @pytest.mark.parametrize(("state", "says"), [
        (False, ("NVML is not usable", "agent.nvml", "no such file")),
        (True, ("cannot reach the API server", "host='127.0.0.1', port=1",
                "apiServer.host")),
        (None, ("NVML is not usable", "--nvml real", "Driver Not Loaded")),
    ], ids=["no-state-file", "no-api-server", "driver-library-but-no-driver"])
    def test_its_process_is_live_not_ready_says_why_and_stops_on_sigterm(
            self, tmp_path: Path, state: bool | None, says: tuple[str, ...]) -> None:
        """Without NVML, with NVML but no API server (a wrong apiServer.host), and with the
        driver's library found by the loader but no driver behind it (None: the simulated
        libnvidia-ml.so.1 with no simulator): the kubelet's probes get live and not ready,
        the log says why in a line, with no traceback, and SIGTERM stops it."""
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
        nvml = tmp_path / "node.json"
        if state:
            write_new_state_file(nvml, new_node_state("n", ["A100-SXM4-80GB"]))
        (port,) = free_ports(1)
        log = tmp_path / "agent.log"
        spec, env = f"sim:{nvml}", dict(os.environ)
        if state is None:  # pynvml's own loader finds the library, as on a node
            spec = "real"
            env["LD_LIBRARY_PATH"] = str(require_nvml_library().parent)
            env[nvml_library.SOCKET_ENV] = str(tmp_path / "no-driver.sock")
        with log.open("wb") as out:
            agent = subprocess.Popen(
                [sys.executable, "-m", "tessera.cli.main", "agent", "--node-name", "n",
                 "--kubeconfig", str(kubeconfig), "--nvml", spec,
                 "--plugin-dir", str(tmp_path / "plugins"),
                 "--pod-resources-socket", str(tmp_path / "pod-resources.sock"),
                 "--resync-seconds", "1", "--metrics-port", str(port)],
                stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            # Once it has said why (its start-up, a second or two, is past by then), the
            # kubelet would see these answers, probe after probe.
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not all(w in log.read_text() for w in says):
                time.sleep(0.2)
            samples = [(_status(port, "/healthz"), _status(port, "/readyz"))
                       for _ in range(3)]
            assert set(samples) == {(200, 503)}, f"(/healthz, /readyz): {samples}"
            assert agent.poll() is None, "still running"
            agent.send_signal(signal.SIGTERM)
            assert agent.wait(15) == 0
        finally:
            if agent.poll() is None:
                agent.kill()
        text = log.read_text()
        for words in says:
            assert words in text, text[-2000:]
        assert "Traceback" not in text
        assert "Retrying" not in text, "urllib3's per-retry warnings stay out of the log"


def _status(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as refused:
        return refused.code
